"""Soak of server kills under one training run (not in CI).

Runs examples/elastic_training.py's loop (the data-parallel transformer on
a 3-device slice, one device a host: puts, plexus.jit, all_reduce and the
momentum update each step) against a standalone plexus-server on a journal
(`--journal`, `--resume-wait-s 60`) and three standalone workers, and
SIGKILLs the server `--kills` times at random moments: in every
`--every`-th step, either at a random delay after the step is issued (0 to
`--window-ms`, by default the reference's median step times
`--window-share` (1): its puts and calls
on the wire or running; a delay past the step's end falls after it) or,
a `--rest-share` of the time, at rest (before the step is issued, once the
server has no call of the client pending or in flight). Each time the
server is started again at once on the same address and journal, by a
keeper process (as a supervisor would; not a thread of this process, which
a binding call holding the GIL would stop); the workers come back as the
hosts they were and the client's session resumes, with no code in the
loop that handles it. The next kill comes only once the last one's
session was resumed.

The same loop runs first with no kill (the reference), in the same
process and cluster. Checks at the end, each a failure if it does not
hold: every step ran; the loss curve and the final parameters equal the
reference's bit for bit; every session was resumed (none lost a future),
every worker came back (the same ids and processes, none lost) and no
call or put was lost; once the client closed, the workers hold no buffer
and no byte and the server no call or buffer record.

Prints a line per kill as it goes, then a summary, and writes both as
JSON (--json):

  to next step      per kill: from the SIGKILL to the first step completed
                    after it (median, p90, max), split into the server
                    ready again (its ready line: exec, replay, compaction),
                    the three workers back (the server's log), the
                    session resumed (the client's "done", the server's
                    log) and the rest (the calls sent again and the step)
  journal           the journal's file and its -wal after each kill (as
                    the killed server left them) and at the end: it stays
                    bounded over the run (each start compacts it into one
                    snapshot of the model)

Every wait is bounded (--step-timeout, 60 s): a step that does not
complete in time stops the run and names the kill and the step; any
failure keeps the logs, the cluster's status and `plexus why` in the run's
folder (a hang also the stacks: py-spy for this process, gdb for the
server and workers), with the seed and window that replay it.

    PYTHONPATH=python PLEXUS_BIN_DIR=build/bin \\
        python3 bench/server_kill.py --kills 100 --seed 0 \\
        --json bench/results/server_kill.json
"""
import argparse
import concurrent.futures
import datetime
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "examples"))
import numpy as np  # noqa: E402

import elastic_training  # noqa: E402
import plexus  # noqa: E402
from plexus import _core, _spawn  # noqa: E402
from plexus._status import cluster_status  # noqa: E402
from plexus._status_text import why_lines  # noqa: E402
from plexus._binaries import bin_dir, default_pjrt_plugin  # noqa: E402

HOSTS = 3
LOG_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) ")
CAME_BACK = re.compile(r"\[server\] info worker (\d+) came back with what "
                       r"it kept \((\d+) shard")
RESUMED = re.compile(r"client (\d+): resumed; (\d+) live buffer\(s\) kept "
                     r"as the workers gave them back, (\d+) call\(s\) and "
                     r"put\(s\) sent again ran again, (\d+) lost")
RESTARTED = re.compile(r"restarted on journal .* \((\d+) records\)")
SENT_AGAIN = re.compile(r"client (\d+): (\d+) op\(s\) sent again after the "
                        r"resume")
# What a resume must never say.
BAD = re.compile(r"lost with the restart|did not come back within|"
                 r"(lost its connection|missed heartbeats)|session .* ends")


class StepTimeout(RuntimeError):
    pass


def log_seconds(line, near):
    """A log line's wall-clock time (spdlog's %H:%M:%S.%e, local time) as
    seconds since the epoch, on the day of `near` (an epoch time)."""
    m = LOG_TIME.match(line)
    if not m:
        return None
    h, mi, s, ms = (int(g) for g in m.groups())
    day = datetime.datetime.fromtimestamp(near).date()
    t = datetime.datetime.combine(
        day, datetime.time(h, mi, s, ms * 1000)).timestamp()
    # A line just past midnight read near the end of the day before.
    return t + 86400 if t < near - 43200 else t


def file_size(path):
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def ready_line(proc, fd, what):
    """The ready line of a process started by _spawn.spawn (60 s at most)."""
    try:
        line = _spawn.read_ready_line(fd, 60)
    finally:
        os.close(fd)
    if not line:
        raise RuntimeError(f"{what} was not ready in 60 s: it "
                           f"{_spawn.describe_exit(proc.poll())}")
    return line


