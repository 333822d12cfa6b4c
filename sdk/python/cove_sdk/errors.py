"""Typed errors: one class per error code of the cove API (docs/api.md "Errors")."""
from typing import Dict, Optional, Type


class CoveError(Exception):
    """An error answer of coved: `status`, `code` (the API's error code) and `message`."""

    code = "error"

    def __init__(self, message: str, status: int = 0, code: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.status = status
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.status else self.message


class BadRequest(CoveError):
    code = "bad_request"


class Unauthorized(CoveError):
    code = "unauthorized"


class NotFound(CoveError):
    code = "not_found"


class Conflict(CoveError):
    code = "conflict"


class LimitExceeded(CoveError):
    code = "limit_exceeded"


class KeyRevoked(CoveError):
    code = "key_revoked"


class Unavailable(CoveError):
    code = "unavailable"


class InternalError(CoveError):
    code = "internal"


class ConnectionFailed(CoveError):
    """coved could not be reached, or the connection broke and could not be resumed."""

    code = "connection_failed"


ERRORS: Dict[str, Type[CoveError]] = {
    c.code: c
    for c in (BadRequest, Unauthorized, NotFound, Conflict, LimitExceeded, KeyRevoked,
              Unavailable, InternalError)
}


def from_answer(status: int, code: Optional[str], message: str) -> CoveError:
    cls = ERRORS.get(code or "", CoveError)
    return cls(message, status, code or f"http_{status}")
