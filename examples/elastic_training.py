"""Elastic training: the data-parallel transformer of examples/transformer.py
on 3 hosts and 1 spare, trained with momentum SGD, going on through lost
hosts with no code in the loop that handles a failure.

Each step puts its batch (split over the slice), computes each island's
gradient (plexus.jit), sums the islands' gradients with the runtime's
all_reduce (in virtual-rank order: a remap does not change the numbers),
updates the momentum, which is split over the slice (each device keeps a
third of it), and the parameters, which are replicated. Every
`--snapshot-every` steps the momentum is snapshotted (client.snapshot: an
in-memory copy of each shard on the next host, peer to peer).

When a host is lost (`--kill-steps`: this script SIGKILLs a random worker
at a random moment inside those steps, as a chaos test does), the server
remaps the slice onto the spare and recovers what the host held:
replicated parameters from a surviving copy, the momentum from its
snapshot, the batch from the data the client kept (puts are kept until the
server releases them), and the step in flight by running its calls again.
The embedded cluster starts a new spare for the next loss. The loss curve
is the one a failure-free run gives, bit for bit.

    python examples/elastic_training.py --steps 12 --kill-steps 4,8

With `--on-loss shrink` there is no spare: the slice is made with
client.slice(4, on_loss="shrink", min_devices=2, grow=True), so losing a
host shrinks it (4 -> 3 -> 2 devices) and workers that join later grow it
back to 4. The loop never restarts: it keeps its last good parameters,
runs a step again when it raised or `slice.resizes` changed under it, and
cuts each step's batch to the slice's size (`--rows` rows a device, taken
in order from one stream of rows, the learning rate scaled to the batch).
At the end every step's parameters are checked against one process
(jax.jit) applying the same steps to the same rows; each resize is shown
with what the server's timeline says it took and moved (client.trace), and
the time from each kill or join to the next step completed. `--model`
picks the plexus.jit transformer (examples/transformer.py's with one block,
so that compiling for each new size stays short on a CPU) or the MLP of
examples/mlp_common.py (16 -> 32 relu -> 4, softmax cross-entropy), both
plain SGD.

    python examples/elastic_training.py --on-loss shrink --model mlp \
        --steps 10 --kill-steps 2,4 --join-steps 6
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plexus  # noqa: E402
from transformer import (init_params, layer_norm, loss_fn,  # noqa: E402
                         make_batches, stage0_forward)
import mlp_common  # noqa: E402

HOSTS = 3
BATCH = 12  # 4 sequences per island
LR, BETA = 0.3, 0.9


def train(client, steps, seed=0, snapshot_every=1, on_step=None,
          return_params=False):
    """Momentum SGD, data parallel over a 3-device slice (one per host).
    Returns the losses (and, with return_params, the final parameters as
    numpy arrays: (losses, params)). on_step(step) is called as each step
    is issued, before its calls are."""
    s = client.slice(HOSTS, placement="spread")
    params = init_params(seed)
    flat, unravel = ravel_pytree(params)
    size = flat.size
    padded = -(-size // HOSTS) * HOSTS  # the momentum splits evenly

    def island_grad(p, x, y):
        """This island's addends of the mean loss and of its gradient (flat,
        padded to the momentum's length)."""
        loss, g = jax.value_and_grad(loss_fn)(p, x, y, BATCH)
        return loss, jnp.pad(ravel_pytree(g)[0], (0, padded - size))

    grad = plexus.jit(island_grad, s, name="island_grad",
                      in_shardings=(None, plexus.split(0), plexus.split(0)),
                      out_shardings=plexus.partial())
    all_reduce = s.program("all_reduce", plexus.Spec((padded,), "float32",
                                                     plexus.partial()))
    # Moves between layouts: the runtime hands each device its third of a
    # replicated vector, or gathers the thirds of a split one.
    vector = (padded,)
    to_split = s.program("identity", plexus.Spec(vector, "float32",
                                                 plexus.split(0)))
    to_whole = s.program("identity", plexus.Spec(vector, "float32",
                                                 plexus.replicated()))
    # Each island updates its third of the momentum from its third of the
    # summed gradient.
    momentum = plexus.jit(lambda m, g: BETA * m + g, s, name="momentum",
                          out_shardings=plexus.split(0))
    # The parameters read the whole momentum.
    update = plexus.jit(
        lambda p, m: jax.tree_util.tree_map(lambda a, b: a - LR * b, p,
                                            unravel(m[:size])),
        s, name="update")

    p = jax.tree_util.tree_map(s.put, params)
    m = s.put(np.zeros(padded, np.float32), plexus.split(0))
    losses = []
    for step, (x, y) in enumerate(make_batches(steps, BATCH, seed), 1):
        if on_step is not None:
            on_step(step)
        x, y = s.put(x, plexus.split(0)), s.put(y, plexus.split(0))
        with client.graph():
            loss, g = grad(p, x, y)
            m = momentum(m, to_split(all_reduce(g)))
            p = update(p, to_whole(m))
        if snapshot_every and step % snapshot_every == 0:
            client.snapshot(m)
        losses.append(float(np.asarray(loss)))
    if return_params:
        return losses, jax.tree_util.tree_map(np.asarray, p)
    return losses