class ServerKeeper:
    """The process that starts, SIGKILLs and starts again the server
    (`server_kill.py --keeper`), as a supervisor would: not a thread of the
    client's process, whose Python threads stop while a binding call holds
    the GIL. Reads one request a line on stdin ({"op": "start"}, {"op":
    "kill", "at": the time.time() to kill at}); answers one JSON line each
    on stdout; at the end
    of stdin stops the server and exits. The server dies with it
    (--die-with-parent)."""

    def __init__(self, journal, log):
        self.journal = journal
        self.log = log
        self.secret = os.environ["PLEXUS_CLUSTER_SECRET"]
        self.address = "127.0.0.1:0"
        self.server = None

    def _start(self, reply):
        proc, ready = _spawn.spawn(
            [str(bin_dir() / "plexus-server"), "--listen", self.address,
             "--log-level", "info", "--journal", self.journal,
             "--resume-wait-s", "60"],
            secret=self.secret, log_path=self.log)
        self.server = proc
        reply["spawned"] = time.time()
        reply["pid"] = proc.pid
        address = ready_line(proc, ready, "plexus-server")
        if address.startswith("cannot start"):
            raise RuntimeError(f"plexus-server {address}")
        reply["ready"] = time.time()
        if self.address not in ("127.0.0.1:0", address):
            raise RuntimeError(f"the server came back on {address}, not "
                               f"{self.address}")
        self.address = reply["address"] = address

    def _kill(self, at, reply):
        # A random moment of the step, on the clock the bench drew it on:
        # the time this request took to reach the keeper (a pipe and a
        # process to wake, long on a loaded machine) is not added to it.
        # A keeper that got it late kills at once.
        wait = at - time.time()
        if wait > 0:
            time.sleep(wait)
        reply["at"] = time.time()
        reply["log_offset"] = file_size(self.log)
        reply["killed_pid"] = self.server.pid
        self.server.kill()
        self.server.wait()
        reply["dead"] = time.time()
        # The journal as the killed server left it.
        reply["journal_bytes"] = file_size(self.journal)
        reply["wal_bytes"] = file_size(self.journal + "-wal")
        self._start(reply)
        # And once the next one opened (and compacted) it.
        reply["journal_bytes_ready"] = file_size(self.journal)
        reply["wal_bytes_ready"] = file_size(self.journal + "-wal")

    def serve(self):
        for line in sys.stdin:
            request = json.loads(line)
            reply = {}
            try:
                if request["op"] == "start":
                    self._start(reply)
                else:
                    self._kill(request["at"], reply)
            except Exception as e:  # noqa: BLE001 - said to the bench
                reply["error"] = f"{type(e).__name__}: {e}"
            print(json.dumps(reply), flush=True)
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()


class Cluster:
    """A standalone plexus-server on a journal, run by a ServerKeeper
    process, and three standalone workers (they outlive the server and
    come back to the next one)."""

    def __init__(self, folder):
        self.folder = folder
        self.secret = _core.new_cluster_secret()
        plugin = default_pjrt_plugin()
        # The server's and workers' info lines are what the timings are
        # read from: $PLEXUS_LOG_LEVEL would override --log-level.
        self.env = {"PLEXUS_LOG_LEVEL": None}
        if plugin:
            self.env["PLEXUS_PJRT_PLUGIN"] = plugin
        self.journal = os.path.join(folder, "journal.db")
        self.log = os.path.join(folder, "server.log")
        self.address = None
        self.server_pid = None
        self.workers = []
        self.keeper = None
        self._pending = []  # (future, kill dict) awaiting the keeper's line
        self._lock = threading.Lock()

    def start(self):
        env = dict(os.environ, PLEXUS_CLUSTER_SECRET=self.secret)
        for k, v in self.env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        self.keeper = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--keeper",
             self.journal, self.log],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=env)
        threading.Thread(target=self._read_keeper, daemon=True,
                         name="keeper-reader").start()
        started = {}
        self._ask({"op": "start"}, started).result(60)
        self.address = started["address"]
        for i in range(HOSTS):
            log = os.path.join(self.folder, f"worker{i}.log")
            proc, ready = _spawn.spawn(
                [str(bin_dir() / "plexus-worker"), "--server", self.address,
                 "--host-name", f"host{i}", "--devices", "1",
                 "--reconnect-timeout-s", "60", "--log-level", "info"],
                secret=self.secret, env=self.env, log_path=log,
                new_session=True, die_with_parent=False)
            line = ready_line(proc, ready, f"worker host{i}")
            self.workers.append((proc, int(line)))

    def _ask(self, request, into):
        future = concurrent.futures.Future()
        with self._lock:
            self._pending.append((future, into))
            self.keeper.stdin.write(json.dumps(request) + "\n")
            self.keeper.stdin.flush()
        return future

    def _read_keeper(self):
        for line in self.keeper.stdout:
            reply = json.loads(line)
            with self._lock:
                future, into = self._pending.pop(0)
            into.update(reply)
            if "pid" in reply:
                self.server_pid = reply["pid"]
            if "error" in reply:
                future.set_exception(RuntimeError(reply["error"]))
            else:
                future.set_result(into)
        with self._lock:
            for future, _ in self._pending:
                future.set_exception(RuntimeError("the keeper exited"))
            self._pending.clear()

    def kill_and_restart(self, kill, delay=0.0):
        """The keeper SIGKILLs the server `delay` seconds from now, notes the
        journal's size as it left it, and starts it again on the same
        address and journal; `kill` (a dict) gets the times. Returns a
        future, done once the server is ready again."""
        return self._ask({"op": "kill", "at": time.time() + delay}, kill)

    def status(self, fresh=False):
        return json.loads(_core.cluster_status(self.address, fresh))

    def stop(self):
        """The workers, then the server (workers first: they would
        otherwise try to register with the next server)."""
        for proc, _ in self.workers:
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in self.workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.keeper is not None:
            self.keeper.stdin.close()  # the keeper stops the server
            try:
                self.keeper.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.keeper.kill()  # its server dies with it
                self.keeper.wait()


