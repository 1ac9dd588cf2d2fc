"""A standby server (plexus-server --standby-of PRIMARY, issue 26): it
follows the primary's journal into its own, synced change by change, and
takes over once the primary has been silent for its lease. Workers and
clients are given both addresses ("PRIMARY,STANDBY") and follow: they
resume with the standby as with a server restarted on its journal, and a
training loop's losses equal, bit for bit, those of a run with no kill."""
import os
import select
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import plexus
from plexus import _core
from plexus._binaries import bin_dir, default_pjrt_plugin

from restart_jobs import assert_same_run, pipeline_job
from test_membership import _ready_line, _spawn, _wait_for_log
from test_reconnect import _worker

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
LEASE_MS = 1000


def _cluster_env():
    """The environment of a cluster's processes: a fresh cluster secret,
    and the PJRT plugin where there is one."""
    env = dict(os.environ, PLEXUS_CLUSTER_SECRET=_core.new_cluster_secret())
    plugin = default_pjrt_plugin()
    if plugin:
        env["PLEXUS_PJRT_PLUGIN"] = plugin
    return env


def _stop_workers(workers):
    """SIGTERM, then SIGKILL past 30 s; each reaped."""
    for w in workers:
        w.terminate()
    for w in workers:
        try:
            w.wait(timeout=30)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()


def _primary(log, env, journal):
    proc, ready = _spawn(
        [str(bin_dir() / "plexus-server"), "--listen", "127.0.0.1:0",
         "--ready-fd", "{READY_FD}", "--log-level", "info",
         "--journal", str(journal), "--standby-lease-ms", str(LEASE_MS),
         "--die-with-parent"], log, env)
    return proc, _ready_line(ready)


def _read_line(fd, timeout):
    """One line from a ready pipe, which stays open (a standby writes its
    address when it follows, and again when it takes over)."""
    line = b""
    deadline = time.monotonic() + timeout
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [],
                                    max(deadline - time.monotonic(), 0))
        assert ready, f"no line within {timeout} s (so far {line!r})"
        chunk = os.read(fd, 1)
        assert chunk, f"the pipe closed (so far {line!r})"
        line += chunk
    return line.decode().strip()


def _standby(primary, address, log, env, journal, die_with_parent=True):
    """Started: (process, its ready pipe, the address it holds, written
    once it follows its primary; it serves there once it takes over, and
    writes it again then). One started from a thread must not die with it
    (PR_SET_PDEATHSIG follows the thread that started the process): the
    fixture stops it."""
    proc, ready = _spawn(
        [str(bin_dir() / "plexus-server"), "--listen", address,
         "--ready-fd", "{READY_FD}", "--log-level", "info",
         "--journal", str(journal), "--standby-of", primary,
         "--standby-lease-ms", str(LEASE_MS)]
        + (["--die-with-parent"] if die_with_parent else []), log, env)
    return proc, ready, _read_line(ready, timeout=30)


@pytest.fixture
def paired(tmp_path):
    """A primary on a journal, its standby on another, and three standalone
    workers given both addresses."""
    env = _cluster_env()

    class Cluster:
        pass

    c = Cluster()
    c.env, c.tmp = env, tmp_path
    c.primary_log = tmp_path / "primary.log"
    c.standby_log = tmp_path / "standby.log"
    c.primary, c.primary_address = _primary(c.primary_log, env,
                                            tmp_path / "primary.db")
    c.standby, c.standby_ready, c.standby_address = _standby(
        c.primary_address, "127.0.0.1:0", c.standby_log, env,
        tmp_path / "standby.db")
    c.address = f"{c.primary_address},{c.standby_address}"
    c.workers = [_worker(c.address, f"host{i}", tmp_path / f"worker{i}.log",
                         env, devices=1)
                 for i in range(3)]

    c.takeovers = 0
    retired = []

    def take_over(stop=False):
        """SIGKILLs the primary (or SIGSTOPs it: it is then silent, not
        gone); returns once the standby serves. The standby is then the
        primary, and the old primary's address is free (or taken) for the
        next standby."""
        if stop:
            os.kill(c.primary.pid, signal.SIGSTOP)
        else:
            c.primary.kill()
            c.primary.wait()
        assert _read_line(c.standby_ready, timeout=60) == c.standby_address
        os.close(c.standby_ready)
        retired.append(c.primary)
        c.primary, c.primary_address = c.standby, c.standby_address
        c.primary_log = c.standby_log
        c.standby = c.standby_ready = None
        c.takeovers += 1

    def standby_again(address):
        """A new standby of the primary, at `address` (the old primary's,
        so the workers' and clients' list still names it)."""
        c.standby_log = tmp_path / f"standby{c.takeovers}.log"
        c.standby, c.standby_ready, c.standby_address = _standby(
            c.primary_address, address, c.standby_log, env,
            tmp_path / f"standby{c.takeovers}.db", die_with_parent=False)
        assert c.standby_address == address

    c.take_over, c.standby_again = take_over, standby_again
    try:
        yield c
    finally:
        _stop_workers(c.workers)
        for p in [c.primary, c.standby] + retired:
            if p is not None and p.poll() is None:
                p.kill()  # a stopped one too
                p.wait(timeout=30)


