"""Fixtures of the cluster tests: a whole cluster (tests/lib/cluster.py) shared by the tests
of one module, and the reasons a module cannot run here, named in its skips."""
import sys

import pytest

from cluster import Cluster, RoleMissing, why_not


@pytest.fixture(scope="module")
def cluster_factory(request, build_dir, templates_dir, log_dir):
    """make(**Cluster kwargs) → a started Cluster, closed at the end of the module (every
    coved log kept under log_dir when a test of the session failed). A cluster role coved
    refuses (not built yet) skips the test with coved's own message."""
    why = why_not()
    if why:
        pytest.skip(why)
    made = []

    def make(**kw):
        try:
            cl = Cluster(build_dir, templates_dir, log_dir, **kw)
        except RoleMissing as e:
            pytest.skip(str(e))
        made.append(cl)
        return cl

    yield make
    failed = request.session.testsfailed > 0
    for cl in made:
        cl.close(keep_logs=request.module.__name__ if failed else None)
        if failed:
            sys.stderr.write(f"\ncluster logs kept under {log_dir}\n")
