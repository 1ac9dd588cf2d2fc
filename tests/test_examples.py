"""The examples in examples/: each runs as a user would run it (a real
embedded cluster in a subprocess) and trains, and one training step of each
matches a float64 numpy reference."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import plexus
from conftest import PLEXUS_PYTHONPATH

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))

from mlp_common import PARAM_NAMES, init_params, make_dataset, reference_step, rel_err  # noqa: E402
from mlp_data_parallel import DataParallelMLP  # noqa: E402
from mlp_pipeline import PipelineMLP  # noqa: E402

FINAL = re.compile(r"^final loss ([0-9.]+) \(threshold ([0-9.]+)\)$")
CHECK = re.compile(r"max relative error ([0-9.e+-]+)")


def run_example(script, *args, timeout=120):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [PLEXUS_PYTHONPATH] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{script} exited with {proc.returncode}:\n{output}"
    lines = proc.stdout.strip().splitlines()
    final = FINAL.match(lines[-1])
    assert final, f"{script}'s last line is not 'final loss ...':\n{output}"
    loss, threshold = float(final.group(1)), float(final.group(2))
    assert loss < threshold, output
    check = CHECK.search(proc.stdout)
    assert check and float(check.group(1)) <= 1e-5, output
    losses = [float(m) for m in re.findall(r"^step +\d+ +loss ([0-9.]+)",
                                             proc.stdout, re.M)]
    return losses, loss


def test_data_parallel_example_trains_over_four_devices_on_two_hosts():
    losses, final = run_example("mlp_data_parallel.py", "--steps", "100",
                                "--hosts", "2", "--devices-per-host", "2")
    assert losses[0] > 1.5 and final < losses[0] / 5, losses


def test_pipeline_example_trains_with_four_microbatches():
    losses, final = run_example("mlp_pipeline.py", "--steps", "100",
                                "--microbatches", "4")
    assert losses[0] > 1.5 and final < losses[0] / 5, losses


@pytest.fixture(scope="module")
def one_device_hosts(tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "cluster.log"
    with plexus.local(hosts=2, devices_per_host=1, log_level="info",
                      log_file=str(log)) as c:
        yield c


def assert_steps_match_numpy(model, steps, batch_size=64, lr=0.5):
    """Runs `steps` chained steps on Plexus and in numpy from the same
    start; every loss, gradient and parameter agrees to 1e-5 relative."""
    x, labels = make_dataset(steps * batch_size, seed=7)
    params_np = init_params(seed=3)
    params = model.put_params(params_np)
    for i in range(steps):
        bx = x[i * batch_size:(i + 1) * batch_size]
        bl = labels[i * batch_size:(i + 1) * batch_size]
        loss, grads, params = model.graph_step(params, *model.put_batch(bx, bl))
        ref_loss, ref_grads, params_np = reference_step(params_np, bx, bl, lr)
        assert rel_err(np.asarray(loss), ref_loss) < 1e-5, (i, float(np.asarray(loss)), ref_loss)
        for n in PARAM_NAMES:
            assert grads[n].shape == ref_grads[n].shape
            assert grads[n].sharding == "replicated", (n, grads[n])
            assert rel_err(np.asarray(grads[n]), ref_grads[n]) < 1e-5, (i, n)
            assert rel_err(np.asarray(params[n]), params_np[n]) < 1e-5, (i, n)
    return params


def test_data_parallel_steps_match_numpy_over_four_devices(cluster):
    client = cluster.connect(name="dp-check")
    s = client.slice(4, placement="spread")
    assert s.num_hosts == 2
    model = DataParallelMLP(client, s, lr=0.5)
    x, _ = model.put_batch(*make_dataset(64))
    assert x.sharding == "split(0)"
    assert_steps_match_numpy(model, steps=3)
    client.close()


def test_pipeline_steps_match_numpy_across_two_hosts(one_device_hosts):
    client = one_device_hosts.connect(name="pipeline-check")
    stage1 = client.slice(1, placement="one_host")
    stage2 = client.slice(1, placement="one_host")
    assert stage1.devices[0]["host"] != stage2.devices[0]["host"]
    model = PipelineMLP(client, stage1, stage2, lr=0.5, microbatches=4)
    params = assert_steps_match_numpy(model, steps=3)
    # Each stage's parameters stay on that stage's slice.
    assert {n: params[n].slice.id for n in PARAM_NAMES} == {
        "w1": stage1.id, "b1": stage1.id, "w2": stage2.id, "b2": stage2.id}
    client.close()


def test_numpy_reference_gradients_match_finite_differences():
    # The reference the examples are checked against is itself right.
    x, labels = make_dataset(32, seed=5)
    params = {n: v.astype(np.float64) for n, v in init_params(seed=2).items()}
    params["b1"] += 0.1  # nonzero biases, so their gradients are exercised
    _, grads, _ = reference_step(params, x, labels, lr=0.0)
    rng = np.random.default_rng(0)
    eps = 1e-6
    for n in PARAM_NAMES:
        for _ in range(5):
            idx = tuple(rng.integers(d) for d in params[n].shape)
            up = {k: v.copy() for k, v in params.items()}
            down = {k: v.copy() for k, v in params.items()}
            up[n][idx] += eps
            down[n][idx] -= eps
            numeric = (reference_step(up, x, labels, 0.0)[0] -
                       reference_step(down, x, labels, 0.0)[0]) / (2 * eps)
            assert abs(numeric - grads[n][idx]) < 1e-6, (n, idx)


def run_shrink_example(model, *args, timeout=180):
    """examples/elastic_training.py --on-loss shrink: a 4-host slice with
    no spare trained through two SIGKILLs and workers joining. The example
    checks every step against one process applying the same batches and
    exits 1 if one differs. Returns (devices by step, resize lines)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [PLEXUS_PYTHONPATH] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "elastic_training.py"),
         "--on-loss", "shrink", "--model", model, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exited with {proc.returncode}:\n{output}"
    assert re.search(r"^all \d+ steps match the one-process reference",
                     proc.stdout, re.M), output
    sizes = re.search(r"devices by step \[([0-9, ]+)\]", proc.stdout)
    assert sizes, output
    # Each kill and join, with the time to the next step done after it.
    assert len(re.findall(r"^killed .* next step done [0-9.]+ s after the "
                          r"kill$", proc.stdout, re.M)) == 2, output
    assert re.search(r"^joined .* next step on 4 devices done [0-9.]+ s",
                     proc.stdout, re.M), output
    # The parameters of a step done are never lost in a shrink (replicated
    # values move, tests/test_shrink.py): the example's fallback unused.
    assert "parameters put again 0 time(s)" in proc.stdout, output
    return ([int(n) for n in sizes.group(1).split(",")],
            re.findall(r"^resize: (\w+ \d -> \d): [0-9.]+ ms at the server",
                       proc.stdout, re.M))


def assert_shrank_and_grew(sizes, resizes):
    # 4 -> 3 -> 2 at the kills, back to 4 by the last step.
    assert sizes[0] == 4 and 3 in sizes and 2 in sizes and sizes[-1] == 4, \
        sizes
    assert resizes[:2] == ["shrink 4 -> 3", "shrink 3 -> 2"], resizes
    assert resizes[-1].startswith("grow") and resizes[-1].endswith("-> 4"), \
        resizes


@pytest.mark.jax_heavy
def test_elastic_mlp_shrinks_and_grows_back_matching_one_process():
    assert_shrank_and_grew(*run_shrink_example(
        "mlp", "--rows", "4", "--steps", "8", "--kill-steps", "1,3",
        "--join-steps", "5"))


@pytest.mark.jax_heavy
def test_elastic_transformer_shrinks_and_grows_back_matching_one_process():
    assert_shrank_and_grew(*run_shrink_example(
        "transformer", "--steps", "6", "--kill-steps", "1,3",
        "--join-steps", "4"))
