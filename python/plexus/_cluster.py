"""The embedded default: a server and H worker processes on this machine."""
import os
import select
import signal
import subprocess
import time

from . import _core
from ._api import Client
from ._binaries import bin_dir, default_pjrt_plugin
from ._spawn import describe_exit, read_ready_line, spawn
from ._status import cluster_status, web_url
from ._status_text import silent_ms



def _brief(st):
    """What a wait on the status that timed out last saw, in a line: each
    client's calls waiting, in flight and admitted; each worker, alive or
    down, and, alive but silent (stopped, starved: _status_text.silent_ms),
    for how long."""
    clients = ", ".join(
        f"{c.get('name')}: {c.get('calls_pending', 0)} waiting, "
        f"{c.get('calls_in_flight', 0)} in flight, "
        f"{c.get('calls_admitted', 0)} admitted"
        for c in st.get("clients", []))

    def worker(w):
        if not w.get("alive"):
            return f"{w.get('host_name')} down"
        silent = silent_ms(st, w)
        return f"{w.get('host_name')} alive" + (
            "" if silent is None else f" (last heard {silent} ms ago)")

    workers = ", ".join(worker(w) for w in st.get("workers", []))
    return f"clients [{clients}]; workers [{workers}]"

class ClusterExitError(RuntimeError):
    """A process of an embedded cluster did not exit cleanly at `down()`:
    the server exited non-zero or on a signal, or a worker did (the server
    reports each by name). A crash at shutdown is a bug, never noise."""


def _down_on_exit(cluster, exc):
    """A cluster's __exit__: down(); a ClusterExitError is raised, unless
    the body raised already: the body's own error stays the one raised, and
    this one rides on it as a note."""
    try:
        cluster.down()
    except ClusterExitError as e:
        if exc is None:
            raise
        exc.add_note(str(e))
    return False


