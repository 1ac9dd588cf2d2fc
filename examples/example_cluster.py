"""Where the examples run: an embedded cluster they start themselves (the
default, `plexus.local()`), or a cluster that is already running, named by
`--address HOST:PORT` (started by `plexus up`, a launcher of docs/DEPLOY.md,
or by hand). On an existing cluster the session opens as $PLEXUS_TENANT with
$PLEXUS_TENANT_TOKEN (or a token derived from $PLEXUS_CLUSTER_SECRET), as
`plexus.connect` does; a server off loopback refuses anonymous sessions.

`--save FILE` writes what a run computed (every step's loss or reward and
the final parameters) as a numpy .npz, so two runs can be compared bit for
bit: tests/test_netns_examples.py compares a cluster of hosts in network
namespaces with the embedded default that way.
"""
import contextlib

import numpy as np

import plexus


def add_cluster_args(parser):
    """--address, --save and --log-file."""
    parser.add_argument(
        "--address", metavar="HOST:PORT",
        help="run on the cluster whose server is at HOST:PORT instead of "
        "starting an embedded one (the tenant and its token come from "
        "$PLEXUS_TENANT and $PLEXUS_TENANT_TOKEN)")
    parser.add_argument(
        "--save", metavar="FILE.npz",
        help="write every step's result and the final parameters here")
    parser.add_argument("--log-file",
                        help="write the embedded cluster's log here")


@contextlib.contextmanager
def example_client(args, name, hosts, devices_per_host):
    """A client of the cluster at --address (closed at the end), or of an
    embedded cluster of `hosts` x `devices_per_host` (taken down at the
    end)."""
    if args.address:
        client = plexus.connect(args.address, name=name)
        try:
            yield client
        finally:
            client.close()
        return
    with plexus.local(hosts=hosts, devices_per_host=devices_per_host,
                      log_file=args.log_file) as cluster:
        yield cluster.connect(name=name)


def save_results(args, **arrays):
    """np.savez(--save, **arrays) when --save was given."""
    path = getattr(args, "save", None)
    if path:
        np.savez(path, **{k: np.asarray(v) for k, v in arrays.items()})
