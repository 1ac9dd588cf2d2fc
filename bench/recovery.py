"""Soak of host failures under one long elastic training run (not in CI).

Runs examples/elastic_training.py's loop (the data-parallel transformer on
3 hosts + 1 spare, momentum split and snapshotted every step) for as many
steps as it takes, killing a random worker of the slice every
`--every` steps at a random moment of the step: SIGKILL, or SIGSTOP
(declared down by missed heartbeats, then SIGCONT: it is fenced and
rejoins as a fresh host), mixed. Each failure waits for the previous one's
spare to join, for a step to complete since the previous kill and for the
snapshot copies it took to be made again, so that failures come one at a time and
each one's recovery is measured on its own (and the loop waits at a
failure's step until the previous failure was made, so that failures keep
to one every `--every` steps when steps are faster than a failure is
made: a spare joining, a stopped host missed; --overlap lets a kill fall while
the previous recovery is still going on; --ready-spare also waits for the
spare to have compiled the job's programs ahead, so that recovery is
measured without compiling).
Prints, and writes as JSON (--json):

  recovered / total     failures after which training went on (and the
                        whole loss curve equals a failure-free run's)
  steps redone          per failure: 1 if calls of the step in flight ran
                        again, else 0 (no step is ever lost: the loop never
                        sees the failure)
  recovery time         from the kill to the first step completed after the
                        server declared the host down (median, max), split into detection (kill -> the server
                        declares the host down, from its log), compile (the
                        spare compiling the programs, from its log), load
                        (the spare loading them from a peer, from its log)
                        and the rest (routing again, copies, recomputation)

    PYTHONPATH=python PLEXUS_BIN_DIR=build/bin \\
        python3 bench/recovery.py --failures 100 --every 3
"""
import argparse
import datetime
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "examples"))
import elastic_training  # noqa: E402
import plexus  # noqa: E402
from plexus import _core  # noqa: E402

LOG_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) ")


def log_seconds(line, day):
    """A log line's wall-clock time, as seconds since the epoch."""
    m = LOG_TIME.match(line)
    if not m:
        return None
    h, mi, s, ms = (int(g) for g in m.groups())
    t = datetime.datetime.combine(day, datetime.time(h, mi, s, ms * 1000))
    return t.replace(tzinfo=datetime.timezone.utc).timestamp()


