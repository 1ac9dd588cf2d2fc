"""bench/shrink_resume: how long a data-parallel training loop stalls when
its slice shrinks on a lost host and when it grows back as a worker joins.

Each trial starts an embedded cluster of --hosts one-device workers and no
spare, and runs examples/elastic_training.py's shrinking loop (plain SGD,
--rows rows a device, the slice made with on_loss="shrink", grow=True):
before a random step one random host of the slice is SIGKILLed (4 -> 3),
two steps later one plexus-worker process starts and joins (3 -> 4), and
the loop goes on to the end without restarting. Every step's parameters
are checked against one process applying the same batches. Reported per
trial, and as medians over --trials:

  - kill -> next step: seconds from the SIGKILL to the next step completed
    (on 3 devices), including a step that raised and ran again, and the
    compile for the new size;
  - join -> next step on 4: seconds from starting the worker to the next
    step completed on 4 devices (the worker starting and registering, the
    growth, its compiling the step, the step);
  - the server's time for each resize and what it moved (its timeline's
    "resize" events, from client.trace), and for a shrink the server's
    handling of the loss it came from (its "recovery" event): a shrink
    moves the replicated parameters in place (no bytes between hosts), a
    growth copies them to the new device (the event gives the bytes on
    the new map: the parameters' bytes times 4; one copy of them crosses
    to the new host);
  - a step's time on 4 devices before the kill, for scale.

    PYTHONPATH=python PLEXUS_BIN_DIR=$PWD/build/bin python3 \\
        bench/shrink_resume.py --trials 5 --model mlp
"""
import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "examples"))
import elastic_training as et  # noqa: E402
import plexus  # noqa: E402


def one_trial(args, seed, tmp, say):
    """One cluster, one kill, one join: a dict of what was measured."""
    rng = random.Random(seed)
    kill = rng.randint(3, 5)
    join, steps = kill + 2, kill + 5
    model = et.shrink_model(args.model, steps * args.rows * args.hosts, seed)
    trace = os.path.join(tmp, f"trace-{seed}.json")
    workers, run = [], None
    try:
        with plexus.local(hosts=args.hosts, log_level="info",
                          log_file=os.path.join(tmp, f"cluster-{seed}.log")
                          ) as cluster:
            with cluster.connect(name="bench-shrink") as client:
                with client.trace(trace):
                    run = et.train_shrinking(
                        cluster, client, model, steps, args.rows, args.lr,
                        args.hosts, args.hosts - 2, [kill], [join], seed,
                        workers, say=lambda _: None)
    except plexus.ClusterExitError as e:
        if run is None or "SIGKILL" not in str(e):
            raise  # only the killed worker may end badly
    finally:
        et.stop_workers(workers)
    bad, same, worst = et.check_shrinking(model, run["done"], args.lr)
    if bad:
        raise AssertionError(f"trial {seed}: steps {bad} differ from one "
                             f"process (largest difference {worst:.2e})")
    with open(trace) as f:
        events = et.resize_events(json.load(f))
    shrinks = [r for r in events if r["kind"] == "shrink"]
    grows = [r for r in events if r["kind"] == "grow"]
    done = run["done"]
    before = [b["t"] - a["t"] for a, b in zip(done, done[1:])
              if b["step"] < kill and a["step"] >= 1]  # step 0 compiles
    row = {
        "seed": seed, "kill_step": kill, "join_step": join,
        "killed": run["kills"][0]["what"],
        "devices_by_step": [d["devices"] for d in done],
        "steps_redone": run["redone"],
        # The parameters lost by a resize though their step was done, put
        # again from the host: 0 (a shrink moves replicated values).
        "params_put_again": run["put_again"],
        "kill_to_next_step_s": et.to_next_step(run, run["kills"][0]),
        "join_to_next_step_on_4_s": et.to_next_step(run, run["joins"][0],
                                                    args.hosts),
        "shrink_server_ms": [r["server_ms"] for r in shrinks],
        "shrink_loss_server_ms": [r["loss_ms"] for r in shrinks],
        "grow_server_ms": [r["server_ms"] for r in grows],
        "shrink_values_moved": [r["values"] for r in shrinks],
        "grow_bytes_moved": [r["bytes"] for r in grows],
        "step_s_on_4": statistics.median(before) if before else None,
        "param_bytes": model.flat.nbytes,
        "max_abs_diff_vs_one_process": worst,
    }
    say(f"killed {row['killed']} before step {kill}: next step on 3 in "
        f"{row['kill_to_next_step_s']:.3f} s (the loss "
        f"{shrinks[0]['loss_ms']:.3f} ms and the shrink "
        f"{shrinks[0]['server_ms']:.3f} ms at the server, "
        f"{shrinks[0]['values']} value(s) moved in place); "
        f"a worker joined before step {join}: next step on 4 in "
        f"{row['join_to_next_step_on_4_s']:.3f} s (growth "
        f"{grows[-1]['server_ms']:.3f} ms at the server, "
        f"{grows[-1]['bytes']} bytes on the new map); steps "
        f"{row['devices_by_step']}, "
        f"{run['redone']} redone, parameters put again {run['put_again']}, "
        f"max |diff| vs one process {worst:.1e}")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--lr", type=float, default=None,
                    help="default: 0.5 (mlp), 0.3 (transformer)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.lr is None:
        args.lr = 0.5 if args.model == "mlp" else et.LR
    say = lambda m: print(f"[shrink_resume] {m}", flush=True)  # noqa: E731
    say(f"{args.trials} trials: {args.model} data parallel on {args.hosts} "
        f"hosts, no spare, one SIGKILL and one worker joining per trial")
    rows = []
    with tempfile.TemporaryDirectory(prefix="plexus-shrink-bench-") as tmp:
        for t in range(args.trials):
            say(f"trial {t + 1} of {args.trials}")
            rows.append(one_trial(args, args.seed + t, tmp,
                                  lambda m: say(f"  {m}")))

    def median(key):
        return statistics.median(r[key] for r in rows)

    result = {
        "machine": f"{platform.node()} ({os.cpu_count()} cores)",
        "date": time.strftime("%Y-%m-%d"),
        "load_average_at_end": os.getloadavg()[0],
        "model": args.model, "hosts": args.hosts, "rows": args.rows,
        "trials": args.trials,
        "kill_to_next_step_median_s": median("kill_to_next_step_s"),
        "join_to_next_step_on_4_median_s": median("join_to_next_step_on_4_s"),
        "shrink_server_median_ms": statistics.median(
            r["shrink_server_ms"][0] for r in rows),
        "shrink_loss_server_median_ms": statistics.median(
            r["shrink_loss_server_ms"][0] for r in rows),
        "grow_server_median_ms": statistics.median(
            r["grow_server_ms"][-1] for r in rows),
        "grow_bytes_moved": rows[0]["grow_bytes_moved"],
        "step_on_4_median_s": statistics.median(
            r["step_s_on_4"] for r in rows if r["step_s_on_4"] is not None),
        "steps_redone_median": median("steps_redone"),
        "params_put_again_total": sum(r["params_put_again"] for r in rows),
        "param_bytes": rows[0]["param_bytes"],
        "per_trial": rows,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "per_trial"},
                     indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
