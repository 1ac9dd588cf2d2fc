"""plexus.pipeline with JAX stages: optimizer state (Adam's moments and step
count) carried per stage through Pipeline(opt_state=...), and gradients
summed over micro-batches in one call per micro-batch per stage, however
many tensors a stage has. Checked against one-process jax.jit training on
the same micro-batches."""
import numpy as np
import pytest

import plexus

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

LAYERS = 3       # per stage: 6 tensors (w, b) each
WIDTH = 8
M = 4            # micro-batches
LR, B1, B2, EPS = 1e-2, 0.9, 0.999, 1e-8


def init(seed):
    rng = np.random.default_rng(seed)
    def layers():
        return [{"w": (rng.standard_normal((WIDTH, WIDTH)) / 3).astype(
                    np.float32),
                 "b": np.zeros(WIDTH, np.float32)} for _ in range(LAYERS)]
    return layers(), layers()


def mlp(p, x):
    for layer in p:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x


def head_loss(p, h, y):
    return jnp.mean((mlp(p, h) - y) ** 2)


def adam(p, g, state):
    """One Adam step: (params, {"m", "v", "t"}) -> new ones."""
    t = state["t"] + 1
    m = jax.tree_util.tree_map(lambda m, g: B1 * m + (1 - B1) * g,
                               state["m"], g)
    v = jax.tree_util.tree_map(lambda v, g: B2 * v + (1 - B2) * g * g,
                               state["v"], g)
    scale = LR * jnp.sqrt(1 - B2 ** t) / (1 - B1 ** t)
    p = jax.tree_util.tree_map(
        lambda p, m, v: p - scale * m / (jnp.sqrt(v) + EPS), p, m, v)
    return p, {"m": m, "v": v, "t": t}


def adam_state(p):
    zeros = jax.tree_util.tree_map(np.zeros_like, p)
    return {"m": zeros, "v": jax.tree_util.tree_map(np.zeros_like, p),
            "t": np.zeros((), np.float32)}


def batches(steps, seed):
    rng = np.random.default_rng(seed + 1)
    for _ in range(steps):
        x = rng.standard_normal((M * 4, WIDTH)).astype(np.float32)
        yield x, np.sin(x)


def reference(steps, seed):
    """One process, jax.jit: the mean of the micro-batches' gradients."""
    p0, p1 = init(seed)
    s0, s1 = adam_state(p0), adam_state(p1)

    @jax.jit
    def step(p0, p1, s0, s1, xs, ys):
        def loss(p0, p1, x, y):
            return head_loss(p1, mlp(p0, x), y)
        losses, grads = jax.vmap(jax.value_and_grad(loss, argnums=(0, 1)),
                                 in_axes=(None, None, 0, 0))(p0, p1, xs, ys)
        g0, g1 = jax.tree_util.tree_map(lambda g: g.mean(0), grads)
        p0, s0 = adam(p0, g0, s0)
        p1, s1 = adam(p1, g1, s1)
        return p0, p1, s0, s1, losses.mean()

    out = []
    for x, y in batches(steps, seed):
        p0, p1, s0, s1, loss = step(p0, p1, s0, s1,
                                    x.reshape(M, -1, WIDTH),
                                    y.reshape(M, -1, WIDTH))
        out.append(float(loss))
    return out, p1


def test_adam_state_rides_with_each_stage_and_matches_jax_jit(client):
    steps, seed = 4, 3
    sa = client.slice(1)
    sb = client.slice(1)

    def backward0(p, x, dh):
        return jax.vjp(lambda q: mlp(q, x), p)[1](dh)[0]

    def backward1(p, h, y):
        gp, gh = jax.grad(head_loss, argnums=(0, 1))(p, h, y)
        return gh, gp

    fwd0 = plexus.jit(mlp, sa)
    bwd0 = plexus.jit(backward0, sa)
    fwd1 = plexus.jit(head_loss, sb)
    bwd1 = plexus.jit(backward1, sb)
    adam0, adam1 = plexus.jit(adam, sa), plexus.jit(adam, sb)
    stages = [
        plexus.pipeline.Stage(sa, forward=lambda p, x: (fwd0(p, x), x),
                              backward=lambda p, x, dh: (None,
                                                         bwd0(p, x, dh)),
                              update=adam0),
        plexus.pipeline.Stage(sb, forward=lambda p, h, y: (fwd1(p, h, y),
                                                           (h, y)),
                              backward=lambda p, saved, _: bwd1(p, *saved),
                              update=adam1),
    ]
    p0, p1 = init(seed)
    put = lambda s, tree: jax.tree_util.tree_map(s.put, tree)  # noqa: E731
    pipe = plexus.pipeline.Pipeline(
        stages, params=[put(sa, p0), put(sb, p1)],
        opt_state=[put(sa, adam_state(p0)), put(sb, adam_state(p1))])
    losses, calls = [], []
    for x, y in batches(steps, seed):
        before = client.counters()["calls"]
        out = pipe.step([sa.put(m) for m in np.split(x, M)],
                        [sb.put(m) for m in np.split(y, M)])
        calls.append(client.counters()["calls"] - before)
        losses.append(float(np.asarray(out.loss)))
    want, want_p1 = reference(steps, seed)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    assert float(np.asarray(pipe.opt_state[1]["t"])) == steps
    got_p1 = jax.tree_util.tree_map(np.asarray, pipe.params[1])
    for got, ref in zip(jax.tree_util.tree_leaves(got_p1),
                        jax.tree_util.tree_leaves(want_p1)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
    # Per step: a forward and a backward per micro-batch and stage (2*2*M),
    # M-1 gradient sums per stage (the first micro-batch's gradients start
    # the sum; the last sum also takes the mean), the loss's M-1 sums and
    # its mean (built-in, one scalar), one update per stage. 6 tensors a
    # stage, yet no call per tensor.
    assert calls == [4 * M + 2 * (M - 1) + M + 2] * steps


def test_state_without_an_update_is_refused(client):
    s = client.slice(1)
    stage = plexus.pipeline.Stage(s, forward=lambda p, x: (x, x),
                                  backward=lambda p, x, dy: (None, None))
    with pytest.raises(ValueError, match="stage 0 has optimizer state but "
                                         "no update"):
        plexus.pipeline.Pipeline([stage], params=[None],
                                 opt_state=[{"t": s.put(np.zeros(()))}])
