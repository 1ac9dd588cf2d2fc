"""A server restarted on its journal loses nothing (issue 26): a standalone
server with --journal and standalone workers, which keep their buffers and
programs while it is away and come back as the hosts they were; the
client's session is resumed with its ids, slices, programs and futures,
and what it had sent that had not run everywhere runs again. The server is
SIGKILLed at rest and in the middle of a training loop, whose losses then
equal, bit for bit, those of a run with no kill."""
import os
import random
import re
import signal
import sys
import threading

import numpy as np
import pytest

import plexus
from plexus import _core
from plexus._binaries import bin_dir, default_pjrt_plugin

from relay import Relay
from restart_jobs import assert_same_run, pipeline_job
from test_membership import _ready_line, _spawn, _wait_for_log
from test_reconnect import _worker

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def _server(address, log, env, journal, die_with_parent=True, park=None,
            resume_wait_s=60):
    # A server started again from a timer's thread must not die with it:
    # PR_SET_PDEATHSIG follows the thread that started the process (the
    # fixture's teardown stops it).
    proc, ready = _spawn(
        [str(bin_dir() / "plexus-server"), "--listen", address,
         "--ready-fd", "{READY_FD}", "--log-level", "info",
         "--journal", str(journal), "--resume-wait-s", str(resume_wait_s)]
        + (["--die-with-parent"] if die_with_parent else [])
        + (["--park-dir", str(park)] if park is not None else []), log, env)
    return proc, _ready_line(ready)


@pytest.fixture
def journaled(tmp_path):
    """A standalone server on a journal and three standalone workers, and a
    way to SIGKILL the server and start it again on the same address and
    journal."""
    env = dict(os.environ, PLEXUS_CLUSTER_SECRET=_core.new_cluster_secret())
    plugin = default_pjrt_plugin()
    if plugin:
        env["PLEXUS_PJRT_PLUGIN"] = plugin
    log = tmp_path / "server.log"
    journal = tmp_path / "journal.db"
    park = tmp_path / "park"  # the slices suspended to files
    park.mkdir()
    server, address = _server("127.0.0.1:0", log, env, journal, park=park)
    procs = {"server": server}
    workers = [_worker(address, f"host{i}", tmp_path / f"worker{i}.log", env,
                       devices=1)
               for i in range(3)]

    class Cluster:
        pass

    cluster = Cluster()
    cluster.address, cluster.log, cluster.tmp = address, log, tmp_path
    cluster.workers, cluster.park = workers, park

    def kill_workers():
        for w in workers:
            w.kill()
            w.wait()

    def start_workers():
        # New processes, which register as fresh hosts of the same names.
        for i in range(len(workers)):
            workers[i] = _worker(address, f"host{i}",
                                 tmp_path / f"worker{i}.again.log", env,
                                 devices=1)

    cluster.kill_workers, cluster.start_workers = kill_workers, start_workers

    def kill_server():
        procs["server"].kill()
        procs["server"].wait()

    def start_server(resume_wait_s=60):
        procs["server"], again = _server(address, log, env, journal,
                                         die_with_parent=False, park=park,
                                         resume_wait_s=resume_wait_s)
        assert again == address

    def kill_and_restart():
        kill_server()
        start_server()

    cluster.kill_server, cluster.start_server = kill_server, start_server
    cluster.kill_and_restart = kill_and_restart
    try:
        yield cluster
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(timeout=30)
            except Exception:  # noqa: BLE001 - reap it whatever happened
                w.kill()
                w.wait()
        procs["server"].terminate()
        procs["server"].wait(timeout=30)


def _spread(client):
    """A slice of one device on each of the three hosts, a value split over
    it (0..5) and a program that doubles it."""
    s = client.slice(3, placement="spread")
    x = s.put(np.arange(6, dtype=np.float32), plexus.P("devices"))
    return s, x, s.program("scale", x, factor=2.0)


