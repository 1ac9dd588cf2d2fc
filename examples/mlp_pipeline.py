"""Pipeline-parallel training of the same MLP: two stages on two hosts.

Stage 1 (the first layer) runs on a 1-device slice on one host, stage 2
(the second layer and the loss) on a 1-device slice on the other. Each
batch is cut into M micro-batches, run in GPipe order: all forwards, then
all backwards. The client only passes futures from one slice's programs to
programs compiled for the other slice; the runtime moves the activations
(stage 1's host -> stage 2's) and their gradients (back) worker to worker.
Gradients are summed over the micro-batches, and each stage updates its own
parameters on its own slice. A step is one program graph over both slices.

    python examples/mlp_pipeline.py --steps 200 --microbatches 4

On a cluster that is already running (two hosts or more; see
examples/example_cluster.py), add --address HOST:PORT.
"""
import argparse
import sys

import numpy as np

from example_cluster import add_cluster_args, example_client
from mlp_common import PARAM_NAMES, Kernels, train_and_check

LOSS_THRESHOLD = 0.3  # the final loss must be below this
STAGE = {"w1": 1, "b1": 1, "w2": 2, "b2": 2}  # which stage owns each parameter


class PipelineMLP:
    """The MLP's training step as calls on two slices, one per stage."""

    def __init__(self, client, stage1, stage2, lr, microbatches):
        self.client = client
        self.slices = {1: stage1, 2: stage2}
        self.k = {1: Kernels(stage1), 2: Kernels(stage2)}
        self.lr = lr
        self.microbatches = microbatches

    def put_params(self, params):
        """Copies each parameter to the slice of the stage that owns it."""
        return {n: self.slices[STAGE[n]].put(params[n]) for n in PARAM_NAMES}

    def put_batch(self, x, labels):
        """Cuts a batch into micro-batches: inputs to stage 1, labels to
        stage 2 (where the loss is computed)."""
        return ([self.slices[1].put(m) for m in np.split(x, self.microbatches)],
                [self.slices[2].put(m) for m in np.split(labels, self.microbatches)])

    def step(self, params, xs, labels):
        """One SGD step over all micro-batches. Returns (loss, grads, new
        params), all futures."""
        k1, k2 = self.k[1], self.k[2]
        w1, b1, w2, b2 = (params[n] for n in PARAM_NAMES)

        # Forward, every micro-batch. `h` is computed on stage 1 and read by
        # stage 2's programs: the runtime sends it to stage 2's host.
        saved, losses = [], []
        for x, y in zip(xs, labels):
            h_pre = k1.bias_add(k1.matmul(x, w1), b1)
            h = k1.relu(h_pre)
            logits = k2.bias_add(k2.matmul(h, w2), b2)
            losses.append(k2.softmax_xent(logits, y))
            saved.append((x, h_pre, h, logits, y))

        # Backward, last micro-batch first. `dh` goes back to stage 1's host.
        grads = {}
        for x, h_pre, h, logits, y in reversed(saved):
            dlogits = k2.softmax_xent_grad(logits, y)
            dh = k2.matmul(dlogits, w2, transpose_b=1)
            dh_pre = k1.relu_grad(h_pre, dh)
            g = {"w2": k2.matmul(h, dlogits, transpose_a=1),
                 "b2": k2.reduce_sum(dlogits, axis=0),
                 "w1": k1.matmul(x, dh_pre, transpose_a=1),
                 "b1": k1.reduce_sum(dh_pre, axis=0)}
            for n in PARAM_NAMES:  # accumulate, on the owning stage
                grads[n] = g[n] if n not in grads else \
                    self.k[STAGE[n]].add(grads[n], g[n])

        # Each micro-batch's loss and gradients are means over its own rows;
        # their mean over the micro-batches is the whole batch's.
        m = 1.0 / self.microbatches
        loss = losses[0]
        for l in losses[1:]:
            loss = k2.add(loss, l)
        loss = k2.scale(loss, factor=m)
        grads = {n: self.k[STAGE[n]].scale(g, factor=m) for n, g in grads.items()}
        new = {n: self.k[STAGE[n]].sgd_update(params[n], grads[n], lr=self.lr)
               for n in PARAM_NAMES}
        return loss, grads, new

    def graph_step(self, params, xs, labels):
        """`step` recorded as one program graph and submitted as a unit."""
        with self.client.graph():
            return self.step(params, xs, labels)


def train(client, args):
    stage1 = client.slice(1, placement="one_host")
    stage2 = client.slice(1, placement="one_host")
    hosts = [s.devices[0]["host"] for s in (stage1, stage2)]
    assert hosts[0] != hosts[1], f"both stages landed on {hosts[0]}"
    print(f"stage 1: {stage1}\nstage 2: {stage2}")
    if args.batch_size % args.microbatches:
        sys.exit(f"--batch-size {args.batch_size} must be a multiple of "
                 f"--microbatches {args.microbatches}")
    model = PipelineMLP(client, stage1, stage2, args.lr, args.microbatches)
    return train_and_check(model, args)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--train-examples", type=int, default=1024)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    add_cluster_args(parser)
    args = parser.parse_args(argv)

    # Embedded: one device per host, so each "one_host" slice gets a host of
    # its own.
    with example_client(args, "mlp-pipeline", hosts=2,
                        devices_per_host=1) as client:
        final_loss, err = train(client, args)
    if err > 1e-5:
        print(f"FAILED: Plexus and numpy differ by {err:.1e} (> 1e-5)")
        return 1
    print(f"final loss {final_loss:.4f} (threshold {LOSS_THRESHOLD})")
    return 0 if final_loss < LOSS_THRESHOLD else 1


if __name__ == "__main__":
    sys.exit(main())
