"""Training a small decoder-only transformer three ways, with plexus.jit.

The model (plain JAX): token embedding + learned positions, two blocks of
(layer norm -> causal multi-head self-attention -> residual, layer norm ->
gelu MLP -> residual), a final layer norm, an output projection, and the
softmax cross-entropy of next-token prediction. It is trained with plain SGD
on a deterministic synthetic language (each sequence counts up modulo the
vocabulary with its own stride), three ways:

  reference      one process, `jax.jit` training step;
  pipeline       two stages on two hosts: stage 0 (embedding + block 1) and
                 stage 1 (block 2 + head + loss) each on a 1-device slice of
                 its own host; the batch is cut into micro-batches whose
                 activations and activation gradients travel between the
                 workers as futures; each stage sums its gradients over the
                 micro-batches and updates its own parameters on its slice;
  1F1B library   the same two stages driven by plexus.pipeline (1F1B);
  data parallel  one 4-device slice over 2 hosts (2 islands of 2 devices):
                 the batch is split over the slice, XLA's SPMD partitioner
                 reduces the gradient inside each island, and the runtime's
                 all_reduce sums it between islands.

All three follow the same arithmetic (the gradient of the mean loss over the
global batch), so their loss curves agree to float32 rounding.

    python examples/transformer.py --steps 30
"""
import argparse
import contextlib
import os
import sys
import time

import numpy as np

# This process's own XLA (the jax.jit reference) logs a harmless
# "Unsupported fusion type" error per compile; keep the output readable.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

import plexus  # noqa: E402

VOCAB, D_MODEL, HEADS, SEQ, BATCH, BLOCKS = 64, 32, 2, 16, 8, 2
LR = 0.5

# ---------------------------------------------------------------- data