def test_a_restarted_server_resumes_the_session_with_its_futures(journaled):
    client = plexus.connect(journaled.address, name="resumed")
    try:
        s, x, double = _spread(client)
        y = double(x)
        np.testing.assert_array_equal(np.asarray(y), np.arange(6) * 2)
        z = double(y)  # not read before the kill
        client_id, slice_id = client.id, s.id

        journaled.kill_and_restart()

        # The same futures, the same program and slice, the same ids.
        np.testing.assert_array_equal(np.asarray(z), np.arange(6) * 4)
        np.testing.assert_array_equal(np.asarray(y), np.arange(6) * 2)
        w = double(z)
        np.testing.assert_array_equal(np.asarray(w), np.arange(6) * 8)
        assert (client.id, s.id) == (client_id, slice_id)
        end = client.session_ends[-1]
        assert end["resumed"] and end["reconnected"], end
        _wait_for_log(journaled.log, "resumed its session", 1, timeout=10)
        _wait_for_log(journaled.log, "came back with what it kept", 3,
                      timeout=10)
    finally:
        client.close()


def test_a_graph_open_across_the_kill_loses_none_of_its_calls(journaled):
    """A graph's calls are queued at its end, their outputs live before.
    The server is SIGKILLed and its session resumed while the graph is
    open: the resume told the next server of those outputs, which no call
    sent again made, so it took them for lost (DATA_LOSS) before the graph
    queued their call (a server_kill run lost a step's loss and gradient).
    Now they are told only once queued, and the call runs."""
    client = plexus.connect(journaled.address, name="graph")
    try:
        s, x, double = _spread(client)
        np.testing.assert_array_equal(np.asarray(double(x)), np.arange(6) * 2)
        with client.graph():
            y = double(x)
            z = double(y)
            journaled.kill_and_restart()
            # The resume is done (its LiveBuffers' end) before the graph
            # queues its calls.
            _wait_for_log(journaled.log, "resumed; ", 1, timeout=60)
        np.testing.assert_array_equal(np.asarray(z), np.arange(6) * 4)
        np.testing.assert_array_equal(np.asarray(y), np.arange(6) * 2)
        resumed = [line for line in journaled.log.read_text().splitlines()
                   if "resumed; " in line]
        assert resumed[-1].endswith(", 0 lost"), resumed[-1]
    finally:
        client.close()


def test_a_graph_call_waiting_for_the_server_lets_other_threads_run(
        journaled):
    """A graph's call waits while the session has no server; like
    client.call it lets the GIL go meanwhile, so another Python thread (here
    the one that starts the server again) runs. Before, it held the GIL: the
    server was started again only once the client had given up (found by
    bench/server_kill.py)."""
    client = plexus.connect(journaled.address, name="graph",
                            reconnect_timeout=20)
    try:
        s, x, double = _spread(client)
        y = double(x)
        np.testing.assert_array_equal(np.asarray(y), np.arange(6) * 2)
        journaled.kill_server()
        calling = threading.Event()

        def restart():
            calling.wait(60)
            journaled.start_server()

        thread = threading.Thread(target=restart, daemon=True)
        thread.start()
        calling.set()
        with client.graph():
            z = double(double(y))
        np.testing.assert_array_equal(np.asarray(z), np.arange(6) * 8)
        thread.join(60)
        assert client.session_ends[-1]["resumed"], client.session_ends[-1]
    finally:
        client.close()


