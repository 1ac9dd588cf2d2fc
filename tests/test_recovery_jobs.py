"""Recovery for every kind of job, not only data parallel: values of a
slice on one host (a pipeline stage's, an RL stage's) keep their lineage or
a snapshot on another host, so a SIGKILLed stage host is recovered as a
data-parallel one is; a value that cannot be recovered fails every future
that depends on it, on every slice, at once; a spare takes the place of a
lost host that held no slice, so new slices still find its capacity."""
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

import plexus
from chaos import kill_host

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import rl_loop  # noqa: E402

WAIT_S = 30


def slice_of(st, s):
    return next(sl for sl in st["slices"] if sl["slice_id"] == s.id)


def remapped(cluster, s):
    cluster.wait_until(
        lambda st: slice_of(st, s).get("generation", 0) >= 1,
        timeout=WAIT_S, what=f"slice {s.id} remapped")


def value(f):
    """f's value, waiting at most WAIT_S: a regression fails, never hangs."""
    return np.asarray(plexus.wait(f, timeout=WAIT_S))


def recovery(cluster):
    return cluster.status().get("recovery", {})


def two_slice_chain(cluster):
    """Slices A (host0) and B (host1) of one device each, f scaling by 2
    on A, g by 10 on B, and w = f(f(x)) computed on A."""
    c = cluster.connect()
    a = c.slice(1, hosts=["host0"])
    b = c.slice(1, hosts=["host1"])
    x = a.put(np.arange(4, dtype=np.float32))
    f = a.program("scale", x, factor=2.0)
    g = b.program("scale", x, factor=10.0)
    w = f(f(x))
    np.testing.assert_array_equal(value(w), 4 * np.arange(4))
    return a, f, g, w


def test_a_chain_on_a_one_host_slice_is_recomputed_for_a_consumer_on_another():
    # The smallest pipeline: slices A and B of one device each, on two
    # hosts. A's values are "replicated" over its one device, which
    # dropped their lineage: after A's host was lost, f(w) raised "cannot
    # be recomputed" and B's g(y) waited for ever.
    with plexus.local(hosts=2, spare=1) as cluster:
        a, f, g, w = two_slice_chain(cluster)
        kill_host(cluster, "host0")
        remapped(cluster, a)
        y = f(w)
        z = g(y)
        np.testing.assert_array_equal(value(z), 80 * np.arange(4))
        np.testing.assert_array_equal(value(y), 8 * np.arange(4))
        assert a.devices[0]["host"].startswith("spare"), a.devices
        r = recovery(cluster)
        assert r["calls_recomputed"] >= 1 and r["buffers_failed"] == 0, r


@pytest.mark.parametrize("signal_first", [signal.SIGKILL, signal.SIGSTOP])
def test_a_chain_issued_as_its_host_dies_is_recomputed_for_a_consumer_on_another(
        signal_first):
    # As above, but y = f(w) and z = g(y) are issued right after host0
    # dies, before the server has remapped its slice: y is routed to the
    # dead host (or onto the spare), z waits on host1 for it. z becomes
    # ready with the right value, never hangs. SIGSTOP first makes the
    # order certain: a stopped worker is declared lost only after a
    # minute of silence, so both calls are routed to it; then SIGKILL.
    with plexus.local(hosts=2, spare=1,
                      heartbeat_timeout_ms=60_000) as cluster:
        a, f, g, w = two_slice_chain(cluster)
        victim = next(wk for wk in cluster.status()["workers"]
                      if wk["alive"] and wk["host_name"] == "host0")
        os.kill(int(victim["pid"]), signal_first)
        y = f(w)
        z = g(y)
        if signal_first == signal.SIGSTOP:
            st = cluster.status()
            assert slice_of(st, a).get("generation", 0) == 0, st
            assert next(wk for wk in st["workers"] if wk["worker_id"] ==
                        victim["worker_id"])["alive"], st
            os.kill(int(victim["pid"]), signal.SIGKILL)
        np.testing.assert_array_equal(value(z), 80 * np.arange(4))
        np.testing.assert_array_equal(value(y), 8 * np.arange(4))
        remapped(cluster, a)
        assert a.devices[0]["host"].startswith("spare"), a.devices
        r = recovery(cluster)
        assert r["hosts_lost"] == 1 and r["buffers_failed"] == 0, r
        if signal_first == signal.SIGSTOP:
            # y was routed to the dead host: it ran again on the spare.
            assert r["calls_recomputed"] >= 1, r


def test_a_one_host_slice_is_restored_from_a_snapshot_on_another_host():
    with plexus.local(hosts=2, spare=1) as cluster:
        c = cluster.connect()
        a = c.slice(1, hosts=["host0"])
        x = a.put(np.arange(4, dtype=np.float32))
        f = a.program("scale", x, factor=3.0)
        w = f(f(x))
        c.snapshot(w)
        # Once the copy is complete, w's producer lets go of its inputs:
        # the snapshot is w's only way back.
        cluster.wait_until(
            lambda st: st["recovery"].get("snapshots_taken", 0) == 1 and
            st["recovery"].get("snapshots_incomplete", 0) == 0,
            timeout=WAIT_S, what="the snapshot of w complete")
        del x
        kill_host(cluster, "host0")
        remapped(cluster, a)
        np.testing.assert_array_equal(value(w), 9 * np.arange(4))
        r = recovery(cluster)
        assert r["shards_from_snapshots"] == 1, r
        assert r["buffers_failed"] == 0, r


