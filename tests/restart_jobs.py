"""Jobs the server-restart and standby tests run through kills, each
compared bit for bit with the same job run with no kill."""
import os
import sys

import numpy as np

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def pipeline_job(client, steps):
    """examples/mlp_pipeline.py's two stages, each a 1-device slice on its
    own host with its own parameters (activations and their gradients move
    host to host inside each step's graph). Returns (run, stages): run(
    on_step=None) trains `steps` steps from the same start (on_step(step)
    is called as each step is issued) and returns (losses, final
    parameters as numpy arrays)."""
    sys.path.insert(0, EXAMPLES)
    from mlp_common import PARAM_NAMES, batches, init_params, make_dataset
    from mlp_pipeline import PipelineMLP

    stage1 = client.slice(1, placement="one_host")
    stage2 = client.slice(1, placement="one_host")
    assert stage1.devices[0]["host"] != stage2.devices[0]["host"]
    model = PipelineMLP(client, stage1, stage2, lr=0.5, microbatches=4)
    x, labels = make_dataset(256, seed=0)
    data = [model.put_batch(bx, bl) for bx, bl in batches(x, labels, 64)]

    def run(on_step=None):
        params = model.put_params(init_params(0))
        losses = []
        for step in range(1, steps + 1):
            if on_step is not None:
                on_step(step)
            loss, _, params = model.graph_step(
                params, *data[(step - 1) % len(data)])
            losses.append(np.asarray(loss).copy())
        return losses, {n: np.asarray(params[n]) for n in PARAM_NAMES}

    return run, (stage1, stage2)


def assert_same_run(got, want):
    """Two pipeline_job runs' (losses, parameters) are equal, bit for bit."""
    for step, (g, w) in enumerate(zip(got[0], want[0]), 1):
        np.testing.assert_array_equal(g, w, err_msg=f"step {step}")
    assert len(got[0]) == len(want[0])
    for n in want[1]:
        np.testing.assert_array_equal(got[1][n], want[1][n], err_msg=n)