def test_calls_in_flight_at_the_kill_run_again_once_and_give_the_same_value(
        journaled):
    """A chain of 2 ms calls (200 ms of work) is sent, then the server is
    SIGKILLed at once: what the workers finished is kept, the calls the
    client kept run again from the last value a worker held (the
    intermediate values were released), and the chain's end is right."""
    client = plexus.connect(journaled.address, name="chain")
    try:
        s, x, double = _spread(client)
        busy = s.program("busy_wait", x, micros=2_000)
        y = double(x)
        for _ in range(100):
            y = busy(y)
        y = double(y)
        client.flush()  # every call is on the wire before the kill
        journaled.kill_and_restart()
        np.testing.assert_array_equal(np.asarray(y), np.arange(6) * 4)
        _wait_for_log(journaled.log, "resumed; ", 1, timeout=10)
        resumed = [line for line in journaled.log.read_text().splitlines()
                   if "resumed; " in line][-1]
        ran_again = int(re.search(r"(\d+) call\(s\) and put\(s\) sent again "
                                  r"ran again, 0 lost", resumed).group(1))
        assert 1 <= ran_again <= 102, resumed
    finally:
        client.close()


def test_a_read_a_worker_failed_as_the_server_died_goes_again_after_the_resume(
        journaled):
    """The workers saw the SIGKILLed server go before the client did (here
    the client's connection to it runs through a relay that holds it open
    until the next server has taken the workers back): the worker failed
    the shard the client was reading, which waited for a call behind a
    running kernel ("the server went away before this shard was
    complete"), while the client's session still looked whole. The read
    waited for a loss note a restart never sends and raised UNAVAILABLE (a
    clean-clone CI run of test_two_clients_... failed so); now it waits for
    its session to end and be resumed, then reads again: the next server
    routes the call again."""
    relay = Relay(journaled.address)
    client = plexus.connect(relay.address, name="late")
    try:
        s, x, double = _spread(client)
        # Under the workers' 2 s drain (teardown_grace), which waits for it.
        nap = s.program("device_sleep", x, micros=1_800_000)
        y = double(nap(x))
        client.flush()
        got = {}

        def read():
            try:
                got["y"] = np.asarray(y)
            except Exception as e:  # noqa: BLE001 - reported below
                got["error"] = e

        reader = threading.Thread(target=read)
        reader.start()
        # The nap runs on the workers and y's shards wait for it (the
        # server's explanations list a call after 1 s).
        for _ in range(600):
            if client.why(after=1.0) or not reader.is_alive():
                break
            threading.Event().wait(0.01)
        assert reader.is_alive(), got
        journaled.kill_server()
        journaled.start_server()
        # The workers drained and came back; only then does the client see
        # its server go.
        _wait_for_log(journaled.log, "came back with what it kept", 3,
                      timeout=60)
        assert relay.held_count >= 1
        relay.cut()
        reader.join(timeout=120)
        assert not reader.is_alive(), "the read did not end"
        if "error" in got:
            raise got["error"]
        np.testing.assert_array_equal(got["y"], np.arange(6) * 2)
        end = client.session_ends[-1]
        assert end["resumed"], end
    finally:
        client.close()
        relay.close()


def test_a_put_on_its_way_as_the_server_dies_is_sent_again(journaled):
    """A put whose shards are on their way (or about to go) as the server
    is SIGKILLed: the session's end shuts its data-plane connection; once
    the next server resumed the session, the shard goes again and the put
    succeeds (it raised "lost worker" before). host1 is stopped meanwhile,
    so the put cannot finish before the kill."""
    client = plexus.connect(journaled.address, name="putter")
    try:
        s = client.slice(3, placement="spread")
        data = np.arange(3 * (8 << 20), dtype=np.float32)  # 32 MiB a host
        warm = s.put(np.arange(6, dtype=np.float32), plexus.P("devices"))
        np.testing.assert_array_equal(np.asarray(warm), np.arange(6))
        stopped = journaled.workers[1]
        os.kill(stopped.pid, signal.SIGSTOP)
        result = {}

        def put():
            try:
                result["value"] = s.put(data, plexus.P("devices"))
            except Exception as e:  # noqa: BLE001 - reported below
                result["error"] = e

        putter = threading.Thread(target=put)
        try:
            putter.start()
            journaled.kill_and_restart()
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
        putter.join(timeout=120)
        assert not putter.is_alive(), "the put is still waiting"
        assert "error" not in result, result["error"]
        np.testing.assert_array_equal(np.asarray(result["value"]), data)
        end = client.session_ends[-1]
        assert end["resumed"], end
    finally:
        client.close()


