"""plexus.pipeline: the schedules as pure functions, and the MLP trained by
the library over two stages on two hosts (real processes), checked against
the hand-written pipeline example and the float64 numpy reference."""
import sys
from pathlib import Path

import numpy as np
import pytest

from plexus.pipeline import (Pipeline, Stage, check_schedule, gpipe,
                             issue_order, one_f_one_b, peak_in_flight,
                             schedule_actions, simulate)


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from mlp_common import (PARAM_NAMES, Kernels, init_params,  # noqa: E402
                        make_dataset, reference_step, rel_err)
from mlp_pipeline import PipelineMLP  # noqa: E402

SIZES = [(1, 1), (1, 5), (2, 1), (2, 4), (3, 7), (4, 4), (4, 16), (8, 3)]


# ---------------------------------------------------------------- schedules


@pytest.mark.parametrize("S,M", SIZES)
@pytest.mark.parametrize("schedule", [gpipe, one_f_one_b])
def test_every_stage_runs_each_forward_then_its_backward_once(schedule, S, M):
    per_stage = schedule(S, M)
    assert len(per_stage) == S
    for actions in per_stage:
        assert sorted(actions) == sorted([("F", m) for m in range(M)] +
                                         [("B", m) for m in range(M)])
        for m in range(M):
            assert actions.index(("F", m)) < actions.index(("B", m))
    check_schedule(per_stage, S, M)  # and the stages never wait forever


@pytest.mark.parametrize("S,M", SIZES)
def test_gpipe_runs_all_forwards_then_backwards_last_first(S, M):
    for actions in gpipe(S, M):
        assert actions[:M] == [("F", m) for m in range(M)]
        assert actions[M:] == [("B", m) for m in reversed(range(M))]
        assert peak_in_flight(actions) == M


@pytest.mark.parametrize("S,M", SIZES)
def test_one_f_one_b_keeps_at_most_S_minus_s_micro_batches(S, M):
    for s, actions in enumerate(one_f_one_b(S, M)):
        assert peak_in_flight(actions) == min(S - s, M) <= S
        # warm-up forwards, then strict alternation, then the drain
        warmup = min(S - s - 1, M)
        assert actions[:warmup] == [("F", m) for m in range(warmup)]
        steady = actions[warmup:warmup + 2 * (M - warmup)]
        assert [k for k, _ in steady] == ["F", "B"] * (M - warmup)
        assert [m for k, m in actions if k == "B"] == list(range(M))


def test_one_f_one_b_for_four_stages_and_six_micro_batches():
    F, B = "F", "B"
    assert one_f_one_b(4, 6)[0] == [(F, 0), (F, 1), (F, 2), (F, 3), (B, 0),
                                    (F, 4), (B, 1), (F, 5), (B, 2), (B, 3),
                                    (B, 4), (B, 5)]
    assert one_f_one_b(4, 6)[3] == [(F, 0), (B, 0), (F, 1), (B, 1), (F, 2),
                                    (B, 2), (F, 3), (B, 3), (F, 4), (B, 4),
                                    (F, 5), (B, 5)]


@pytest.mark.parametrize("schedule", [gpipe, one_f_one_b])
def test_issue_order_keeps_each_stage_in_order_after_its_inputs(schedule):
    S, M = 4, 16
    per_stage = schedule(S, M)
    order = issue_order(per_stage)
    assert len(order) == 2 * S * M
    for s in range(S):
        assert [(k, m) for t, k, m in order if t == s] == per_stage[s]
    pos = {a: i for i, a in enumerate(order)}
    for s, k, m in order:
        if k == "F" and s > 0:
            assert pos[(s - 1, "F", m)] < pos[(s, "F", m)]
        if k == "B" and s < S - 1:
            assert pos[(s + 1, "B", m)] < pos[(s, "B", m)]


@pytest.mark.parametrize("schedule", [gpipe, one_f_one_b])
@pytest.mark.parametrize("S,M", [(4, 16), (2, 4), (3, 1)])
def test_both_schedules_have_the_ideal_bubble(schedule, S, M):
    step, busy = simulate(schedule(S, M), 2.0, 4.0)
    assert step == pytest.approx((M + S - 1) * 6.0)
    assert busy == [M * 6.0] * S
    # utilization M / (M + S - 1)
    assert sum(busy) / (S * step) == pytest.approx(M / (M + S - 1))


