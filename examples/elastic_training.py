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
"""
import argparse
import json
import os
import random
import signal
import sys
import threading
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plexus  # noqa: E402
from transformer import init_params, loss_fn, make_batches  # noqa: E402

HOSTS = 3
BATCH = 12  # 4 sequences per island
LR, BETA = 0.3, 0.9


def train(client, steps, seed=0, snapshot_every=1, on_step=None):
    """Momentum SGD, data parallel over a 3-device slice (one per host).
    Returns the losses. on_step(step) is called as each step is issued,
    before its calls are."""
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
    args = parser.parse_args(argv)
    kill_steps = [int(k) for k in args.kill_steps.split(",") if k]
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
    main()
