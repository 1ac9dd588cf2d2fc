"""A torch model cut into modules, trained as a plexus.pipeline."""
from .. import pipeline as _pipeline
from ._functional import Functional, jax_function
from ._program import jit


def pipeline(modules, slices, loss_fn, optimizer, schedule="1f1b"):
    """A plexus.pipeline.Pipeline training `modules` (nn.Modules applied in
    a row, module s on slices[s]) with `loss_fn(output, target)` (the mean
    loss of a micro-batch) and `optimizer` (AdamW), each stage keeping its
    own parameters and optimizer state as futures on its slice.

    Each stage's forward, backward (recomputing its forward from its saved
    input) and update are plexus.jit programs, compiled once; the first
    stage's input may be integer (token ids: no gradient flows into it).
    A step's loss and updates are those of eager PyTorch over the
    micro-batches together, to float32 rounding."""
    import jax
    if len(modules) != len(slices):
        raise ValueError(f"{len(modules)} modules for {len(slices)} slices")
    loss = jax_function(loss_fn)
    stages, params, states = [], [], []
    last = len(modules) - 1
    for s, (module, slice_) in enumerate(zip(modules, slices)):
        fn = Functional(module)
        p0 = fn.init_params()
        params.append(jax.tree_util.tree_map(slice_.put, p0))
        states.append(jax.tree_util.tree_map(slice_.put, optimizer.init(p0)))
        stages.append(_stage(fn, slice_, loss if s == last else None,
                             optimizer, first=(s == 0), name=f"stage{s}"))
    return _pipeline.Pipeline(stages, params=params, opt_state=states,
                              schedule=schedule)


def _stage(fn, slice_, loss, optimizer, first, name):
    """The plexus.pipeline.Stage of one module; `loss` on the last."""
    import jax
    update = jit(optimizer.update, slice_, name=f"{name}_adamw")
    if loss is None:
        forward = jit(fn, slice_, name=f"{name}_forward")

        def backward_fn(p, x, dy):
            if first:
                return None, jax.vjp(lambda q: fn(q, x), p)[1](dy)[0]
            gp, gx = jax.vjp(fn, p, x)[1](dy)
            return gx, gp
        backward = jit(backward_fn, slice_, name=f"{name}_backward")
        return _pipeline.Stage(
            slice_, forward=lambda p, x: (forward(p, x), x),
            backward=lambda p, x, dy: _pair(backward(p, x, dy), first),
            update=update, name=name)

    def stage_loss(p, x, y):
        return loss(fn(p, x), y)

    def loss_backward(p, x, y):
        gp, gx = jax.grad(stage_loss, argnums=(0, 1))(p, x, y)
        return gx, gp
    forward = jit(stage_loss, slice_, name=f"{name}_loss")
    backward = jit(loss_backward, slice_, name=f"{name}_backward")
    return _pipeline.Stage(
        slice_, forward=lambda p, x, y: (forward(p, x, y), (x, y)),
        backward=lambda p, saved, _: backward(p, *saved),
        update=update, name=name)


def _pair(out, first):
    """(dx, grads) from a backward program's outputs (a first stage's has
    no dx: its program returns (None, grads), and None is no output)."""
    return (None, out[1]) if first else (out[0], out[1])