def _resumed_lines(log):
    return [line for line in log.read_text().splitlines()
            if "resumed; " in line]


@pytest.mark.parametrize("stop", [False, True], ids=["killed", "stopped"])
def test_training_goes_on_through_a_takeover_bit_for_bit(paired, stop):
    """examples/elastic_training.py's loop (plexus.jit, all_reduce, puts
    each step) on a slice of the three hosts; the primary is SIGKILLed
    after step 4 is issued (its calls in flight), or SIGSTOPped (silent,
    its sockets open: the workers and the client find it by their pings);
    the standby takes over after the lease, and the workers and the client
    resume with it: the losses equal those of the same run with no kill,
    bit for bit."""
    sys.path.insert(0, EXAMPLES)
    from elastic_training import train

    steps = 7
    client = plexus.connect(paired.address, name="trainer")
    try:
        baseline = train(client, steps, snapshot_every=0)
        ends_before = len(client.session_ends)
        done = threading.Event()

        def on_step(step):
            if step == 4:
                threading.Thread(target=lambda: (paired.take_over(stop=stop),
                                                 done.set())).start()
            elif step == 5:
                assert done.wait(60), "the standby did not take over"

        losses = train(client, steps, snapshot_every=0, on_step=on_step)
        assert losses == baseline, (losses, baseline)
        _check_takeover(client, paired.primary_log, ends_before)
    finally:
        client.close()


def test_an_operators_shutdown_stops_the_standby_too(paired):
    """`plexus down` (the Shutdown RPC) is the operator's: the standby
    stops with the primary rather than take over."""
    _core.shutdown_server(paired.primary_address,
                          paired.env["PLEXUS_CLUSTER_SECRET"])
    assert paired.primary.wait(timeout=30) == 0
    assert paired.standby.wait(timeout=30) == 0
    assert "shut down; so does the standby" in paired.standby_log.read_text()


def _check_takeover(client, log, ends_before):
    """The client's session ended once and was resumed by the standby,
    which lost nothing and took every worker back."""
    ends = client.session_ends[ends_before:]
    assert len(ends) == 1 and ends[0]["resumed"], ends
    _wait_for_log(log, "resumed; ", 1, timeout=30)
    for line in _resumed_lines(log):
        assert line.endswith(", 0 lost"), line
    text = log.read_text()
    assert "taking over" in text and "restarted on journal" in text, text
    assert text.count("came back with what it kept") == 3, text


def test_a_pipeline_trains_through_two_takeovers_bit_for_bit(paired):
    """examples/mlp_pipeline.py's two stages (per-stage parameters,
    activations host to host): the primary is SIGKILLed inside step 3 and
    the standby takes over; the old primary's address comes back as the
    standby of the new one, which is SIGKILLed inside step 7 in turn. The
    same two addresses serve the whole run; every loss and the final
    parameters equal those of the run with no kill, bit for bit."""
    client = plexus.connect(paired.address, name="pipeline")
    try:
        run, _ = pipeline_job(client, steps=9)
        want = run()
        pending = []
        logs = []

        def takeover(done):
            old = paired.primary_address
            paired.take_over()
            logs.append((paired.primary_log, len(client.session_ends)))
            paired.standby_again(old)
            done.set()

        def on_step(step):
            for done in pending:
                assert done.wait(60), "the standby did not take over"
            pending.clear()
            if step in (3, 7):
                done = threading.Event()
                pending.append(done)
                threading.Thread(target=takeover, args=(done,)).start()

        got = run(on_step)
        for done in pending:
            assert done.wait(60)
        assert_same_run(got, want)
        ends = client.session_ends
        assert len(ends) == 2 and all(e["resumed"] for e in ends), ends
        for log, _ in logs:
            _wait_for_log(log, "resumed; ", 1, timeout=30)
            for line in _resumed_lines(log):
                assert line.endswith(", 0 lost"), line
    finally:
        client.close()


def _pair_member(address, peer, log, env, journal, first):
    """One server of a pair (deploy/kubernetes/plexus.yaml's shape): each
    the standby of the other; the first serves its own journal when the
    other cannot be followed within SERVE_ALONE_MS of its start. Started:
    (process, its ready pipe), which says the address when it follows or
    serves."""
    return _spawn(
        [str(bin_dir() / "plexus-server"), "--listen", address,
         "--ready-fd", "{READY_FD}", "--log-level", "info",
         "--journal", str(journal), "--standby-of", peer,
         "--standby-lease-ms", str(LEASE_MS), "--die-with-parent"]
        + (["--serve-if-alone-ms", str(SERVE_ALONE_MS)] if first else []),
        log, env)


SERVE_ALONE_MS = 3 * LEASE_MS  # past the peer's lease and its takeover


