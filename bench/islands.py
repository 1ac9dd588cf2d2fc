"""bench/islands: data parallelism over two islands joined by a slow link,
against one island of the same number of devices.

The model is examples/transformer.py's (embedding, two blocks, head), data
parallel over 4 devices: 2 islands x 2 devices (each island a network
namespace holding one worker of 2 devices; the link between the islands
shaped with `tc` TBF) against 1 island of 4 devices (one worker of 4
devices, in a namespace of its own). Per-device compute is held fixed:
every block's forward and backward is a `device_sleep` of the time the real
block (jax, on this CPU, at the per-device batch) takes, measured at the
start of the run; every block's gradient is a float32 buffer of the real
gradient's size, all-reduced over the 4 devices and applied with
`sgd_update`. A step waits for nothing but its data: block k's forward in
step t+1 reads block k's parameters updated in step t.

Two ways to reduce the gradients:
  per-block   the backward is one program per block (head first); each
              block's all_reduce follows its backward, so the last blocks'
              gradients cross the link while the earlier blocks still
              compute (a collective runs on its device's communication
              stream, not its compute queue); the updates follow the
              whole backward;
  flat        one all_reduce of all gradients after the whole backward
              (examples/transformer.py's data-parallel step).

Reported: the link rate (a plain TCP stream between the island namespaces,
unshaped and shaped, in the same run), the step time of each layout and
way (median of --repeats runs of --steps steps, the layouts alternated),
the throughput ratio 2 islands / 1 island, the bytes each island sends per
step (workers' counters), the transfer time of a step's gradients alone
(the same all_reduces with no compute: 2 islands minus 1 island) and their
time on the wire (bytes / shaped rate), the exposed communication time
(step time, 2 islands minus 1 island) and the share of the transfer hidden
behind compute (1 - exposed / transfer, and 1 - exposed / wire time).

The server runs with a large admission window (--admission-window-us,
default here 200 ms), so a step's calls are all queued on the devices
ahead of time; with the default window (5 ms of device time per device)
each long backward block's successor waits at the server for its report,
which costs both layouts the same round trips but hides nothing. The TBF
bucket (--burst) must be smaller than a step's gradients (121 kB), or they
leave at the unshaped rate on a bucket refilled during the compute.

Needs root, `ip` and `tc` (iproute2); not in CI.

    PYTHONPATH=python PLEXUS_BIN_DIR=build/bin python3 bench/islands.py \\
        --rate 1gbit --burst 16kb --batch-per-device 128 --steps 20 --repeats 5
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples"))
os.environ.setdefault("PLEXUS_BIN_DIR", str(ROOT / "build" / "bin"))

import plexus  # noqa: E402
from netns import NetnsLab, cannot_make_namespaces  # noqa: E402

BLOCKS = ["embed", "block1", "block2", "head"]


# ------------------------------------------------------------ the model


def measure_blocks(batch, reps):
    """Per block: forward and backward time (µs, median of `reps`, jax on
    this CPU at `batch` sequences) and the gradient's float count."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import jax
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree
    import transformer as T

    params = T.init_params(0)
    p0, p1 = params["stage0"], params["stage1"]
    tokens, targets = T.make_batches(1, batch=batch)[0]
    emb = {"tok": p0["tok"], "pos": p0["pos"]}
    head = {k: p1[k] for k in ("ln_g", "ln_b", "head_w", "head_b")}

    def embed_f(p, t):
        return p["tok"][t] + p["pos"]

    def head_f(p, x, y):
        logits = T.layer_norm(x, p["ln_g"], p["ln_b"]) @ p["head_w"] + \
            p["head_b"]
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.sum(jnp.take_along_axis(logp, y[..., None], -1)) / (
            batch * T.SEQ)

    x0 = embed_f(emb, tokens)
    x1 = T.block(p0["block"], x0)
    x2 = T.block(p1["block"], x1)
    fwd = {
        "embed": (jax.jit(embed_f), (emb, tokens)),
        "block1": (jax.jit(T.block), (p0["block"], x0)),
        "block2": (jax.jit(T.block), (p1["block"], x1)),
        "head": (jax.jit(head_f), (head, x2, targets)),
    }
    bwd = {
        "embed": (jax.jit(lambda p, t, c: jax.vjp(
            lambda q: embed_f(q, t), p)[1](c)), (emb, tokens, x0)),
        "block1": (jax.jit(lambda p, x, c: jax.vjp(T.block, p, x)[1](c)),
                   (p0["block"], x0, x1)),
        "block2": (jax.jit(lambda p, x, c: jax.vjp(T.block, p, x)[1](c)),
                   (p1["block"], x1, x2)),
        "head": (jax.jit(jax.grad(head_f, argnums=(0, 1))),
                 (head, x2, targets)),
    }
    sizes = {"embed": emb, "block1": p0["block"], "block2": p1["block"],
             "head": head}

    def timed(fn, args):
        jax.block_until_ready(fn(*args))  # compile
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e6

    out = {}
    for b in BLOCKS:
        out[b] = {"forward_us": timed(*fwd[b]), "backward_us": timed(*bwd[b]),
                  "grad_floats": int(ravel_pytree(sizes[b])[0].size)}
    return out


