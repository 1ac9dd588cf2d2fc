"""Plexus on Ray: Ray provisions the hosts, Plexus runs the step.

    import ray
    import plexus.ray

    ray.init()                      # or ray.init(address="auto")
    with plexus.ray.start(hosts=2, devices_per_host=4) as cluster:
        client = cluster.client     # connected, like cluster.connect()
        s = client.slice(8, placement="spread")
        ...

`start` reserves one bundle of resources per host in a Ray placement group
(by default STRICT_SPREAD: every host on a Ray node of its own), starts one
host actor in each bundle, plexus-server beside the first host's actor and
plexus-worker beside every one, and returns a RayCluster with a connected
client. The server and the workers are processes of those actors: they
die with them (PR_SET_PDEATHSIG), and `down()` (or leaving the `with`)
stops the workers, shuts the server down, kills the actors and removes the
placement group.

Every host runs the Plexus of its own node: the `plexus` package (and its
plexus-server and plexus-worker, or $PLEXUS_BIN_DIR there) must be
installed on every Ray node, as for any Ray library. The cluster secret is
drawn here and reaches the host actors as a task argument (inside the Ray
cluster) and the processes in their environment, never on a command line.
Ray's own options (runtime_env, resources) pass through `actor_options`.
"""
import os
import signal
import socket
import subprocess
import tempfile
import time

from . import _core
from ._api import Client
from ._binaries import bin_dir, default_pjrt_plugin
from ._cluster import ClusterExitError, _down_on_exit
from ._spawn import describe_exit, read_ready_line, spawn
from ._status import decode_status

__all__ = ["ClusterExitError", "RayCluster", "start"]