def test_bad_schedules_are_rejected_with_the_reason():
    with pytest.raises(ValueError, match="unknown pipeline schedule 'zb'"):
        schedule_actions("zb", 2, 2)
    with pytest.raises(ValueError, match="stage 1 runs B0 before F0"):
        check_schedule([gpipe(2, 1)[0], [("B", 0), ("F", 0)]], 2, 1)
    with pytest.raises(ValueError, match="stage 0 of the schedule must run"):
        check_schedule([[("F", 0)], [("F", 0), ("B", 0)]], 2, 1)
    # stage 0's B0 waits for stage 1's B0, which comes after stage 1's F1,
    # which waits for stage 0's F1, which comes after stage 0's B0
    crossed = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)],
               [("F", 0), ("F", 1), ("B", 0), ("B", 1)]]
    with pytest.raises(ValueError, match="deadlocks"):
        check_schedule(crossed, 2, 2)
    with pytest.raises(ValueError, match="at least 1 stage"):
        gpipe(0, 4)
    custom = lambda S, M: gpipe(S, M)  # noqa: E731 - a schedule function
    assert schedule_actions(custom, 3, 2) == gpipe(3, 2)


# ---------------------------------------------------------------- the MLP


def mlp_stages(slice1, slice2, lr):
    """The example MLP as two pipeline stages written with built-in kernels:
    layer 1 on slice1; layer 2 and the loss on slice2."""
    k1, k2 = Kernels(slice1), Kernels(slice2)

    def forward1(p, x):
        h_pre = k1.bias_add(k1.matmul(x, p["w1"]), p["b1"])
        return k1.relu(h_pre), (x, h_pre)

    def backward1(p, saved, dh):
        x, h_pre = saved
        dh_pre = k1.relu_grad(h_pre, dh)
        return None, {"w1": k1.matmul(x, dh_pre, transpose_a=1),
                      "b1": k1.reduce_sum(dh_pre, axis=0)}

    def forward2(p, h, labels):  # the last stage: returns the loss
        logits = k2.bias_add(k2.matmul(h, p["w2"]), p["b2"])
        return k2.softmax_xent(logits, labels), (h, logits, labels)

    def backward2(p, saved, dy):  # starts from the loss: dy is None
        assert dy is None
        h, logits, labels = saved
        dlogits = k2.softmax_xent_grad(logits, labels)
        return (k2.matmul(dlogits, p["w2"], transpose_b=1),
                {"w2": k2.matmul(h, dlogits, transpose_a=1),
                 "b2": k2.reduce_sum(dlogits, axis=0)})

    def sgd(k):
        return lambda p, g: {n: k.sgd_update(p[n], g[n], lr=lr) for n in p}

    return [Stage(slice1, forward1, backward1, sgd(k1), name="layer1"),
            Stage(slice2, forward2, backward2, sgd(k2), name="layer2+loss")]


def two_stage_slices(client):
    s1 = client.slice(1, placement="one_host")
    s2 = client.slice(1, placement="one_host")
    assert s1.devices[0]["host"] != s2.devices[0]["host"]
    return s1, s2


def split_params(slice1, slice2, params):
    return [{n: slice1.put(params[n]) for n in ("w1", "b1")},
            {n: slice2.put(params[n]) for n in ("w2", "b2")}]


