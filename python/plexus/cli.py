"""The `plexus` command: up, status, top, why, wait, down, token.

    plexus up --hosts 2 --devices-per-host 2
    plexus status
    plexus status --web       # the live page's URL, with the operator's token
    plexus top                # the same in a terminal
    plexus why                # every call waiting > 1 s, and its root cause
    plexus wait --address HOST:PORT --workers 4   # deploy/slurm, a client pod
    plexus down
    plexus token --tenant research --secret-file /etc/plexus/secret
    plexus token --admin      # for /metrics (Prometheus' bearer token)
    plexus trace --seconds 10 -o job.json         # Perfetto, TensorBoard

--tls-ca FILE (or $PLEXUS_TLS_CA): the CA of a server's TLS certificate.
"""
import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from . import _core
from ._process import wait_for_exit


def _write_private(path, text):
    """Writes a new file that only this user can read (it holds the
    cluster secret)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _state_file():
    root = Path(os.environ.get("PLEXUS_STATE_DIR",
                               Path.home() / ".plexus"))
    return root / "cluster.json"


def current_address():
    """$PLEXUS_ADDRESS, else the cluster `plexus up` started."""
    if os.environ.get("PLEXUS_ADDRESS"):
        return os.environ["PLEXUS_ADDRESS"]
    f = _state_file()
    if f.exists():
        return json.loads(f.read_text())["address"]
    raise _core.NotFoundError(
        "no Plexus cluster: start one with `plexus up` or set PLEXUS_ADDRESS")


def state_secret(address):
    """The cluster secret `plexus up` kept, if it started the cluster at
    `address`; else None."""
    f = _state_file()
    if not f.exists():
        return None
    state = json.loads(f.read_text())
    return state.get("secret") if state.get("address") == address else None


def _human(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _table(headers, rows):
    widths = [len(h) for h in headers]
    for r in rows:
        widths = [max(w, len(str(c))) for w, c in zip(widths, r)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))
    return "\n".join([line(headers)] + [line(r) for r in rows])


def format_status(st):
    """The cluster status as tables a person can scan."""
    out = []
    workers = st.get("workers", [])
    rows = []
    for w in workers:
        s = w.get("stats", {})
        rows.append([
            w["host_name"], w["worker_id"], w["pid"],
            ("spare" if w.get("spare") else "up") if w["alive"] else "DOWN",
            len(w.get("devices", [])),
            s.get("live_buffers", 0), _human(s.get("live_bytes", 0)),
            s.get("calls_executed", 0), s.get("calls_failed", 0),
            _human(s.get("bytes_sent", 0)), _human(s.get("bytes_received", 0)),
            _human(s.get("bytes_from_clients", 0)),
            _human(s.get("bytes_to_clients", 0))])
    out.append(_table(["HOST", "WORKER", "PID", "STATE", "DEVICES", "BUFFERS",
                       "LIVE", "CALLS", "FAILED", "SENT", "RECEIVED",
                       "FROM-CLIENTS", "TO-CLIENTS"], rows))
    xla = [w for w in workers if w.get("stats", {}).get("xla_platform") or
           w.get("stats", {}).get("xla_compiles")]
    if xla:
        rows = []
        for w in xla:
            s = w["stats"]
            rows.append([w["host_name"], w["worker_id"],
                         s.get("xla_platform", "") or "-",
                         s.get("xla_compiles", 0), s.get("xla_cache_hits", 0),
                         s.get("xla_serialized_loads", 0),
                         f"{s.get('xla_compile_micros', 0) / 1000:.0f} ms",
                         s.get("device_memory_shards", 0),
                         _human(s.get("bytes_host_to_device", 0)),
                         _human(s.get("bytes_device_to_host", 0)),
                         "/".join(str(s.get(f"transfers_{k}", 0)) for k in
                                  ("alias", "device_to_device", "host_staged",
                                   "ipc", "nccl"))])
        out.append("")
        # Loaded: executables loaded from a peer's serialized bytes instead
        # of compiled (a spare's). In device memory: shards XLA left there;
        # the bytes copied each way between host and device memory since
        # the worker started; the shards moved by each path (alias /
        # device-to-device / through host memory / CUDA IPC / NCCL).
        out.append(_table(["HOST", "WORKER", "XLA PLATFORM", "COMPILES",
                           "CACHE-HITS", "LOADED", "COMPILE-TIME", "ON-DEVICE",
                           "TO-DEVICE", "TO-HOST",
                           "PATHS A/D2D/HOST/IPC/NCCL"], rows))
    down = [w for w in workers if not w["alive"] and w.get("down_reason")]
    for w in down:
        out.append(f"  worker {w['worker_id']} down: {w['down_reason']}")
    slices = st.get("slices", [])
    if slices:
        # Where each virtual device is: one row per host a slice uses, its
        # virtual devices in mesh order with the device each maps to.
        rows = []
        for s in slices:
            by_host = {}
            for v, d in enumerate(s.get("devices", [])):
                key = (d.get("host_name", ""), d.get("worker_id", 0))
                by_host.setdefault(key, []).append(f"{v}->{d.get('device', 0)}")
            islands = len({host for host, _ in by_host})
            for i, ((host, worker), maps) in enumerate(by_host.items()):
                rows.append([s["slice_id"] if i == 0 else "",
                             s["client_id"] if i == 0 else "",
                             len(s.get("devices", [])) if i == 0 else "",
                             host, worker, " ".join(maps),
                             # remaps onto spares; BROKEN: lost a host, no
                             # spare; WAITING: for a host to take its place
                             ("BROKEN" if s.get("broken") else
                              f"WAITING ({int(s.get('awaiting_left_ms', 0)) / 1000:.1f} s left)"
                              if s.get("awaiting") else
                              s.get("generation", 0)) if i == 0 else "",
                             islands if i == 0 else ""])
        out.append("")
        out.append(_table(["SLICE", "CLIENT", "DEVICES", "HOST", "WORKER",
                           "VIRTUAL->DEVICE", "GENERATION", "ISLANDS"], rows))
    r = st.get("recovery", {})
    if int(r.get("hosts_lost", 0)):
        out.append("")
        out.append(
            f"recovery: {r.get('hosts_lost', 0)} host(s) lost, "
            f"{r.get('slices_remapped', 0)} slice remap(s), "
            f"{r.get('slices_broken', 0)} broken; "
            f"{r.get('calls_recomputed', 0)} call(s) run again, "
            f"{r.get('buffers_restored', 0)} buffer(s) restored, "
            f"{r.get('shards_reput', 0)} shard(s) put again, "
            f"{r.get('buffers_failed', 0)} lost")
    pending = st.get("pending_slices", [])
    if pending:
        rows = [[p["client_id"], p.get("request_id", 0), p.get("num_devices", 0),
                 f"{p.get('waited_ms', 0) / 1000:.1f} s",
                 f"{p.get('left_ms', 0) / 1000:.1f} s", p.get("waiting_for", "")]
                for p in pending]
        out.append("")
        out.append(_table(["WAITING CLIENT", "REQUEST", "DEVICES", "WAITED",
                           "LEFT", "WAITING FOR"], rows))
    clients = st.get("clients", [])
    if clients:
        rows = []
        for c in clients:
            s = c.get("stats", {})
            rows.append([c["client_id"], c["name"], c.get("tenant", ""),
                         c["slices"],
                         s.get("calls", 0), s.get("live_futures", 0),
                         _human(s.get("bytes_put", 0)),
                         _human(s.get("bytes_fetched", 0))])
        out.append("")
        out.append(_table(["CLIENT", "NAME", "TENANT", "SLICES", "CALLS",
                           "FUTURES",
                           "PUT", "FETCHED"], rows))
    out.append("")
    out.append(f"server {st.get('address')}: scheduler {st.get('scheduler', '?')}, "
               f"{st.get('epoch', 0)} batches ordered, {st.get('calls_routed', 0)} "
               f"calls routed, {_human(st.get('control_bytes_in', 0))} of "
               f"control messages in, {_human(st.get('data_bytes', 0))} of "
               "buffer data through the server")
    return "\n".join(out)


def cmd_up(args):
    from ._cluster import LocalCluster
    f = _state_file()
    if f.exists():
        try:
            _core.cluster_status(json.loads(f.read_text())["address"])
            print(f"a cluster is already up ({f}); `plexus down` first",
                  file=sys.stderr)
            return 1
        except Exception:  # noqa: BLE001 - stale state file
            f.unlink()
    f.parent.mkdir(parents=True, exist_ok=True)
    log = f.parent / "cluster.log"
    spares = f" and {args.spare} spare(s)" if args.spare else ""
    print(f"starting a server and {args.hosts} worker(s){spares} "
          f"({args.devices_per_host} device(s) each); log: {log}")
    # The cluster secret: kept in the state file (mode 0600) for `plexus
    # down`, which needs the admin credential.
    secret = _core.new_cluster_secret()
    cluster = LocalCluster(hosts=args.hosts, spare=args.spare,
                           devices_per_host=args.devices_per_host,
                           device_memory_mib=args.device_memory_mib,
                           shared_memory=not args.no_shm, log_level="info",
                           log_file=str(log), attached=False, secret=secret,
                           spare_wait_ms=args.spare_wait_ms)
    cluster.start()
    _write_private(f, json.dumps({"address": cluster.address,
                                  "pid": cluster.process.pid,
                                  "secret": secret}))
    print(f"cluster up at {cluster.address} (server pid {cluster.process.pid})")
    return 0


def cmd_status(args):
    address = args.address or current_address()
    from ._api import _decode_status
    st = _decode_status(_core.cluster_status(address))
    if args.web:
        url = web_url(st, secret=_secret_for(address, args.secret_file))
        print(url)
        # A browser only where there is a display to show it on.
        if not args.no_browser and (os.environ.get("DISPLAY") or
                                    os.environ.get("WAYLAND_DISPLAY") or
                                    os.environ.get("BROWSER")):
            import webbrowser
            webbrowser.open(url)
        return 0
    print(json.dumps(st, indent=2) if args.json else format_status(st))
    return 0


def _secret_for(address, secret_file=None):
    """The cluster secret this process holds for the server at `address`:
    --secret-file's, else $PLEXUS_CLUSTER_SECRET's, else the one `plexus up`
    kept for it; None if none."""
    if secret_file:
        with open(secret_file) as f:
            return f.readline().strip()
    if os.environ.get("PLEXUS_CLUSTER_SECRET"):
        return os.environ["PLEXUS_CLUSTER_SECRET"]
    return state_secret(address)


def web_url(st, secret=None, tenant=None, tenant_token=None):
    """The URL of the live page of the server whose status is `st`, with
    the token it needs in its fragment (which a browser never sends): the
    operator's when `secret` (hex) is given, else the tenant's ($PLEXUS_TENANT
    and $PLEXUS_TENANT_TOKEN by default). The page keeps the token for the
    tab and takes it off the address bar."""
    web = st.get("web_address")
    if not web:
        raise _core.PlexusError(
            f"the server at {st.get('address')} serves no live page (it "
            "was started with --web-listen off)")
    if secret:
        token = _core.operator_token(secret)
    else:
        tenant = tenant or os.environ.get("PLEXUS_TENANT")
        tenant_token = tenant_token or os.environ.get("PLEXUS_TENANT_TOKEN")
        if not (tenant and tenant_token):
            raise _core.PlexusError(
                "the live page needs a token: give --secret-file (the "
                "operator's), or set $PLEXUS_TENANT and $PLEXUS_TENANT_TOKEN "
                "(a tenant's)")
        token = f"{tenant}:{tenant_token}"
    return f"http://{web}/#token={token}"


def cmd_top(args):
    from ._top import run
    return run(args.address or current_address(), interval=args.interval,
               iterations=args.iterations)


def why_lines(st, after=1.0):
    """What `plexus why` says of status `st`: (client id, sentence) for each
    slice request waiting for capacity, slice waiting for a host, client
    with calls waiting at admission, and call waiting longer than `after`
    seconds (the server's explanation, server/why/why.h)."""
    names = {c["client_id"]: c["name"] for c in st.get("clients", [])}
    lines = []
    for p in st.get("pending_slices", []):
        if p.get("waited_ms", 0) >= after * 1000:
            lines.append((p.get("client_id"), (
                f"a slice request for {p.get('num_devices')} device(s) has "
                f"waited {p.get('waited_ms', 0) / 1000:.1f} s "
                f"({p.get('left_ms', 0) / 1000:.1f} s left): waiting for "
                f"{p.get('waiting_for')}")))
    for s in st.get("slices", []):
        if s.get("awaiting"):
            lines.append((s.get("client_id"), (
                f"slice {s.get('slice_id')} waits for a host to take a lost "
                f"one's place ({s['awaiting']}), "
                f"{s.get('awaiting_left_ms', 0) / 1000:.1f} s left")))
    # Admission: calls not yet routed wait for their client's share.
    running = {c["client_id"]: int(c.get("calls_in_flight", 0))
               for c in st.get("clients", [])}
    for c in st.get("clients", []):
        pending = int(c.get("calls_pending", 0))
        if pending == 0:
            continue
        others = ", ".join(
            f"{names.get(o, o)} {n}" for o, n in running.items()
            if o != c["client_id"] and n > 0) or "none"
        lines.append((c["client_id"], (
            f"{pending} call(s) wait at admission for this client's share "
            f"(tenant {c.get('tenant', '?')}, weight "
            f"{float(c.get('weight', 1)):g}); calls in flight: its own "
            f"{running.get(c['client_id'], 0)}, other clients' {others}")))
    lines += [(e.get("client_id"), e["reason"]) for e in st.get("why", [])
              if e.get("waited_ms", 0) >= after * 1000]
    return [(cid, f"client {cid} ({names.get(cid, '?')}): {line}")
            for cid, line in lines]


def cmd_why(args):
    """Every call that has waited longer than --after seconds, with the
    root of its wait (the server follows its records: server/why/why.h), and
    what else its clients wait on."""
    address = args.address or current_address()
    from ._api import _decode_status
    st = _decode_status(_core.cluster_status(address))
    if args.json:
        print(json.dumps([e for e in st.get("why", [])
                          if e.get("waited_ms", 0) >= args.after * 1000],
                         indent=2))
        return 0
    lines = why_lines(st, args.after)
    if not lines:
        print(f"nothing has waited longer than {args.after:g} s")
        return 0
    for _, line in lines:
        print(line)
    return 0


def cmd_wait(args):
    """Waits until the server at --address answers and --workers workers are
    up; exit 0, or 1 after --timeout saying what it saw. For scripts that
    start a server and workers on their own (deploy/slurm, a client pod)."""
    address = args.address or current_address()
    from ._api import _decode_status
    deadline = time.monotonic() + args.timeout
    alive, error = 0, None
    while True:
        # A fresh status waits for a heartbeat of every live worker (~0.5 s);
        # with no server or no worker yet it returns at once, so those
        # rounds are 0.2 s apart.
        try:
            st = _decode_status(_core.cluster_status(address, True))
            alive = sum(1 for w in st.get("workers", []) if w["alive"])
            error = None
        except _core.PlexusError as e:  # not up yet, or restarting
            alive, error = 0, e
        if alive >= args.workers:
            print(f"{alive} worker(s) up at {address}")
            return 0
        if time.monotonic() > deadline:
            seen = (f"no server answers ({error})" if error else
                    f"{alive} of {args.workers} worker(s) up")
            print(f"plexus wait: {seen} at {address} after {args.timeout:g} s",
                  file=sys.stderr)
            return 1
        if not alive:
            time.sleep(0.2)


def cmd_down(args):
    f = _state_file()
    if not f.exists() and not args.address:
        print("no cluster is up", file=sys.stderr)
        return 1
    state = json.loads(f.read_text()) if f.exists() else {}
    if args.address and state.get("address") != args.address:
        # Another cluster's state (`plexus up` on this machine): its secret
        # and server pid are not this one's.
        state, f = {}, None
    address = args.address or state["address"]
    pid = state.get("pid")
    try:
        # The secret `plexus up` kept; else $PLEXUS_CLUSTER_SECRET's.
        _core.shutdown_server(address, state.get("secret"))
    except Exception as e:  # noqa: BLE001 - fall back to signals
        print(f"shutdown request failed ({e}); signalling", file=sys.stderr)
        if pid:
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    if pid:
        wait_for_exit([pid], timeout=10)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if f is not None and f.exists():
        f.unlink()
    print("cluster down")
    return 0


def cmd_trace(args):
    """A timeline of the whole cluster (every process's ring, through the
    server) as a Chrome trace-event file: the next --seconds, or with
    --last the past ones the rings still hold."""
    from . import _trace
    address = args.address or current_address()
    secret = _secret_for(address, args.secret_file)
    if secret is None:
        # Before recording: the server would refuse the trace at its end.
        print("plexus: the trace of every client's calls needs the cluster "
              "secret: give --secret-file or set $PLEXUS_CLUSTER_SECRET (a "
              "client reads its own with client.trace())", file=sys.stderr)
        return 1
    summary = _trace.collect_for(address, args.seconds, args.output,
                                 last=args.last, secret=secret)
    print(_trace.describe(summary, args.output))
    return 0


def cmd_token(args):
    """Prints the tenant token of --tenant: what the operator hands to that
    tenant's users ($PLEXUS_TENANT_TOKEN, or connect(token=...)); with
    --admin, the operator's token of the live page and /metrics. It is
    derived from the cluster secret: --secret-file, else
    $PLEXUS_CLUSTER_SECRET, else the cluster `plexus up` started."""
    secret = None
    if args.secret_file:
        with open(args.secret_file) as f:
            secret = f.readline().strip()
    elif not os.environ.get("PLEXUS_CLUSTER_SECRET"):
        f = _state_file()
        if f.exists():
            secret = json.loads(f.read_text()).get("secret")
    if args.admin:
        print(_core.operator_token(secret))
    else:
        print(_core.tenant_token(args.tenant, secret))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="plexus", description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster on this machine")
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--devices-per-host", type=int, default=1)
    up.add_argument("--spare", type=int, default=0,
                    help="more workers kept to take the place of a lost host")
    up.add_argument("--spare-wait-ms", type=int, default=None,
                    help="with spares: how long a slice that lost a host "
                         "waits for another when none is free at once "
                         "(default 10000; 0: it breaks at once)")
    up.add_argument("--device-memory-mib", type=float, default=1024)
    up.add_argument("--no-shm", action="store_true",
                    help="move buffers over TCP even between local workers")
    up.set_defaults(fn=cmd_up)
    st = sub.add_parser("status", help="hosts, devices, slices, clients, bytes")
    st.add_argument("--address")
    st.add_argument("--json", action="store_true")
    st.add_argument("--web", action="store_true",
                    help="print the live page's URL (with the operator's "
                         "token, or $PLEXUS_TENANT's) and open it where "
                         "there is a display")
    st.add_argument("--no-browser", action="store_true",
                    help="with --web: only print the URL")
    st.add_argument("--secret-file",
                    help="with --web: the cluster secret (default: "
                         "$PLEXUS_CLUSTER_SECRET, else `plexus up`'s)")
    st.set_defaults(fn=cmd_status)
    top = sub.add_parser("top", help="the live page in a terminal: hosts' "
                                     "busy time and memory, clients, slices, "
                                     "why")
    top.add_argument("--address")
    top.add_argument("--interval", type=float, default=1.0,
                     help="seconds between frames")
    top.add_argument("-n", "--iterations", type=int, default=None,
                     help="frames to print (default: until interrupted on a "
                          "terminal, 1 otherwise)")
    top.set_defaults(fn=cmd_top)
    why = sub.add_parser("why", help="why is it stuck: each call waiting "
                                     "longer than --after, and its root cause")
    why.add_argument("--address")
    why.add_argument("--after", type=float, default=1.0,
                     help="seconds (at least 1: the server lists no shorter "
                          "waits)")
    why.add_argument("--json", action="store_true")
    why.set_defaults(fn=cmd_why)
    wait = sub.add_parser("wait", help="wait until a server and N workers are up")
    wait.add_argument("--address")
    wait.add_argument("--workers", type=int, default=1)
    wait.add_argument("--timeout", type=float, default=60)
    wait.set_defaults(fn=cmd_wait)
    down = sub.add_parser("down", help="stop the cluster `plexus up` started")
    down.add_argument("--address")
    down.set_defaults(fn=cmd_down)
    token = sub.add_parser("token", help="print a tenant's token, or the "
                                         "operator's (--admin)")
    who = token.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant")
    who.add_argument("--admin", action="store_true",
                     help="the operator's token of the live page and "
                          "/metrics")
    token.add_argument("--secret-file",
                       help="the cluster secret (default: "
                            "$PLEXUS_CLUSTER_SECRET, else `plexus up`'s)")
    token.set_defaults(fn=cmd_token)
    trace = sub.add_parser("trace", help="write a timeline of the cluster "
                                         "(Perfetto, TensorBoard)")
    trace.add_argument("--address")
    trace.add_argument("--seconds", type=float, default=10.0,
                       help="how long to record (with --last: how far back)")
    trace.add_argument("--last", action="store_true",
                       help="the past --seconds, at once, from what each "
                            "process's ring still holds")
    trace.add_argument("-o", "--output", default="plexus-trace.json")
    trace.add_argument("--secret-file",
                       help="the cluster secret: the trace shows every "
                            "client's calls to the operator only (default: "
                            "$PLEXUS_CLUSTER_SECRET, else `plexus up`'s)")
    trace.set_defaults(fn=cmd_trace)
    for cmd in (st, top, why, wait, down, trace):
        cmd.add_argument("--tls-ca",
                         help="CA file of the server's TLS certificate "
                              "(default: $PLEXUS_TLS_CA)")
    args = p.parse_args(argv)
    if getattr(args, "tls_ca", None):
        os.environ["PLEXUS_TLS_CA"] = args.tls_ca  # read by the C++ client
    try:
        return args.fn(args)
    except _core.PlexusError as e:
        print(f"plexus: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
