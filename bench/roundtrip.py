"""A blocking round trip, measured beside what this machine allows.

In one run, in interleaved rounds (each round runs every measure once, in
an order that alternates between rounds), the median microseconds of:
  - pingpong-unix / pingpong-tcp: 64 bytes between this process and a
    child Python process over a unix socket / TCP loopback (TCP_NODELAY):
    the cost of two process hops on this machine, with Python's own cost
    on both ends;
  - ring-unix: 64 bytes around a ring of three Python processes (this
    one, then two children, each forwarding it to the next over a unix
    socket pair): three process hops, the path a round trip through the
    controller takes (client -> server -> worker -> client), so the
    least such a round trip could cost here with Python's own cost at
    one end;
  - pingpong-same-cpu / pingpong-cross-cpu: the unix ping-pong again,
    between two processes of their own each pinned to a CPU: both to CPU
    0, or one to CPU 0 and the other to CPU 1 (run in a child process of
    this one, which prints its median). On a VM whose idle vCPUs sleep in
    the hypervisor, the two differ several times over (a wake-up across
    vCPUs costs tens of microseconds), and the unpinned ping-pong above
    lands in either, as the scheduler places its ends;
  - plexus-python: `np.asarray(prog(x))` on a 1-host, 1-device embedded
    cluster (`prog` the built-in `scale` by 1 of f32[4]): a call, then a
    fetch of its small result, from the Python client;
  - plexus-jit: the same with a plexus.jit program (`x * 1.0`, compiled
    by XLA's CPU plugin on the worker), the round trip a JAX user makes;
  - plexus-wait: `prog(x).block_until_ready()`, the round trip of JAX's
    own idiom (a wait, no value read);
  With --hosts H (default 1) those three run on a cluster of H hosts of
  one device each, on a slice spanning them: x is replicated, so a fetch
  reads device 0's copy and a wait confirms every host's (the CPU and
  context switches below are host 0's worker's);
  - plexus-cpp: the C++ client's op-by-op call + wait on its own embedded
    cluster (`plexus-bench-dispatch --op-by-op-only --hosts-list 1`, one
    process per round; its own 64 B TCP ping-pong is reported beside it as
    pingpong-tcp-cpp);
  - ray-cdag: a Ray Compiled Graph round trip (`InputNode` into one
    actor's method, `experimental_compile()`, `ray.get(dag.execute(1))`),
    skipped with a message when Ray cannot start here; ray-cdag-ndarray
    the same with the f32[4] array as its argument (far slower in Ray:
    milliseconds, here).
Each round measures --iters round trips per measure (after a warm-up) and
takes their median; the figure printed is the median of the rounds'
medians, and the ratios to the unix ping-pong are medians of the rounds'
ratios.

    PYTHONPATH=python PLEXUS_BIN_DIR=$PWD/build/bin \\
        python3 bench/roundtrip.py [--rounds 8] [--iters 2000] [--json F]
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# After $PYTHONPATH: bench/roundtrip_ab.sh runs this script against
# another tree's client.
sys.path.append(str(Path(__file__).resolve().parent.parent / "python"))
import plexus  # noqa: E402
from proc_cpu import ProcessCost  # noqa: E402

MESSAGE = 64


def _echo(family, address):
    """The child of a ping-pong: echoes every message until EOF."""
    s = socket.socket(family, socket.SOCK_STREAM)
    s.connect(address)
    if family == socket.AF_INET:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        data = s.recv(MESSAGE)
        if not data:
            return
        s.sendall(data)


def _round_trip(out, back, buf):
    """Sends `buf` on `out` and reads as many bytes back from `back`."""
    out.sendall(buf)
    got = 0
    while got < len(buf):
        got += len(back.recv(len(buf) - got))


class PingPong:
    """A connected pair: this process and an echoing child process."""

    def __init__(self, family):
        listener = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_UNIX:
            self._path = f"/tmp/roundtrip-{os.getpid()}-{id(self)}.sock"
            listener.bind(self._path)
            address = self._path
        else:
            self._path = None
            listener.bind(("127.0.0.1", 0))
            address = listener.getsockname()
        listener.listen(1)
        self._child = subprocess.Popen(
            [sys.executable, __file__, "--echo",
             "unix" if family == socket.AF_UNIX else "tcp",
             json.dumps(address)])
        self._sock, _ = listener.accept()
        listener.close()
        if family == socket.AF_INET:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b"x" * MESSAGE

    def once(self):
        _round_trip(self._sock, self._sock, self._buf)

    def close(self):
        self._sock.close()
        self._child.wait()
        if self._path:
            os.unlink(self._path)


def _forward(in_fd, out_fd):
    """A ring's child: sends on every message it reads until EOF."""
    src = socket.socket(fileno=in_fd)
    dst = socket.socket(fileno=out_fd)
    while True:
        data = src.recv(MESSAGE)
        if not data:
            dst.close()
            return
        dst.sendall(data)