def make_batches(steps, batch=BATCH, seed=0):
    """`steps` batches of int32 token sequences of length SEQ + 1: each
    sequence counts up from a random start with a random stride in {1, 2, 3},
    modulo VOCAB. Returns (inputs [B, SEQ], targets [B, SEQ]) per step."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        start = rng.integers(0, VOCAB, size=(batch, 1))
        stride = rng.integers(1, 4, size=(batch, 1))
        seq = ((start + stride * np.arange(SEQ + 1)) % VOCAB).astype(np.int32)
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


# ---------------------------------------------------------------- model


def init_params(seed=0):
    """Float32 numpy parameters: {"stage0": embedding + block 1, "stage1":
    block 2 + final norm + output projection}."""
    rng = np.random.default_rng(seed)

    def dense(n_in, n_out):
        w = rng.normal(0, 1 / np.sqrt(n_in), (n_in, n_out))
        return w.astype(np.float32), np.zeros(n_out, np.float32)

    def block():
        p = {"ln1_g": np.ones(D_MODEL, np.float32),
             "ln1_b": np.zeros(D_MODEL, np.float32),
             "ln2_g": np.ones(D_MODEL, np.float32),
             "ln2_b": np.zeros(D_MODEL, np.float32)}
        p["qkv_w"], p["qkv_b"] = dense(D_MODEL, 3 * D_MODEL)
        p["out_w"], p["out_b"] = dense(D_MODEL, D_MODEL)
        p["mlp1_w"], p["mlp1_b"] = dense(D_MODEL, 4 * D_MODEL)
        p["mlp2_w"], p["mlp2_b"] = dense(4 * D_MODEL, D_MODEL)
        return p

    stage0 = {"tok": rng.normal(0, 0.5, (VOCAB, D_MODEL)).astype(np.float32),
              "pos": rng.normal(0, 0.1, (SEQ, D_MODEL)).astype(np.float32),
              "block": block()}
    head_w, head_b = dense(D_MODEL, VOCAB)
    stage1 = {"block": block(), "ln_g": np.ones(D_MODEL, np.float32),
              "ln_b": np.zeros(D_MODEL, np.float32),
              "head_w": head_w, "head_b": head_b}
    return {"stage0": stage0, "stage1": stage1}


def layer_norm(x, g, b):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g + b


def attention(p, x):
    b, t, d = x.shape
    dh = d // HEADS
    qkv = x @ p["qkv_w"] + p["qkv_b"]
    q, k, v = (a.reshape(b, t, HEADS, dh).transpose(0, 2, 1, 3)
               for a in jnp.split(qkv, 3, axis=-1))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh).astype(np.float32)
    causal = jnp.tril(jnp.ones((t, t), bool))
    scores = jnp.where(causal, scores, jnp.float32(-1e9))
    out = jax.nn.softmax(scores, axis=-1) @ v
    return out.transpose(0, 2, 1, 3).reshape(b, t, d) @ p["out_w"] + p["out_b"]


def block(p, x):
    x = x + attention(p, layer_norm(x, p["ln1_g"], p["ln1_b"]))
    h = jax.nn.gelu(layer_norm(x, p["ln2_g"], p["ln2_b"]) @ p["mlp1_w"]
                    + p["mlp1_b"])
    return x + h @ p["mlp2_w"] + p["mlp2_b"]


def stage0_forward(p, tokens):
    """Embedding + block 1: int32 [b, SEQ] -> float32 [b, SEQ, D_MODEL]."""
    return block(p["block"], p["tok"][tokens] + p["pos"])


def stage1_loss(p, h, targets, global_batch):
    """Block 2 + head + cross-entropy, summed over this part of the batch
    and divided by the global token count: the parts' losses (and their
    gradients) add up to the mean over the global batch."""
    x = block(p["block"], h)
    logits = layer_norm(x, p["ln_g"], p["ln_b"]) @ p["head_w"] + p["head_b"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)
    return jnp.sum(nll) / (global_batch * SEQ)


def loss_fn(params, tokens, targets, global_batch):
    h = stage0_forward(params["stage0"], tokens)
    return stage1_loss(params["stage1"], h, targets, global_batch)


def sgd(params, grads, lr=LR):
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)


# ---------------------------------------------------------------- training


@contextlib.contextmanager
def _client(cluster_or_client, name):
    """The client itself, or a new client of the cluster, closed (with its
    slices) at the end."""
    if isinstance(cluster_or_client, plexus.Client):
        yield cluster_or_client
        return
    client = cluster_or_client.connect(name=name)
    try:
        yield client
    finally:
        client.close()


def _report(on_step, step, loss, wait_for):
    """Calls on_step(step, loss); before step 1's, waits until everything
    step 1 computed is ready (so every program is compiled and loaded)."""
    if on_step is None:
        return
    if step == 1:
        for f in jax.tree_util.tree_leaves(wait_for):
            f.block_until_ready()
    on_step(step, loss)


def train_reference(steps=30, batch=BATCH, seed=0, lr=LR, on_step=None):
    """One process, one `jax.jit` SGD step per batch. Returns the losses."""
    step_fn = jax.jit(lambda p, x, y: _sgd_step(p, x, y, batch, lr))
    params = jax.tree_util.tree_map(jnp.asarray, init_params(seed))
    losses = []
    for step, (x, y) in enumerate(make_batches(steps, batch, seed), 1):
        loss, params = step_fn(params, x, y)
        losses.append(float(loss))
        if on_step:
            on_step(step, losses[-1])
    return losses


def _sgd_step(params, x, y, batch, lr):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y, batch)
    return loss, sgd(params, grads, lr)


def stage_slices(client):
    """Two 1-device slices on two different workers. The server places a
    new slice on the least-loaded host; slices that land next to stage 0
    are held until one lands elsewhere, then released."""
    first = client.slice(1, placement="one_host")
    extra = []
    for _ in range(16):
        s = client.slice(1, placement="one_host")
        if s.devices[0]["worker"] != first.devices[0]["worker"]:
            for e in extra:
                e.close()
            return first, s
        extra.append(s)
    raise RuntimeError("could not place the two stages on different workers")


def train_pipeline(cluster_or_client, steps=30, microbatches=4, batch=BATCH,
                   seed=0, lr=LR, on_step=None, info=None):
    """Two pipeline stages on two workers, GPipe order, one program graph
    per step. Returns the losses; `info` (a dict) gets the stages' workers.
    on_step(step, loss) is called after each step."""
    with _client(cluster_or_client, "transformer-pipeline") as client:
        return _pipeline(client, steps, microbatches, batch, seed, lr,
                         on_step, info)


def _pipeline(client, steps, microbatches, batch, seed, lr, on_step, info):
    s0, s1 = stage_slices(client)
    if info is not None:
        info["workers"] = [s.devices[0]["worker"] for s in (s0, s1)]
    if batch % microbatches:
        raise ValueError(f"batch {batch} must be a multiple of "
                         f"microbatches {microbatches}")

    # Each micro-batch's loss and gradients are its part of the global
    # batch's mean (stage1_loss divides by the global token count), so the
    # sums over micro-batches are the global batch's loss and gradient.
    def stage1_step(p, h, targets, acc):
        """Forward, loss and backward of stage 1: returns the loss, acc plus
        the parameters' gradient, and d loss / d h."""
        loss, (gp, gh) = jax.value_and_grad(stage1_loss, argnums=(0, 1))(
            p, h, targets, batch)
        return loss, jax.tree_util.tree_map(jnp.add, acc, gp), gh

    def stage0_backward(p, tokens, dh, acc):
        """Recomputes stage 0's forward and adds its gradient to acc."""
        _, vjp = jax.vjp(lambda q: stage0_forward(q, tokens), p)
        return jax.tree_util.tree_map(jnp.add, acc, vjp(dh)[0])

    fwd0 = plexus.jit(stage0_forward, s0, name="stage0_forward")
    bwd0 = plexus.jit(stage0_backward, s0, name="stage0_backward")
    step1 = plexus.jit(stage1_step, s1, name="stage1_step")
    update0 = plexus.jit(lambda p, g: sgd(p, g, lr), s0, name="stage0_sgd")
    update1 = plexus.jit(lambda p, g, losses: (sgd(p, g, lr), sum(losses)),
                         s1, name="stage1_sgd")

    params = init_params(seed)
    p0 = jax.tree_util.tree_map(s0.put, params["stage0"])
    p1 = jax.tree_util.tree_map(s1.put, params["stage1"])
    zeros = lambda tree, s: jax.tree_util.tree_map(  # noqa: E731
        lambda a: s.put(np.zeros_like(a)), tree)
    acc0_init = zeros(params["stage0"], s0)
    acc1_init = zeros(params["stage1"], s1)
    data = [([s0.put(m) for m in np.split(x, microbatches)],
             [s1.put(m) for m in np.split(y, microbatches)])
            for x, y in make_batches(steps, batch, seed)]

    losses = []
    for step, (xs, ys) in enumerate(data, 1):
        with client.graph():
            hs = [fwd0(p0, x) for x in xs]          # activations: s0 -> s1
            acc0, acc1, mb_losses = acc0_init, acc1_init, [None] * microbatches
            for m in reversed(range(microbatches)):
                mb_losses[m], acc1, dh = step1(p1, hs[m], ys[m], acc1)
                acc0 = bwd0(p0, xs[m], dh, acc0)   # dh: s1 -> s0
            p0 = update0(p0, acc0)
            p1, loss = update1(p1, acc1, mb_losses)
        losses.append(float(np.asarray(loss)))
        _report(on_step, step, losses[-1], (p0, p1))
    return losses


