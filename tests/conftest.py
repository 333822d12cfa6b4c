"""pytest fixtures for integration and security tests: a real coved on a temp data dir.

Fixtures
  coved           session: the shared coved (tests/lib/cove.py Coved); .client is the admin
  client          session: coved.client (Client: request, ok/get/post, exec, stream, files)
  sandbox         function: a fresh busybox sandbox (the dict from POST /v1/sandboxes),
                  deleted afterwards
  coved_factory   function: start(data_dir=None, extra_args=()) → another Coved (for
                  kill -9 / restart tests); all are stopped at the end of the test
  build_dir, templates_dir
Markers
  slow            long test; skipped with a reason when COVE_SKIP_SLOW=1 (e.g. under ASan)
  root            needs root; skipped with a reason otherwise (the coved fixtures imply it)

Environment: COVE_BUILD (absolute build dir; else $BUILD relative to the checkout, default
build), COVE_TEMPLATES_DIR (default $COVE_BUILD/test-templates: shared across runs, so the
base template is built at most once), COVE_TEST_OUT (where coved logs of failed runs go).
"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))

from cove import Client, Coved, CoveError  # noqa: E402,F401  (re-exported for tests)


def _build_dir():
    b = os.environ.get("COVE_BUILD") or os.environ.get("BUILD") or "build"
    return b if os.path.isabs(b) else os.path.join(ROOT, b)


def _is_root():
    return os.geteuid() == 0


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long test, skipped when COVE_SKIP_SLOW=1")
    config.addinivalue_line("markers", "root: needs root")


def pytest_collection_modifyitems(config, items):
    skip_slow = os.environ.get("COVE_SKIP_SLOW") == "1"
    for item in items:
        if skip_slow and item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.skip(
                reason="slow test skipped in this pass (COVE_SKIP_SLOW=1, e.g. under ASan)"))
        if item.get_closest_marker("root") and not _is_root():
            item.add_marker(pytest.mark.skip(reason="needs root"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # remember per test whether it failed, so fixtures can keep coved's log
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        item.cove_failed = True


def _failed(request):
    return getattr(request.node, "cove_failed", False)


@pytest.fixture(scope="session")
def build_dir():
    return _build_dir()


@pytest.fixture(scope="session")
def templates_dir(build_dir):
    d = os.environ.get("COVE_TEMPLATES_DIR") or os.path.join(build_dir, "test-templates")
    os.makedirs(d, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def log_dir(build_dir):
    return os.environ.get("COVE_TEST_OUT") or os.path.join(build_dir, "test-out")


@pytest.fixture(scope="session")
def coved(request, build_dir, templates_dir, log_dir):
    if not _is_root():
        pytest.skip("coved's namespace runtime needs root")
    d = Coved(build_dir, templates_dir=templates_dir, log_dir=log_dir)
    yield d
    failed = request.session.testsfailed > 0
    rc, saved = d.stop(keep_log_as="session" if failed else None)
    if saved:
        sys.stderr.write(f"\ncoved log kept at {saved}\n")
    # coved must stop cleanly on SIGTERM (exit 0); a crash at shutdown is a failure
    assert rc == 0, f"coved exited with {rc} on SIGTERM"


@pytest.fixture(scope="session")
def client(coved):
    return coved.client


@pytest.fixture
def sandbox(coved):
    c = coved.client
    sb = c.create(template="busybox")
    yield sb
    try:
        c.remove(sb["id"])
    except (CoveError, OSError) as e:  # teardown must not hide the test's own result
        sys.stderr.write(f"cleanup of {sb['id']} failed: {e}\n")


@pytest.fixture
def coved_factory(request, build_dir, templates_dir, log_dir):
    """start(data_dir=None, extra_args=(), start=True, env=None) → Coved. A data dir given
    by the test is left in place (the test owns it); temp ones are removed. env: variables
    added to coved's environment."""
    if not _is_root():
        pytest.skip("coved's namespace runtime needs root")
    started = []

    def start(data_dir=None, extra_args=(), start=True, env=None):
        d = Coved(build_dir, data_dir=data_dir, templates_dir=templates_dir,
                  extra_args=extra_args, log_dir=log_dir, start=start, env=env)
        started.append(d)
        return d

    yield start
    for i, d in enumerate(started):
        d.stop(keep_log_as=f"{request.node.name}-{i}" if _failed(request) else None)