def test_a_pair_serves_whichever_is_up_and_a_restarted_one_follows(tmp_path):
    """Two servers, each the standby of the other: started together, the
    first serves (no primary answered within its --serve-if-alone-ms) and
    the second follows it. The first is SIGKILLed in step 3 and started
    again at once, as a kubelet does: the second takes over at its lease's
    end and the first, finding it serving, follows it rather than serve
    its own journal. The second is SIGKILLed in step 6 and the first takes
    over again. The data-parallel loop's losses equal those of the run
    with no kill, bit for bit, and the client's two resumed sessions lost
    nothing."""
    from test_deploy_slurm import free_port
    sys.path.insert(0, EXAMPLES)
    from elastic_training import train

    env = _cluster_env()
    a, b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    procs = []

    def member(name, address, peer, first):
        log = tmp_path / f"{name}{len(procs)}.log"
        proc, ready = _pair_member(address, peer, log, env,
                                   tmp_path / f"{name}.db", first)
        procs.append(proc)
        return proc, ready, log

    first, first_ready, _ = member("first", a, b, first=True)
    second, second_ready, second_log = member("second", b, a, first=False)
    workers = []
    client = None
    restarted = {}
    try:
        assert _read_line(first_ready, timeout=60) == a  # serving
        assert _read_line(second_ready, timeout=60) == b  # following
        workers = [_worker(f"{a},{b}", f"host{i}", tmp_path / f"w{i}.log",
                           env, devices=1) for i in range(3)]
        client = plexus.connect(f"{a},{b}", name="trainer")
        baseline = train(client, 8, snapshot_every=0)
        ends_before = len(client.session_ends)

        def on_step(step):
            if step == 3:
                first.kill()
                first.wait()
                # Again at once: the second has not taken over yet.
                restarted["proc"], restarted["ready"], restarted["log"] = \
                    member("first", a, b, first=True)
                assert _read_line(second_ready, timeout=60) == b  # serves
                assert _read_line(restarted["ready"], timeout=60) == a
            elif step == 6:
                second.kill()
                second.wait()
                assert _read_line(restarted["ready"], timeout=60) == a

        losses = train(client, 8, snapshot_every=0, on_step=on_step)
        assert losses == baseline, (losses, baseline)
        ends = client.session_ends[ends_before:]
        assert len(ends) == 2 and all(e["resumed"] for e in ends), ends
        text = restarted["log"].read_text()
        assert f"following the primary at {b}" in text, text
        assert "serving this server's journal" not in text, text
        assert "taking over" in text, text
        _wait_for_log(restarted["log"], "resumed; ", 1, timeout=30)
        for log in (second_log, restarted["log"]):
            for line in _resumed_lines(log):
                assert line.endswith(", 0 lost"), line
    finally:
        if client is not None:
            client.close()
        _stop_workers(workers)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
        for fd in (first_ready, second_ready, restarted.get("ready")):
            if fd is not None:
                os.close(fd)


def test_a_primary_that_wakes_after_a_takeover_steps_down(tmp_path):
    """The pair's serving server is SIGSTOPped past the lease; the other
    takes over, with the workers and the client, which goes on computing.
    The stopped one, continued, finds that it stalled past its lease and
    that the other serves, and steps down (exit code 5, saying so) rather
    than serve beside it: a client given the pair then finds every worker
    at the one that took over."""
    from test_deploy_slurm import free_port

    env = _cluster_env()
    a, b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    first, first_ready = _pair_member(a, b, tmp_path / "first.log", env,
                                      tmp_path / "first.db", first=True)
    second, second_ready = _pair_member(b, a, tmp_path / "second.log", env,
                                        tmp_path / "second.db", first=False)
    workers, clients = [], []
    try:
        assert _read_line(first_ready, timeout=60) == a
        assert _read_line(second_ready, timeout=60) == b
        workers = [_worker(f"{a},{b}", f"host{i}", tmp_path / f"w{i}.log",
                           env, devices=1) for i in range(3)]
        client = plexus.connect(f"{a},{b}", name="job")
        clients.append(client)
        s = client.slice(3, placement="spread")
        x = s.put(np.arange(6, dtype=np.float32), plexus.P("devices"))
        double = s.program("scale", x, factor=2.0)
        y = double(x)
        np.testing.assert_array_equal(np.asarray(y), np.arange(6) * 2.0)

        os.kill(first.pid, signal.SIGSTOP)
        assert _read_line(second_ready, timeout=60) == b  # it took over
        z = double(y)
        np.testing.assert_array_equal(
            np.asarray(plexus.wait(z, timeout=60)), np.arange(6) * 4.0)
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(timeout=60) == 5
        text = (tmp_path / "first.log").read_text()
        assert f"the other server of the pair, at {b}, serves" in text, text
        assert "Stepping down" in text, text
        assert second.poll() is None, "the one that took over serves on"
        # A client given the pair reaches the one that serves.
        late = plexus.connect(f"{a},{b}", name="late")
        clients.append(late)
        st = plexus.status(f"{a},{b}")
        assert sum(w["alive"] for w in st["workers"]) == 3, st["workers"]
        np.testing.assert_array_equal(np.asarray(double(z)),
                                      np.arange(6) * 8.0)
    finally:
        for c in clients:
            c.close()
        _stop_workers(workers)
        for p in (first, second):
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.wait(timeout=30)
        os.close(first_ready)
        os.close(second_ready)