def reference(steps, seed=0):
    """The same arithmetic in one process with jax.jit."""
    params = jax.tree_util.tree_map(jnp.asarray, init_params(seed))
    flat, unravel = ravel_pytree(params)

    @jax.jit
    def step(p, m, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y, BATCH)
        m = BETA * m + ravel_pytree(g)[0]
        return loss, jax.tree_util.tree_map(lambda a, b: a - LR * b, p,
                                            unravel(m)), m

    m = jnp.zeros(flat.size, jnp.float32)
    losses = []
    for x, y in make_batches(steps, BATCH, seed):
        loss, params, m = step(params, m, x, y)
        losses.append(float(loss))
    return losses


class Chaos:
    """SIGKILLs one random live worker of the slice's hosts at a random
    moment (0 to `window_s` after the step is issued) in each of `steps`."""

    def __init__(self, cluster, steps, seed, window_s=0.05, snapshot_every=1):
        self.cluster = cluster
        self.steps = set(steps)
        self.snapshot_every = snapshot_every
        self._snapshots_before = None  # the cluster's count at step 1
        self.rng = random.Random(seed)
        self.window_s = window_s
        self.kills = []  # (step, host, pid, seconds into the step)
        self._timers = []

    def __call__(self, step):
        # A kill lands inside the step it was meant for: the next step is
        # not issued before it.
        for t in self._timers:
            t.join()
        if self._snapshots_before is None:
            self._snapshots_before = self.cluster.status().get(
                "recovery", {}).get("snapshots_taken", 0)
        if step not in self.steps:
            return
        # Before the step is issued: the last loss has been declared and a
        # spare has joined (each loss recoverable), and the victim is
        # chosen among the slice's hosts; the kill itself comes at a
        # random moment of the step, from another thread.
        if self.kills:
            last = self.kills[-1]
            self._status("the last loss", lambda st: not any(
                w["alive"] and w["pid"] == last[2]
                for w in st["workers"]))

        def spare_and_slice(st):
            in_slices = {d["worker_id"] for sl in st.get("slices", [])
                         for d in sl.get("devices", [])}
            return any(w["alive"] and w.get("spare") for w in st["workers"]) \
                and in_slices
        st = self._status("a spare joining", spare_and_slice)
        # And the last snapshot the loop asked for is complete (every copy
        # arrived, including those a loss made again): a loss restores from
        # it, so only the step in flight runs again. (A loss before a
        # snapshot lands recomputes the value from its lineage instead;
        # src/plexus/server/recovery_snapshot_test.cc covers that.)
        asked = self._snapshots_before + (
            (step - 1) // self.snapshot_every if self.snapshot_every else 0)

        def snapshot_landed(st):
            r = st.get("recovery", {})
            return r.get("snapshots_taken", 0) >= asked and \
                r.get("snapshots_incomplete", 0) == 0 and \
                r.get("snapshot_recopies_pending", 0) == 0
        self._status("the last snapshot", snapshot_landed)
        in_slices = {d["worker_id"] for sl in st.get("slices", [])
                     for d in sl.get("devices", [])}
        used = [w for w in st["workers"]
                if w["alive"] and w["worker_id"] in in_slices]
        victim = used[int(self.rng.random() * len(used)) % len(used)]
        delay = self.rng.uniform(0, self.window_s)
        timer = threading.Timer(delay, self._kill, (step, delay, victim))
        timer.start()
        self._timers.append(timer)

    def _status(self, what, ready):
        """The cluster status once `ready(status)` holds: re-read after each
        round of heartbeats, for at most 30 s."""
        return self.cluster.wait_until(ready, timeout=30, what=f"chaos: {what}")

    def _kill(self, step, delay, victim):
        os.kill(int(victim["pid"]), signal.SIGKILL)
        self.kills.append((step, victim["host_name"], int(victim["pid"]),
                           round(delay, 4)))

    def join(self):
        for t in self._timers:
            t.join()

# ------------------------------------------- shrink on a loss, grow back

WAIT_S = 60  # for a resize the loop expects


class ShrinkModel:
    """What the shrinking loop trains: flat float32 parameters, each row's
    loss (a jax function of the flat parameters), and one stream of rows
    (x, y) the steps take in order. A step's loss is the sum over its rows:
    the step divides by its batch."""

    def __init__(self, name, params, row_losses_of_tree, x, y):
        self.name = name
        flat, unravel = ravel_pytree(params)
        self.flat = np.asarray(flat, np.float32)
        self.row_losses = lambda p, x, y: row_losses_of_tree(unravel(p), x, y)
        self.x, self.y = x, y

    def loss(self, p, x, y):
        return jnp.sum(self.row_losses(p, x, y))


def mlp_row_losses(p, x, labels):
    """examples/mlp_common.py's MLP: each row's softmax cross-entropy."""
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    logp = jax.nn.log_softmax(h @ p["w2"] + p["b2"], axis=-1)
    return -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]


