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