class Model:
    """The stand-in step on one 4-device slice."""

    def __init__(self, client, s, blocks, scale):
        self.client, self.s = client, s
        n = s.num_devices
        self.blocks = blocks
        self.fwd_us = {b: int(blocks[b]["forward_us"] * scale) for b in BLOCKS}
        self.bwd_us = {b: int(blocks[b]["backward_us"] * scale) for b in BLOCKS}
        g = {b: blocks[b]["grad_floats"] for b in BLOCKS}
        self.total = sum(g.values())
        # Each device's gradient addend (split(0): device d holds rows d).
        self.grad_in = {b: s.put(np.full(n * g[b], 1e-3, np.float32),
                                 plexus.split(0)) for b in BLOCKS}
        self.flat_in = s.put(np.full(n * self.total, 1e-3, np.float32),
                             plexus.split(0))
        self.params0 = {b: s.put(np.zeros(g[b], np.float32)) for b in BLOCKS}
        self.flat0 = s.put(np.zeros(self.total, np.float32))
        P = s.program
        self.fwd = {b: P("device_sleep", self.params0[b],
                         micros=self.fwd_us[b], name=f"{b}_forward")
                    for b in BLOCKS}
        self.bwd = {b: P("device_sleep", self.grad_in[b],
                         micros=self.bwd_us[b], name=f"{b}_backward")
                    for b in BLOCKS}
        self.ar = {b: P("all_reduce", self.grad_in[b]) for b in BLOCKS}
        self.sgd = {b: P("sgd_update", self.params0[b], self.params0[b],
                         lr=0.1) for b in BLOCKS}
        # Flat: the backward's last program writes every block's gradient.
        self.flat_fwd = P("device_sleep", self.flat0,
                          micros=sum(self.fwd_us.values()), name="forward")
        self.flat_bwd = {b: P("device_sleep", self.flat_in,
                              micros=self.bwd_us[b], name=f"{b}_backward")
                         for b in BLOCKS}
        self.flat_ar = P("all_reduce", self.flat_in)
        self.flat_sgd = P("sgd_update", self.flat0, self.flat0, lr=0.1)

    def step_per_block(self, params, compute=True):
        with self.client.graph():
            if compute:
                for b in BLOCKS:
                    self.fwd[b](params[b])
            reduced = {}
            for b in reversed(BLOCKS):
                g = self.bwd[b](self.grad_in[b]) if compute else \
                    self.grad_in[b]
                reduced[b] = self.ar[b](g)   # on the communication stream
            # The updates after the whole backward: a device runs its tasks
            # in order, so an update queued between two backward blocks
            # would hold the rest of the backward until its gradient
            # arrived.
            return {b: self.sgd[b](params[b], reduced[b])
                    for b in reversed(BLOCKS)}

    def step_flat(self, params):
        with self.client.graph():
            self.flat_fwd(params)
            g = self.flat_in
            for b in reversed(BLOCKS):
                g = self.flat_bwd[b](g)
            return self.flat_sgd(params, self.flat_ar(g))

    def run(self, way, steps):
        """Seconds per step over `steps` steps submitted back to back."""
        if way == "flat":
            params, step = self.flat0, self.step_flat
        else:
            params = dict(self.params0)
            step = (lambda p: self.step_per_block(p, compute=False)) \
                if way == "comm-only" else self.step_per_block
        params = step(params)           # warm: programs loaded, links up
        plexus.wait(params)
        t0 = time.perf_counter()
        for _ in range(steps):
            params = step(params)
        plexus.wait(params)
        return (time.perf_counter() - t0) / steps