class Soak:
    def __init__(self, cluster, failures, every, seed, stop_share,
                 overlap=False, ready_spare=False):
        self.cluster = cluster
        self.overlap = overlap
        self.ready_spare = ready_spare
        self.failures = failures
        self.every = every
        self.rng = random.Random(seed)
        self.stop_share = stop_share
        self.finished = False  # the run ended: no more failures
        self.kills = []      # dicts: step, kind, host, worker, at (wall)
        self.completed = []  # (step, wall time its loss was read)
        self._lock = threading.Lock()
        self._threads = []
        self._declared = []  # per failure: set once its loss was declared

    def status(self):
        return json.loads(_core.cluster_status(self.cluster.address))

    def wait(self, what, ready, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if ready(st):
                return st
            if time.monotonic() > deadline:
                raise RuntimeError(f"soak: {what} did not happen in {timeout} s")
            time.sleep(0.02)

    def on_step(self, step):
        self.completed.append((step - 1, time.time()))
        if step % self.every or len(self._threads) >= self.failures:
            return
        if self.ready_spare:
            # The loop waits for the last failure (and its ready spare), so
            # that waiting for compiles does not leave the failures behind.
            for t in self._threads:
                t.join()
        elif self._declared and not self.overlap:
            # Nor do steps faster than a failure is made (a spare joining,
            # a stopped host missed): the loop waits until the last failure
            # was made and declared, so that failures keep to one every
            # `every` steps and all of them fall inside the run.
            if not self._declared[-1].wait(timeout=600):
                print("  soak: the last failure was not made in 600 s",
                      flush=True)
        kind = "SIGSTOP" if self.rng.random() < self.stop_share else "SIGKILL"
        declared = threading.Event()
        self._declared.append(declared)
        t = threading.Thread(target=self._fail,
                             args=(step, kind, self.rng.uniform(0, 0.05),
                                   self.rng.random(), declared))
        t.start()
        self._threads.append(t)

    def _fail(self, step, kind, delay, pick, declared):
        try:
            self._fail_once(step, kind, delay, pick)
        finally:
            declared.set()  # also when it ended early: the loop goes on

    def _fail_once(self, step, kind, delay, pick):
        time.sleep(delay)  # a random moment of the step
        def in_slices(st):
            return {d["worker_id"] for sl in st.get("slices", [])
                    for d in sl.get("devices", [])}

        with self._lock:
            if self.kills and not self.overlap:
                # The previous failure recovered: a step completed since,
                # and every snapshot copy the loss took was made again (a
                # shard whose new copy is still on its way has one copy: a
                # second loss in that window is a double fault that
                # one-neighbour snapshots do not cover).
                # (Since the loss was declared: steps can complete while
                # a stopped host is not yet missed.)
                last = self.kills[-1]["declared"]
                deadline = time.monotonic() + 120
                while not (any(c[1] > last for c in self.completed) and int(
                        self.status().get("recovery", {}).get(
                            "snapshot_recopies_pending", 0)) == 0):
                    if self.finished:
                        return
                    if time.monotonic() > deadline:
                        raise RuntimeError("soak: no recovery in 120 s "
                                           "after the last kill")
                    time.sleep(0.02)
            # A host in no slice to take the next loss: the last kill's new
            # spare, or a stopped host that woke and rejoined.
            def spare(st, w):
                if not w["alive"] or w["worker_id"] in in_slices(st):
                    return False
                if not self.ready_spare:
                    return True
                # Every program it was loaded with compiled or loaded from
                # a live worker's serialized executable (a spare is loaded
                # with the job's XLA programs only).
                stats = w.get("stats", {})
                return int(stats.get("xla_compiles", 0)) + int(stats.get(
                    "xla_cache_hits", 0)) + int(stats.get(
                        "xla_serialized_loads", 0)) >= int(stats.get(
                        "programs_loaded", 0)) > 0

            st = self.wait("a spare joining", lambda st: any(
                spare(st, w) for w in st["workers"]), timeout=120)
            used = [w for w in st["workers"]
                    if w["alive"] and w["worker_id"] in in_slices(st)]
            if not used or self.finished:
                return  # the run ended first
            victim = used[int(pick * len(used)) % len(used)]
            pid = int(victim["pid"])
            at = time.time()
            os.kill(pid, getattr(signal, kind))
            self.kills.append({"step": step, "kind": kind, "pid": pid,
                               "host": victim["host_name"],
                               "worker": victim["worker_id"], "at": at})
            # Said as it happens: a run that ends early still shows them.
            print(f"  failure {len(self.kills)}: {kind} {victim['host_name']} "
                  f"(worker {victim['worker_id']}, pid {pid}) in step {step}",
                  flush=True)
            self.wait("the loss", lambda st: not any(
                w["alive"] and w["worker_id"] == victim["worker_id"]
                for w in st["workers"]))
            self.kills[-1]["declared"] = time.time()
            if kind == "SIGSTOP":
                os.kill(pid, signal.SIGCONT)  # fenced; rejoins as a fresh host

    def kills_before(self, t):
        """Whether a failure was made before wall time t."""
        return bool(self.kills) and self.kills[0]["at"] < t

    def join(self):
        for t in self._threads:
            t.join()


def analyse(soak, log_text, steps, counters):
    day = datetime.datetime.now(datetime.timezone.utc).date()
    down_at = {}   # worker id -> when the server declared it down
    unplanned = []  # workers declared down that the soak did not fail
    compiles = []  # (time, ms, host) of compiles on spares
    loaded = []    # (time, ms, host) of executables loaded from a peer
    host_of = {}   # worker id -> host name
    took = {}      # lost worker id -> the spare worker id that took its place
    spare_loads = 0  # executables spares loaded from a live worker's bytes
    loads = 0  # by any host (only hosts standing by load: spares, rejoined)
    first = set()  # the workers the cluster started with (hosts + spare)
    current = {}   # host name -> its latest registration's worker id
    later_compiles = 0  # compiles by a host registered after those
    for line in log_text.splitlines():
        t = log_seconds(line, day)
        if t is None:
            continue
        m = re.search(r"\[server\] \w+ worker (\d+) (lost its connection|"
                      r"missed heartbeats)", line)
        if m:
            down_at.setdefault(m.group(1), t)
        # A warning: not the shutdown at the end (logged as info).
        m = re.search(r"\[server\] warning worker (\d+) (lost its connection|"
                      r"missed heartbeats)", line)
        if m and m.group(1) not in unplanned:
            unplanned.append(m.group(1))
        m = re.search(r"\[server\] info worker (\d+) registered: host (\S+),",
                      line)
        if m:
            host_of[m.group(1)] = m.group(2)
            current[m.group(2)] = m.group(1)
            if len(first) < 4 and not soak.kills_before(t):
                first.add(m.group(1))
        m = re.search(r"worker (\d+)'s \d+ slice\(s\) remapped onto spare "
                      r"worker (\d+)", line)
        if m:
            took[m.group(1)] = m.group(2)
        m = re.search(r"\[worker (\S+)\] info XLA: compiled .* in (\d+) ms",
                      line)
        if m:
            compiles.append((t, int(m.group(2)), m.group(1)))
            later_compiles += current.get(m.group(1)) not in first
        m = re.search(r"\[worker (\S+)\] info XLA: loaded .* serialized "
                      r"executable .* in (\d+) ms", line)
        if m:
            loads += 1
            spare_loads += m.group(1).startswith("spare")
            loaded.append((t, int(m.group(2)), m.group(1)))
    failed = {str(k["worker"]) for k in soak.kills}
    unplanned = [w for w in unplanned if w not in failed]
    rows = []
    for i, k in enumerate(soak.kills):
        # The first step completed once the host was declared down (a step
        # may complete before a stopped host is missed: not a recovery).
        after = max(k["at"], down_at.get(str(k["worker"]), k["at"]))
        nxt = [c for c in soak.completed if c[1] > after]
        until = soak.kills[i + 1]["at"] if i + 1 < len(soak.kills) else 1e30
        # Compiles the spare that took the host's place did between the kill
        # and the next step: it had not finished compiling ahead.
        spare_host = host_of.get(took.get(k["worker"], ""), "?")
        # The time inside (kill, next step) in which it compiled: the union
        # of its compiles' spans (they can overlap), clipped to the window.
        end = nxt[0][1] if nxt else until

        def busy_ms(events):
            spans = sorted((max(t - ms / 1000, k["at"]), min(t, end))
                           for t, ms, host in events
                           if host == spare_host and k["at"] < t < until)
            total_ms, reach = 0.0, k["at"]
            for a, b in spans:
                a = max(a, reach)
                if b > a:
                    total_ms += (b - a) * 1000
                    reach = b
            return total_ms

        compile_ms = busy_ms(compiles)
        # Likewise loading an executable from a peer: it joined so shortly
        # before that it had not finished loading them.
        load_ms = busy_ms(loaded)
        detect = down_at.get(str(k["worker"]), k["at"]) - k["at"]
        total = (nxt[0][1] - k["at"]) if nxt else None
        rows.append({**k, "detect_s": round(detect, 3),
                     "compile_s": round(compile_ms / 1000, 3),
                     "load_s": round(load_ms / 1000, 3),
                     "to_next_step_s": None if total is None else round(total, 3)})
    recovered = [r for r in rows if r["to_next_step_s"] is not None]
    totals = [r["to_next_step_s"] for r in recovered]
    summary = {
        "failures": len(rows),
        "recovered": len(recovered),
        "sigkill": sum(r["kind"] == "SIGKILL" for r in rows),
        "sigstop": sum(r["kind"] == "SIGSTOP" for r in rows),
        "steps": steps,
        "to_next_step_median_s": statistics.median(totals) if totals else None,
        "to_next_step_max_s": max(totals) if totals else None,
        "detect_median_s": {
            kind: statistics.median([r["detect_s"] for r in rows
                                     if r["kind"] == kind] or [0])
            for kind in ("SIGKILL", "SIGSTOP")},
        "compile_median_s": statistics.median(
            [r["compile_s"] for r in rows] or [0]),
        # Executables spares loaded from a live worker's serialized bytes,
        # and compiles on spares (each spare of the run, not only those that
        # took a place).
        "spare_executables_loaded": spare_loads,
        "spare_compiles": sum(host.startswith("spare")
                              for _, _, host in compiles),
        # The same by any host that joined after the cluster started (new
        # spares, and hosts that rejoined after a SIGSTOP: they stand by as
        # spares do); the cluster's first hosts compile the job.
        "executables_loaded": loads,
        "compiles_by_later_hosts": later_compiles,
        "load_median_s": statistics.median(
            [r["load_s"] for r in rows] or [0]),
        "loading_in_window": sum(r["load_s"] > 0 for r in rows),
        "rest_median_s": statistics.median(
            [r["to_next_step_s"] - r["detect_s"] - r["compile_s"]
             - r["load_s"] for r in recovered] or [0]),
        # Hosts declared down that the soak did not kill or stop (a busy
        # host taken for a dead one would be one).
        "unplanned_losses": [{"worker": w, "host": host_of.get(w, "?")}
                             for w in unplanned],
        "calls_recomputed": counters.get("calls_recomputed"),
        "calls_recomputed_per_failure": round(
            counters.get("calls_recomputed", 0) / max(1, len(rows)), 2),
        "counters": counters,
    }
    return summary, rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--failures", type=int, default=100)
    parser.add_argument("--every", type=int, default=3,
                        help="a failure every this many steps")
    parser.add_argument("--stop-share", type=float, default=0.3,
                        help="share of failures that are SIGSTOP")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overlap", action="store_true",
                        help="do not wait for a step after the last kill")
    parser.add_argument("--ready-spare", action="store_true",
                        help="each failure also waits for a spare that has "
                             "compiled the job's programs ahead (recovery "
                             "without compile)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    # Room after the last failure's step for it to be made and recovered.
    steps = (args.failures + 2) * args.every + 2
    log = tempfile.NamedTemporaryFile(prefix="plexus-soak-", suffix=".log",
                                      delete=False).name
    print(f"{steps} steps, {args.failures} failures; cluster log {log}",
          flush=True)
    with plexus.local(hosts=3, spare=1, log_level="info",
                      log_file=log) as cluster:
        with cluster.connect(name="reference") as client:
            expected = elastic_training.train(client, steps, seed=0)
        soak = Soak(cluster, args.failures, args.every, args.seed,
                    args.stop_share, overlap=args.overlap,
                    ready_spare=args.ready_spare)

        def progress(step):
            soak.on_step(step)
            if step % 25 == 0:
                print(f"  step {step}/{steps}, {len(soak.kills)} failures",
                      flush=True)

        error = None
        losses = None
        with cluster.connect(name="soak") as client:
            try:
                losses = elastic_training.train(client, steps, seed=0,
                                                on_step=progress)
                soak.completed.append((steps, time.time()))
            except plexus.PlexusError as e:
                # The run ended early: what it did until then is reported.
                error = f"{type(e).__name__}: {e}"
                print(f"soak: the run failed: {error}", flush=True)
            soak.finished = True
            soak.join()
        counters = {k: int(v) for k, v in json.loads(
            _core.cluster_status(cluster.address)).get("recovery", {}).items()}
    summary, rows = analyse(soak, open(log).read(), steps, counters)
    summary["loss_curve_equal"] = losses == expected
    summary["error"] = error
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "failures": rows}, f, indent=1)


if __name__ == "__main__":
    main()