def train_pipeline_library(cluster_or_client, steps=30, microbatches=4,
                           schedule="1f1b", batch=BATCH, seed=0, lr=LR,
                           on_step=None, info=None):
    """The same two stages through plexus.pipeline (1F1B by default): the
    library decides when each stage's forward and backward run, sums and
    averages the gradients and the loss, and calls the updates. Each
    micro-batch's loss is its own mean, so the average over micro-batches
    is the global batch's mean."""
    with _client(cluster_or_client, "transformer-pipeline-lib") as client:
        s0, s1 = stage_slices(client)
        if info is not None:
            info["workers"] = [s.devices[0]["worker"] for s in (s0, s1)]
        mb = batch // microbatches

        def backward0(p, tokens, dh):
            _, vjp = jax.vjp(lambda q: stage0_forward(q, tokens), p)
            return vjp(dh)[0]

        def loss1(p, h, targets):
            return stage1_loss(p, h, targets, mb)

        def backward1(p, h, targets):
            gp, gh = jax.grad(loss1, argnums=(0, 1))(p, h, targets)
            return gh, gp

        fwd0 = plexus.jit(stage0_forward, s0, name="lib_stage0_forward")
        bwd0 = plexus.jit(backward0, s0, name="lib_stage0_backward")
        fwd1 = plexus.jit(loss1, s1, name="lib_stage1_loss")
        bwd1 = plexus.jit(backward1, s1, name="lib_stage1_backward")
        sgd0 = plexus.jit(lambda p, g: sgd(p, g, lr), s0, name="lib_sgd0")
        sgd1 = plexus.jit(lambda p, g: sgd(p, g, lr), s1, name="lib_sgd1")
        stages = [
            plexus.pipeline.Stage(
                s0, forward=lambda p, x: (fwd0(p, x), x),
                backward=lambda p, x, dh: (None, bwd0(p, x, dh)),
                update=sgd0, name="embedding + block 1"),
            plexus.pipeline.Stage(
                s1, forward=lambda p, h, y: (fwd1(p, h, y), (h, y)),
                backward=lambda p, saved, _: bwd1(p, *saved),
                update=sgd1, name="block 2 + head"),
        ]
        params = init_params(seed)
        pipe = plexus.pipeline.Pipeline(
            stages, schedule=schedule,
            params=[jax.tree_util.tree_map(s0.put, params["stage0"]),
                    jax.tree_util.tree_map(s1.put, params["stage1"])])
        losses = []
        for step, (x, y) in enumerate(make_batches(steps, batch, seed), 1):
            out = pipe.step([s0.put(m) for m in np.split(x, microbatches)],
                            [s1.put(m) for m in np.split(y, microbatches)])
            losses.append(float(np.asarray(out.loss)))
            _report(on_step, step, losses[-1], out.params)
        return losses


