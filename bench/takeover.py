"""Standby takeovers under one training run (not in CI).

Runs examples/elastic_training.py's loop (the data-parallel transformer on
a 3-device slice, one device a host) against a primary plexus-server on a
journal, its standby (`--standby-of`) and three standalone workers, all
given both addresses. In every `--every`-th step, at a random delay after
the step is issued (0 to `--window-ms`), the serving server is SIGKILLed
(or, with `--stop`, SIGSTOPped: silent, not gone); its standby takes over
once the lease (`--lease-ms`) has passed, and a new standby starts at the
dead server's address, following the new primary, so the same two
addresses serve the whole run. The next kill comes once the last one's
session was resumed.

The same loop runs first with no kill (the reference). Checks, each a
failure: every step ran; the losses equal the reference's bit for bit;
every session was resumed with nothing lost, by the server that took
over, and every worker came back to it.

Per takeover: from the kill to the standby serving (its ready line: the
lease, then its journal opened as a restart does), to the three workers
back, to the session resumed, to the next step completed. Medians and
maxima, and the rows, as JSON (--json).

    PYTHONPATH=python PLEXUS_BIN_DIR=build/bin \\
        python3 bench/takeover.py --takeovers 20 --json /tmp/takeover.json
"""
import argparse
import json
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import plexus  # noqa: E402
from plexus import _core  # noqa: E402
from plexus._binaries import bin_dir, default_pjrt_plugin  # noqa: E402


def spawn(args, log, env):
    """A plexus binary with --ready-fd: (process, read end of the pipe)."""
    read_end, write_end = os.pipe()
    args = [a.replace("{READY_FD}", str(write_end)) for a in args]
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=out, pass_fds=(write_end,), env=env,
                                start_new_session=True)
    os.close(write_end)
    return proc, read_end


def read_line(fd, timeout):
    line, deadline = b"", time.monotonic() + timeout
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [],
                                    max(deadline - time.monotonic(), 0))
        if not ready:
            raise TimeoutError(f"no ready line within {timeout} s")
        chunk = os.read(fd, 1)
        if not chunk:
            raise RuntimeError(f"the ready pipe closed ({line!r})")
        line += chunk
    return line.decode().strip()


def log_count(path, text):
    with open(path, errors="replace") as f:
        return f.read().count(text)


def wait_log(path, text, count, timeout):
    deadline = time.monotonic() + timeout
    while log_count(path, text) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"'{text}' x{count} not in {path}")
        time.sleep(0.005)  # a bench's poll of a log file, bounded
    return time.monotonic()


