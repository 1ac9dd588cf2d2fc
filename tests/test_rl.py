"""plexus.rl.AsyncRLLoop on a real embedded cluster (3 hosts, one device
each): sampler, reward program and trainer on three slices; the loop gives
exactly the values of a plain sequential loop under each staleness rule."""
import faulthandler
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import plexus
import plexus.rl
from conftest import PLEXUS_PYTHONPATH
from plexus.rl import sampler_weights_step

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import rl_loop  # noqa: E402

TEST_DEADLINE_S = 120


@pytest.fixture(autouse=True)
def deadline():
    """Bounded time: a test that hangs dumps every thread's stack and ends
    the run instead of waiting forever."""
    faulthandler.dump_traceback_later(TEST_DEADLINE_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def rl_cluster(tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "cluster.log"
    with plexus.local(hosts=3, devices_per_host=1, log_level="info",
                      log_file=str(log)) as c:
        yield c


@pytest.fixture
def rl_client(rl_cluster):
    c = rl_cluster.connect(name="test-rl")
    yield c
    c.close()


def test_sampler_weights_rule():
    # sync_every 0: on-policy, the newest weights.
    assert [sampler_weights_step(k, 0) for k in range(5)] == [0, 1, 2, 3, 4]
    # sync_every 1: one step behind, so sample k+1 overlaps train k.
    assert [sampler_weights_step(k, 1) for k in range(5)] == [0, 0, 1, 2, 3]
    # sync_every 2: the weights after every 2nd step, at most 2 steps old.
    assert [sampler_weights_step(k, 2) for k in range(8)] == [0, 0, 0, 2, 2,
                                                              4, 4, 6]
    for n in range(1, 6):
        for k in range(1, 40):
            m = sampler_weights_step(k, n)
            assert m % n == 0 and 1 <= k - m <= n and m <= k - 1
    with pytest.raises(ValueError):
        sampler_weights_step(3, -1)


class CounterTask:
    """W_k = k (the trainer adds 1 each step) and the batch is the weights the
    sampler used plus 100 k: every batch tells which weights made it."""

    def __init__(self, client):
        self.sampler = client.slice(1, placement="one_host")
        self.rewarder = client.slice(1, placement="one_host")
        self.trainer = client.slice(1, placement="one_host")
        devices = {(d["host"], d["device"]) for s in
                   (self.sampler, self.rewarder, self.trainer)
                   for d in s.devices}
        assert len(devices) == 3, devices
        spec = plexus.Spec((4,))
        self.steps = [self.sampler.put(np.full(4, 100.0 * k, np.float32))
                      for k in range(12)]
        self.one = self.trainer.put(np.ones(4, np.float32))
        self.s_add = self.sampler.program("add", spec, spec)
        self.r_scale = self.rewarder.program("scale", spec, factor=2.0)
        self.t_add = self.trainer.program("add", spec, spec)
        self.t_double = self.trainer.program("scale", spec, factor=2.0)
        self.t_neg = self.trainer.program("scale", spec, factor=-1.0)

    def sample(self, w, k):
        assert w.slice.id == self.sampler.id  # sent to the sampler's slice
        return self.s_add(w, self.steps[k])

    def reward(self, batch):
        return self.r_scale(batch)

    def train(self, w, batch, rewards):
        # w + 1, depending on the batch and the rewards through a term that
        # is exactly 0: 2 batch - rewards.
        zero = self.t_add(self.t_double(batch), self.t_neg(rewards))
        return self.t_add(self.t_add(w, self.one), zero)


@pytest.mark.parametrize("sync_every", [0, 1, 2, 3])
@pytest.mark.parametrize("sequential", [False, True])
def test_weights_used_follow_the_staleness_rule(rl_client, sync_every,
                                                sequential):
    task = CounterTask(rl_client)
    w0 = task.trainer.put(np.zeros(4, np.float32))
    loop = plexus.rl.AsyncRLLoop(task.sample, task.reward, task.train, w0,
                                 sampler_slice=task.sampler,
                                 sync_every=sync_every, sequential=sequential)
    steps = []
    loop.run(7, steps.append)
    final = loop.run(5, steps.append)  # a second run continues the rule
    assert [s.k for s in steps] == list(range(12))
    for s in steps:
        m = sampler_weights_step(s.k, sync_every)
        assert s.weights_step == m
        np.testing.assert_array_equal(np.asarray(s.batch),
                                      np.full(4, 100.0 * s.k + m))
        np.testing.assert_array_equal(np.asarray(s.rewards),
                                      np.full(4, 2 * (100.0 * s.k + m)))
        np.testing.assert_array_equal(np.asarray(s.state), np.full(4, s.k + 1))
    np.testing.assert_array_equal(np.asarray(final), np.full(4, 12.0))
    assert loop.step == 12
    # One transfer to the sampler per distinct weights version.
    assert loop.syncs == len({s.weights_step for s in steps})


@pytest.mark.parametrize("sync_every", [0, 2])
def test_policy_gradient_loop_matches_numpy(rl_client, sync_every):
    pool, teacher, w0 = rl_loop.make_task(seed=3)
    lr, steps = 2.0, 30
    task = rl_loop.RLTask(rl_client, lr, pool, teacher, w0)
    loop = task.loop(sync_every)
    got_rewards, used = [], []

    def on_step(step):
        got_rewards.append(step.rewards[1])
        used.append(step.weights_step)

    final = np.asarray(loop.run(steps, on_step))
    got_rewards = [float(np.asarray(r)) for r in got_rewards]
    ref_rewards, ref_used, ref_w = rl_loop.reference_run(
        pool, teacher, w0, lr, steps, sync_every)
    assert used == ref_used
    np.testing.assert_allclose(got_rewards, ref_rewards, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(final, ref_w, rtol=1e-4,
                               atol=1e-5 * np.abs(ref_w).max())
    # It learns: the reward rises well above the first step's.
    assert got_rewards[-1] > 2 * got_rewards[0]


def test_sequential_mode_gives_the_same_values(rl_client):
    pool, teacher, w0 = rl_loop.make_task(seed=5)
    task = rl_loop.RLTask(rl_client, 2.0, pool, teacher, w0)
    a = np.asarray(task.loop(1).run(10))
    b = np.asarray(task.loop(1, sequential=True).run(10))
    np.testing.assert_array_equal(a, b)


def test_overlapped_loop_is_faster_than_sequential(rl_client):
    """With sampler and trainer of equal device time (20 ms each), the
    overlapped loop beats the sequential one clearly (ideal 2x; the floor
    here is loose because this machine is shared and noisy)."""
    s = rl_client.slice(1, placement="one_host")
    r = rl_client.slice(1, placement="one_host")
    t = rl_client.slice(1, placement="one_host")
    spec = plexus.Spec((4,))
    sleep_s = s.program("device_sleep", spec, micros=20000)
    sleep_r = r.program("device_sleep", spec, micros=2000)
    sleep_t = t.program("device_sleep", spec, micros=20000)
    update = t.program("add", spec, spec)

    def run(sequential):
        loop = plexus.rl.AsyncRLLoop(
            lambda w, k: sleep_s(w), sleep_r,
            lambda w, b, rw: sleep_t(update(w, rw)),
            t.put(np.zeros(4, np.float32)), sampler_slice=s, sync_every=1,
            sequential=sequential)
        t0 = time.perf_counter()
        loop.run(10).block_until_ready()
        return time.perf_counter() - t0

    run(False)  # compile and warm up
    sequential = min(run(True) for _ in range(2))
    overlapped = min(run(False) for _ in range(2))
    # sequential >= 10 * 42 ms; overlapped ideally 42 + 9 * 21 ms.
    assert sequential > 0.42
    assert sequential / overlapped > 1.4, (sequential, overlapped)


def test_bad_arguments():
    with pytest.raises(ValueError, match="sync_every"):
        plexus.rl.AsyncRLLoop(None, None, None, None, sync_every=-1)
    with pytest.raises(ValueError, match="max_in_flight"):
        plexus.rl.AsyncRLLoop(None, None, None, None, max_in_flight=0)


def test_example_runs_and_learns():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [PLEXUS_PYTHONPATH] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "rl_loop.py"), "--steps", "60",
         "--sync-every", "2"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("final reward "), proc.stdout
    assert "matches the numpy loop" in proc.stdout