def train_data_parallel(cluster_or_client, steps=30, batch=BATCH, seed=0,
                        lr=LR, on_step=None, info=None):
    """Data parallel over one 4-device slice spanning 2 hosts. Returns the
    losses; `info` (a dict) gets the slice's devices. on_step(step, loss) is
    called after each step."""
    with _client(cluster_or_client, "transformer-data-parallel") as client:
        return _data_parallel(client, steps, batch, seed, lr, on_step, info)


def _data_parallel(client, steps, batch, seed, lr, on_step, info):
    s = client.slice(4, placement="spread")
    if info is not None:
        info["devices"] = s.devices
    params = init_params(seed)
    flat, unravel = ravel_pytree(params)

    def island_grad(p, x, y):
        """This island's addend of the global mean loss and of its gradient,
        as one flat vector. Inside the island the batch is split over the
        devices and XLA sums the gradient itself."""
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y, batch)
        return loss, ravel_pytree(grads)[0]

    grad = plexus.jit(island_grad, s, name="island_grad",
                      in_shardings=(None, plexus.split(0), plexus.split(0)),
                      out_shardings=plexus.partial())
    # The runtime's all-reduce between islands: partial -> replicated.
    all_reduce = s.program("all_reduce", plexus.Spec(flat.shape, "float32",
                                                     plexus.partial()))
    update = plexus.jit(lambda p, g: sgd(p, unravel(g), lr), s, name="sgd")

    p = jax.tree_util.tree_map(s.put, params)
    data = [(s.put(x, plexus.split(0)), s.put(y, plexus.split(0)))
            for x, y in make_batches(steps, batch, seed)]
    losses = []
    for step, (x, y) in enumerate(data, 1):
        with client.graph():
            loss, g = grad(p, x, y)               # partial over islands
            p = update(p, all_reduce(g))          # replicated
        # A partial value is fetched as the sum of its islands' addends.
        losses.append(float(np.asarray(loss)))
        _report(on_step, step, losses[-1], p)
    return losses