class Pair:
    """The serving server, its standby and the workers."""

    def __init__(self, folder, lease_ms):
        self.folder, self.lease_ms, self.n = folder, lease_ms, 0
        self.env = dict(os.environ,
                        PLEXUS_CLUSTER_SECRET=_core.new_cluster_secret())
        plugin = default_pjrt_plugin()
        if plugin:
            self.env["PLEXUS_PJRT_PLUGIN"] = plugin
        self.retired = []
        self.primary_log = os.path.join(folder, "server0.log")
        self.primary, ready = spawn(
            [str(bin_dir() / "plexus-server"), "--listen", "127.0.0.1:0",
             "--ready-fd", "{READY_FD}", "--journal",
             os.path.join(folder, "server0.db"), "--standby-lease-ms",
             str(lease_ms)], self.primary_log, self.env)
        self.primary_address = read_line(ready, 30)
        os.close(ready)
        self.start_standby("127.0.0.1:0")
        self.address = f"{self.primary_address},{self.standby_address}"
        self.workers = []
        for i in range(3):
            proc, ready = spawn(
                [str(bin_dir() / "plexus-worker"), "--server", self.address,
                 "--host-name", f"host{i}", "--devices", "1",
                 "--ready-fd", "{READY_FD}", "--reconnect-timeout-s", "60"],
                os.path.join(folder, f"worker{i}.log"), self.env)
            read_line(ready, 60)
            os.close(ready)
            self.workers.append(proc)

    def start_standby(self, address):
        self.n += 1
        self.standby_log = os.path.join(self.folder, f"server{self.n}.log")
        self.standby, self.standby_ready = spawn(
            [str(bin_dir() / "plexus-server"), "--listen", address,
             "--ready-fd", "{READY_FD}", "--journal",
             os.path.join(self.folder, f"server{self.n}.db"),
             "--standby-of", self.primary_address, "--standby-lease-ms",
             str(self.lease_ms)], self.standby_log, self.env)
        self.standby_address = read_line(self.standby_ready, 30)

    def take_over(self, stop, row):
        """Kills (or stops) the primary; times the standby's takeover and
        the workers' return; starts the next standby at the old address."""
        old = self.primary_address
        t0 = time.monotonic()
        if stop:
            os.kill(self.primary.pid, signal.SIGSTOP)
        else:
            self.primary.kill()
            self.primary.wait()
        read_line(self.standby_ready, 60)
        row["serving_s"] = time.monotonic() - t0
        os.close(self.standby_ready)
        self.retired.append(self.primary)
        self.primary, self.primary_address = self.standby, self.standby_address
        self.primary_log = self.standby_log
        row["workers_back_s"] = wait_log(
            self.primary_log, "came back with what it kept", 3, 60) - t0
        row["resumed_s"] = wait_log(self.primary_log, "resumed; ", 1, 60) - t0
        with open(self.primary_log) as f:
            row["lost"] = [ln for ln in f if "resumed; " in ln
                           and not ln.rstrip().endswith(", 0 lost")]
        # A stopped server still holds its address: it goes (as its host
        # would be restarted) before that address serves as the standby.
        old_server = self.retired[-1]
        if old_server.poll() is None:
            old_server.kill()
            old_server.wait()
        self.start_standby(old)

    def stop(self):
        for p in self.workers + [self.primary, self.standby] + self.retired:
            if p.poll() is None:
                p.kill()
                p.wait()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--takeovers", type=int, default=20)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--lease-ms", type=int, default=1000)
    parser.add_argument("--window-ms", type=float, default=20.0)
    parser.add_argument("--stop", action="store_true",
                        help="SIGSTOP the primary instead of SIGKILL")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    parser.add_argument("--keep", action="store_true",
                        help="keep the logs (kept anyway on a failure)")
    args = parser.parse_args(argv)
    from elastic_training import train

    folder = tempfile.mkdtemp(prefix="plexus-takeover-")
    pair = Pair(folder, args.lease_ms)
    rng = random.Random(args.seed)
    steps = args.takeovers * args.every + 2
    rows, pending, failure = [], [], None
    client = plexus.connect(pair.address, name="takeover-bench")
    try:
        t = time.monotonic()
        reference = train(client, steps, snapshot_every=0)
        step_s = (time.monotonic() - t) / steps
        print(f"reference: {steps} steps, {step_s * 1000:.0f} ms a step",
              flush=True)
        done_at = {}

        def takeover(row, done):
            try:
                pair.take_over(args.stop, row)
            except Exception as e:  # noqa: BLE001 - reported below
                row["error"] = repr(e)
            done.set()

        def on_step(step):
            done_at[step - 1] = time.monotonic()
            for row, done in pending:
                if not done.wait(120):
                    raise TimeoutError(f"takeover {row['n']} hung")
                if "error" in row:
                    raise RuntimeError(row["error"])
                print(f"takeover {row['n']:3d}: serving {row['serving_s']:.3f} s,"
                      f" workers back {row['workers_back_s']:.3f} s, resumed "
                      f"{row['resumed_s']:.3f} s", flush=True)
            pending.clear()
            if step % args.every == 0 and len(rows) < args.takeovers:
                row = {"n": len(rows) + 1, "step": step,
                       "delay_s": rng.uniform(0, args.window_ms / 1000)}
                rows.append(row)
                done = threading.Event()
                pending.append((row, done))
                timer = threading.Timer(row["delay_s"], takeover, (row, done))
                row["t0"] = time.monotonic() + row["delay_s"]
                timer.start()

        losses = train(client, steps, snapshot_every=0, on_step=on_step)
        for row in rows:  # to the first step done after the kill
            after = [t for t in done_at.values() if t > row["t0"]]
            row["next_step_s"] = (min(after) - row["t0"]) if after else None
            row.pop("t0")
        if losses != reference:
            failure = "the losses differ from the reference's"
        ends = client.session_ends
        if len(ends) != len(rows) or not all(e["resumed"] for e in ends):
            failure = f"sessions not all resumed: {ends}"
        if any(r["lost"] for r in rows):
            failure = f"lost: {[r['lost'] for r in rows if r['lost']]}"
    except Exception as e:  # noqa: BLE001 - reported below
        failure = repr(e)
    finally:
        client.close()
        pair.stop()

    def figures(key):
        values = [r[key] for r in rows if r.get(key) is not None]
        return {"median": statistics.median(values) if values else None,
                "max": max(values) if values else None}

    summary = {"takeovers": len(rows), "lease_ms": args.lease_ms,
               "stop": args.stop, "failure": failure,
               "step_ms": step_s * 1000,
               **{k: figures(k) for k in ("serving_s", "workers_back_s",
                                          "resumed_s", "next_step_s")},
               "rows": rows}
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"},
                     indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    if failure:
        print(f"FAILED: {failure} (logs in {folder})")
        return 1
    if args.keep:
        print(f"logs in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