def test_a_slice_parked_in_files_outlives_its_server_and_its_workers(
        journaled):
    """A slice suspended to files; then the server is SIGKILLed and every
    worker too, and all are started again (the server on its journal, the
    workers as fresh processes): the session resumes with the slice still
    parked (the journal names its values), and its resume reads them back
    on the new workers, bit for bit."""
    client = plexus.connect(journaled.address, name="parked")
    try:
        s = client.slice(3, placement="spread")
        rows = np.arange(12, dtype=np.float32).reshape(6, 2)
        x = s.put(rows, plexus.P("devices"))
        w = s.put(np.linspace(0, 1, 5, dtype=np.float32))
        y = s.program("scale", x, factor=3.0)(x)
        np.testing.assert_array_equal(np.asarray(y), rows * 3)
        parked = s.suspend(to_files=True)
        assert parked["values_parked"] == 3, parked
        assert len(os.listdir(journaled.park)) == 3 + 3 + 3

        journaled.kill_server()
        journaled.kill_workers()
        # The old workers never come back: they are lost 2 s after the
        # start, and the session resumes then.
        journaled.start_server(resume_wait_s=2)
        journaled.start_workers()

        with pytest.raises(plexus.InvalidArgumentError, match="parked in files"):
            np.asarray(y)
        assert s.suspended
        moved = s.resume()
        assert moved["values_moved"] == 3, moved
        np.testing.assert_array_equal(np.asarray(x), rows)
        np.testing.assert_array_equal(np.asarray(y), rows * 3)
        np.testing.assert_array_equal(np.asarray(w),
                                      np.linspace(0, 1, 5, dtype=np.float32))
        assert os.listdir(journaled.park) == []
        z = s.program("scale", y, factor=2.0)(y)
        np.testing.assert_array_equal(np.asarray(z), rows * 6)
        assert client.session_ends[-1]["resumed"], client.session_ends[-1]
    finally:
        client.close()


@pytest.mark.jax_heavy
def test_training_goes_on_through_a_server_kill_bit_for_bit(journaled):
    """examples/elastic_training.py's loop (plexus.jit, all_reduce, puts
    each step) on a slice of the three hosts; the server is SIGKILLed at a
    random moment after step 4 is issued (its calls in flight) and started
    again on its journal; step 5 is issued only once it was."""
    sys.path.insert(0, EXAMPLES)
    from elastic_training import train

    steps = 7
    client = plexus.connect(journaled.address, name="trainer")
    try:
        baseline = train(client, steps, snapshot_every=0)
        killed = threading.Event()
        rng = random.Random(26)

        def kill():
            journaled.kill_and_restart()
            killed.set()

        def on_step(step):
            if step == 4:
                threading.Timer(rng.uniform(0, 0.02), kill).start()
            elif step == 5:
                assert killed.wait(60)

        losses = train(client, steps, snapshot_every=0, on_step=on_step)
        assert losses == baseline, (losses, baseline)
        end = client.session_ends[-1]
        assert end["resumed"] and end["lost_futures"] > 0, end
        _wait_for_log(journaled.log, "resumed its session", 1, timeout=10)
    finally:
        client.close()


