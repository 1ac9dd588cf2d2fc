"""Shared fixtures: real embedded clusters (a server process and worker
processes on loopback), started once per module where tests only read.

With CI=true a test that skips fails instead (see pytest_runtest_makereport)."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The package under test: the one on PYTHONPATH if there is one (the ASan
# stage puts build-asan/python there, whose extension is instrumented),
# else the source tree's.
if importlib.util.find_spec("plexus") is None:
    sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("PLEXUS_BIN_DIR", str(ROOT / "build" / "bin"))

import plexus  # noqa: E402

# PYTHONPATH for a Python subprocess (an example, the CLI): the package and
# extension this test process runs.
PLEXUS_PYTHONPATH = str(Path(plexus.__file__).parent.parent)

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _fail_skip_under_ci(report):
    # CI has every capability the suite needs (packages, root for network
    # namespaces, ...): a test that skips there for a missing one would
    # hide that it never ran. Expected failures (xfail) are not skips.
    if not (CI and report.skipped) or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    report.outcome = "failed"
    report.longrepr = ("CI=true: a test may not skip; it skipped with "
                       f"{reason.removeprefix('Skipped: ')!r}")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "jax_heavy: a whole model trained through plexus.jit, whose time is "
        "JAX's tracing and XLA's compiles; the ASan stage leaves it out "
        "(-m 'not jax_heavy': every C++ path it takes is taken there by a "
        "smaller test), the plain and jax-next suites run it")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip_under_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # A whole module skipped at import (pytest.importorskip) fails too.
    outcome = yield
    _fail_skip_under_ci(outcome.get_result())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "cluster.log"
    # Shared by a module's tests, none of which loses a host on purpose
    # (those start clusters of their own): a 5 s heartbeat deadline, so
    # that a worker starved of CPU by parallel XLA compiles on a loaded
    # 2-core machine is not declared lost (test_torch's pipeline was, once,
    # at the default 1 s).
    with plexus.local(hosts=2, devices_per_host=2, log_level="info",
                      log_file=str(log), heartbeat_timeout_ms=5000) as c:
        yield c


@pytest.fixture
def client(cluster):
    c = cluster.connect(name="test")
    yield c
    c.close()
