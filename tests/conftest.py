"""Shared fixtures: real embedded clusters (a server process and worker
processes on loopback), started once per module where tests only read."""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("PLEXUS_BIN_DIR", str(ROOT / "build" / "bin"))

import plexus  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "cluster.log"
    with plexus.local(hosts=2, devices_per_host=2, log_level="info",
                      log_file=str(log)) as c:
        yield c


@pytest.fixture
def client(cluster):
    c = cluster.connect(name="test")
    yield c
    c.close()


def wait_until(condition, timeout=10.0, what="condition"):
    """Waits for `condition()` to be true, checking with backoff; fails the
    test with `what` after `timeout` seconds."""
    import time
    deadline = time.monotonic() + timeout
    delay = 0.01
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
