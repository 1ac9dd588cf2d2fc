"""The model the MLP examples train, in numpy: data, parameters, a reference
training step, and accuracy. The examples run the same step on Plexus and
check it against `reference_step`.

The task: 16 input features, 4 classes; each label is the argmax of a fixed
random linear "teacher", so the MLP (16 -> 32 relu -> 4) can learn it.
"""
import numpy as np

IN, HIDDEN, CLASSES = 16, 32, 4
PARAM_NAMES = ("w1", "b1", "w2", "b2")


def make_dataset(n, seed=0):
    """n examples (x float32[n, 16], labels int32[n]) from a linear teacher."""
    rng = np.random.default_rng(seed)
    teacher = np.random.default_rng(1234).standard_normal((IN, CLASSES))
    x = rng.standard_normal((n, IN)).astype(np.float32)
    labels = np.argmax(x @ teacher, axis=1).astype(np.int32)
    return x, labels


def init_params(seed=0):
    """He-initialised weights and zero biases, as float32 numpy arrays."""
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.standard_normal((IN, HIDDEN)) * np.sqrt(2 / IN)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.standard_normal((HIDDEN, CLASSES)) * np.sqrt(2 / HIDDEN)).astype(np.float32),
        "b2": np.zeros(CLASSES, np.float32),
    }


def batches(x, labels, batch_size):
    """The dataset cut into whole batches, in order."""
    n = len(x) // batch_size * batch_size
    return [(x[i:i + batch_size], labels[i:i + batch_size])
            for i in range(0, n, batch_size)]


def logits_of(params, x):
    h = np.maximum(x @ params["w1"] + params["b1"], 0)
    return h @ params["w2"] + params["b2"]


def accuracy(params, x, labels):
    return float(np.mean(np.argmax(logits_of(params, x), axis=1) == labels))


def reference_step(params, x, labels, lr):
    """One SGD step in float64 numpy: returns (loss, grads, new params)."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    n = len(x)
    h_pre = x @ p["w1"] + p["b1"]
    h = np.maximum(h_pre, 0)
    logits = h @ p["w2"] + p["b2"]
    z = logits - logits.max(axis=1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(n), labels].mean()
    dlogits = np.exp(log_probs)
    dlogits[np.arange(n), labels] -= 1
    dlogits /= n
    dh_pre = (dlogits @ p["w2"].T) * (h_pre > 0)
    grads = {"w1": x.T @ dh_pre, "b1": dh_pre.sum(0),
             "w2": h.T @ dlogits, "b2": dlogits.sum(0)}
    new = {k: p[k] - lr * grads[k] for k in PARAM_NAMES}
    return loss, grads, new


def rel_err(got, want):
    """max |got - want| / max |want|: the error relative to the array's scale."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def check_against_numpy(model, params_np, x, labels):
    """Runs one step of `model` (either example's: it has put_params,
    put_batch, graph_step and lr) on Plexus and in numpy from the same
    parameters; returns the largest relative error over the loss, the
    gradients and the new parameters."""
    loss, grads, new = model.graph_step(model.put_params(params_np),
                                        *model.put_batch(x, labels))
    ref_loss, ref_grads, ref_new = reference_step(params_np, x, labels,
                                                  model.lr)
    errs = [rel_err(np.asarray(loss), ref_loss)]
    errs += [rel_err(np.asarray(grads[n]), ref_grads[n]) for n in PARAM_NAMES]
    errs += [rel_err(np.asarray(new[n]), ref_new[n]) for n in PARAM_NAMES]
    return max(errs)


class Kernels:
    """Built-in kernels on one slice, called like functions and compiled once
    per (input shapes, dtypes, shardings, attributes), like jax.jit's cache:

        k = Kernels(slice_)
        h = k.relu(k.bias_add(k.matmul(x, w1), b1))
    """

    def __init__(self, slice_):
        self.slice = slice_
        self._programs = {}

    def __getattr__(self, kernel):
        if kernel.startswith("_"):
            raise AttributeError(kernel)

        def call(*args, **attrs):
            key = (kernel, tuple(sorted(attrs.items())),
                   tuple((a.shape, str(a.dtype), a.sharding) for a in args))
            program = self._programs.get(key)
            if program is None:
                program = self._programs[key] = self.slice.program(
                    kernel, *args, **attrs)
            return program(*args)

        return call


def train_and_check(model, args):
    """The examples' training loop: the dataset put once, batch by batch;
    one graph per step with the loss printed every --log-every steps; then
    test accuracy and one step checked against the numpy reference.
    Returns (final loss, that step's max relative error)."""
    import time
    x, labels = make_dataset(args.train_examples, seed=args.seed)
    x_test, labels_test = make_dataset(512, seed=args.seed + 1)
    data = [model.put_batch(bx, bl)
            for bx, bl in batches(x, labels, args.batch_size)]
    params = model.put_params(init_params(args.seed))

    t0 = time.perf_counter()
    loss, losses = None, []
    for step in range(1, args.steps + 1):
        loss, _, params = model.graph_step(params, *data[(step - 1) % len(data)])
        losses.append(loss)  # futures; fetched at the end for --save
        if step % args.log_every == 0 or step in (1, args.steps):
            print(f"step {step:4d}  loss {float(np.asarray(loss)):.4f}  "
                  f"({time.perf_counter() - t0:.2f} s)", flush=True)
    final_loss = float(np.asarray(loss))
    elapsed = time.perf_counter() - t0
    final = {n: np.asarray(params[n]) for n in PARAM_NAMES}
    if getattr(args, "save", None):
        from example_cluster import save_results
        save_results(args, losses=[np.asarray(l) for l in losses], **final)
    print(f"{args.steps} steps in {elapsed:.2f} s "
          f"({elapsed / args.steps * 1e3:.1f} ms/step); "
          f"test accuracy {accuracy(final, x_test, labels_test):.3f}")

    err = check_against_numpy(model, final, x[:args.batch_size],
                              labels[:args.batch_size])
    print(f"one step matches the numpy reference: max relative error {err:.1e}")
    return final_loss, err
