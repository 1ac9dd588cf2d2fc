"""Network namespaces for tests: hosts that share this machine's kernel (and
its /etc/machine-id, hostname and boot id) but not its network, as
containers or Kubernetes pods on one node do.

    lab = NetnsLab.create()          # or pytest.skip with the reason
    a, b = lab.add_host(), lab.add_host()
    server = lab.start_server()      # in this (the root) namespace
    lab.start_worker(server, a)      # plexus-worker inside namespace a
    ...
    lab.close()                      # kills what it started, deletes it all

Every process the lab starts gets the lab's cluster secret in its
environment ($PLEXUS_CLUSTER_SECRET), as an operator would hand it out
(unless asked not to); clients connect as a tenant with its token
(`lab.connect`), as a user the operator gave a token would.

The topology: a hub namespace holds a bridge; this namespace and every host
namespace have one veth end on it, all on one private /24 (this namespace
is .1). The bridge lives in a namespace of its own so that no firewall of
the machine's own namespace sees the traffic between hosts. A host may also
have a *hidden* address (on its loopback, in a second /24): this namespace
routes to it, the other hosts do not, so a worker that advertises it can be
reached by the client and the server but not by its peers.

Needs root and the `ip` command (iproute2); `NetnsLab.create()` skips the
test with the reason where namespaces cannot be made.
"""
import fcntl
import ipaddress
import os
import select
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field

import pytest

from conftest import ROOT  # noqa: F401 - sets up sys.path and PLEXUS_BIN_DIR

from plexus import _core
from plexus._binaries import bin_dir


@dataclass
class Host:
    name: str          # plexus host name, e.g. "host1"
    netns: str         # network namespace
    address: str       # on the shared /24
    hidden: str        # reachable from the root namespace only


@dataclass
class Process:
    popen: subprocess.Popen
    what: str
    address: str = ""  # the server's, once ready
    ready_fd: int = -1


# The environment of the `ip` command: without the sanitizer runtime the
# ASan stage preloads into this process (iproute2 is not built for it, and
# `ip route show` trips ASan's strncpy-param-overlap check: a report that
# fails the stage).
_IP_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def _ip(*args, netns=None, check=True):
    cmd = ["ip"] + (["-n", netns] if netns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                       env=_IP_ENV)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


def _run(*cmd):
    """A command (tc, sh) in the `ip` command's environment; raises with its
    stderr if it fails."""
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30,
                       env=_IP_ENV)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


def _used_networks():
    out = _ip("-4", "route", "show", "table", "all", check=False).stdout
    nets = []
    for line in out.splitlines():
        word = line.split()[0] if line.split() else ""
        try:
            nets.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            pass  # "default", "broadcast", "local", ...
    return nets


def _free_subnets(count):
    """`count` 10.x.y.0/24 networks no route of this machine touches."""
    used = _used_networks()
    found = []
    start = os.getpid() % 200
    for i in range(250 * 50):
        second, third = 200 + (start + i) // 250 % 50, (start + i) % 250 + 1
        net = ipaddress.ip_network(f"10.{second}.{third}.0/24")
        if any(net.overlaps(u) for u in used if u.prefixlen > 0):
            continue
        found.append(net)
        if len(found) == count:
            return found
    raise RuntimeError("no free private /24 for the test network")