def _kills_inside(journaled, steps_with_kill, seed, stopped=None,
                  window_s=0.005):
    """An on_step hook: at each step in `steps_with_kill`, 0 to `window_s`
    after the step is issued (a Timer), the worker process `stopped` is
    SIGSTOPped (so the step's work on it is still to run), the server is
    SIGKILLed and started again on its journal, and the worker continued.
    The next step waits until that is done (no two kills overlap)."""
    rng = random.Random(seed)
    pending = []

    def kill(done):
        if stopped is not None:
            os.kill(stopped.pid, signal.SIGSTOP)
        try:
            journaled.kill_and_restart()
        finally:
            if stopped is not None:
                os.kill(stopped.pid, signal.SIGCONT)
        done.set()

    def on_step(step):
        for done in pending:
            assert done.wait(60), "the server did not come back"
        pending.clear()
        if step in steps_with_kill:
            done = threading.Event()
            pending.append(done)
            threading.Timer(rng.uniform(0, window_s), kill, (done,)).start()

    def finish():
        for done in pending:
            assert done.wait(60), "the server did not come back"

    return on_step, finish


def _worker_of(journaled, slice_):
    """The worker process of a 1-device slice (the fixture's host<i>)."""
    host = slice_.devices[0]["host"]
    return journaled.workers[int(host.removeprefix("host"))]


def _resumed_lines(journaled):
    return [line for line in journaled.log.read_text().splitlines()
            if "resumed; " in line]


def _check_resumed(client, journaled, ends_before, lines_before, kills):
    """Each kill ended the client's session and the next server resumed
    it, losing nothing. A kill may land in the last one's resume (the
    next server then finishes both): so at least one resume is logged, not
    one per kill."""
    ends = client.session_ends[ends_before:]
    assert len(ends) == kills, ends
    assert all(e["resumed"] for e in ends), ends
    _wait_for_log(journaled.log, "resumed; ", lines_before + 1, timeout=30)
    for line in _resumed_lines(journaled)[lines_before:]:
        assert line.endswith(", 0 lost"), line


def test_a_pipeline_trains_through_server_kills_bit_for_bit(journaled):
    """examples/mlp_pipeline.py's two stages (each its own host and its own
    parameters; activations and their gradients move host to host inside
    each step's graph), the server SIGKILLed inside three of its steps and
    started again on its journal (stage 2's host SIGSTOPped meanwhile, so
    the step is still to finish there): every loss and the final
    parameters of both stages equal those of the same run with no kill,
    bit for bit."""
    client = plexus.connect(journaled.address, name="pipeline")
    try:
        run, (_, stage2) = pipeline_job(client, steps=10)
        want = run()
        before = len(_resumed_lines(journaled))
        ends_before = len(client.session_ends)
        on_step, finish = _kills_inside(journaled, {3, 6, 9}, seed=28,
                                        stopped=_worker_of(journaled, stage2))
        got = run(on_step)
        finish()
        assert_same_run(got, want)
        _check_resumed(client, journaled, ends_before, before, kills=3)
    finally:
        client.close()


def test_an_rl_loop_runs_through_server_kills_bit_for_bit(journaled):
    """examples/rl_loop.py's sampler, reward and trainer, each a slice of
    its own host, in plexus.rl.AsyncRLLoop (the trainer's weights sent to
    the sampler every other step), the server SIGKILLed inside three of its
    steps and started again on its journal (the trainer's host SIGSTOPped
    meanwhile, so its calls are still to run): every reward and the final
    weights equal those of the same run with no kill, bit for bit."""
    sys.path.insert(0, EXAMPLES)
    from rl_loop import RLTask, make_task

    steps = 12
    pool, teacher, w0 = make_task(0)
    client = plexus.connect(journaled.address, name="rl")
    try:
        task = RLTask(client, 2.0, pool, teacher, w0)

        def run(on_step=None):
            rewards = {}

            def each(step):
                rewards[step.k] = step.rewards[1]  # read at the end
                if on_step is not None:
                    on_step(step.k + 1)  # before step k + 1 is issued

            final = np.asarray(task.loop(sync_every=2).run(steps, each))
            return [np.asarray(rewards[k]) for k in range(steps)], final

        want_rewards, want_w = run()
        before = len(_resumed_lines(journaled))
        ends_before = len(client.session_ends)
        on_step, finish = _kills_inside(
            journaled, {3, 7, 10}, seed=27,
            stopped=_worker_of(journaled, task.trainer))
        got_rewards, got_w = run(on_step)
        finish()
        for k, (got, want) in enumerate(zip(got_rewards, want_rewards)):
            np.testing.assert_array_equal(got, want, err_msg=f"step {k}")
        np.testing.assert_array_equal(got_w, want_w)
        _check_resumed(client, journaled, ends_before, before, kills=3)
    finally:
        client.close()