class _Host:
    """One Plexus host on a Ray node: the processes it starts run on the
    node Ray placed it on, with the resources of its bundle. Methods run on
    the actor's main thread, so --die-with-parent ties each process's life
    to the actor's."""

    def __init__(self, index, log_dir):
        self.index = index
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="plexus-ray-")
        os.makedirs(self.log_dir, exist_ok=True)
        self.server = None
        self.worker = None

    def node_ip(self):
        import ray
        return ray.util.get_node_ip_address()

    def write_tls(self, files):
        """Writes the PEM files given by content ({name: text}) into this
        host's folder (mode 0600) and returns {name: path}."""
        paths = {}
        for name, text in files.items():
            # Hosts may share the folder (log_dir): a name per host.
            path = os.path.join(self.log_dir, f"host{self.index}-{name}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            paths[name] = path
        return paths

    def _start(self, name, cmd, secret, timeout, extra_env=None):
        """Starts `cmd` (_spawn.spawn: its log in this host's folder, and
        it dies with this actor) and returns (process, the line it writes
        once ready); raises naming its log if it does not come up."""
        log_path = os.path.join(self.log_dir, f"{name}.log")
        proc, read_end = spawn(cmd, secret=secret, env=extra_env,
                               log_path=log_path)
        try:
            line = read_ready_line(read_end, timeout)
        finally:
            os.close(read_end)
        if not line:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            with open(log_path, errors="replace") as f:
                tail = f.read()[-2000:]
            raise RuntimeError(
                f"{name} on {socket.gethostname()} did not come up within "
                f"{timeout:g} s ({describe_exit(proc.returncode)}); its log "
                f"({log_path}) ends with:\n{tail}")
        return proc, line

    def start_server(self, secret, port, heartbeat_timeout_ms, log_level,
                     timeout, tls=None):
        cmd = [str(bin_dir() / "plexus-server"),
               "--listen", f"{self.node_ip()}:{port}",
               "--heartbeat-timeout-ms", str(heartbeat_timeout_ms),
               "--log-level", log_level]
        if tls:
            paths = self.write_tls({"tls.crt": tls[0], "tls.key": tls[1]})
            cmd += ["--tls-cert", paths["tls.crt"],
                    "--tls-key", paths["tls.key"]]
        proc, address = self._start("plexus-server", cmd, secret, timeout)
        self.server = proc
        return address

    def start_worker(self, server, secret, host_name, devices,
                     device_memory_mib, data_port, log_level, timeout,
                     tls_ca=None):
        env = {"PLEXUS_PJRT_PLUGIN": default_pjrt_plugin() or ""}
        if tls_ca:
            env["PLEXUS_TLS_CA"] = self.write_tls({"ca.crt": tls_ca})["ca.crt"]
        proc, worker_id = self._start(
            f"plexus-worker-{host_name}",
            [str(bin_dir() / "plexus-worker"), "--server", server,
             "--host-name", host_name, "--devices", str(devices),
             "--device-memory-mib", str(device_memory_mib),
             "--data-host", f"{self.node_ip()}:{data_port}",
             "--log-level", log_level], secret, timeout, extra_env=env)
        self.worker = proc
        return int(worker_id), proc.pid

    def stop_worker(self, timeout):
        """SIGTERM to the worker (it leaves the cluster and exits); its exit
        in words, or None if it was clean."""
        return self._stop("worker", self.worker, timeout, signal.SIGTERM)

    def stop_server(self, timeout):
        """Waits for the server (shut down by the caller) to exit."""
        return self._stop("server", self.server, timeout, None)

    def _stop(self, what, proc, timeout, sig):
        if proc is None:
            return None
        if sig is not None and proc.poll() is None:
            proc.send_signal(sig)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return (f"plexus-{what} of host {self.index} did not stop within "
                    f"{timeout:g} s and was killed")
        if code != 0:
            return f"plexus-{what} of host {self.index} {describe_exit(code)}"
        return None


class RayCluster:
    """A Plexus cluster on resources Ray reserved: `address` (the server's),
    `client` (connected at start), `hosts` (the host actors, in bundle
    order), `placement_group`. Use as a context manager, or call down()."""

    def __init__(self, placement_group, hosts, address, secret, timeout,
                 tls_ca=None):
        self.placement_group = placement_group
        self.hosts = hosts
        self.address = address
        self._secret = secret
        self._timeout = timeout
        self._tls_ca = tls_ca  # a file on this machine, or None
        self._clients = []
        self.client = None

    def connect(self, name="python", shared_memory=True,
                sequential_dispatch=False, tenant=None):
        """Another client of this cluster. The session opens as `tenant`
        (default "default"), with the token derived from the cluster's
        secret (the server listens off loopback: no anonymous sessions)."""
        c = Client(_core.Client.connect(
            self.address, name, shared_memory, sequential_dispatch,
            tenant=tenant or "", secret_hex=self._secret,
            tls_ca=self._tls_ca or ""), self.address)
        self._clients.append(c)
        return c

    def _with_tls_ca(self, fn):
        """Runs fn() with $PLEXUS_TLS_CA naming this cluster's CA (the
        status and shutdown calls read it there), and puts the variable back
        as it was: the rest of the process (and clusters it starts later)
        must not inherit it."""
        if not self._tls_ca:
            return fn()
        before = os.environ.get("PLEXUS_TLS_CA")
        os.environ["PLEXUS_TLS_CA"] = self._tls_ca
        try:
            return fn()
        finally:
            if before is None:
                os.environ.pop("PLEXUS_TLS_CA", None)
            else:
                os.environ["PLEXUS_TLS_CA"] = before

    def status(self, fresh=False):
        return decode_status(self._with_tls_ca(
            lambda: _core.cluster_status(self.address, fresh)))

    def down(self, timeout=30.0):
        """Closes the clients, stops every worker (SIGTERM), shuts the
        server down (the admin credential), kills the host actors and
        removes the placement group. Raises ClusterExitError naming every
        process that did not exit cleanly."""
        import ray
        problems = []
        for c in self._clients:
            c.close()
        self._clients.clear()
        try:
            if self.hosts:
                problems += ray.get([h.stop_worker.remote(timeout)
                                     for h in self.hosts],
                                    timeout=timeout + 10)
                if self.address:
                    try:
                        self._with_tls_ca(lambda: _core.shutdown_server(
                            self.address, self._secret))
                    except _core.PlexusError as e:
                        problems.append(f"shutdown of the server failed: {e}")
                problems.append(ray.get(self.hosts[0].stop_server.remote(
                    timeout), timeout=timeout + 10))
        finally:
            for h in self.hosts:
                ray.kill(h)
            self.hosts = []
            if self.placement_group is not None:
                ray.util.remove_placement_group(self.placement_group)
                self.placement_group = None
        problems = [p for p in problems if p]
        if problems:
            raise ClusterExitError(
                "the Ray cluster did not shut down cleanly:\n  "
                + "\n  ".join(problems))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return _down_on_exit(self, exc)

    def __repr__(self):
        return (f"RayCluster(hosts={len(self.hosts)}, "
                f"address={self.address!r})")


def start(hosts=None, devices_per_host=1, *, cpus_per_host=1,
          gpus_per_host=0, strategy="STRICT_SPREAD", device_memory_mib=1024,
          server_port=0, data_port=0, heartbeat_timeout_ms=3000,
          log_level="info", log_dir=None, timeout=60.0, client_name="ray",
          actor_options=None, tls_cert=None, tls_key=None, tls_ca=None):
    """Starts a Plexus cluster on the Ray cluster this process is connected
    to (ray.init() first) and returns it with a connected client.

    hosts: Plexus hosts (workers), one Ray bundle each (default: one per
      alive Ray node); cpus_per_host, gpus_per_host: each bundle's
      resources, held by the host's actor; strategy: the placement group's
      (STRICT_SPREAD: one host per node; PACK or SPREAD where a node may
      hold several, e.g. a one-node Ray);
    server_port, data_port: the server's control port and every worker's
      data-plane port (0: any free one);
    timeout: seconds for Ray to place the bundles and for each process to
      come up (TimeoutError or RuntimeError naming what did not);
    tls_cert, tls_key: PEM files here (the server's certificate, naming the
      first host's node address, and its key): the control plane on TLS;
      they reach the host actors by content. tls_ca: the CA that signed it
      (default: tls_cert itself, self-signed), for workers and clients.
    """
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not ray.is_initialized():
        raise RuntimeError("plexus.ray.start needs a Ray cluster: call "
                           "ray.init() (or ray.init(address=...)) first")
    if hosts is None:
        hosts = sum(1 for n in ray.nodes() if n.get("Alive"))
    if hosts < 1:
        raise ValueError(f"hosts must be at least 1, got {hosts}")
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("tls_cert and tls_key go together")
    tls = None
    if tls_cert:
        tls_ca = tls_ca or tls_cert
        with open(tls_cert) as c, open(tls_key) as k, open(tls_ca) as a:
            tls = (c.read(), k.read(), a.read())
    bundle = {"CPU": cpus_per_host}
    if gpus_per_host:
        bundle["GPU"] = gpus_per_host
    pg = placement_group([dict(bundle) for _ in range(hosts)],
                         strategy=strategy, name="plexus")
    try:
        ray.get(pg.ready(), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(pg)
        raise TimeoutError(
            f"Ray did not place {hosts} bundle(s) of {bundle} ({strategy}) "
            f"within {timeout:g} s; available: "
            f"{ray.available_resources()}") from None

    host_cls = ray.remote(_Host)
    options = dict(actor_options or {})
    actors = [host_cls.options(
        num_cpus=cpus_per_host, num_gpus=gpus_per_host,
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=i), **options).remote(i, log_dir)
        for i in range(hosts)]
    cluster = RayCluster(pg, actors, None, _core.new_cluster_secret(), timeout,
                         tls_ca=tls_ca if tls else None)
    try:
        deadline = time.monotonic() + 3 * timeout
        left = lambda: max(1.0, deadline - time.monotonic())  # noqa: E731
        cluster.address = ray.get(actors[0].start_server.remote(
            cluster._secret, server_port, heartbeat_timeout_ms, log_level,
            timeout, tls=tls[:2] if tls else None), timeout=left())
        ray.get([a.start_worker.remote(
            cluster.address, cluster._secret, f"ray-{i}", devices_per_host,
            device_memory_mib, data_port, log_level, timeout,
            tls_ca=tls[2] if tls else None)
            for i, a in enumerate(actors)], timeout=left())
        cluster.client = cluster.connect(name=client_name)
    except BaseException:
        try:
            cluster.down(timeout=10)
        except ClusterExitError:
            pass  # the first error is the one to see
        raise
    return cluster