def cannot_make_namespaces():
    """Why this process cannot make network namespaces, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"plxprobe{uuid.uuid4().hex[:6]}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class NetnsLab:
    tag: str
    net: ipaddress.IPv4Network
    hidden_net: ipaddress.IPv4Network
    hub: str = ""
    hosts: list = field(default_factory=list)
    namespaces: list = field(default_factory=list)
    root_links: list = field(default_factory=list)
    processes: list = field(default_factory=list)
    # The cluster secret (hex) of every server and worker the lab starts.
    secret: str = field(default_factory=lambda: _core.new_cluster_secret())

    @classmethod
    def create(cls):
        reason = cannot_make_namespaces()
        if reason:
            pytest.skip(f"cannot run hosts in network namespaces: {reason}")
        # Tests run in several processes (make test's PYTEST_WORKERS): one
        # lab at a time picks its /24 and puts this namespace's address on
        # it, which is what makes the next pick see it as used.
        with open(os.path.join(tempfile.gettempdir(), "plexus-netns.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            net, hidden = _free_subnets(2)
            lab = cls(tag=f"plx{uuid.uuid4().hex[:5]}", net=net, hidden_net=hidden)
            try:
                lab._make_hub()
            except BaseException:
                lab.close()
                raise
        return lab

    @property
    def root_address(self):
        return str(self.net.network_address + 1)

    def _netns(self, suffix):
        name = f"{self.tag}{suffix}"
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("link", "set", "lo", "up", netns=name)
        return name

    def _make_hub(self):
        self.hub = self._netns("hub")
        _ip("link", "add", "br0", "type", "bridge", netns=self.hub)
        _ip("link", "set", "br0", "up", netns=self.hub)
        # This namespace's end: .1 on the shared /24.
        root_end = f"{self.tag}r"
        # The hub's end is made in the hub's namespace: a name made here
        # first would clash with another lab's made at the same time.
        _ip("link", "add", root_end, "type", "veth", "peer", "name", "hubr",
            "netns", self.hub)
        self.root_links.append(root_end)
        self._attach_to_hub("hubr")
        _ip("addr", "add", f"{self.root_address}/{self.net.prefixlen}",
            "dev", root_end)
        _ip("link", "set", root_end, "up")

    def _attach_to_hub(self, link):
        _ip("link", "set", link, "master", "br0", netns=self.hub)
        _ip("link", "set", link, "up", netns=self.hub)

    def add_host(self):
        """A namespace with its own address on the /24 (and a hidden one)."""
        i = len(self.hosts)
        ns = self._netns(f"h{i}")
        address = str(self.net.network_address + 10 + i)
        hidden = str(self.hidden_net.network_address + 10 + i)
        root_end = f"{self.tag}h{i}"
        _ip("link", "add", root_end, "type", "veth", "peer", "name", f"hub{i}",
            "netns", self.hub)
        self.root_links.append(root_end)  # until it moves into `ns`
        self._attach_to_hub(f"hub{i}")
        _ip("link", "set", root_end, "netns", ns)
        self.root_links.remove(root_end)
        _ip("link", "set", root_end, "name", "eth0", netns=ns)
        _ip("addr", "add", f"{address}/{self.net.prefixlen}", "dev", "eth0",
            netns=ns)
        _ip("link", "set", "eth0", "up", netns=ns)
        _ip("addr", "add", f"{hidden}/32", "dev", "lo", netns=ns)
        # Only this namespace knows the way to the hidden address.
        _ip("route", "add", f"{hidden}/32", "via", address)
        host = Host(name=f"host{i}", netns=ns, address=address, hidden=hidden)
        self.hosts.append(host)
        return host

    # ---------------------------------------------------------- processes
    def _spawn(self, cmd, what, log, secret=None, env_extra=None):
        """secret: the cluster secret to hand it (hex; default the lab's;
        "" for none)."""
        read_end, write_end = os.pipe()
        cmd = [c.replace("{READY_FD}", str(write_end)) for c in cmd]
        env = dict(os.environ, PLEXUS_CLUSTER_SECRET=self.secret
                   if secret is None else secret, **(env_extra or {}))
        if not env["PLEXUS_CLUSTER_SECRET"]:
            del env["PLEXUS_CLUSTER_SECRET"]
        with open(log, "ab") as out:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=out, pass_fds=(write_end,), env=env)
        os.close(write_end)
        proc = Process(p, what, ready_fd=read_end)
        self.processes.append(proc)
        return proc

    @staticmethod
    def _await_ready(proc, timeout, log):
        ready, _, _ = select.select([proc.ready_fd], [], [], timeout)
        line = os.read(proc.ready_fd, 256).decode().strip() if ready else ""
        if not line:
            raise RuntimeError(
                f"{proc.what} did not come up within {timeout} s "
                f"(exit code {proc.popen.poll()}); its log ({log}) ends with:\n"
                + open(log, errors="replace").read()[-3000:])
        return line

    def start_server(self, log, timeout=30, host=None, secret=None,
                     extra=()):
        """plexus-server listening on the shared /24: in this namespace, or
        inside `host`'s. `secret` as for _spawn; `extra`: more flags."""
        listen = host.address if host else self.root_address
        prefix = ["ip", "netns", "exec", host.netns] if host else []
        proc = self._spawn(
            prefix + [str(bin_dir() / "plexus-server"),
                      "--listen", f"{listen}:0", "--ready-fd", "{READY_FD}",
                      "--log-level", "info", "--die-with-parent", *extra],
            "plexus-server", log, secret=secret)
        proc.address = self._await_ready(proc, timeout, log)
        return proc

    def run_server_until_exit(self, log, host, secret=None, timeout=30):
        """plexus-server asked to listen on `host`'s address, expected to
        refuse: (exit code, its log)."""
        proc = self._spawn(
            ["ip", "netns", "exec", host.netns,
             str(bin_dir() / "plexus-server"), "--listen",
             f"{host.address}:0", "--log-level", "info"],
            "plexus-server (refusing)", log, secret=secret)
        code = proc.popen.wait(timeout=timeout)
        self.processes.remove(proc)
        os.close(proc.ready_fd)
        return code, open(log, errors="replace").read()

    def connect(self, address, name="netns", tenant="default", **kwargs):
        """A client of the server at `address`, opening its session as
        `tenant` with the token the operator would hand out."""
        import plexus
        return plexus.connect(address, name=name, tenant=tenant,
                              token=_core.tenant_token(tenant, self.secret),
                              **kwargs)

    def start_worker(self, server, host, log, data_host=None, devices=1,
                     timeout=30, secret=None, env_extra=None, extra=()):
        """plexus-worker inside `host`'s namespace; its data plane binds and
        advertises `data_host` (default: the host's address on the /24).
        `secret`: another cluster secret than the lab's (hex); `extra`: more
        flags (e.g. --spare)."""
        proc = self._spawn(
            ["ip", "netns", "exec", host.netns,
             str(bin_dir() / "plexus-worker"), "--server", server.address,
             "--devices", str(devices), "--host-name", host.name,
             "--data-host", data_host or host.address,
             "--ready-fd", "{READY_FD}", "--log-level", "info",
             "--die-with-parent", *extra], f"plexus-worker {host.name}", log,
            secret=secret, env_extra=env_extra)
        self._await_ready(proc, timeout, log)
        return proc

    def set_link(self, host, up):
        """Sets `host`'s only link (to the bridge every other namespace is
        on) up or down: down, its connections go silent (no RST, no FIN)."""
        _ip("link", "set", "eth0", "up" if up else "down", netns=host.netns)

    def stall(self, src, dst, stalled=True):
        """Discards every packet `src` sends to `dst`'s address (stalled=False:
        stops): a /32 blackhole route in `src`'s namespace, which beats the
        /24's. Their connections go silent (no RST, no ICMP: TCP retransmits
        until the way is open again), while the rest of `src`'s traffic (its
        heartbeats to the server) flows. (This machine's kernel has no
        netem, prio qdisc or drop action for a `tc` loss.)"""
        _ip("route", "add" if stalled else "del", "blackhole",
            f"{dst.address}/32", netns=src.netns)

    def cap_retransmit_interval(self, host, ms=1000):
        """TCP connections made in `host`'s namespace from now on retransmit
        at least every `ms` (net.ipv4.tcp_rto_max_ms): one that stalled
        resumes within `ms` of the way opening again, not after a backoff of
        up to two minutes. False where the kernel lacks it (before 6.15)."""
        path = "/proc/sys/net/ipv4/tcp_rto_max_ms"
        if not os.path.exists(path):
            return False
        _run("ip", "netns", "exec", host.netns, "sh", "-c",
             f"echo {int(ms)} > {path}")
        return True

    def stop(self, timeout=10):
        """Shuts the server down (it ends every worker's session), reaps
        everything and returns what did not exit with code 0."""
        servers = [p for p in self.processes if p.what == "plexus-server"]
        for s in servers:
            if s.popen.poll() is None:
                try:
                    _core.shutdown_server(s.address, self.secret)
                except Exception:  # noqa: BLE001 - signals below
                    s.popen.terminate()
        unclean = []
        for p in self.processes:
            try:
                code = p.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
                unclean.append(f"{p.what} did not stop within {timeout} s")
                continue
            if code != 0:
                unclean.append(f"{p.what} exited with {code}")
        for p in self.processes:
            if p.ready_fd >= 0:
                os.close(p.ready_fd)
        self.processes.clear()
        return unclean

    def close(self):
        """Kills whatever is left and deletes every namespace and link."""
        for p in self.processes:
            if p.popen.poll() is None:
                p.popen.kill()
            p.popen.wait()
            if p.ready_fd >= 0:
                os.close(p.ready_fd)
        self.processes.clear()
        for host in self.hosts:
            _ip("route", "del", f"{host.hidden}/32", check=False)
        # Deleting a namespace deletes the veth ends in it, and their peers.
        for ns in reversed(self.namespaces):
            _ip("netns", "del", ns, check=False)
        for link in self.root_links:
            _ip("link", "del", link, check=False)
        self.namespaces.clear()
        self.root_links.clear()