# ------------------------------------------------- a 3-axis mesh (hybrid)

MESH = {"data": 2, "fsdp": 2, "tensor": 2}
BATCH_SPEC = ("data", "fsdp")  # dimension 0 of the batch


# Matrices split over tensor (rows) and fsdp (columns). (With ("fsdp",
# "tensor") jax.jit itself over 8 CPU devices, jax 0.10.2, computes
# gradients 3e-2 away from the unsharded ones; Plexus, whose islands
# partition over (fsdp, tensor) only, does not: tests/test_mesh_training.py.)
MATRIX_SPEC = ("tensor", "fsdp")


def param_specs(params, matrix_spec=MATRIX_SPEC):
    """Each parameter's PartitionSpec entries over MESH: matrices by
    `matrix_spec`, vectors over tensor; all are replicated over data."""
    return jax.tree_util.tree_map(
        lambda w: matrix_spec if w.ndim == 2 else ("tensor",), params)


def train_mesh(cluster_or_client, steps=30, batch=BATCH, seed=0, lr=LR,
               on_step=None, info=None, matrix_spec=MATRIX_SPEC):
    """Data parallel across 2 islands, FSDP and tensor parallel inside each:
    one slice of 8 devices, mesh {data: 2, fsdp: 2, tensor: 2} with "data"
    across hosts (dcn_axes). Inside an island XLA partitions the step over
    (fsdp, tensor) as jax.jit would; between islands the runtime sums the
    islands' gradients (partial -> all_reduce). Returns the losses; `info`
    gets the slice's devices."""
    with _client(cluster_or_client, "transformer-mesh") as client:
        s = client.slice(mesh=MESH, dcn_axes=("data",))
        try:
            return _mesh(client, s, steps, batch, seed, lr, on_step, info,
                         matrix_spec)
        finally:
            s.close()


def _mesh(client, s, steps, batch, seed, lr, on_step, info, matrix_spec):
    if info is not None:
        info["devices"] = s.devices
    params = init_params(seed)
    specs = jax.tree_util.tree_map(lambda e: plexus.P(*e),
                                   param_specs(params, matrix_spec),
                                   is_leaf=lambda x: isinstance(x, tuple))
    flat, unravel = ravel_pytree(params)
    data_spec = plexus.P(BATCH_SPEC)

    def island_grad(p, x, y):
        """This island's addend of the loss and gradient (its half of the
        batch); inside the island the batch is split over fsdp, the weights
        over tensor and fsdp, and XLA inserts the collectives."""
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y, batch)
        return loss, ravel_pytree(grads)[0]

    grad = plexus.jit(island_grad, s, name="mesh_grad",
                      in_shardings=(specs, data_spec, data_spec),
                      out_shardings=plexus.partial())
    all_reduce = s.program("all_reduce", plexus.Spec(flat.shape, "float32",
                                                     plexus.partial()))
    update = plexus.jit(lambda p, g: sgd(p, unravel(g), lr), s,
                        name="mesh_sgd", out_shardings=specs)
    p = jax.tree_util.tree_map(s.put, params, specs)
    data = [(s.put(x, data_spec), s.put(y, data_spec))
            for x, y in make_batches(steps, batch, seed)]
    losses = []
    for step, (x, y) in enumerate(data, 1):
        with client.graph():
            loss, g = grad(p, x, y)
            p = update(p, all_reduce(g))
        losses.append(float(np.asarray(loss)))
        _report(on_step, step, losses[-1], p)
    return losses


