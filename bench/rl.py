"""bench/rl: the RL loop overlapped versus sequential.

Sampler and trainer take equal device time (device_sleep, --stage-us each),
the reward program less (--reward-us); each on its own 1-device slice on its
own host (3 hosts). Tensors are tiny (float32[16]): the figures measure
scheduling, not bytes.

    sample(w, k)      = device_sleep(w_on_sampler)              (S)
    reward(batch)     = device_sleep(batch)                     (R)
    train(w, b, r)    = device_sleep(sgd_update(w, r))          (T)

Loops timed, each over --steps steps, median of --repeats runs:
- sequential: plexus.rl.AsyncRLLoop(sequential=True), sync_every 1: blocks
  on every stage's result before issuing the next (S + R + T per step, plus
  the client's round trips).
- on-policy: sync_every 0, asynchronous dispatch: no client round trips, but
  sample k + 1 needs training step k, so the devices take turns.
- overlapped, sync_every n: the sampler works on batch k + 1 while the
  trainer learns from batch k. Ideal time per step (see `ideal_ms`): with
  n = 1, sample k + 1 needs the weights of training step k - 1, so train
  k - 1 -> sample k + 1 -> reward k + 1 -> train k + 1 is a cycle of two
  steps: (S + R + T) / 2 = 5.5 ms for 5/1/5 ms. With n >= 2 the cycle from
  one sync to the next is S + R + (n - 1) T over n steps, or n T if longer:
  5.5 ms (n = 2), 5.25 ms (n = 4); it tends to max(S, T) as n grows.
- overlapped, sync_every 1, on a client with sequential_dispatch=True (each
  call sent only once its inputs are computed): the loop's issue order
  (sample k + 1, train k, reward k + 1) still overlaps the stages, but every
  call now waits for its inputs on the client; the gap to the row above is
  what parallel asynchronous dispatch adds.

    PYTHONPATH=python PLEXUS_BIN_DIR=build/bin python3 bench/rl.py
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

import plexus  # noqa: E402
import plexus.rl  # noqa: E402

COMMAND = "PYTHONPATH=python PLEXUS_BIN_DIR=build/bin python3 bench/rl.py"


class SleepTask:
    def __init__(self, client, stage_us, reward_us, size=16):
        self.sampler = client.slice(1, placement="one_host")
        self.rewarder = client.slice(1, placement="one_host")
        self.trainer = client.slice(1, placement="one_host")
        self.devices = [(d["host"], d["device"]) for s in
                        (self.sampler, self.rewarder, self.trainer)
                        for d in s.devices]
        assert len(set(self.devices)) == 3, self.devices
        spec = plexus.Spec((size,))
        self.w0 = np.linspace(0, 1, size, dtype=np.float32)
        self.s_sleep = self.sampler.program("device_sleep", spec,
                                            micros=stage_us)
        self.r_sleep = self.rewarder.program("device_sleep", spec,
                                             micros=reward_us)
        self.t_update = self.trainer.program("sgd_update", spec, spec,
                                             lr=1e-3)
        self.t_sleep = self.trainer.program("device_sleep", spec,
                                            micros=stage_us)

    def sample(self, w, k):
        return self.s_sleep(w)

    def reward(self, batch):
        return self.r_sleep(batch)

    def train(self, w, batch, rewards):
        return self.t_sleep(self.t_update(w, rewards))

    def time_loop(self, steps, sync_every, sequential):
        loop = plexus.rl.AsyncRLLoop(
            self.sample, self.reward, self.train, self.trainer.put(self.w0),
            sampler_slice=self.sampler, sync_every=sync_every,
            sequential=sequential, max_in_flight=None)
        t0 = time.perf_counter()
        final = loop.run(steps)
        final.block_until_ready()
        elapsed = time.perf_counter() - t0
        return elapsed, np.asarray(final)


def ideal_ms(s, r, t, sync_every, sequential):
    """Steady-state device-bound time per step (no dispatch overhead)."""
    if sequential or sync_every == 0:
        return s + r + t
    if sync_every == 1:
        return max(s, t, (s + r + t) / 2)
    n = sync_every
    return max(s, t, (s + r + (n - 1) * t) / n)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--stage-us", type=int, default=5000,
                        help="sampler and trainer device time per step")
    parser.add_argument("--reward-us", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--log-file", help="write the cluster's log here")
    args = parser.parse_args(argv)

    # (name, sync_every, sequential, client with sequential_dispatch)
    configs = [("sequential (block on each stage)", 1, True, False),
               ("on-policy, sync_every 0 (async dispatch)", 0, False, False),
               ("overlapped, sync_every 1", 1, False, False),
               ("overlapped, sync_every 2", 2, False, False),
               ("overlapped, sync_every 4", 4, False, False),
               ("overlapped, sync_every 1, sequential_dispatch client", 1,
                False, True)]
    t_start = time.perf_counter()
    with plexus.local(hosts=3, devices_per_host=1,
                      log_file=args.log_file) as cluster:
        tasks = {sd: SleepTask(cluster.connect(name=f"bench-rl-{sd}",
                                               sequential_dispatch=sd),
                               args.stage_us, args.reward_us)
                 for sd in (False, True)}
        task = tasks[False]
        for _, sync_every, sequential, sd in configs:  # warm up, compile
            tasks[sd].time_loop(4, sync_every, sequential)
        times = {c[0]: [] for c in configs}
        finals = {}
        for _ in range(args.repeats):  # interleaved: noise hits all alike
            for name, sync_every, sequential, sd in configs:
                elapsed, final = tasks[sd].time_loop(args.steps, sync_every,
                                                     sequential)
                times[name].append(elapsed)
                finals[name] = final
    total = time.perf_counter() - t_start

    # The sequential and overlapped loops with sync_every 1 compute the same.
    same = np.array_equal(finals[configs[0][0]], finals[configs[2][0]])
    s, r = args.stage_us / 1e3, args.reward_us / 1e3
    seq_ms = statistics.median(times[configs[0][0]]) / args.steps * 1e3
    print(f"RL loop, {args.steps} steps: sampler {s:g} ms, reward {r:g} ms, "
          f"trainer {s:g} ms of device time per step; sampler, reward, "
          f"trainer on {task.devices}; median of {args.repeats}")
    print()
    onp_ms = statistics.median(times[configs[1][0]]) / args.steps * 1e3
    print("| loop | ms/step | steps/s | ideal ms/step | vs sequential "
          "| vs on-policy |")
    print("|---|---|---|---|---|---|")
    rows = []
    for name, sync_every, sequential, sd in configs:
        ms = statistics.median(times[name]) / args.steps * 1e3
        ideal = ideal_ms(s, r, s, sync_every, sequential)
        rows.append({"loop": name, "sync_every": sync_every,
                     "sequential": sequential, "sequential_dispatch": sd, "ms_per_step": ms,
                     "steps_per_s": 1e3 / ms, "ideal_ms_per_step": ideal,
                     "speedup": seq_ms / ms, "vs_on_policy": onp_ms / ms,
                     "runs_s": times[name]})
        print(f"| {name} | {ms:.2f} | {1e3 / ms:.1f} | {ideal:.2f} | "
              f"{seq_ms / ms:.2f}x | {onp_ms / ms:.2f}x |")
    speedup = rows[2]["speedup"]
    print()
    print(f"overlapped (sync_every 1) / sequential: {speedup:.2f}x "
          f"(floor 1.8x); same final weights: {same}")
    print(f"total {total:.1f} s. Command: {COMMAND}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"steps": args.steps, "stage_us": args.stage_us,
             "reward_us": args.reward_us, "repeats": args.repeats,
             "rows": rows, "speedup_sync1": speedup, "same_values": same},
            indent=1))
    return 0 if speedup >= 1.8 and same else 1


if __name__ == "__main__":
    sys.exit(main())