class Soak:
    """The on_step hook of the killed run: plans and makes the kills, notes
    when each step completes, and bounds each step's wait."""

    def __init__(self, cluster, client, kills, every, seed, rest_share,
                 window_s, step_timeout):
        self.cluster = cluster
        self.client = client
        self.kills_wanted = kills
        self.every = every
        self.rng = random.Random(seed)
        self.rest_share = rest_share
        self.window_s = window_s
        self.step_timeout = step_timeout
        self.kills = []       # dicts, in order
        self.completed = {}   # step -> wall time its loss was read
        self.pending = None   # the last kill's future (the keeper's)
        self.progress_at = time.monotonic()
        self.current = 0      # the step issued last
        self._reported = 0    # kills whose line was printed

    def on_step(self, step):
        now = time.time()
        if step > 1:
            self.completed[step - 1] = now
        self.progress_at = time.monotonic()
        self._wait_kill()
        self._report_done()
        self.current = step
        if step % self.every or len(self.kills) >= self.kills_wanted:
            return
        # One kill at a time: the last one's session resumed first.
        self._report_done(wait=True)
        kill = {"kill": len(self.kills) + 1, "step": step}
        self.kills.append(kill)
        if self.rng.random() < self.rest_share:
            kill["when"] = "at rest before step"
            kill["delay_ms"] = None
            self._await_rest(kill)
            self.pending = self.cluster.kill_and_restart(kill)
            self._wait_kill()  # the step is issued to the new server
        else:
            delay = self.rng.uniform(0, self.window_s)
            kill["when"] = "in step"
            kill["delay_ms"] = round(delay * 1000, 1)
            self.pending = self.cluster.kill_and_restart(kill, delay)

    def finish(self, steps):
        self.completed[steps] = time.time()
        self._wait_kill()
        self._report_done(wait=True)

    def _wait_kill(self):
        """The last kill made and its server ready (bounded)."""
        if self.pending is None:
            return
        kill = self.kills[-1]
        try:
            self.pending.result(self.step_timeout)
        except concurrent.futures.TimeoutError:
            raise StepTimeout(
                f"kill {kill['kill']} (step {kill['step']}): the server was "
                f"not killed and ready again within {self.step_timeout} s")
        self.pending = None
        if kill["when"] == "in step" and kill["step"] in self.completed and \
                self.completed[kill["step"]] < kill["at"]:
            kill["when"] = "after step"  # the delay outlasted the step

    def _await_rest(self, kill):
        """Until the server has no call of this client pending or in
        flight (the last step's update is done), bounded."""
        deadline = time.monotonic() + self.step_timeout
        while True:
            st = self.cluster.status()
            mine = [c for c in st.get("clients", [])
                    if int(c["client_id"]) == self.client.id]
            if mine and int(mine[0].get("calls_in_flight", 0)) == 0 and \
                    int(mine[0].get("calls_pending", 0)) == 0:
                return
            if time.monotonic() > deadline:
                raise StepTimeout(
                    f"kill {kill['kill']} (before step {kill['step']}): the "
                    f"client's calls were not done within "
                    f"{self.step_timeout} s")
            time.sleep(0.01)

    def _session_end(self, kill, wait):
        """The client's record of the session this kill ended (the first
        to end after it), once its reconnect is decided (resumed, or given
        up); None if it is not yet and `wait` is False. With `wait`, waits
        for it (bounded)."""
        deadline = kill["at"] + self.step_timeout
        while True:
            end = next((e for e in self.client.session_ends
                        if e["ended"] >= kill["at"]), None)
            if end is not None and (end["reconnected"] or end["gave_up"]):
                return end
            if not wait and time.time() < deadline:
                return None
            if time.time() > deadline:
                raise StepTimeout(
                    f"kill {kill['kill']} (step {kill['step']}): the "
                    f"client's session was not resumed within "
                    f"{self.step_timeout} s: {end}")
            time.sleep(0.01)

    def _report_done(self, wait=False):
        """A line for each kill whose session was resumed and whose next
        step completed since; a failure for one whose resume was not
        whole. With `wait`, first waits for the last kill's session to be
        resumed (the next kill does not fall in its resume)."""
        while self._reported < len(self.kills):
            kill = self.kills[self._reported]
            if "ready" not in kill:
                return
            end = self._session_end(kill, wait)
            if end is None:
                return
            kill["session"] = {k: end.get(k) for k in (
                "resumed", "reconnected", "lost_futures", "down_s",
                "attempts", "slices_lost", "programs_lost", "reason",
                "gave_up")}
            # The client's own clock: from the kill to its session open
            # again on the next server (the resume's "done" comes after).
            if end["down_s"] is not None:
                kill["reconnected_s"] = round(
                    end["ended"] + end["down_s"] - kill["at"], 3)
            problem = None if end["resumed"] else (
                f"the client's session was not resumed: {kill['session']}")
            # The first step completed with the session back: the step
            # that was in flight, or the next.
            nxt = next_step(self.completed, max(
                kill["at"], end["ended"] + (end["down_s"] or 0)))
            if nxt is None and problem is None:
                return
            with open(self.cluster.log, errors="replace") as f:
                f.seek(kill["log_offset"])
                text = f.read()
            fill_from_log(kill, text, self.client.id)
            if nxt is not None:
                kill["next_step"], t = nxt
                kill["to_next_step_s"] = round(t - kill["at"], 3)
            self._reported += 1
            print(kill_line(kill, self.kills_wanted), flush=True)
            problem = problem or resume_problem(kill)
            if problem:
                raise RuntimeError(f"kill {kill['kill']} (step "
                                   f"{kill['step']}): {problem}")