def test_without_a_spare_a_lost_value_fails_its_consumers_on_other_slices(
        tmp_path):
    # A value on the lost host, read by a call on another host's slice:
    # that call's future fails as soon as the server declares the host
    # lost, naming it and the value (the client waited 15 s more for a
    # spare's word). The killed worker stays lost, and the cluster says so
    # as it ends.
    with pytest.raises(plexus.ClusterExitError, match="SIGKILL"):
        lose_a_value_read_by_another_slice(tmp_path / "loss.json")


def lose_a_value_read_by_another_slice(trace_path):
    # The client's own wait for the server's word on a loss is 5 s plus
    # the server's spare wait: over 10 minutes here. The failure comes
    # well inside WAIT_S only if it comes from the server's word, sent as
    # it declares the host lost, with no timer on the way.
    with plexus.local(hosts=2, spare_wait_ms=600_000) as cluster:
        c = cluster.connect()
        a = c.slice(1, hosts=["host0"])
        b = c.slice(1, hosts=["host1"])
        x = a.put(np.arange(4, dtype=np.float32))
        slow = a.program("device_sleep", x, micros=60_000_000)
        g = b.program("scale", x, factor=10.0)
        w = slow(x)          # holds host0's device for a minute
        z = g(w)             # waits on host1 for w
        # x (the put slow reads) and w (the value z reads) were on host0.
        w_name = (rf"buffer {w._f.buffer_id} \(output 0 of program "
                  rf"'device_sleep', call \d+\) were on a slice of it")
        # The kill comes once w's call runs on host0. Killed before the
        # server routed it, the call is refused instead (the slice lost a
        # host) and z with it, in that refusal's words: a CI run under
        # ASan did so.
        cluster.wait_until(
            lambda st: any(h["host_name"] == "host0"
                           and sum(h["stats"].get("device_busy_micros", [])) > 0
                           for h in st["workers"]),
            timeout=WAIT_S, what="host0's device running w's call")
        with c.trace(str(trace_path)):
            kill_host(cluster, "host0")
            # z's wait is made before the loss is declared, or as it is.
            with pytest.raises(plexus.DeviceLostError,
                               match="host0(.|\n)*" + w_name):
                value(z)
        # From the timeline, on the server's clock: the server's
        # declaration to z's wait returning. Printed, not asserted (a
        # loaded machine may take longer; the word, not a timer, is what
        # ends the wait, and the 10-minute wait above shows that).
        events = json.loads(trace_path.read_text())["traceEvents"]
        declared = next(e["ts"] for e in events if e.get("ph") == "b" and
                        e["name"] == "recovery: host lost, its slices broke")
        waits = {e["id"] for e in events
                 if e.get("ph") == "b" and e.get("cat") == "client" and
                 e["name"] == "wait" and e["args"].get("failed")}
        failed = [e["ts"] for e in events if e.get("ph") == "e" and
                  e.get("cat") == "client" and e["id"] in waits]
        assert failed, "no failed wait on the client's timeline"
        took_ms = (max(failed) - declared) / 1000
        print(f"z failed {took_ms:.1f} ms after the server declared host0 "
              f"lost")
        assert took_ms >= 0, took_ms
        with pytest.raises(plexus.DeviceLostError, match=w_name):
            value(w)
        # A call issued now that reads the lost value is refused at once.
        with pytest.raises(plexus.DeviceLostError, match="host0"):
            value(g(w))