class Ring:
    """This process and two children, each forwarding to the next over a
    unix socket pair: this -> first -> second -> this."""

    def __init__(self):
        to_first, first_in = socket.socketpair()
        first_out, second_in = socket.socketpair()
        second_out, from_second = socket.socketpair()
        self._children = []
        for a, b in ((first_in, first_out), (second_in, second_out)):
            self._children.append(subprocess.Popen(
                [sys.executable, __file__, "--forward", str(a.fileno()),
                 str(b.fileno())], pass_fds=(a.fileno(), b.fileno())))
        for s in (first_in, first_out, second_in, second_out):
            s.close()
        self._out, self._in = to_first, from_second
        self._buf = b"x" * MESSAGE

    def once(self):
        _round_trip(self._out, self._in, self._buf)

    def close(self):
        self._out.close()
        for child in self._children:
            child.wait()
        self._in.close()


def _pinned_pingpong(cross, iters):
    """In a child process: a ping-pong between this process, pinned to CPU
    0, and a fork of it pinned to CPU 1 (`cross`) or 0; prints the median
    microseconds."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {1 if cross else 0})
        a.close()
        while True:
            data = b.recv(MESSAGE)
            if not data:
                os._exit(0)
            b.sendall(data)
    os.sched_setaffinity(0, {0})
    b.close()
    buf = b"x" * MESSAGE
    print(median_micros(lambda: _round_trip(a, a, buf), iters))
    a.close()
    os.waitpid(pid, 0)


def pinned_pingpong(cross, iters):
    """_pinned_pingpong's median, run in a fresh process."""
    out = subprocess.run(
        [sys.executable, __file__, "--pinned-pingpong",
         "cross" if cross else "same", str(iters)],
        check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def median_micros(once, iters, warmup=50, cost=None):
    """Median of `iters` timed calls of once(), in microseconds; with
    `cost` (a ProcessCost), also what each process spent per call."""
    for _ in range(warmup):
        once()
    if cost:
        cost.start()
    times = []
    clock = time.perf_counter
    for _ in range(iters):
        t0 = clock()
        once()
        times.append(clock() - t0)
    if cost:
        cost.per_call = cost.stop(iters)
    return 1e6 * statistics.median(times)


def ray_round_trip():
    """A compiled Ray graph of one actor method: (once, close), or None."""
    try:
        import ray
        from ray.dag import InputNode
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")

        @ray.remote
        class Echo:
            def echo(self, x):
                return x

        actor = Echo.remote()
        with InputNode() as inp:
            dag = actor.echo.bind(inp)
        compiled = dag.experimental_compile()
        x = np.ones(4, np.float32)

        def once():  # an int: a small array costs Ray milliseconds here
            ray.get(compiled.execute(1))

        def once_array():
            ray.get(compiled.execute(x))

        once()
        once_array()

        def close():
            compiled.teardown()
            ray.shutdown()

        return once, once_array, close
    except Exception as e:  # noqa: BLE001 - any failure means: skip Ray
        print(f"[roundtrip] ray-cdag skipped: Ray could not start here "
              f"({type(e).__name__}: {e})", flush=True)
        return None


def cpp_op_by_op(bin_dir, iters):
    """(op-by-op us per call, its TCP ping-pong us) from one process."""
    exe = Path(bin_dir) / "plexus-bench-dispatch"
    out = subprocess.run(
        [str(exe), "--op-by-op-only", "--hosts-list", "1", "--repeats", "3",
         "--calls", str(4 * iters)], capture_output=True, text=True,
        check=True).stdout
    op = re.search(r"^\[dispatch\] op-by-op, 1 host: ([\d,]+) calls/s", out,
                   re.M)
    ping = re.search(r"ping-pong, 64 B, 2 processes: [\d,]+ round trips/s, "
                     r"([\d.]+) us each", out)
    return 1e6 / float(op.group(1).replace(",", "")), float(ping.group(1))


def _trace_slices(path):
    """{(process, cat): [(start_us, end_us), ...] sorted} of a Chrome
    trace written by client.trace()."""
    doc = json.loads(Path(path).read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    open_, out = {}, {}
    for e in events:
        key = (names.get(e.get("pid"), str(e.get("pid"))), e.get("cat"))
        if e.get("ph") == "X":
            out.setdefault(key, []).append((e["ts"], e["ts"] + e["dur"]))
        elif e.get("ph") == "b":
            open_[(e["pid"], e["id"])] = (key, e["ts"])
        elif e.get("ph") == "e" and (e["pid"], e["id"]) in open_:
            k, ts = open_.pop((e["pid"], e["id"]))
            out.setdefault(k, []).append((ts, e["ts"]))
    return {k: sorted(v) for k, v in out.items()}


def breakdown(client, prog, x, calls, path):
    """Where a blocking round trip's time goes, from the timeline: `calls`
    op-by-op call + fetch under client.trace(); the median of each hop."""
    for _ in range(50):
        np.asarray(prog(x))
    with client.trace(path):
        for _ in range(calls):
            np.asarray(prog(x))
    sl = _trace_slices(path)
    for k, v in sorted(sl.items()):
        print(f"[breakdown] {k}: {len(v)} slices, median duration "
              f"{statistics.median(e - s for s, e in v):.1f} us")

    def pick(proc_part, cat):
        for (p, c), v in sl.items():
            if proc_part in p and c == cat and len(v) >= calls:
                return v[-calls:]
        return None

    issued = pick("bench-roundtrip", "call issued")
    fetch = pick("bench-roundtrip", "client")
    routed = pick("server", "call")
    task = pick("worker", "task")
    served = pick("worker", "data plane")
    if not all((issued, fetch, routed, task, served)):
        print("[breakdown] some events are missing: no breakdown")
        return
    hops = {
        "client: call built -> queued": [i[1] - i[0] for i in issued],
        "client queued -> server routed": [r[0] - i[1] for i, r in
                                           zip(issued, routed)],
        "server routed -> worker task starts": [t[0] - r[0] for r, t in
                                                zip(routed, task)],
        "worker task (kernel)": [t[1] - t[0] for t in task],
        "task done -> worker's fetch answered": [s[1] - t[1] for t, s in
                                                 zip(task, served)],
        "fetch answered -> client has it": [f[1] - s[1] for s, f in
                                            zip(served, fetch)],
        "client: queued -> fetch made": [f[0] - i[1] for i, f in
                                         zip(issued, fetch)],
        "fetch made -> worker fetch starts": [s[0] - f[0] for f, s in
                                              zip(fetch, served)],
        "total: call built -> client has it": [f[1] - i[0] for i, f in
                                               zip(issued, fetch)],
    }
    print(f"\n| hop (timeline, {calls} op-by-op calls) | median us |")
    print("|---|---|")
    for k, v in hops.items():
        print(f"| {k} | {statistics.median(v):.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--no-cpp", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--hosts", type=int, default=1,
                    help="hosts (one device each) of the Plexus measures' "
                         "slice, over which x is replicated")
    ap.add_argument("--breakdown", type=int, default=0, metavar="CALLS",
                    help="only attribute the Python round trip's time to "
                         "its hops, from the timeline of CALLS calls")
    args = ap.parse_args()
    bin_dir = os.environ.get("PLEXUS_BIN_DIR", "build/bin")
    if args.breakdown:
        with plexus.local(hosts=1, devices_per_host=1) as cluster:
            client = cluster.connect(name="bench-roundtrip")
            s = client.slice(1)
            x = s.put(np.ones(4, np.float32))
            prog = s.program("scale", x, factor=1.0)
            breakdown(client, prog, x, args.breakdown,
                      f"/tmp/roundtrip-{os.getpid()}.json")
            client.close()
        return
    print(f"[roundtrip] {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f}; {args.rounds} rounds x {args.iters} "
          f"round trips per measure", flush=True)
    measures = {
        "pingpong-unix": PingPong(socket.AF_UNIX),
        "pingpong-tcp": PingPong(socket.AF_INET),
        "ring-unix": Ring(),
    }
    onces = {k: v.once for k, v in measures.items()}
    cluster = plexus.local(hosts=args.hosts, devices_per_host=1)
    client = cluster.connect(name="bench-roundtrip")
    s = client.slice(args.hosts,
                     hosts=[f"host{h}" for h in range(args.hosts)])
    x = s.put(np.ones(4, np.float32))  # replicated
    prog = s.program("scale", x, factor=1.0)
    assert np.asarray(prog(x)).tolist() == [1.0] * 4
    onces["plexus-python"] = lambda: np.asarray(prog(x))
    onces["plexus-wait"] = lambda: prog(x).block_until_ready()
    jitted = plexus.jit(lambda a: a * 1.0, slice=s)
    assert np.asarray(jitted(x)).tolist() == [1.0] * 4
    onces["plexus-jit"] = lambda: np.asarray(jitted(x))
    # What a Python round trip costs each process: CPU and context
    # switches (each a sleep and a wake-up of some thread).
    cost = ProcessCost({"client": os.getpid(), "server": cluster.process.pid,
                        "worker": cluster.worker_pids()[0]})
    costs = []
    ray = None if args.no_ray else ray_round_trip()
    if ray:
        onces["ray-cdag"] = ray[0]
        onces["ray-cdag-ndarray"] = ray[1]
    rows = {k: [] for k in onces}
    if len(os.sched_getaffinity(0)) >= 2:
        rows["pingpong-same-cpu"] = []
        rows["pingpong-cross-cpu"] = []
    if not args.no_cpp:
        rows["plexus-cpp"] = []
        rows["pingpong-tcp-cpp"] = []
    try:
        for r in range(args.rounds):
            names = list(rows)
            if r % 2:
                names.reverse()
            for name in names:
                if name == "pingpong-tcp-cpp":
                    continue  # measured with plexus-cpp, in its process
                if name.startswith("pingpong-") and name.endswith("-cpu"):
                    rows[name].append(pinned_pingpong(
                        name == "pingpong-cross-cpu", args.iters))
                elif name == "plexus-cpp":
                    op, ping = cpp_op_by_op(bin_dir, args.iters)
                    rows["plexus-cpp"].append(op)
                    rows["pingpong-tcp-cpp"].append(ping)
                else:
                    # Ray's array round trip takes milliseconds: fewer.
                    n = (max(100, args.iters // 20)
                         if name == "ray-cdag-ndarray" else args.iters)
                    measure_cost = cost if name == "plexus-python" else None
                    rows[name].append(median_micros(onces[name], n,
                                                    cost=measure_cost))
                    if measure_cost:
                        costs.append(cost.per_call)
            print(f"[roundtrip] round {r}: " + ", ".join(
                f"{k} {v[-1]:.1f}" for k, v in rows.items()), flush=True)
    finally:
        for m in measures.values():
            m.close()
        client.close()
        cluster.down()
        if ray:
            ray[2]()
    base = rows["pingpong-unix"]
    ring = rows["ring-unix"]
    print(f"\n| measure | us per round trip (median of {args.rounds} "
          f"rounds) | [min, max] | / unix ping-pong | / ring of three "
          f"(medians of rounds' ratios) |")
    print("|---|---|---|---|---|")
    result = {"rounds": args.rounds, "iters": args.iters, "measures": {}}
    for k, v in rows.items():
        ratio = statistics.median(a / b for a, b in zip(v, base))
        to_ring = statistics.median(a / b for a, b in zip(v, ring))
        print(f"| {k} | {statistics.median(v):.1f} | [{min(v):.1f}, "
              f"{max(v):.1f}] | {ratio:.2f} | {to_ring:.2f} |")
        result["measures"][k] = {"micros": v,
                                 "median_micros": statistics.median(v),
                                 "ratio_to_unix_pingpong": ratio,
                                 "ratio_to_ring": to_ring}
    print("\n| plexus-python, per round trip (median of rounds) | CPU us | "
          "context switches | threads: [CPU us, switches] |")
    print("|---|---|---|---|")
    for role in ("client", "server", "worker"):
        cpu = statistics.median(c[role]["cpu_us"] for c in costs)
        sw = statistics.median(c[role]["switches"] for c in costs)
        print(f"| {role} | {cpu:.1f} | {sw:.2f} | "
              f"{costs[len(costs) // 2][role]['threads']} |")
    result["plexus_python_cost"] = costs
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--pinned-pingpong":
        _pinned_pingpong(sys.argv[2] == "cross", int(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "--forward":
        _forward(int(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "--echo":
        fam = socket.AF_UNIX if sys.argv[2] == "unix" else socket.AF_INET
        addr = json.loads(sys.argv[3])
        _echo(fam, addr if isinstance(addr, str) else tuple(addr))
    else:
        main()