def kill_line(kill, total):
    """A kill's progress line."""
    def s(key):
        v = kill.get(key)
        return "?" if v is None else f"{v:.2f}"
    return (f"  kill {kill['kill']}/{total} {kill['when']} {kill['step']}"
            + (f" (+{kill['delay_ms']:.0f} ms)"
               if kill["delay_ms"] is not None else "")
            + f": step {kill.get('next_step', '?')} done "
            f"{s('to_next_step_s')} s after it (server ready "
            f"{kill['ready'] - kill['at']:.2f} s, workers back "
            f"{s('workers_back_s')} s, session resumed {s('resumed_s')} s; "
            f"{kill.get('ran_again', '?')} call(s) and put(s) ran again); "
            f"journal {kill['journal_bytes']} B + wal {kill['wal_bytes']} B")


def next_step(completed, after):
    """(step, time) of the first step completed after `after`."""
    later = [(t, s) for s, t in completed.items() if t > after]
    if not later:
        return None
    t, s = min(later)
    return s, t


def fill_from_log(kill, text, client_id):
    """What the server's log says of the resume that followed a kill:
    `text` is the log from the kill on (up to the next kill, or more)."""
    backs, resumed, records, bad, warnings = [], None, None, [], []
    for line in text.splitlines():
        t = log_seconds(line, kill["at"])
        m = RESTARTED.search(line)
        if m and records is None:
            records = int(m.group(1))
        m = CAME_BACK.search(line)
        if m and len(backs) < HOSTS:
            backs.append((t, int(m.group(1)), int(m.group(2))))
        m = SENT_AGAIN.search(line)
        if m and int(m.group(1)) == client_id and "ops_sent_again" not in kill:
            kill["ops_sent_again"] = int(m.group(2))
        m = RESUMED.search(line)
        if m and int(m.group(1)) == client_id and resumed is None:
            resumed = (t, int(m.group(2)), int(m.group(3)), int(m.group(4)))
        if re.search(r"\[server\] (warning|error|critical) ", line):
            warnings.append(line)
            if BAD.search(line):
                bad.append(line)
    kill["records_replayed"] = records
    kill["workers_back"] = [w for _, w, _ in backs]
    kill["shards_kept"] = sum(n for _, _, n in backs)
    if len(backs) == HOSTS and all(t is not None for t, _, _ in backs):
        kill["workers_back_s"] = round(max(t for t, _, _ in backs)
                                       - kill["at"], 3)
    if resumed is not None:
        kill["resumed_s"] = round(resumed[0] - kill["at"], 3)
        kill["buffers_kept"], kill["ran_again"], kill["lost"] = resumed[1:]
    kill["log_problems"] = bad[:10]
    kill["log_warnings"] = warnings[:10]


