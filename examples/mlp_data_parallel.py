"""Data-parallel training of a small MLP over two hosts.

One client drives a slice of 2*D virtual devices spread over 2 hosts. Each
batch is split over the slice (P("devices", None)); the parameters are
replicated. Every built-in kernel runs on its shard's local rows, so
gradients come out `partial` and one all_reduce per gradient turns them
into replicated values before the SGD update. Each step is one program
graph: its ~25 calls reach the server as one unit, and the loop never
waits for a step to finish except when it fetches a loss to print.

    python examples/mlp_data_parallel.py --steps 200 --hosts 2 --devices-per-host 1

On a cluster that is already running (examples/example_cluster.py):

    PLEXUS_TENANT=... PLEXUS_TENANT_TOKEN=... \
        python examples/mlp_data_parallel.py --address HOST:PORT
"""
import argparse
import sys


import plexus
from example_cluster import add_cluster_args, example_client
from mlp_common import PARAM_NAMES, Kernels, train_and_check

LOSS_THRESHOLD = 0.3  # the final loss must be below this


class DataParallelMLP:
    """The MLP's training step as calls of built-in kernels on one slice."""

    def __init__(self, client, slice_, lr):
        self.client = client
        self.slice = slice_
        self.k = Kernels(slice_)
        self.lr = lr

    def put_params(self, params):
        """Copies numpy parameters to every device of the slice."""
        return {n: self.slice.put(params[n], plexus.P()) for n in PARAM_NAMES}

    def put_batch(self, x, labels):
        """Splits a batch over the slice: each device gets its own rows."""
        return (self.slice.put(x, plexus.P("devices", None)),
                self.slice.put(labels, plexus.P("devices")))

    def step(self, params, x, labels):
        """One SGD step. Returns (loss, grads, new params), all futures; the
        loss is `partial` (fetching it sums the shards' parts)."""
        k = self.k
        # Forward, on each device's rows.
        h_pre = k.bias_add(k.matmul(x, params["w1"]), params["b1"])
        h = k.relu(h_pre)
        logits = k.bias_add(k.matmul(h, params["w2"]), params["b2"])
        loss = k.softmax_xent(logits, labels)             # partial
        # Backward. Contracting over the split batch axis gives partial sums.
        dlogits = k.softmax_xent_grad(logits, labels)     # split(0)
        grads = {
            "w2": k.matmul(h, dlogits, transpose_a=1),    # partial
            "b2": k.reduce_sum(dlogits, axis=0),          # partial
        }
        dh = k.matmul(dlogits, params["w2"], transpose_b=1)  # split(0)
        dh_pre = k.relu_grad(h_pre, dh)
        grads["w1"] = k.matmul(x, dh_pre, transpose_a=1)  # partial
        grads["b1"] = k.reduce_sum(dh_pre, axis=0)        # partial
        # Sum the partial gradients over every device of the slice.
        grads = {n: k.all_reduce(g) for n, g in grads.items()}  # replicated
        new = {n: k.sgd_update(params[n], grads[n], lr=self.lr)
               for n in PARAM_NAMES}
        return loss, grads, new

    def graph_step(self, params, x, labels):
        """`step` recorded as one program graph and submitted as a unit."""
        with self.client.graph():
            return self.step(params, x, labels)


def train(client, args):
    devices = args.hosts * args.devices_per_host
    s = client.slice(devices, axis_names=("devices",),
                     placement="spread" if args.hosts > 1 else "any")
    print(f"slice: {s}")
    if args.batch_size % devices:
        sys.exit(f"--batch-size {args.batch_size} must be a multiple of the "
                 f"{devices} devices")
    model = DataParallelMLP(client, s, args.lr)
    return train_and_check(model, args)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--devices-per-host", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--train-examples", type=int, default=1024)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    add_cluster_args(parser)
    args = parser.parse_args(argv)

    with example_client(args, "mlp-data-parallel", args.hosts,
                        args.devices_per_host) as client:
        final_loss, err = train(client, args)
    if err > 1e-5:
        print(f"FAILED: Plexus and numpy differ by {err:.1e} (> 1e-5)")
        return 1
    print(f"final loss {final_loss:.4f} (threshold {LOSS_THRESHOLD})")
    return 0 if final_loss < LOSS_THRESHOLD else 1


if __name__ == "__main__":
    sys.exit(main())
