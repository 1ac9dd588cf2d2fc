"""The cluster `plexus up` started, as this user's state file records it
($PLEXUS_STATE_DIR, else ~/.plexus, /cluster.json: its address, server pid
and cluster secret, mode 0600), and where a process finds the address and
secret of a cluster to talk to.

Imports only the binding: the API (connect() without an address) and the
CLI both read it.
"""
import json
import os
from pathlib import Path

from . import _core


def write_private(path, text):
    """Writes a new file that only this user can read (it holds the
    cluster secret)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def state_file():
    root = Path(os.environ.get("PLEXUS_STATE_DIR",
                               Path.home() / ".plexus"))
    return root / "cluster.json"


def current_address():
    """$PLEXUS_ADDRESS, else the cluster `plexus up` started."""
    if os.environ.get("PLEXUS_ADDRESS"):
        return os.environ["PLEXUS_ADDRESS"]
    f = state_file()
    if f.exists():
        return json.loads(f.read_text())["address"]
    raise _core.NotFoundError(
        "no Plexus cluster: start one with `plexus up` or set PLEXUS_ADDRESS")


def state_secret(address):
    """The cluster secret `plexus up` kept, if it started the cluster at
    `address`; else None."""
    f = state_file()
    if not f.exists():
        return None
    state = json.loads(f.read_text())
    return state.get("secret") if state.get("address") == address else None


def secret_for(address, secret_file=None):
    """The cluster secret this process holds for the server at `address`:
    `secret_file`'s, else $PLEXUS_CLUSTER_SECRET's, else the one `plexus up`
    kept for it; None if none."""
    if secret_file:
        with open(secret_file) as f:
            return f.readline().strip()
    if os.environ.get("PLEXUS_CLUSTER_SECRET"):
        return os.environ["PLEXUS_CLUSTER_SECRET"]
    return state_secret(address)