def resume_problem(kill):
    """Why a kill's resume was not whole, or None."""
    s = kill.get("session", {})
    if not s.get("resumed"):
        return f"the client's session was not resumed: {s}"
    if s.get("slices_lost") or s.get("programs_lost"):
        return f"the session lost slices or programs: {s}"
    if len(kill.get("workers_back", [])) != HOSTS:
        return (f"only workers {kill.get('workers_back')} came back with "
                f"what they kept")
    if kill.get("lost"):
        return f"{kill['lost']} buffer(s) lost with the restart"
    if kill.get("log_problems"):
        return "the server logged: " + " | ".join(kill["log_problems"])
    return None


class Watchdog(threading.Thread):
    """Stops the run when no step completes within the step timeout:
    names the kill and the step, keeps the diagnostics, ends the process
    (the main thread is blocked in a wait that has no deadline of its
    own: a fetch of the step's loss)."""

    def __init__(self, soak, dump):
        super().__init__(daemon=True, name="watchdog")
        self.soak = soak
        self.dump = dump
        self.stopped = threading.Event()
        self.fired = threading.Event()

    def run(self):
        while not self.stopped.wait(1.0):
            idle = time.monotonic() - self.soak.progress_at
            if idle > self.soak.step_timeout and not self.stopped.is_set():
                self.fired.set()
                kill = self.soak.kills[-1] if self.soak.kills else None
                self.dump(f"step {self.soak.current} did not complete within "
                          f"{self.soak.step_timeout} s"
                          + (f" (the last kill: {kill['kill']}, in step "
                             f"{kill['step']}, {kill['when']})" if kill
                             else ""))
                return


def stacks(pid, python):
    """The stacks of process `pid`'s threads, as text: py-spy (with native
    frames) for this Python process, gdb for the C++ ones."""
    argv = (["py-spy", "dump", "--native", "--pid", str(pid)] if python
            else ["gdb", "-p", str(pid), "-batch", "-ex",
                  "thread apply all bt"])
    if shutil.which(argv[0]) is None:
        return f"({argv[0]} is not installed)"
    # Into a file, not a pipe: gdb attached to this process stops the
    # thread that would drain a pipe, and would then block on it.
    with tempfile.TemporaryFile("w+") as out:
        try:
            subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT,
                           text=True, timeout=120)
        except subprocess.TimeoutExpired:
            return f"$ {' '.join(argv)}: no answer in 120 s"
        out.seek(0)
        return f"$ {' '.join(argv)}\n{out.read()}"


class Diagnostics:
    """What a failed run keeps in its folder, collected once by whichever
    thread sees the failure first: the failure (failure.txt), the
    cluster's status and `plexus why` (status.json, why.txt), the states of
    the Plexus processes (ps.txt: a server killed but not gone shows
    here), and the stacks of this process (py-spy) and of the server and
    workers (gdb) when it hangs."""

    def __init__(self, cluster, folder, with_stacks=True):
        self.cluster = cluster
        self.folder = folder
        self.with_stacks = with_stacks
        self._lock = threading.Lock()
        self._collected = False

    def _write(self, name, text):
        with open(os.path.join(self.folder, name), "w") as f:
            f.write(text)

    def collect(self, why, hang=False):
        """Keeps the failure `why`; the stacks only for a hang (gdb stops
        each process for seconds: the server declares stopped workers
        down, which would then read as part of the failure)."""
        with self._lock:
            if self._collected:
                return
            self._collected = True
            print(f"  keeping the logs, the status"
                  f"{' and the stacks' if hang and self.with_stacks else ''}"
                  f" in {self.folder}", flush=True)
            self._write("failure.txt", why + "\n")
            try:
                st = cluster_status(self.cluster.address)
                self._write("status.json", json.dumps(st, indent=1))
                self._write("why.txt", "\n".join(
                    line for _, line in why_lines(st, 1.0)) + "\n")
            except Exception as e:  # noqa: BLE001 - the server may be down
                self._write("status.json", json.dumps({"error": str(e)}))
            ps = subprocess.run(
                ["ps", "-eo", "pid,ppid,stat,wchan:32,etimes,args"],
                capture_output=True, text=True)
            mine = {str(os.getpid()), str(self.cluster.keeper.pid)}
            self._write("ps.txt", "\n".join(
                line for line in ps.stdout.splitlines()
                if "PID" in line or line.split()[1] in mine) + "\n")
            if not (hang and self.with_stacks):
                return
            # py-spy shows the Python threads; gdb (attached to this very
            # process, which it stops while it reads) the client's C++ ones.
            self._write("client-stacks.txt", stacks(os.getpid(), True) +
                        "\n" + stacks(os.getpid(), False))
            pids = [("server", self.cluster.server_pid)] + [
                (f"worker{i}", p.pid if p.poll() is None else None)
                for i, (p, _) in enumerate(self.cluster.workers)]
            for name, pid in pids:
                if pid is not None and os.path.exists(f"/proc/{pid}"):
                    self._write(f"{name}-stacks.txt", stacks(pid, False))


