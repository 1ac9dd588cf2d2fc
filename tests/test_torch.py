"""plexus.torch: a small PyTorch GPT (examples/torch_gpt_model.py) trained
with AdamW on a real cluster of 2 hosts x 2 devices, data parallel over
both hosts and as a 4-stage 1F1B pipeline, matching the same model trained
by eager PyTorch with torch.optim.AdamW, every program compiled once; an
RL loop with a PyTorch reward model between a JAX sampler and a JAX
trainer (examples/rl_torch_reward.py), equal to the same loop in one
process, with nothing passing through the client; and the errors a torch
user sees for an op that does not lower and for a tensor of the wrong
dtype or device."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import plexus
from chaos import kill_host
from conftest import PLEXUS_PYTHONPATH

torch = pytest.importorskip("torch")
pytest.importorskip("torchax")
import plexus.torch as pt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import rl_torch_reward as rl_torch  # noqa: E402
import torch_gpt_model as gpt  # noqa: E402

STEPS = 20
TOLERANCE = 1e-5


def xla_compiles(cluster):
    return sum(w["stats"]["xla_compiles"]
               for w in cluster.status(fresh=True)["workers"])


def optimizer():
    return pt.AdamW(lr=gpt.LR, betas=gpt.BETAS, eps=gpt.EPS,
                    weight_decay=gpt.WEIGHT_DECAY)


@pytest.fixture(scope="module")
def eager():
    return gpt.train_eager(STEPS)


def train_data_parallel(client, steps, on_step=None):
    trainer = pt.DataParallel(gpt.GPT(0), gpt.loss_fn, optimizer(),
                              client.slice(4, placement="spread"))
    params, state = trainer.init()
    losses = []
    for step, (x, y) in enumerate(gpt.make_batches(steps), 1):
        loss, params, state = trainer.step(params, state,
                                           *trainer.put_batch(x, y))
        losses.append(float(np.asarray(loss)))
        if on_step is not None:
            on_step(step, params)
    return losses


@pytest.mark.jax_heavy
def test_data_parallel_over_two_hosts_matches_eager_pytorch_adamw(
        cluster, client, eager):
    compiles = [xla_compiles(cluster)]

    def after_step_1(step, params):
        if step == 1:
            plexus.wait(list(params.values()))
            compiles.append(xla_compiles(cluster))
    losses = train_data_parallel(client, STEPS, on_step=after_step_1)
    compiles.append(xla_compiles(cluster))
    np.testing.assert_allclose(losses, eager, rtol=TOLERANCE)
    assert losses[-1] < 0.8 * losses[0], losses
    # Step 1 compiled the gradient and update programs on each of the two
    # workers (and the built-in all_reduce); nothing compiled after it.
    assert compiles[1] > compiles[0] and compiles[2] == compiles[1], compiles


@pytest.mark.jax_heavy
def test_four_stage_1f1b_pipeline_matches_eager_pytorch_adamw(
        cluster, client, eager):
    model = gpt.GPT(0)
    slices = [client.slice(1) for _ in model.stages()]
    pipe = pt.pipeline(model.stages(), slices, gpt.loss_fn, optimizer())
    M = 4
    compiles, losses = [xla_compiles(cluster)], []
    for step, (x, y) in enumerate(gpt.make_batches(STEPS), 1):
        out = pipe.step(
            [pt.put(slices[0], m) for m in x.chunk(M)],
            [pt.put(slices[-1], m) for m in y.chunk(M)])
        losses.append(float(np.asarray(out.loss)))
        if step == 1:
            out.block_until_ready()
            compiles.append(xla_compiles(cluster))
    compiles.append(xla_compiles(cluster))
    np.testing.assert_allclose(losses, eager, rtol=TOLERANCE)
    assert compiles[1] > compiles[0] and compiles[2] == compiles[1], compiles


def bytes_sent(status, host):
    """The bytes `host`'s worker has sent to other workers."""
    return sum(w["stats"].get("bytes_sent", 0) for w in status["workers"]
               if w["alive"] and w["host_name"] == host)


@pytest.mark.parametrize("sync_every", [0, 2])
def test_rl_loop_with_a_torch_reward_model_matches_one_process(
        cluster, client, sync_every):
    # The JAX sampler and trainer on host0's two devices, the torch reward
    # model on host1: batches and rewards cross hosts at every step.
    steps, lr = 30, 10.0
    sampler, trainer = (client.slice(1, hosts=["host0"]) for _ in range(2))
    rewarder = client.slice(1, hosts=["host1"])
    pool, model, w0 = rl_torch.make_task(seed=3)
    task = rl_torch.TorchRewardRL(sampler, rewarder, trainer, pool, model,
                                  w0, lr)
    loop = task.loop(sync_every)
    futures, used = [], []

    def on_step(step):
        futures.append(step.rewards[1])
        used.append(step.weights_step)

    status = cluster.status(fresh=True)
    sent = {h: bytes_sent(status, h) for h in ("host0", "host1")}
    before = client.counters()
    final = loop.run(steps, on_step)
    final.block_until_ready()
    after = client.counters()
    # Nothing went through the client while the loop ran: no put, no fetch.
    assert after["bytes_put"] == before["bytes_put"]
    assert after["bytes_fetched"] == before["bytes_fetched"]
    # The reward model's scores (float32[B, A] a step) went from host1's
    # worker to the trainer's on host0; the batches the other way.
    scores_bytes = steps * rl_torch.B * rl_torch.A * 4
    cluster.wait_until(
        lambda st: all(bytes_sent(st, h) - sent[h] >= scores_bytes
                       for h in sent),
        what="the workers' counters to show the batches and rewards moved")

    got = [float(np.asarray(r)) for r in futures]
    ref_rewards, ref_used, ref_w = rl_torch.reference_run(
        pool, model, w0, lr, steps, sync_every)
    assert used == ref_used
    np.testing.assert_allclose(got, ref_rewards, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(final), ref_w, rtol=1e-5,
                               atol=1e-6 * np.abs(ref_w).max())
    assert got[-1] > 5 * got[0], got  # it learns