def one_block_row_losses(p, tokens, targets):
    """examples/transformer.py's model with one block (its compile is what
    a resize waits for, on 2 CPU cores): embedding + block 1, the final
    norm and the output projection; each sequence's mean cross-entropy
    over its tokens."""
    h = stage0_forward(p["stage0"], tokens)
    head = p["head"]
    logits = layer_norm(h, head["ln_g"], head["ln_b"]) @ head["head_w"] + \
        head["head_b"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(nll, axis=1)


def shrink_model(name, rows, seed=0):
    """The MLP or the transformer, with a stream of `rows` rows."""
    if name == "mlp":
        x, y = mlp_common.make_dataset(rows, seed)
        return ShrinkModel(name, mlp_common.init_params(seed), mlp_row_losses,
                           x, y)
    if name == "transformer":
        (x, y), = make_batches(1, rows, seed)
        params = init_params(seed)
        head = {k: v for k, v in params["stage1"].items() if k != "block"}
        return ShrinkModel(name, {"stage0": params["stage0"], "head": head},
                           one_block_row_losses, x, y)
    raise ValueError(f"--model must be mlp or transformer, not {name!r}")


def join_worker(cluster, name):
    """A new plexus-worker process (one device) that registers with the
    embedded cluster's server, as a host joining the cluster would."""
    from plexus import _binaries
    return subprocess.Popen(
        [str(_binaries.bin_dir() / "plexus-worker"),
         "--server", cluster.address, "--devices", "1",
         "--host-name", name, "--die-with-parent"],
        env={**os.environ, "PLEXUS_CLUSTER_SECRET": cluster._secret,
             "PLEXUS_PJRT_PLUGIN": cluster.pjrt_plugin},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_host(cluster, host):
    """SIGKILLs the live worker of `host`; returns its pid."""
    for w in cluster.status()["workers"]:
        if w["alive"] and w["host_name"] == host:
            os.kill(int(w["pid"]), signal.SIGKILL)
            return int(w["pid"])
    raise RuntimeError(f"no live worker on {host}")


def kill_one(cluster, s, rng, step):
    """SIGKILLs a random host of slice `s`; a record of it."""
    host = rng.choice([d["host"] for d in s.devices])
    pid = kill_host(cluster, host)
    return {"step": step, "t": time.monotonic(),
            "what": f"{host} (pid {pid})"}


def join_workers(cluster, count, workers, step):
    """Starts `count` workers (appended to `workers`); a record of it."""
    t = time.monotonic()
    for _ in range(count):
        workers.append(join_worker(cluster, f"joiner{len(workers)}"))
    return {"step": step, "t": t, "what": f"{count} worker(s)"}


def await_resize(s, resizes, timeout=WAIT_S):
    """Whether the client hears of a resize of `s` after `resizes` within
    `timeout` seconds (the client has no event for it: polled)."""
    deadline = time.monotonic() + timeout
    while s.resizes == resizes:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def sgd_step(s, grad, all_reduce, update, p, x, y, lr):
    """One step on the slice's current size: (new parameters, their value,
    the loss). Nothing else of the step outlives it: a value the loop held
    (the partial gradient, a batch split for this size) would keep the
    slice from growing back."""
    batch = len(x)
    loss, g = grad(p, s.put(x, plexus.split(0)), s.put(y, plexus.split(0)))
    new_p = update(p, all_reduce(g), s.put(np.float32(lr / batch)))
    got = np.asarray(plexus.wait(new_p, timeout=WAIT_S))
    return new_p, got, float(np.asarray(loss)) / batch


def kept_params(s, p, last, run, say):
    """Before a step runs again: (the parameters `p` if the resize kept
    them, else `last` (their value, fetched when their step was done) put
    again, said and counted; whether they were lost). They are kept: a
    shrink moves every replicated value, done or still running
    (docs/scheduling.md). The fallback is for a loop whose state is split
    over the slice, which a shrink loses with the host's rows."""
    run["redone"] += 1
    try:
        plexus.wait(p, timeout=WAIT_S)
        return p, False
    except plexus.PlexusError as e:
        say(f"  the parameters, done and fetched, were lost in the resize "
            f"({type(e).__name__}: {str(e)[:80]}...): put again from the "
            "fetched copy")
        run["put_again"] += 1
        return s.put(last), True


def train_shrinking(cluster, client, model, steps, rows, lr, hosts=4,
                    min_devices=2, kill_steps=(), join_steps=(), seed=0,
                    workers=None, say=print):
    """Plain SGD, data parallel over a slice of `hosts` devices that shrinks
    on a loss and grows back, `rows` rows a device. Before step k (counting
    from 0) in kill_steps, a random host of the slice is SIGKILLed; before
    one in join_steps, as many workers start as the slice is short of
    `hosts` (the loop goes on meanwhile; before the last step it waits for
    them to be taken); their processes are appended to `workers` (the
    caller stops them). Returns {"done": one dict per completed step
    (step, offset, batch, devices, params, loss, t), "kills", "joins"
    (dicts with step, t and what), "redone": steps run again,
    "put_again": times the parameters were put again (kept_params)}."""
    workers = [] if workers is None else workers
    rng = random.Random(seed)
    s = client.slice(hosts, placement="spread", on_loss="shrink",
                     min_devices=min_devices, grow=True)
    grad = plexus.jit(jax.value_and_grad(model.loss), s, name="island_grad",
                      in_shardings=(None, plexus.split(0), plexus.split(0)),
                      out_shardings=plexus.partial())
    update = plexus.jit(lambda p, g, scale: p - scale * g, s, name="sgd")
    spec = plexus.Spec(model.flat.shape, "float32", plexus.partial())
    all_reduce = {}  # by slice.resizes: a builtin is made for one size
    p, last = s.put(model.flat), model.flat  # on the slice, and fetched
    run = {"done": [], "kills": [], "joins": [], "redone": 0, "put_again": 0}
    k, offset, handled = 0, 0, set()
    while k < steps:
        if k not in handled:  # once a step, not again when it is redone
            handled.add(k)
            if k in kill_steps:
                run["kills"].append(kill_one(cluster, s, rng, k))
            if k in join_steps and s.num_devices < hosts:
                run["joins"].append(join_workers(cluster, hosts - s.num_devices,
                                                 workers, k))
        if k == steps - 1 and run["joins"]:
            # The workers may still be starting: the last step is on all.
            while s.num_devices < hosts:
                if not await_resize(s, s.resizes):
                    raise RuntimeError("the slice did not grow back to "
                                       f"{hosts} within {WAIT_S} s")
        n, resizes = s.num_devices, s.resizes
        batch = rows * n
        x_k = model.x[offset:offset + batch]
        y_k = model.y[offset:offset + batch]
        try:
            if resizes not in all_reduce:
                all_reduce = {resizes: s.program("all_reduce", spec)}
            new_p, got, loss = sgd_step(s, grad, all_reduce[resizes], update,
                                        p, x_k, y_k, lr)
        except plexus.PlexusError as e:
            # A host went under this step: the slice shrinks (the client
            # hears of it) and the step runs again on the devices left.
            # (Or a resize heard before the step lost its parameters.)
            say(f"  step {k} on {n} devices raised ({type(e).__name__}: "
                f"{str(e)[:100]}...)")
            p, lost = kept_params(s, p, last, run, say)
            if not lost and not await_resize(s, resizes):
                raise RuntimeError(f"step {k} failed and the slice was not "
                                   f"resized: {e}") from e
            say(f"  step {k} runs again on {s.num_devices}")
            continue
        if s.resizes != resizes:
            # Done on the old size, but a value of it may have been lost
            # in the move: the same step again, from the same parameters.
            say(f"  step {k} done on {n} devices as the slice was resized "
                f"to {s.num_devices}; runs again")
            p, _ = kept_params(s, p, last, run, say)
            continue
        run["done"].append({"step": k, "offset": offset, "batch": batch,
                            "devices": n, "params": got, "loss": loss,
                            "t": time.monotonic()})
        say(f"step {k:3d}  devices {n}  batch {batch:3d}  loss {loss:.6f}")
        p, last, offset, k = new_p, got, offset + batch, k + 1
    return run


def check_shrinking(model, done, lr):
    """Applies the same steps in one process (jax.jit, the same rows and
    batch sizes) and compares each step's parameters. Returns
    (steps outside rtol 1e-5 / atol 1e-6, steps bit for bit equal,
    the largest absolute difference). One compile for every batch size:
    each batch is padded to the largest with rows of weight 0."""
    grad = jax.jit(jax.grad(
        lambda p, x, y, w: jnp.sum(w * model.row_losses(p, x, y))))
    most = max(d["batch"] for d in done)
    want = model.flat.copy()
    bad, same, worst = [], 0, 0.0
    for d in done:
        rows = slice(d["offset"], d["offset"] + most)
        x, y = model.x[rows], model.y[rows]
        if len(x) < most:  # the stream's end: any rows, of weight 0
            x = np.concatenate([x, model.x[:most - len(x)]])
            y = np.concatenate([y, model.y[:most - len(y)]])
        w = (np.arange(most) < d["batch"]).astype(np.float32)
        want = want - np.float32(lr / d["batch"]) * np.asarray(
            grad(want, x, y, w))
        diff = np.abs(d["params"] - want)
        worst = max(worst, float(diff.max()))
        same += bool(np.array_equal(d["params"], want))
        if not np.allclose(d["params"], want, rtol=1e-5, atol=1e-6):
            bad.append(d["step"])
    return bad, same, worst


RESIZE = re.compile(r"(shrank to|grew back to) (\d+) devices")


def spans(trace, cat):
    """(begin event, duration in us) of a trace's async events of `cat`."""
    begins = {e["id"]: e for e in trace["traceEvents"]
              if e.get("cat") == cat and e["ph"] == "b"}
    return [(begins[e["id"]], e["ts"] - begins[e["id"]]["ts"])
            for e in trace["traceEvents"]
            if e.get("cat") == cat and e["ph"] == "e" and e["id"] in begins]


def resize_events(trace):
    """The resizes of a client.trace file's events, in order: dicts with
    kind (shrink/grow), to (devices), server_ms (the resize at the server),
    loss_ms (a shrink: the server's handling of the loss it came from, from
    declaring the host lost, its "recovery" event), values (moved), bytes
    (the moved values' bytes on the new map; None where the event does not
    say: a shrink moves none between hosts) and name."""
    losses = [(b["ts"], us) for b, us in spans(trace, "recovery")
              if "its slices shrank" in b["name"]]
    out = []
    for b, us in spans(trace, "resize"):
        m = RESIZE.search(b["name"])
        values = re.search(r"(\d+) values moved", b["name"])
        moved = re.search(r"\((\d+) bytes\)", b["name"])
        kind = ("shrink" if m and m.group(1) == "shrank to"
                else "grow" if m else "resize")
        loss = [us for ts, us in losses if ts <= b["ts"]]
        out.append({"kind": kind, "to": int(m.group(2)) if m else None,
                    "server_ms": us / 1e3, "ts": b["ts"],
                    "loss_ms": loss[-1] / 1e3 if kind == "shrink" and loss
                    else None,
                    "values": int(values.group(1)) if values else None,
                    "bytes": int(moved.group(1)) if moved else None,
                    "name": b["name"]})
    return sorted(out, key=lambda r: r["ts"])


def to_next_step(run, event, devices=None):
    """Seconds from a kill or join to the next completed step (on
    `devices`, if given)."""
    for d in run["done"]:
        if d["t"] > event["t"] and devices in (None, d["devices"]):
            return d["t"] - event["t"]
    return None


def stop_workers(workers):
    """The joined workers exit with the server; any that did not is
    killed."""
    for w in workers:
        try:
            w.wait(timeout=10)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()


def main_shrink(args, kill_steps, join_steps):
    """--on-loss shrink: see the module's doc. Returns the exit code."""
    lr = args.lr if args.lr is not None else (
        0.5 if args.model == "mlp" else LR)
    model = shrink_model(args.model, args.steps * args.rows * args.hosts,
                         args.seed)
    trace_path = args.trace or os.path.join(
        tempfile.mkdtemp(prefix="plexus-shrink-"), "trace.json")
    workers, killed = [], []
    try:
        with plexus.local(hosts=args.hosts, log_file=args.log_file,
                          log_level="info" if args.log_file else "warn"
                          ) as cluster:
            with cluster.connect(name="elastic-shrink") as client:
                with client.trace(trace_path):
                    t0 = time.monotonic()
                    run = train_shrinking(
                        cluster, client, model, args.steps, args.rows, lr,
                        args.hosts, args.min_devices, kill_steps, join_steps,
                        args.seed, workers)
                    elapsed = time.monotonic() - t0
                killed = [k["what"] for k in run["kills"]]
    except plexus.ClusterExitError as e:
        # The workers this script SIGKILLed are named, and the server exits
        # with code 3 for them; anything else is not expected.
        pids = [re.search(r"pid (\d+)", k).group(1) for k in killed]
        other = [ln for ln in str(e).splitlines()[1:]
                 if not any(f"pid {p})" in ln and "SIGKILL" in ln
                            for p in pids)
                 and not (pids and ln.strip().startswith("plexus-server")
                          and ln.strip().endswith("exited with code 3"))]
        if other:
            raise
    finally:
        stop_workers(workers)
    with open(trace_path) as f:
        events = resize_events(json.load(f))
    sizes = [d["devices"] for d in run["done"]]
    print(f"{args.steps} steps in {elapsed:.1f} s, devices by step {sizes}, "
          f"{run['redone']} step(s) run again, parameters put again "
          f"{run['put_again']} time(s)")
    frm = args.hosts
    for r in events:
        moved = (f"{r['bytes']} bytes on the new map"
                 if r["bytes"] is not None else "no bytes between hosts")
        loss = (f" (the loss: {r['loss_ms']:.2f} ms)"
                if r["loss_ms"] is not None else "")
        print(f"resize: {r['kind']} {frm} -> {r['to']}: {r['server_ms']:.2f} "
              f"ms at the server{loss}, {r['values']} value(s) moved, "
              f"{moved}")
        frm = r["to"]
    for k in run["kills"]:
        print(f"killed {k['what']} before step {k['step']}: next step done "
              f"{to_next_step(run, k):.3f} s after the kill")
    for j in run["joins"]:
        print(f"joined {j['what']} before step {j['step']}: next step on "
              f"{args.hosts} devices done {to_next_step(run, j, args.hosts):.3f}"
              f" s after they started")
    bad, same, worst = check_shrinking(model, run["done"], lr)
    if bad:
        print(f"FAILED: steps {bad} differ from the one-process reference "
              f"(rtol 1e-5, atol 1e-6); largest difference {worst:.2e}")
        return 1
    print(f"all {len(run['done'])} steps match the one-process reference "
          f"(rtol 1e-5, atol 1e-6): {same} bit for bit, largest difference "
          f"{worst:.2e}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0,
                        help="the model's and the chaos's seed")
    parser.add_argument("--kill-steps", default="",
                        help="comma-separated steps in which a random worker "
                             "is SIGKILLed at a random moment")
    parser.add_argument("--snapshot-every", type=int, default=1)
    parser.add_argument("--log-file")
    parser.add_argument("--on-loss", choices=("wait", "shrink"),
                        default="wait",
                        help="wait: 3 hosts and a spare that takes a lost "
                        "host's place; shrink: no spare, the slice shrinks "
                        "and grows back (see above)")
    shrink = parser.add_argument_group("--on-loss shrink")
    shrink.add_argument("--model", choices=("transformer", "mlp"),
                        default="transformer")
    shrink.add_argument("--hosts", type=int, default=4)
    shrink.add_argument("--min-devices", type=int, default=2)
    shrink.add_argument("--rows", type=int, default=2,
                        help="rows (sequences) a device per step")
    shrink.add_argument("--lr", type=float, default=None,
                        help="default: 0.5 (mlp), 0.3 (transformer)")
    shrink.add_argument("--join-steps", default="",
                        help="comma-separated steps (from 0) before which "
                        "workers start, as many as the slice is short of "
                        "--hosts")
    shrink.add_argument("--trace", help="write the client's trace here")
    args = parser.parse_args(argv)
    kill_steps = [int(k) for k in args.kill_steps.split(",") if k]
    if args.on_loss == "shrink":
        return main_shrink(args, kill_steps,
                           [int(k) for k in args.join_steps.split(",") if k])
    with plexus.local(hosts=HOSTS, spare=1, log_file=args.log_file,
                      log_level="info" if args.log_file else "warn") as cluster:
        chaos = Chaos(cluster, kill_steps, args.seed,
                      snapshot_every=args.snapshot_every)
        with cluster.connect(name="elastic") as client:
            t0 = time.monotonic()
            losses = train(client, args.steps, args.seed, args.snapshot_every,
                           on_step=chaos)
            chaos.join()
            elapsed = time.monotonic() - t0
        st = cluster.status()
    for step, loss in enumerate(losses, 1):
        print(f"step {step:3d}  loss {loss:.6f}")
    for step, host, pid, at in chaos.kills:
        print(f"killed {host} (pid {pid}) {at * 1000:.1f} ms into step {step} "
              f"(seed {args.seed})")
    print("recovery " + json.dumps(st.get("recovery", {})))
    print(f"{args.steps} steps in {elapsed:.1f} s")
    print("losses " + json.dumps(losses))


if __name__ == "__main__":
    sys.exit(main())
