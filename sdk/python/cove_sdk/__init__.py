"""cove: sandboxes for AI agents. A small client over the REST API (docs/api.md), standard
library only.

    from cove_sdk import Sandbox
    with Sandbox.create("base") as sb:
        print(sb.exec("echo hello").text)
"""
from .client import Client
from .errors import (BadRequest, Conflict, ConnectionFailed, CoveError, InternalError,
                     KeyRevoked, LimitExceeded, NotFound, Unauthorized, Unavailable)
from .sandbox import ExecResult, Files, Pty, PtySession, Sandbox, audit, diff, diff_file

__all__ = ["Client", "Sandbox", "ExecResult", "Files", "Pty", "PtySession", "audit", "diff",
           "diff_file", "CoveError", "BadRequest", "Unauthorized", "NotFound", "Conflict",
           "LimitExceeded", "KeyRevoked", "Unavailable", "InternalError", "ConnectionFailed"]
__version__ = "0.1.0"