def test_two_clients_train_through_server_kills_bit_for_bit(journaled):
    """Several clients: a pipeline (two stages) and an RL loop (three
    slices) of two clients share the three hosts; the server is SIGKILLed
    three times while both run (a host SIGSTOPped at each kill), and each
    session is resumed: each job's losses or rewards and final parameters
    equal those of the same job run alone with no kill, bit for bit. It
    hung in about 4 runs of 10, kill or not, until a task waiting for a
    transfer could no longer pass another client's on its device
    (worker/task_queue.h); and failed in 1 of 3 with 'released before this
    call could read it' until a resumed session's releases waited for its
    resume (ClientSession::SenderLoop)."""
    sys.path.insert(0, EXAMPLES)
    from rl_loop import RLTask, make_task

    pipe_client = plexus.connect(journaled.address, name="pipeline")
    rl_client = plexus.connect(journaled.address, name="rl")
    try:
        pipeline, _ = pipeline_job(pipe_client, steps=12)
        pool, teacher, w0 = make_task(0)
        task = RLTask(rl_client, 2.0, pool, teacher, w0)

        def rl():
            rewards = {}

            def each(step):
                rewards[step.k] = np.asarray(step.rewards[1]).copy()

            final = np.asarray(task.loop(sync_every=2).run(rl_steps, each))
            return [rewards[k] for k in range(rl_steps)], final

        rl_steps = 300  # each read at once: the loop spans the kills
        want_pipe, want_rl = pipeline(), rl()
        ends_before = (len(pipe_client.session_ends),
                       len(rl_client.session_ends))
        before = len(_resumed_lines(journaled))
        # The kills follow the pipeline's steps; the RL loop runs beside it
        # in a thread (started first, and usually still running at the
        # last kill; either way its session ends and resumes with each).
        on_step, finish = _kills_inside(
            journaled, {3, 7, 10}, seed=26,
            stopped=_worker_of(journaled, task.trainer))
        got = {}

        def run_rl():
            try:
                got["rl"] = rl()
            except Exception as e:  # noqa: BLE001 - reported below
                got["error"] = e

        rl_thread = threading.Thread(target=run_rl)
        rl_thread.start()
        try:
            got_pipe = pipeline(on_step)
            finish()
        finally:
            rl_thread.join(timeout=120)
        assert not rl_thread.is_alive(), "the RL loop did not finish"
        if "error" in got:
            raise got["error"]
        assert_same_run(got_pipe, want_pipe)
        for k, (g, w) in enumerate(zip(got["rl"][0], want_rl[0])):
            np.testing.assert_array_equal(g, w, err_msg=f"RL step {k}")
        np.testing.assert_array_equal(got["rl"][1], want_rl[1])
        # Both sessions ended and were resumed, losing nothing. The
        # pipeline's with each kill (its steps wait for the server); the RL
        # loop's, once done, is idle: a kill that comes while it still
        # reconnects after the last (its back-off) ends no session of it,
        # the next server resumes the one that ended.
        for client, n, kills in ((pipe_client, ends_before[0], (3, 3)),
                                 (rl_client, ends_before[1], (1, 3))):
            ends = client.session_ends[n:]
            assert kills[0] <= len(ends) <= kills[1], ends
            assert all(e["resumed"] for e in ends), ends
        _wait_for_log(journaled.log, "resumed; ", before + 2, timeout=30)
        for line in _resumed_lines(journaled)[before:]:
            assert line.endswith(", 0 lost"), line
    finally:
        rl_client.close()
        pipe_client.close()