LR, M, BATCH, STEPS = 0.5, 4, 64, 3


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_one_step_matches_the_numpy_reference(client, schedule):
    s1, s2 = two_stage_slices(client)
    params = init_params(seed=3)
    x, labels = make_dataset(BATCH, seed=4)
    pipe = Pipeline(mlp_stages(s1, s2, LR), split_params(s1, s2, params),
                    schedule=schedule)
    xs = [s1.put(m) for m in np.split(x, M)]
    ys = [s2.put(m) for m in np.split(labels, M)]
    loss, grads, new = pipe.step(xs, ys)
    ref_loss, ref_grads, ref_new = reference_step(params, x, labels, LR)
    assert rel_err(np.asarray(loss), ref_loss) <= 1e-5
    got_grads = {**grads[0], **grads[1]}
    got_new = {**new[0], **new[1]}
    for n in PARAM_NAMES:
        assert rel_err(np.asarray(got_grads[n]), ref_grads[n]) <= 1e-5, n
        assert rel_err(np.asarray(got_new[n]), ref_new[n]) <= 1e-5, n
    assert pipe.params is not None and {**pipe.params[0], **pipe.params[1]
                                        }.keys() == set(PARAM_NAMES)
    # the recorded order follows the schedule on each stage
    result = pipe.step(xs, ys)
    for s in range(2):
        assert [(k, m) for t, k, m in result.order if t == s] == \
            pipe.actions(M)[s]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_training_matches_the_hand_written_pipeline(client, schedule):
    s1, s2 = two_stage_slices(client)
    params = init_params(seed=0)
    x, labels = make_dataset(BATCH * STEPS, seed=1)
    batches = [(x[i:i + BATCH], labels[i:i + BATCH])
               for i in range(0, BATCH * STEPS, BATCH)]

    # The library.
    pipe = Pipeline(mlp_stages(s1, s2, LR), split_params(s1, s2, params),
                    schedule=schedule)
    losses = []
    for bx, bl in batches:
        out = pipe.step([s1.put(m) for m in np.split(bx, M)],
                        [s2.put(m) for m in np.split(bl, M)])
        losses.append(out.loss)
    got = {**pipe.params[0], **pipe.params[1]}

    # examples/mlp_pipeline.py's hand-written GPipe, on the same slices.
    model = PipelineMLP(client, s1, s2, LR, M)
    ref_params = model.put_params(params)
    ref_losses = []
    for bx, bl in batches:
        loss, _, ref_params = model.graph_step(ref_params,
                                               *model.put_batch(bx, bl))
        ref_losses.append(loss)

    # And float64 numpy.
    np_params = params
    np_losses = []
    for bx, bl in batches:
        l, _, np_params = reference_step(np_params, bx, bl, LR)
        np_losses.append(l)

    for a, b, c in zip(losses, ref_losses, np_losses):
        assert rel_err(np.asarray(a), np.asarray(b)) <= 1e-5
        assert rel_err(np.asarray(a), c) <= 1e-5
    for n in PARAM_NAMES:
        assert rel_err(np.asarray(got[n]), np.asarray(ref_params[n])) <= 1e-5
        assert rel_err(np.asarray(got[n]), np_params[n]) <= 1e-5
    assert float(np.asarray(losses[-1])) < float(np.asarray(losses[0]))


def live_buffers(status):
    return {w["worker_id"]: w["stats"].get("live_buffers", 0)
            for w in status["workers"]}


def test_a_step_leaves_no_activation_alive(cluster, client):
    """Every activation, gradient, loss and old parameter is dropped: once
    the steps have run and their results are gone, each stage's worker
    holds only the new parameters and the inputs the client still owns.
    (Counted in shards, not bytes: see the report on put accounting.)"""
    before = live_buffers(cluster.status(fresh=True))
    s1, s2 = two_stage_slices(client)
    workers = [s.devices[0]["worker"] for s in (s1, s2)]
    params = init_params(seed=0)
    x, labels = make_dataset(BATCH, seed=1)
    pipe = Pipeline(mlp_stages(s1, s2, LR), split_params(s1, s2, params),
                    schedule="1f1b")
    xs = [s1.put(m) for m in np.split(x, M)]
    ys = [s2.put(m) for m in np.split(labels, M)]
    for _ in range(3):
        out = pipe.step(xs, ys)
    out.block_until_ready()
    del out
    # 2 parameters + M inputs per stage
    want = {w: before.get(w, 0) + 2 + M for w in workers}
    cluster.wait_until(
        lambda st: {w: live_buffers(st)[w] for w in workers} == want,
        timeout=10, what=f"live shards on the stages' workers to "
               f"fall to {want}")
    assert np.isfinite(np.asarray(pipe.params[0]["w1"])).all()


def test_stage_errors_name_the_stage(client):
    s1, s2 = two_stage_slices(client)
    bad = Stage(s1, lambda p, x: x, lambda p, saved, dy: (None, None),
                name="broken")
    pipe = Pipeline([bad], schedule="gpipe")
    with pytest.raises(TypeError, match="Stage\\(broken .*forward must "
                                        "return a pair"):
        pipe.step([s1.put(np.zeros(4, np.float32))])
    with pytest.raises(TypeError, match="not a plexus.pipeline.Stage"):
        Pipeline([object()])
    with pytest.raises(ValueError, match="2 micro-batches but 1 targets"):
        Pipeline([bad]).step([1, 2], [3])