def test_rl_torch_reward_example_runs_and_learns():
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [PLEXUS_PYTHONPATH] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                               else []))
    proc = subprocess.run(
        [sys.executable, str(root / "examples" / "rl_torch_reward.py"),
         "--steps", "60", "--sync-every", "2"], cwd=root, env=env,
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 bytes put, 0 bytes fetched" in proc.stdout, proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("final reward")


class Noisy(torch.nn.Module):
    """A module whose forward calls torch.poisson, which torchax 0.0.13
    has no JAX lowering for."""

    def forward(self, rate):
        return torch.poisson(rate)  # the line the error names


class Counts(torch.nn.Module):
    """bincount: its output's length depends on the values, which a traced
    (compiled) program cannot have."""

    def forward(self, x):
        return torch.bincount(x)  # the line the error names


@pytest.mark.parametrize("module, arg, op", [
    (Noisy(), torch.ones(4), "aten.poisson"),
    (Counts(), torch.arange(4), "aten.bincount"),
])
def test_an_op_that_does_not_lower_names_the_op_and_the_modules_line(
        client, module, arg, op):
    program = pt.jit(pt.Functional(module), client.slice(1))
    line = next(i for i, text in enumerate(
        Path(__file__).read_text().splitlines(), 1)
        if f"torch.{op.split('.')[1]}(" in text and "error names" in text)
    with pytest.raises(plexus.UnimplementedError) as e:
        program({}, arg)
    message = str(e.value)
    assert op in message and "does not lower to JAX" in message, message
    assert (f"test_torch.py:{line} in {type(module).__name__}.forward"
            in message), message


def test_tensor_parallel_layers_take_plexus_partition_specs(client):
    """Megatron-style column- then row-parallel Linear layers: their
    weights put split over a 'model' axis with plexus.P (the vocabulary
    plexus.jit takes), the forward run on the two devices of one host,
    equal to eager torch."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, 4))
    s = client.slice(2, mesh=(2,), axis_names=("model",), hosts=["host0"])
    layout = {"0.weight": plexus.P("model", None), "0.bias": plexus.P("model"),
              "2.weight": plexus.P(None, "model"), "2.bias": None}
    params = {name: pt.put(s, t, layout[name], name=name)
              for name, t in model.named_parameters()}
    # Each device holds half of each split weight.
    assert params["0.weight"].sharding == "split(0)"
    assert params["2.weight"].sharding == "split(1)"
    x = torch.randn(5, 8)
    forward = pt.jit(pt.Functional(model), s)
    np.testing.assert_allclose(np.asarray(forward(params, x)),
                               model(x).detach().numpy(), rtol=1e-5,
                               atol=1e-6)


def test_a_tensor_of_another_dtype_or_device_is_refused_in_torch_terms(
        client):
    linear = torch.nn.Linear(4, 2)
    program = pt.jit(pt.Functional(linear), client.slice(1))
    params = pt.Functional(linear).init_params()
    x = torch.ones(3, 4)
    np.testing.assert_allclose(np.asarray(program(params, x)),
                               linear(x).detach().numpy(), rtol=1e-6)
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"args\[1\] is a torch.float64 tensor, but the "
                             r"program was traced for torch.float32"):
        program(params, x.double())
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"args\[1\] is a tensor on device meta; Plexus "
                             r"programs take CPU tensors .* pass args\[1\]"
                             r"\.cpu\(\)"):
        program(params, x.to("meta"))
    # Before any trace: float64 would silently run as float32.
    with pytest.raises(plexus.InvalidArgumentError,
                       match="torch.float64 tensor; Plexus traces torch "
                             "programs with JAX's 64-bit types off"):
        pt.put(client.slice(1), x.double(), name="x")


@pytest.mark.jax_heavy
def test_a_host_killed_mid_run_leaves_the_loss_curve_bit_identical():
    # Parameters and AdamW's state are replicated over both islands, so a
    # lost host's copy is recovered from the other's; its batch from the
    # data the client kept, and the step in flight by running its calls
    # again on the spare.
    steps, kill_after = 8, 3
    with plexus.local(hosts=2, devices_per_host=2, spare=1) as cluster:
        with cluster.connect(name="failure-free") as client:
            expected = train_data_parallel(client, steps)
        killed = []

        def kill(step, params):
            if step == kill_after:
                killed.append(kill_host(cluster, "host1"))
        with cluster.connect(name="elastic") as client:
            losses = train_data_parallel(client, steps, on_step=kill)
        recovery = cluster.status().get("recovery", {})
    assert killed and recovery.get("hosts_lost") == 1, recovery
    assert recovery.get("buffers_failed", 0) == 0, recovery
    assert losses == expected  # bit for bit