# ------------------------------------------------------------ the network


RECEIVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.perf_counter()
    n += len(b)
print(n, time.perf_counter() - t0, flush=True)
"""

SENDER = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
buf = b"x" * (1 << 20)
for _ in range(int(sys.argv[3])): c.sendall(buf)
c.close()
"""


def tcp_rate(src, dst, mib):
    """Bits/s of one TCP stream from namespace `src` to `dst`."""
    rx = subprocess.Popen(["ip", "netns", "exec", dst.netns, sys.executable,
                           "-c", RECEIVER, dst.address],
                          stdout=subprocess.PIPE, text=True)
    port = rx.stdout.readline().strip()
    subprocess.run(["ip", "netns", "exec", src.netns, sys.executable, "-c",
                    SENDER, dst.address, port, str(mib)], check=True,
                   timeout=120)
    n, secs = rx.stdout.readline().split()
    rx.wait(timeout=30)
    return int(n) * 8 / float(secs)


def shape(host, rate, burst):
    """TBF on the host's link: what it sends to anyone (the other island
    included) goes at most at `rate`."""
    subprocess.run(["ip", "netns", "exec", host.netns, "tc", "qdisc", "add",
                    "dev", "eth0", "root", "tbf", "rate", rate, "burst",
                    burst, "latency", "50ms"], check=True)


def qdisc(host):
    return subprocess.run(["ip", "netns", "exec", host.netns, "tc", "qdisc",
                           "show", "dev", "eth0"], capture_output=True,
                          text=True).stdout.strip()


def bytes_sent(address, hosts):
    from plexus._api import _decode_status
    st = _decode_status(plexus._core.cluster_status(address, True))
    return sum(w["stats"].get("bytes_sent", 0) for w in st["workers"]
               if w["alive"] and w["host_name"] in hosts)