class LocalCluster:
    """A whole Plexus cluster on this machine: one server process that starts
    `hosts` worker processes, each with `devices_per_host` CPU devices, and
    `spare` more that the server keeps for taking the place of a host that
    is lost (its slices are remapped there, and what it held is recovered;
    a worker that exits is replaced by a new spare).

    Used as a context manager it tears everything down, even on an
    exception. Worker processes die with the server (PR_SET_PDEATHSIG);
    with `attached=True` (the default) the server dies with this process.

    The cluster has a secret of its own (`secret`, 64 hex digits; None
    draws one): the server and its workers get it in their environment
    ($PLEXUS_CLUSTER_SECRET, never on a command line), workers register
    with it, each client gets a credential of its own from the server, and
    `down()` asks the server to shut down with the admin credential.

    The server serves its live page and /metrics (`web_url()`; `web_listen`
    "off" turns them off).
    """

    def __init__(self, hosts=2, devices_per_host=1, device_memory_mib=1024,
                 spare=0,
                 shared_memory=True, log_level="warn", log_file=None,
                 attached=True, heartbeat_timeout_ms=1000, scheduler="gang",
                 pjrt_plugin=None, secret=None, tenants=None,
                 admission_window_us=None, gpus=None, cuda_ipc=True,
                 spare_wait_ms=None, max_restarts_per_minute=None,
                 web_listen="auto", park_dir=None):
        if hosts < 1:
            raise ValueError(f"hosts must be at least 1, got {hosts}")
        if devices_per_host < 1:
            raise ValueError(
                f"devices_per_host must be at least 1, got {devices_per_host}")
        if spare < 0:
            raise ValueError(f"spare must be at least 0, got {spare}")
        self.hosts = hosts
        self.spare = spare
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
        # The operator's tenants (weights and quotas): a dict as the server's
        # --tenants file holds it, or the path of such a file.
        self.tenants = tenants
        self.admission_window_us = admission_window_us
        # With spares: how long a slice that lost a host waits for another
        # when none is free at once (the server's --spare-wait-ms; None: its
        # default, 10 s), and how many killed workers the cluster replaces
        # in any minute (--max-restarts-per-minute; None: its default).
        for name, value, least in (("spare_wait_ms", spare_wait_ms, 0),
                                   ("max_restarts_per_minute",
                                    max_restarts_per_minute, 1)):
            if value is not None and (not isinstance(value, int)
                                      or isinstance(value, bool)
                                      or value < least):
                raise ValueError(f"{name} must be an integer of at least "
                                 f"{least}, got {value!r}")
        self.spare_wait_ms = spare_wait_ms
        self.max_restarts_per_minute = max_restarts_per_minute
        self._tenants_file = None
        # The workers' PJRT plugin for XLA programs (plexus.jit).
        self.pjrt_plugin = pjrt_plugin or default_pjrt_plugin() or ""
        # GPUs (indices on this machine) every worker uses, sharing them:
        # its devices are then the plugin's (one per GPU, with the GPU's
        # kind and memory, devices_per_host ignored), its budget
        # device_memory_mib per GPU at most. None: devices_per_host CPU
        # devices.
        if gpus is not None:
            given = list(gpus)
            if not given or not all(
                    isinstance(g, int) and not isinstance(g, bool) and g >= 0
                    for g in given):
                raise ValueError(
                    f"gpus must be GPU indices (0, 1, ...), got {given!r}")
            gpus = given
        self.gpus = gpus
        # Device values between these workers by CUDA IPC where they can
        # (GPUs); False: through host memory (PLEXUS_CUDA_IPC=0).
        self.cuda_ipc = bool(cuda_ipc)
        # Hex, from the binding: credentials are derived in C++ only.
        self._secret = secret or _core.new_cluster_secret()
        # The live page and /metrics (web/web_server.h): "auto" (a free
        # port on the server's host), HOST:PORT, or "off".
        self.web_listen = web_listen
        # Where slices suspended to files park their values (the server's
        # --park-dir; every worker of this machine reaches it). None: a
        # directory of this cluster's, made at start and removed by down().
        self.park_dir = park_dir
        self._own_park_dir = None
        self.address = None
        self.process = None
        self._clients = []
        self._joined = []  # add_worker's processes, reaped by down()
        # The read end of the server's --ready-fd pipe: its address once
        # ready, then at exit one line per worker that did not exit cleanly.
        self._ready_fd = None

    # ------------------------------------------------------------------
    def start(self, timeout=30.0):
        """Starts the server and its workers; returns once every worker has
        registered (the server says so on a pipe), or raises."""
        cmd = [str(bin_dir() / "plexus-server"),
               "--listen", "127.0.0.1:0",
               "--local-workers", str(self.hosts),
               "--spare-workers", str(self.spare),
               "--devices-per-host", str(self.devices_per_host),
               "--device-memory-mib", str(self.device_memory_mib),
               "--heartbeat-timeout-ms", str(self.heartbeat_timeout_ms),
               "--scheduler", self.scheduler,
               "--log-level", self.log_level]
        if not self.shared_memory:
            cmd.append("--no-shm")
        cmd += ["--web-listen", self.web_listen]
        if self.tenants is not None:
            if isinstance(self.tenants, dict):
                import json
                import tempfile
                with tempfile.NamedTemporaryFile(
                        "w", prefix="plexus-tenants-", suffix=".json",
                        delete=False) as f:
                    json.dump(self.tenants, f)
                self._tenants_file = f.name
                cmd += ["--tenants", f.name]
            else:
                cmd += ["--tenants", str(self.tenants)]
        if self.admission_window_us is not None:
            cmd += ["--admission-window-us", str(int(self.admission_window_us))]
        if self.spare_wait_ms is not None:
            cmd += ["--spare-wait-ms", str(self.spare_wait_ms)]
        if self.max_restarts_per_minute is not None:
            cmd += ["--max-restarts-per-minute",
                    str(self.max_restarts_per_minute)]
        if self.park_dir is None:
            import tempfile
            self._own_park_dir = self.park_dir = tempfile.mkdtemp(
                prefix="plexus-park-")
        cmd += ["--park-dir", str(self.park_dir)]
        # Workers inherit the server's environment, the secret included;
        # None: not inherited from this process's.
        env = {"PLEXUS_PJRT_PLUGIN": self.pjrt_plugin,
               "PLEXUS_GPUS": (None if self.gpus is None else
                               ",".join(str(g) for g in self.gpus)),
               "PLEXUS_CUDA_IPC": None if self.cuda_ipc else "0"}
        # A session of its own: down() kills it and its workers as a group.
        self.process, self._ready_fd = spawn(
            cmd, secret=self._secret, env=env, log_path=self.log_file,
            new_session=True, die_with_parent=self.attached)
        # The server writes its address once ready; end-of-file if it exits.
        # down() reads the rest.
        line = read_ready_line(self._ready_fd, timeout)
        if line and line.startswith("cannot start: "):
            # What the server could not start with (a bad --tenants file),
            # as the exception of its status code.
            self._stop(timeout=10.0)
            code, _, message = line[len("cannot start: "):].partition(": ")
            _core.raise_status(code, f"plexus-server cannot start: {message}")
        if not line:
            code = self.process.poll()
            self._stop(timeout=10.0)
            if line is None:
                raise TimeoutError(f"timed out after {timeout:.0f} s waiting for "
                                   f"the server and {self.hosts} workers")
            raise RuntimeError(f"plexus-server exited with code {code} while "
                               "starting (see its log)")
        self.address = line
        return self

    def status(self, fresh=False):
        """The server's view of the cluster, as a dict. fresh=True first asks
        every live worker for its figures and waits for them and for each
        one's next heartbeat (~0.1 s), so worker stats count everything
        this process saw happen."""
        return cluster_status(self.address, fresh)

    def wait_until(self, predicate, timeout=10.0, what="a condition"):
        """Waits until `predicate(status)` is true, re-reading the status
        after each round of heartbeats (the only thing that changes it);
        returns that status. TimeoutError naming `what` after `timeout`."""
        deadline = time.monotonic() + timeout
        st = self.status()
        while not predicate(st):
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout} s waiting for "
                                   f"{what}; the last status: {_brief(st)}")
            st = self.status(fresh=True)
        return st

    def web_url(self, tenant=None):
        """The URL of this cluster's live page, with the operator's token
        (or `tenant`'s) in its fragment (web/viewer.h)."""
        if tenant:
            return web_url(self.status(), tenant=tenant,
                           tenant_token=_core.tenant_token(tenant, self._secret))
        return web_url(self.status(), secret=self._secret)

    def add_worker(self, host_name, devices=None, timeout=60.0):
        """Starts one more plexus-worker (`devices`, default the cluster's
        devices_per_host) that registers with this cluster's server as host
        `host_name`, as a host joining the cluster would: slices that grow
        back (grow=True) grow onto it, and a slice waiting for a host takes
        it. Returns its subprocess.Popen once it has registered (its worker
        id is `worker_id` on it); down() stops and reaps it with the rest.
        TimeoutError if it did not register within `timeout` seconds."""
        if self.process is None:
            raise RuntimeError("add_worker: the cluster is not running")
        cmd = [str(bin_dir() / "plexus-worker"), "--server", self.address,
               "--devices", str(devices or self.devices_per_host),
               "--device-memory-mib", str(self.device_memory_mib),
               "--host-name", host_name, "--log-level", self.log_level]
        process, ready = spawn(
            cmd, secret=self._secret, env={"PLEXUS_PJRT_PLUGIN":
                                           self.pjrt_plugin},
            log_path=self.log_file, die_with_parent=True)
        self._joined.append(process)
        try:
            line = read_ready_line(ready, timeout)
        finally:
            os.close(ready)
        if not line:
            process.kill()
            process.wait()
            if line is None:
                raise TimeoutError(f"add_worker: {host_name} did not register "
                                   f"within {timeout:g} s")
            raise RuntimeError(f"add_worker: plexus-worker for {host_name} "
                               f"{describe_exit(process.returncode)} before "
                               "it registered (see its log)")
        process.worker_id = int(line)
        return process

    def worker_pids(self):
        return [int(w["pid"]) for w in self.status()["workers"] if w["alive"]]

    def connect(self, name="python", shared_memory=True,
                sequential_dispatch=False, tenant=None):
        """A new client of this cluster. sequential_dispatch=True sends each
        call only once its inputs are computed (for comparison with the
        default parallel asynchronous dispatch). The session opens as
        `tenant` (default "default"), with the token derived from the
        cluster's secret."""
        client = Client(_core.Client.connect(
            self.address, name, shared_memory, sequential_dispatch,
            tenant=tenant or "", secret_hex=self._secret), self.address)
        self._clients.append(client)
        return client

    def down(self, timeout=20.0):
        """Stops the server and its workers, and reaps them. Raises
        ClusterExitError naming every process (server or worker) that did not
        exit cleanly: a crash, a signal, or a non-zero exit code."""
        problems = self._stop(timeout)
        if problems:
            raise ClusterExitError(
                "the embedded cluster did not shut down cleanly:\n  " +
                "\n  ".join(problems))

    def _stop(self, timeout):
        """down() without the check: returns what did not exit cleanly."""
        for c in self._clients:
            c.close()
        self._clients.clear()
        if self._tenants_file is not None:
            os.unlink(self._tenants_file)
            self._tenants_file = None
        if self._own_park_dir is not None:
            import shutil
            shutil.rmtree(self._own_park_dir, ignore_errors=True)
            self._own_park_dir = self.park_dir = None
        if self.process is None:
            self._reap_joined()
            return []
        problems = []
        if self.process.poll() is None:
            try:
                _core.shutdown_server(self.address, self._secret)
            except Exception:  # noqa: BLE001 - fall back to signals below
                pass
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
                problems.append(f"plexus-server (pid {self.process.pid}) did "
                                f"not stop within {timeout:g} s and was killed")
        # Anything left in the session (workers are in it) goes too.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not problems and self.process.returncode != 0:
            problems.append(f"plexus-server (pid {self.process.pid}) "
                            f"{describe_exit(self.process.returncode)}")
        self._reap_joined()
        problems += self._read_exit_report()
        self.process = None
        return problems

    def _reap_joined(self):
        """add_worker's processes, after the server: killed if they still
        run (a worker outlives its server's shutdown while it reconnects),
        and reaped."""
        for w in self._joined:
            if w.poll() is None:
                w.kill()
            w.wait()
        self._joined.clear()

    def _read_exit_report(self):
        """The lines the server wrote on its ready pipe after the address:
        one per worker that did not exit cleanly. The server has exited, so
        the pipe ends (bounded wait all the same)."""
        if self._ready_fd is None:
            return []
        data = b""
        try:
            while True:
                ready, _, _ = select.select([self._ready_fd], [], [], 5.0)
                chunk = os.read(self._ready_fd, 4096) if ready else b""
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(self._ready_fd)
            self._ready_fd = None
        lines = data.decode(errors="replace").splitlines()
        if self.address and lines and lines[0].strip() == self.address:
            lines = lines[1:]  # start() may not have read it (a timeout)
        return [ln.strip() for ln in lines if ln.strip()]

    def __enter__(self):
        if self.process is None:
            self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        return _down_on_exit(self, exc)

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
