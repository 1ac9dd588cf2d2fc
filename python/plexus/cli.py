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

from . import _core
from ._process import wait_for_exit
from ._state import current_address
from ._state import state_secret  # noqa: F401 - plexus.cli.state_secret
from ._state import secret_for as _secret_for
from ._state import state_file as _state_file
from ._state import write_private as _write_private
from ._status import cluster_status, web_url
from ._status_text import format_status, why_lines
from ._status_text import human as _human  # noqa: F401 - plexus.cli._human
from ._status_text import table as _table  # noqa: F401 - plexus.cli._table


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
    st = cluster_status(address)
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


def cmd_top(args):
    from ._top import run
    return run(args.address or current_address(), interval=args.interval,
               iterations=args.iterations)


def cmd_why(args):
    """Every call that has waited longer than --after seconds, with the
    root of its wait (the server follows its records: server/why/why.h), and
    what else its clients wait on."""
    address = args.address or current_address()
    st = cluster_status(address)
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
    deadline = time.monotonic() + args.timeout
    alive, error = 0, None
    while True:
        # A fresh status waits for every live worker's figures and next
        # heartbeat (~0.1 s); with no server or no worker yet it returns at
        # once, so those rounds are 0.2 s apart.
        try:
            st = cluster_status(address, True)
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