# ------------------------------------------------------------ main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="1gbit", help="tc rate between islands")
    ap.add_argument("--burst", default="16kb",
                    help="TBF bucket: smaller than a step's gradients, or "
                    "they pass at the unshaped rate")
    ap.add_argument("--batch-per-device", type=int, default=128,
                    help="sequences per device whose block times are "
                    "measured (the example's batch is 8 over all devices)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply the measured compute times")
    ap.add_argument("--admission-window-us", type=int, default=200_000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" /
                                         "islands.json"))
    a = ap.parse_args()
    why = cannot_make_namespaces()
    if why:
        sys.exit(f"bench/islands.py needs network namespaces: {why}")

    blocks = measure_blocks(a.batch_per_device, reps=30)
    print(f"per-block compute at {a.batch_per_device} sequences per device "
          f"(jax on this CPU, median of 30), gradient floats:")
    for b in BLOCKS:
        print(f"  {b:7} forward {blocks[b]['forward_us']:8.0f} µs  backward "
              f"{blocks[b]['backward_us']:8.0f} µs  gradient "
              f"{blocks[b]['grad_floats']:6d} floats")

    lab = NetnsLab.create()
    logs = Path(tempfile.mkdtemp(prefix="plexus-islands-"))
    try:
        island_a, island_b, one = lab.add_host(), lab.add_host(), lab.add_host()
        unshaped = statistics.median(
            tcp_rate(island_a, island_b, 512) for _ in range(3))
        for h in (island_a, island_b):
            shape(h, a.rate, a.burst)
        shaped = statistics.median(
            tcp_rate(island_a, island_b, 48) for _ in range(3))
        print(f"link between the islands: unshaped {unshaped / 1e9:.2f} "
              f"Gbit/s, shaped ({a.rate}) {shaped / 1e9:.3f} Gbit/s "
              f"({shaped / unshaped:.1%} of unshaped); {qdisc(island_a)}")

        # A window of a whole step or more: the step's calls are all on the
        # devices' queues ahead of time (the default, 5 ms of device time
        # per device, holds the next block's call at the server until the
        # one before it is reported done: a report round trip per block).
        server = lab.start_server(
            logs / "server.log",
            extra=["--admission-window-us", str(a.admission_window_us)])
        for h, d in ((island_a, 2), (island_b, 2), (one, 4)):
            lab.start_worker(server, h, logs / f"{h.name}.log", devices=d)
        client = lab.connect(server.address, name="islands-bench")
        two = client.slice(4, hosts=[island_a.name, island_b.name],
                           placement="spread")
        single = client.slice(4, hosts=[one.name])
        assert len(two.islands) == 2 and len(single.islands) == 1
        models = {"2x2": Model(client, two, blocks, a.scale),
                  "1x4": Model(client, single, blocks, a.scale)}
        ways = ["per-block", "flat", "comm-only"]
        times = {(l, w): [] for l in models for w in ways}
        sent = {w: [] for w in ways}
        pair = {island_a.name, island_b.name}
        for _ in range(a.repeats):
            for w in ways:
                for layout, m in models.items():
                    before = bytes_sent(server.address, pair)
                    times[(layout, w)].append(m.run(w, a.steps))
                    if layout == "2x2":
                        # warm step included: steps + 1
                        sent[w].append((bytes_sent(server.address, pair) -
                                        before) / (a.steps + 1) / 2)
        client.close()
        med = {k: statistics.median(v) for k, v in times.items()}
    finally:
        lab.close()

    compute_us = sum(blocks[b]["forward_us"] + blocks[b]["backward_us"]
                     for b in BLOCKS) * a.scale
    transfer = med[("2x2", "comm-only")] - med[("1x4", "comm-only")]
    grad_bytes = 4 * sum(blocks[b]["grad_floats"] for b in BLOCKS)
    wire = grad_bytes * 8 / shaped  # a step's gradients at the link's rate
    result = {"rate": a.rate, "burst": a.burst,
              "admission_window_us": a.admission_window_us,
              "unshaped_bits_per_s": unshaped, "shaped_bits_per_s": shaped,
              "batch_per_device": a.batch_per_device, "scale": a.scale,
              "steps": a.steps, "repeats": a.repeats, "blocks": blocks,
              "compute_per_step_us": compute_us,
              "gradient_bytes": grad_bytes, "wire_s": wire,
              "transfer_s": transfer, "ways": {}}
    print(f"\nstep: {compute_us / 1e3:.2f} ms of compute per device, "
          f"{result['gradient_bytes'] / 1e3:.0f} kB of gradients; "
          f"median of {a.repeats} runs of {a.steps} steps")
    print(f"gradients alone (no compute): 2 islands "
          f"{med[('2x2', 'comm-only')] * 1e3:.2f} ms/step, 1 island "
          f"{med[('1x4', 'comm-only')] * 1e3:.2f}: transfer "
          f"{transfer * 1e3:.2f} ms/step; on the wire at the shaped rate "
          f"{wire * 1e3:.2f} ms")
    for w in ("per-block", "flat"):
        t2, t1 = med[("2x2", w)], med[("1x4", w)]
        exposed = t2 - t1
        hidden = 1 - exposed / transfer if transfer > 0 else float("nan")
        hidden_wire = 1 - exposed / wire
        per_step = statistics.median(sent[w])
        result["ways"][w] = {
            "step_s_2x2": t2, "step_s_1x4": t1, "ratio": t1 / t2,
            "exposed_s": exposed, "hidden_share": hidden,
            "hidden_share_of_wire_time": hidden_wire,
            "bytes_sent_per_island_per_step": per_step,
            "runs_2x2": times[("2x2", w)], "runs_1x4": times[("1x4", w)]}
        print(f"{w:9}: 2 islands {t2 * 1e3:6.2f} ms/step, 1 island "
              f"{t1 * 1e3:6.2f}: throughput ratio {t1 / t2:6.1%}; exposed "
              f"communication {exposed * 1e3:5.2f} ms/step, hidden "
              f"{hidden:6.1%} of the transfer ({hidden_wire:6.1%} of the "
              f"wire time); each island sends {per_step / 1e3:.0f} kB/step")
    Path(a.json).write_text(json.dumps(result, indent=1))
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