def test_a_spare_takes_the_place_of_a_lost_host_that_held_no_slice():
    # 2 hosts of 2 devices and a spare; host1 holds nothing when it is
    # lost. The spare takes its place as a host, so a slice of 4 is still
    # granted (spares serve no new slices: it was refused, with 6 devices
    # alive once the embedded cluster had started a new spare).
    with plexus.local(hosts=2, devices_per_host=2, spare=1) as cluster:
        c = cluster.connect()
        kill_host(cluster, "host1")
        cluster.wait_until(
            lambda st: any(w["alive"] and not w.get("spare") and
                           w["host_name"].startswith("spare")
                           for w in st["workers"]),
            timeout=WAIT_S, what="a spare standing in for host1")
        s = c.slice(4, timeout=WAIT_S)
        hosts = sorted({d["host"] for d in s.devices})
        assert hosts[0] == "host0" and hosts[1].startswith("spare"), hosts
        x = s.put(np.arange(8, dtype=np.float32), plexus.split(0))
        np.testing.assert_array_equal(value(x), np.arange(8))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipeline_with_adam_goes_on_through_a_lost_stage_host(schedule):
    # Four 1-device stages on four hosts and a spare, Adam state per
    # stage, GPipe or 1F1B. Stage 2's host is SIGKILLed right after a step
    # is submitted (its calls in flight): the server remaps the stage onto
    # the spare and recomputes or restores what it held; the losses and
    # weights are bit-identical to the same pipeline run without the
    # failure in the same cluster.
    jax = pytest.importorskip("jax")
    from test_pipeline_optimizer import M, adam, adam_state, batches, \
        head_loss, init, mlp

    steps, seed, victim_step = 4, 5, 1
    # The SIGKILLed host is seen lost as its stream breaks. A long heartbeat
    # deadline keeps the others, starved while five workers compile XLA on a
    # loaded 2-core machine, from being taken for lost as well (a clean-clone
    # run counted 4 hosts lost, 3 of them by missed heartbeats, with the
    # results still bit-identical).
    with plexus.local(hosts=4, spare=1,
                      heartbeat_timeout_ms=60_000) as cluster:
        c = cluster.connect()
        slices = [c.slice(1, hosts=[f"host{i}"]) for i in range(4)]
        stages = []
        for i, s in enumerate(slices):
            upd = plexus.jit(adam, s)
            if i < 3:
                fwd = plexus.jit(mlp, s)
                bwd = plexus.jit(
                    lambda p, x, dh: jax.vjp(lambda q, x: mlp(q, x), p, x)[1](dh)[::-1], s)
                stages.append(plexus.pipeline.Stage(
                    s, forward=lambda p, x, fwd=fwd: (fwd(p, x), x),
                    backward=lambda p, x, dh, bwd=bwd: tuple(bwd(p, x, dh)),
                    update=upd))
            else:
                fwd = plexus.jit(head_loss, s)
                bwd = plexus.jit(lambda p, h, y: jax.grad(
                    head_loss, argnums=(1, 0))(p, h, y), s)
                stages.append(plexus.pipeline.Stage(
                    s, forward=lambda p, h, y, fwd=fwd: (fwd(p, h, y), (h, y)),
                    backward=lambda p, saved, _, bwd=bwd: tuple(bwd(p, *saved)),
                    update=upd))

        def run(kill):
            params = [init(seed + i)[0] for i in range(4)]
            put = lambda s, tree: jax.tree_util.tree_map(s.put, tree)  # noqa
            pipe = plexus.pipeline.Pipeline(
                stages, params=[put(s, p) for s, p in zip(slices, params)],
                opt_state=[put(s, adam_state(p))
                           for s, p in zip(slices, params)],
                schedule=schedule)
            losses = []
            for k, (x, y) in enumerate(batches(steps, seed)):
                out = pipe.step([slices[0].put(m) for m in np.split(x, M)],
                                [slices[3].put(m) for m in np.split(y, M)])
                if kill and k == victim_step:
                    kill_host(cluster, "host2")
                losses.append(value(out.loss))
            weights = [value(leaf) for p in pipe.params
                       for leaf in jax.tree_util.tree_leaves(p)]
            return losses, weights

        want_losses, want_weights = run(kill=False)
        got_losses, got_weights = run(kill=True)
        assert slices[2].devices[0]["host"].startswith("spare")
        for got, want in zip(got_losses, want_losses):
            np.testing.assert_array_equal(got, want)
        for got, want in zip(got_weights, want_weights):
            np.testing.assert_array_equal(got, want)
        r = recovery(cluster)
        assert r["hosts_lost"] == 1 and r["slices_remapped"] == 1, r
        assert r["buffers_failed"] == 0, r
        # The loss cost work: what host2 held (its stage's parameters and
        # Adam state, the step's values in flight) was recomputed or
        # restored from a snapshot, not found intact.
        print(f"{schedule}: {r}")
        assert r.get("calls_recomputed", 0) + \
            r.get("shards_from_snapshots", 0) > 0, r


@pytest.mark.parametrize("stage", ["sampler", "trainer"])
def test_an_rl_loop_goes_on_through_a_lost_stage_host(stage):
    # Sampler, reward program and trainer each on a slice of one host (the
    # values of which dropped their lineage); the host of one is SIGKILLed
    # mid-loop. The loop ends with the rewards and weights of the same
    # loop uninterrupted, in the same cluster.
    with plexus.local(hosts=3, devices_per_host=1, spare=1) as cluster:
        c = cluster.connect()
        pool, teacher, w0 = rl_loop.make_task(seed=3)
        task = rl_loop.RLTask(c, 2.0, pool, teacher, w0)
        steps = 16

        def run(on_step=None):
            rewards = []

            def record(step):
                rewards.append(step.rewards[1])
                if on_step is not None:
                    on_step(step)

            final = value(task.loop(2).run(steps, record))
            return [float(value(r)) for r in rewards], final

        want_rewards, want = run()
        victim = getattr(task, stage)
        host = victim.devices[0]["host"]
        killed = []

        def kill_mid_loop(step):
            if not killed and step.k >= steps // 2:
                killed.append(kill_host(cluster, host))

        got_rewards, got = run(kill_mid_loop)
        assert killed, "the host was never killed"
        remapped(cluster, victim)
        assert got_rewards == want_rewards
        np.testing.assert_array_equal(got, want)
