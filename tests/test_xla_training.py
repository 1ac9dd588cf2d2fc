"""A small transformer language model trained with plexus.jit programs on a
real cluster of 2 hosts x 2 devices (examples/transformer.py): as a 2-stage
pipeline over two workers (a hand-written GPipe loop, and plexus.pipeline's
1F1B) and data parallel over two islands, each for 30 SGD steps. Every loss
curve matches a one-process jax.jit reference to float32 rounding, the loss
falls, and every program compiles during the first step only. One cluster serves the module (conftest's module-scoped `cluster`)."""
import collections
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import transformer  # noqa: E402

STEPS = 30
TOLERANCE = 1e-4


def xla_compiles(cluster):
    """Programs compiled so far, per worker (current: waits for a
    heartbeat from every worker)."""
    return {w["worker_id"]: w["stats"]["xla_compiles"]
            for w in cluster.status(fresh=True)["workers"]}


def train(cluster, fn, **kwargs):
    """Runs `fn` for STEPS steps; returns its losses, its info and the
    workers' compile counters before training, after step 1 (once
    everything step 1 computed is ready) and at the end."""
    compiles = {"before": xla_compiles(cluster)}

    def on_step(step, loss):
        if step == 1:
            compiles["step 1"] = xla_compiles(cluster)

    info = {}
    losses = fn(cluster, STEPS, on_step=on_step, info=info, **kwargs)
    compiles["end"] = xla_compiles(cluster)
    return losses, info, compiles


@pytest.fixture(scope="module")
def reference():
    return transformer.train_reference(STEPS)


def assert_matches(losses, reference):
    assert len(losses) == STEPS
    err = transformer.max_rel_diff(losses, reference)
    assert err <= TOLERANCE, (
        f"max relative difference {err:.2e} > {TOLERANCE:.0e}:\n"
        f"plexus    {losses}\nreference {reference}")


def assert_compiled_in_first_step_only(compiles):
    assert sum(compiles["step 1"].values()) > sum(compiles["before"].values())
    assert compiles["end"] == compiles["step 1"], compiles


def test_reference_loss_falls(reference):
    assert reference[-1] < 0.8 * reference[0], reference


def test_pipeline_on_two_workers_matches_reference(cluster, reference):
    losses, info, compiles = train(cluster, transformer.train_pipeline,
                                   microbatches=4)
    stage0_worker, stage1_worker = info["workers"]
    assert stage0_worker != stage1_worker
    assert_matches(losses, reference)
    assert losses[-1] < 0.8 * losses[0], losses
    assert_compiled_in_first_step_only(compiles)


def test_pipeline_library_1f1b_with_jit_programs_matches_reference(
        cluster, reference):
    losses, info, compiles = train(cluster, transformer.train_pipeline_library,
                                   microbatches=4, schedule="1f1b")
    assert info["workers"][0] != info["workers"][1]
    assert_matches(losses, reference)
    assert_compiled_in_first_step_only(compiles)


@pytest.mark.jax_heavy
def test_data_parallel_over_two_islands_matches_reference(cluster, reference):
    losses, info, compiles = train(cluster, transformer.train_data_parallel)
    islands = collections.Counter(d["worker"] for d in info["devices"])
    assert sorted(islands.values()) == [2, 2], info["devices"]
    assert_matches(losses, reference)
    assert losses[-1] < 0.8 * losses[0], losses
    assert_compiled_in_first_step_only(compiles)