def train_mesh_reference(steps=30, batch=BATCH, seed=0, lr=LR):
    """One process, `jax.jit` over 8 devices with MESH and the same
    shardings as train_mesh (run it with
    XLA_FLAGS=--xla_force_host_platform_device_count=8). Returns the
    losses."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    devices = np.array(jax.devices()[:8]).reshape(tuple(MESH.values()))
    mesh = Mesh(devices, tuple(MESH))
    params = init_params(seed)
    shard = jax.tree_util.tree_map(
        lambda e: NamedSharding(mesh, PartitionSpec(*e)), param_specs(params),
        is_leaf=lambda x: isinstance(x, tuple))
    data = NamedSharding(mesh, PartitionSpec(BATCH_SPEC))
    step_fn = jax.jit(lambda p, x, y: _sgd_step(p, x, y, batch, lr),
                      in_shardings=(shard, data, data),
                      out_shardings=(NamedSharding(mesh, PartitionSpec()),
                                     shard))
    p = jax.device_put(params, shard)
    losses = []
    for x, y in make_batches(steps, batch, seed):
        loss, p = step_fn(p, x, y)
        losses.append(float(loss))
    return losses


# ---------------------------------------------------------------- main


def max_rel_diff(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.abs(b)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--log-file", help="write the cluster's log here")
    parser.add_argument("--mesh-reference", action="store_true",
                        help="print the 3-axis-mesh jax.jit reference's "
                        "losses as JSON and exit (needs 8 JAX devices)")
    args = parser.parse_args(argv)
    if args.mesh_reference:
        import json
        print(json.dumps(train_mesh_reference(args.steps, seed=args.seed)))
        return 0

    def progress(what):
        """Prints step 1 (which compiles), every --log-every'th and the last."""
        t0 = time.perf_counter()

        def on_step(step, loss):
            if step == 1 or step % args.log_every == 0 or step == args.steps:
                print(f"  {what:13} step {step:3d}  loss {loss:.5f}  "
                      f"({time.perf_counter() - t0:.2f} s)", flush=True)
        return on_step

    curves, times = {}, {}
    t = time.perf_counter()
    curves["reference"] = train_reference(args.steps, seed=args.seed,
                                          on_step=progress("reference"))
    times["reference"] = time.perf_counter() - t
    with plexus.local(hosts=2, devices_per_host=2,
                      log_file=args.log_file) as cluster:
        t = time.perf_counter()
        info = {}
        curves["pipeline"] = train_pipeline(
            cluster, args.steps, args.microbatches, seed=args.seed,
            on_step=progress("pipeline"), info=info)
        times["pipeline"] = time.perf_counter() - t
        print(f"pipeline stages ran on workers {info['workers']}")
        t = time.perf_counter()
        curves["1F1B library"] = train_pipeline_library(
            cluster, args.steps, args.microbatches, seed=args.seed,
            on_step=progress("1F1B library"))
        times["1F1B library"] = time.perf_counter() - t
        t = time.perf_counter()
        curves["data parallel"] = train_data_parallel(
            cluster, args.steps, seed=args.seed,
            on_step=progress("data parallel"))
        times["data parallel"] = time.perf_counter() - t

    names = list(curves)
    print("\nstep  " + "  ".join(f"{n:>14}" for n in names))
    for i in range(args.steps):
        print(f"{i + 1:4d}  " + "  ".join(f"{curves[n][i]:14.6f}"
                                           for n in names))
    print("\n" + "  ".join(f"{n}: {times[n]:.1f} s" for n in names))
    failed = False
    for n in names[1:]:
        err = max_rel_diff(curves[n], curves["reference"])
        ok = err <= args.tolerance
        failed |= not ok
        print(f"{n} vs reference: max relative difference {err:.2e} "
              f"({'ok' if ok else 'FAILED'}, tolerance {args.tolerance:.0e})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
