"""The embedded default: a server and H worker processes on this machine."""
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from . import _core
from ._binaries import bin_dir


def _wait_for(condition, timeout, what):
    """Polls `condition` until true; raises TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


class LocalCluster:
    """A whole Plexus cluster on this machine: one server process that starts
    `hosts` worker processes, each with `devices_per_host` CPU devices.

    Used as a context manager it tears everything down, even on an
    exception. Worker processes die with the server (PR_SET_PDEATHSIG);
    with `attached=True` (the default) the server dies with this process.
    """

    def __init__(self, hosts=2, devices_per_host=1, device_memory_mib=1024,
                 shared_memory=True, log_level="warn", log_file=None,
                 attached=True, heartbeat_timeout_ms=3000, scheduler="gang"):
        if hosts < 1:
            raise ValueError(f"hosts must be at least 1, got {hosts}")
        if devices_per_host < 1:
            raise ValueError(
                f"devices_per_host must be at least 1, got {devices_per_host}")
        self.hosts = hosts
        self.devices_per_host = devices_per_host
        self.device_memory_mib = device_memory_mib
        self.shared_memory = shared_memory
        self.log_level = log_level
        self.log_file = log_file
        self.attached = attached
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        if scheduler not in ("gang", "none"):
            raise ValueError(f"scheduler must be 'gang' or 'none' (test only), "
                             f"not {scheduler!r}")
        self.scheduler = scheduler
        self.address = None
        self.process = None
        self._tmp = None
        self._clients = []

    # ------------------------------------------------------------------
    def start(self, timeout=30.0):
        self._tmp = tempfile.TemporaryDirectory(prefix="plexus-")
        address_file = Path(self._tmp.name) / "address"
        cmd = [str(bin_dir() / "plexus-server"),
               "--listen", "127.0.0.1:0",
               "--address-file", str(address_file),
               "--local-workers", str(self.hosts),
               "--devices-per-host", str(self.devices_per_host),
               "--device-memory-mib", str(self.device_memory_mib),
               "--heartbeat-timeout-ms", str(self.heartbeat_timeout_ms),
               "--scheduler", self.scheduler,
               "--log-level", self.log_level]
        if not self.shared_memory:
            cmd.append("--no-shm")
        if self.attached:
            cmd.append("--die-with-parent")
        log = open(self.log_file, "ab") if self.log_file else None
        self.process = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log or subprocess.DEVNULL,
            stderr=log, start_new_session=True)
        if log:
            log.close()

        def address_ready():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"plexus-server exited with code {self.process.returncode}"
                    " while starting (see its log)")
            return address_file.exists() and address_file.read_text().strip()

        self.address = _wait_for(address_ready, timeout, "the server to listen")
        _wait_for(lambda: self._alive_workers() >= self.hosts, timeout,
                  f"{self.hosts} workers to register")
        return self

    def _alive_workers(self):
        if self.process.poll() is not None:
            raise RuntimeError(
                f"plexus-server exited with code {self.process.returncode}")
        st = self.status()
        return sum(1 for w in st.get("workers", []) if w.get("alive"))

    def status(self):
        """The server's view of the cluster, as a dict."""
        from ._api import _decode_status
        return _decode_status(_core.cluster_status(self.address))

    def worker_pids(self):
        return [int(w["pid"]) for w in self.status()["workers"] if w["alive"]]

    def connect(self, name="python", shared_memory=True,
                sequential_dispatch=False):
        """A new client of this cluster. sequential_dispatch=True sends each
        call only once its inputs are computed (for comparison with the
        default parallel asynchronous dispatch)."""
        from ._api import Client
        client = Client(_core.Client.connect(self.address, name, shared_memory,
                                             sequential_dispatch))
        self._clients.append(client)
        return client

    def down(self, timeout=10.0):
        """Stops the server and its workers, and reaps them."""
        for c in self._clients:
            c.close()
        self._clients.clear()
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                _core.shutdown_server(self.address)
            except Exception:  # noqa: BLE001 - fall back to signals below
                pass
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        # Anything left in the session (workers are in it) goes too.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process = None
        if self._tmp:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        if self.process is None:
            self.start()
        return self

    def __exit__(self, *exc):
        self.down()
        return False

    def __repr__(self):
        return (f"LocalCluster(hosts={self.hosts}, devices_per_host="
                f"{self.devices_per_host}, address={self.address!r})")


def local(hosts=2, devices_per_host=1, **kwargs):
    """Starts a whole cluster on this machine and returns it (started).

        with plexus.local(hosts=2, devices_per_host=2) as cluster:
            client = cluster.connect()
    """
    return LocalCluster(hosts=hosts, devices_per_host=devices_per_host,
                        **kwargs).start()