def percentile(values, q):
    """The q-quantile of `values` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


ROW = ("kill", "step", "when", "delay_ms", "at", "ready_s", "reconnected_s",
       "workers_back_s", "resumed_s", "to_next_step_s", "next_step",
       "ops_sent_again", "ran_again", "buffers_kept", "lost",
       "records_replayed", "journal_bytes", "wal_bytes",
       "journal_bytes_ready", "wal_bytes_ready", "log_problems", "error")


def row(kill):
    """What the JSON keeps of a kill."""
    out = {k: kill[k] for k in ROW if kill.get(k) not in (None, [])}
    if "session" in kill:
        out["session_resumed"] = kill["session"]["resumed"]
    return out


def summarise(kills, steps, reference_step_s):
    done = [k for k in kills if k.get("to_next_step_s") is not None]

    def figures(key):
        vals = [k[key] for k in done if k.get(key) is not None]
        if not vals:
            return None
        return {"median": round(statistics.median(vals), 3),
                "p90": round(percentile(vals, 0.9), 3),
                "max": round(max(vals), 3), "n": len(vals)}

    for k in done:
        k["ready_s"] = round(k["ready"] - k["at"], 3)
        if k.get("resumed_s") is not None:
            k["rest_s"] = round(k["to_next_step_s"] - k["resumed_s"], 3)
    by_when = {}
    for k in done:
        by_when.setdefault(k["when"], []).append(k["to_next_step_s"])
    # Over a long run, per 100 kills: what grows with the session's
    # length (the ops its client keeps and sends again) and what does not.
    by_hundred = []
    for first in range(0, len(done), 100) if len(done) >= 200 else ():
        part = done[first:first + 100]
        resumed = [k["resumed_s"] - k["workers_back_s"] for k in part
                   if k.get("resumed_s") is not None
                   and k.get("workers_back_s") is not None]
        by_hundred.append({
            "kills": f"{part[0]['kill']}-{part[-1]['kill']}",
            "ops_sent_again_median": statistics.median(
                [k.get("ops_sent_again", 0) for k in part]),
            "workers_back_median_s": round(statistics.median(
                [k.get("workers_back_s") or 0 for k in part]), 3),
            "workers_back_to_resumed_median_s": round(
                statistics.median(resumed), 3) if resumed else None,
            "to_next_step_median_s": round(statistics.median(
                [k["to_next_step_s"] for k in part]), 3)})
    journal = [k["journal_bytes"] for k in kills if "journal_bytes" in k]
    wal = [k["wal_bytes"] for k in kills if "wal_bytes" in k]
    records = [k["records_replayed"] for k in kills
               if k.get("records_replayed") is not None]
    return {
        "kills": len(kills),
        "resumed": sum(resume_problem(k) is None for k in done),
        "steps": steps,
        "reference_step_median_s": round(reference_step_s, 3),
        "when": {w: len(v) for w, v in sorted(by_when.items())},
        "to_next_step_s": figures("to_next_step_s"),
        "to_next_step_median_s_by_when": {
            w: round(statistics.median(v), 3)
            for w, v in sorted(by_when.items())},
        "server_ready_s": figures("ready_s"),
        "workers_back_s": figures("workers_back_s"),
        "client_reconnected_s": figures("reconnected_s"),
        "session_resumed_s": figures("resumed_s"),
        "resumed_to_step_s": figures("rest_s"),
        "calls_and_puts_ran_again": figures("ran_again"),
        # Every call and put the client kept (its last 65,536) is sent
        # again at a resume; the server runs those whose outputs are
        # missing.
        "ops_sent_again": figures("ops_sent_again"),
        # Kills that found calls or puts of the client not yet run
        # everywhere (sent again at the resume), and kills that found none.
        "kills_with_work_in_flight": sum(
            (k.get("ran_again") or 0) > 0 for k in done),
        "kills_with_nothing_in_flight": sum(
            k.get("ran_again") == 0 for k in done),
        "records_replayed": {"first": records[0], "max": max(records),
                             "last": records[-1]} if records else None,
        "journal_bytes": {"first": journal[0], "max": max(journal),
                          "last": journal[-1]} if journal else None,
        "wal_bytes": {"first": wal[0], "max": max(wal),
                      "last": wal[-1]} if wal else None,
        "journal_bytes_after_restart_max": max(
            [k["journal_bytes_ready"] for k in kills
             if "journal_bytes_ready" in k] or [0]),
        "by_hundred_kills": by_hundred,
    }


def leaks(st):
    """What the cluster still holds for clients: a dict, all zero when
    nothing leaked."""
    live = [w for w in st["workers"] if w["alive"]]
    rec = st.get("recovery", {})
    return {
        "worker_live_buffers": sum(int(w.get("stats", {}).get(
            "live_buffers", 0)) for w in live),
        "worker_live_bytes": sum(int(w.get("stats", {}).get(
            "live_bytes", 0)) for w in live),
        "server_call_records": int(rec.get("call_records", 0)),
        "server_buffer_records": int(rec.get("buffer_records", 0)),
        "clients": len(st.get("clients", [])),
    }


def await_no_leaks(cluster, timeout):
    """The leaks once none are left, or the last read after `timeout`
    (each read waits for a heartbeat of every worker: their stats are
    fresh)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = leaks(cluster.status(fresh=True))
        except plexus.PlexusError as e:
            return {"status": f"{type(e).__name__}: {e}"}
        if not any(found.values()) or time.monotonic() > deadline:
            return found


