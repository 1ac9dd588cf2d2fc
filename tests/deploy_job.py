"""The job the launcher tests run on a cluster a launcher started: the
data-parallel example (examples/mlp_data_parallel.py) trained on the
cluster at $PLEXUS_ADDRESS, one step checked against numpy; what it saw is
written as JSON to --out.

    PLEXUS_ADDRESS=host:7070 python3 tests/deploy_job.py --hosts 1 \\
        --devices-per-host 2 --steps 100 --out result.json
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import plexus  # noqa: E402
from mlp_data_parallel import LOSS_THRESHOLD, train  # noqa: E402


def run(client, hosts, devices_per_host, steps):
    """The example's training on `client`'s cluster: (final loss, the
    checked step's max relative error)."""
    args = argparse.Namespace(
        steps=steps, hosts=hosts, devices_per_host=devices_per_host,
        batch_size=64, lr=0.5, train_examples=1024, log_every=25, seed=0)
    return train(client, args)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("--devices-per-host", type=int, required=True)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    client = plexus.connect(name="deploy-job")
    try:
        final_loss, err = run(client, a.hosts, a.devices_per_host, a.steps)
    finally:
        client.close()
    st = plexus.status()
    Path(a.out).write_text(json.dumps({
        "final_loss": final_loss, "max_rel_err": err,
        "threshold": LOSS_THRESHOLD,
        "hosts": sorted(w["host_name"] for w in st["workers"] if w["alive"]),
        "data_addresses": sorted(w["data_address"] for w in st["workers"]
                                 if w["alive"]),
    }))
    return 0 if final_loss < LOSS_THRESHOLD and err <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
