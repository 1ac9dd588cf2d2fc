"""Failures the tests cause on purpose, one way each."""
import os
import signal


def kill_host(cluster, host):
    """SIGKILLs the live worker of `host` (its process, as a crash would);
    returns its worker id."""
    for w in cluster.status()["workers"]:
        if w["alive"] and w["host_name"] == host:
            os.kill(int(w["pid"]), signal.SIGKILL)
            return int(w["worker_id"])
    raise AssertionError(f"no live worker on {host}")
