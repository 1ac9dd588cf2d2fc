"""A PyTorch GPT trained on Plexus: the torch.nn model of
examples/torch_gpt_model.py (embedding, layer norms, causal attention,
GELU MLP) with AdamW, data parallel over one 4-device slice on 2 hosts,
and checked against the same model trained by eager PyTorch.

plexus.torch turns the module's forward, the loss and AdamW's update into
JAX functions through torchax; plexus.jit lowers them, and the workers run
them. The parameters and AdamW's moments stay on the workers as futures;
each step puts its batch split over the slice, computes each island's
gradient, sums the islands' gradients with the runtime's all_reduce, and
updates.

    python examples/torch_gpt.py --steps 20
"""
import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plexus  # noqa: E402
import plexus.torch as pt  # noqa: E402
import torch_gpt_model as gpt  # noqa: E402


def train(client, steps, seed=0, on_step=None):
    """Data parallel over 4 devices spread over the hosts; the losses."""
    trainer = pt.DataParallel(
        gpt.GPT(seed), gpt.loss_fn,
        pt.AdamW(lr=gpt.LR, betas=gpt.BETAS, eps=gpt.EPS,
                 weight_decay=gpt.WEIGHT_DECAY),
        client.slice(4, placement="spread"))
    params, state = trainer.init()
    losses = []
    for step, (x, y) in enumerate(gpt.make_batches(steps, seed=seed), 1):
        loss, params, state = trainer.step(params, state,
                                           *trainer.put_batch(x, y))
        losses.append(float(np.asarray(loss)))
        if on_step is not None:
            on_step(step, losses[-1])
    return losses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--log-every", type=int, default=5)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()

    def on_step(step, loss):
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            print(f"step {step:3d}  loss {loss:.5f}  "
                  f"({time.perf_counter() - t0:.2f} s)", flush=True)

    with plexus.local(hosts=2, devices_per_host=2) as cluster:
        with cluster.connect(name="torch-gpt") as client:
            losses = train(client, args.steps, on_step=on_step)
    eager = gpt.train_eager(args.steps)
    err = max(abs(a - b) / abs(b) for a, b in zip(losses, eager))
    print(f"max relative error vs eager PyTorch {err:.2e}")
    threshold = 0.8 * losses[0]
    print(f"final loss {losses[-1]:.5f} (threshold {threshold:.5f})")
    return 0 if err <= 1e-5 and losses[-1] < threshold else 1


if __name__ == "__main__":
    sys.exit(main())