def same_tree(a, b):
    """Whether two pytrees of numpy arrays are equal bit for bit."""
    import jax
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and all(
        x.dtype == y.dtype and x.shape == y.shape and
        np.array_equal(x.view(np.uint8), y.view(np.uint8))
        for x, y in zip(la, lb))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--keeper"]:
        ServerKeeper(*argv[1:3]).serve()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--every", type=int, default=2,
                        help="a kill in every this many steps")
    parser.add_argument("--rest-share", type=float, default=0.2,
                        help="share of kills made at rest, between steps")
    parser.add_argument("--seed", type=int, default=0,
                        help="the kills' seed (the model's is 0)")
    parser.add_argument("--window-ms", type=float, default=None,
                        help="a kill in a step falls this many ms or less "
                             "after the step is issued (default: the "
                             "reference's median step times "
                             "--window-share; printed, to replay a seed)")
    parser.add_argument("--window-share", type=float, default=1.0,
                        help="without --window-ms: the window is this "
                             "share of the reference's median step")
    parser.add_argument("--step-timeout", type=float, default=60.0,
                        help="seconds a step (or a kill) may take")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--rows-every", type=int, default=1,
                        help="the JSON keeps every this many kills' rows "
                             "(and any that failed); the summary covers all")
    parser.add_argument("--no-stacks", action="store_true",
                        help="on a hang, keep the logs and the status "
                             "but not the processes' stacks (gdb stops "
                             "each process for seconds to minutes)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the run's folder (logs, journal) even "
                             "when it passed")
    args = parser.parse_args(argv)
    steps = args.kills * args.every + args.every
    folder = tempfile.mkdtemp(prefix="plexus-server-kill-")
    print(f"{steps} steps, {args.kills} server kills, seed {args.seed}; "
          f"logs and journal in {folder}", flush=True)
    cluster = Cluster(folder)
    result = {"summary": None, "kills": None}
    soak = None

    def write(summary, error=None):
        summary = dict(summary or {}, seed=args.seed, error=error,
                       folder=folder)
        result["summary"] = summary
        result["kills"] = [row(kill) for kill in (soak.kills if soak else [])
                           if kill["kill"] % args.rows_every == 0
                           or kill.get("log_problems") or kill.get("error")]
        if args.json:
            # One line a kill: a 1,000-kill run stays readable.
            with open(args.json, "w") as f:
                f.write('{"summary": ' + json.dumps(summary, indent=1)
                        + ',\n "kills": [\n')
                f.write(",\n".join(json.dumps(k) for k in result["kills"]))
                f.write("\n]}\n")

    diagnostics = Diagnostics(cluster, folder, not args.no_stacks)

    def timed_out(why):
        """The watchdog's: a step did not complete in time. Keeps what
        there is to see, and ends the process (the main thread is blocked
        in a wait of the client's)."""
        print(f"server_kill: FAILED: {why} (seed {args.seed})", flush=True)
        diagnostics.collect(why, hang=True)
        write(summarise(soak.kills, steps, 0.0) if soak else None, why)
        print(f"  kept in {folder}", flush=True)
        try:
            cluster.stop()
        finally:
            os._exit(3)

    try:
        cluster.start()
        # The reference: the same loop with no kill, its step times.
        with plexus.connect(cluster.address, name="reference") as client:
            marks = []
            t0 = time.monotonic()
            expected, expected_params = elastic_training.train(
                client, steps, seed=0, snapshot_every=0,
                on_step=lambda step: marks.append(time.monotonic()),
                return_params=True)
            marks.append(time.monotonic())
        step_s = statistics.median(b - a for a, b in zip(marks, marks[1:]))
        window_s = (step_s * args.window_share if args.window_ms is None
                    else args.window_ms / 1000)
        print(f"reference: {steps} steps in {time.monotonic() - t0:.1f} s, "
              f"median step {step_s * 1000:.1f} ms; kills in a step fall "
              f"0 to {window_s * 1000:.1f} ms after it is issued (seed "
              f"{args.seed}, --window-ms {window_s * 1000:.1f})", flush=True)
        before = await_no_leaks(cluster, 30)
        if any(before.values()):
            raise RuntimeError(f"the reference run left {before}")
        pids = {w["worker_id"]: w["pid"] for w in cluster.status()["workers"]}

        client = plexus.connect(cluster.address, name="soak")
        soak = Soak(cluster, client, args.kills, args.every, args.seed,
                    args.rest_share, window_s, args.step_timeout)
        watchdog = Watchdog(soak, timed_out)
        watchdog.start()
        error = None
        losses = params = None
        t0 = time.monotonic()
        try:
            losses, params = elastic_training.train(
                client, steps, seed=0, snapshot_every=0,
                on_step=soak.on_step, return_params=True)
            soak.finish(steps)
        except (plexus.PlexusError, RuntimeError) as e:
            watchdog.stopped.set()
            if watchdog.fired.is_set():
                # The watchdog saw the failure first and ends the process;
                # this is what its diagnostics did (gdb stops the workers:
                # their heartbeats are missed).
                watchdog.join(timeout=900)
                os._exit(3)
            error = f"{type(e).__name__}: {e}"
            print(f"server_kill: FAILED: {error} (seed {args.seed})",
                  flush=True)
            diagnostics.collect(error)
        elapsed = time.monotonic() - t0
        watchdog.stopped.set()
        client.close()
        # (Shorter after a failure: what is left then is reported as is.)
        after = await_no_leaks(cluster, 60 if error is None else 10)
        try:
            st = cluster.status()
        except plexus.PlexusError:
            st = {"workers": []}
        now_pids = {w["worker_id"]: w["pid"] for w in st["workers"]}
        summary = summarise(soak.kills, steps, step_s)
        summary.update({
            "soak_s": round(elapsed, 1),
            "steps_done": len(losses) if losses is not None else None,
            "loss_curve_equal": losses == expected,
            "first_loss_differing": next(
                (i + 1 for i, (a, b) in enumerate(zip(losses, expected))
                 if a != b), None) if losses is not None else None,
            "final_params_equal": params is not None and same_tree(
                params, expected_params),
            "workers_same_processes": now_pids == pids and all(
                w["alive"] for w in st["workers"]),
            "leaks_after_close": after,
            "journal_bytes_end": file_size(cluster.journal),
            "wal_bytes_end": file_size(cluster.journal + "-wal"),
        })
        failed = [name for name, ok in (
            ("error", error is None),
            ("every kill resumed", summary["resumed"] == len(soak.kills)),
            ("loss curve", summary["loss_curve_equal"]),
            ("final parameters", summary["final_params_equal"]),
            ("workers", summary["workers_same_processes"]),
            ("leaks", not any(after.values()))) if not ok]
        summary["failed_checks"] = failed
        print(json.dumps(summary, indent=2), flush=True)
        write(summary, error)
        if failed:
            print(f"server_kill: FAILED: {', '.join(failed)} (seed "
                  f"{args.seed}); logs in {folder}", flush=True)
            return 1
        print(f"server_kill: {len(soak.kills)} kills, all resumed, nothing "
              f"lost", flush=True)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
