"""RL post-training loop: a sampler, a reward program and a trainer on three
different slices (three hosts), overlapped with plexus.rl.AsyncRLLoop.

The task is a contextual bandit, the skeleton of RL post-training. A linear
policy W[D, A] maps a prompt x[D] to logits over A actions.
- sampler (its own slice): takes a batch of prompts from a fixed pool
  (rotated by step) and "generates": the policy's action distribution
  p = softmax(x @ W) for each prompt, a deterministic stand-in for drawing
  samples. The batch is (x, p).
- reward program (its own slice): a hidden teacher T[D, A], which only this
  slice holds, scores every action, r = x @ T, and the batch's reward is the
  policy's expected score, mean_b sum_a p[b, a] r[b, a].
- trainer (its own slice): a policy-gradient step on the expected reward,
  W += lr/B * x^T (p * (r - sum_a p r)), with the p the sampler saw.
Every `--sync-every` steps the trainer's W is sent worker to worker to the
sampler (0: on-policy, every step, no overlap). Reward rises towards the
best achievable (always picking the teacher's best action).

    python examples/rl_loop.py --steps 100 --sync-every 1

On a cluster that is already running (three hosts or more; see
examples/example_cluster.py), add --address HOST:PORT.
"""
import argparse
import sys
import time

import numpy as np

import plexus
import plexus.rl
from example_cluster import add_cluster_args, example_client, save_results

D, A, B, POOL = 8, 4, 32, 8  # features, actions, prompts per batch, batches
REWARD_THRESHOLD = 0.9  # final reward / best achievable must exceed this


def make_task(seed=0):
    """The prompt pool float32[POOL, B, D], the hidden teacher float32[D, A]
    and the initial policy float32[D, A]."""
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal((POOL, B, D)).astype(np.float32)
    teacher = rng.standard_normal((D, A)).astype(np.float32)
    w0 = (0.01 * rng.standard_normal((D, A))).astype(np.float32)
    return pool, teacher, w0


def best_reward(pool, teacher, k):
    """The reward of batch k for a policy that always picks the best action."""
    return float((pool[k % POOL] @ teacher).max(axis=1).mean())


def _softmax(logits):
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def reference_run(pool, teacher, w0, lr, steps, sync_every):
    """The same loop in plain float64 numpy, one stage after the other:
    returns (rewards per step, weights step used per step, final W)."""
    w = {0: w0.astype(np.float64)}  # W_m by training step
    rewards, used = [], []
    for k in range(steps):
        m = plexus.rl.sampler_weights_step(k, sync_every)
        x = pool[k % POOL].astype(np.float64)
        p = _softmax(x @ w[m])
        r = x @ teacher.astype(np.float64)
        rewards.append(float((p * r).sum() / B))
        used.append(m)
        adv = r - (p * r).sum(axis=1, keepdims=True)
        w[k + 1] = w[k] + lr / B * (x.T @ (p * adv))
    return rewards, used, w[steps]


class RLTask:
    """The three stages as calls of built-in kernels, each on its slice."""

    def __init__(self, client, lr, pool, teacher, w0):
        # One device each; placement picks the least-loaded device, so the
        # three land on three different devices (hosts, with 3 hosts).
        self.sampler = client.slice(1, placement="one_host")
        self.rewarder = client.slice(1, placement="one_host")
        self.trainer = client.slice(1, placement="one_host")
        devices = [(d["host"], d["device"]) for s in
                   (self.sampler, self.rewarder, self.trainer)
                   for d in s.devices]
        assert len(set(devices)) == 3, f"stages share a device: {devices}"
        self.devices = devices
        self.lr = lr
        s, rw, t = self.sampler, self.rewarder, self.trainer
        # Data, put once where it is used.
        self.pool = [s.put(batch) for batch in pool]
        self.zero_labels = s.put(np.zeros(B, np.int32))
        self.onehot0 = s.put(np.eye(A, dtype=np.float32)[np.zeros(B, int)])
        self.teacher = rw.put(teacher)  # hidden: only the reward slice has it
        self.ones = t.put(np.ones((A, A), np.float32))
        self.w0 = t.put(w0)
        x, w = self.pool[0], self.w0
        bxa = plexus.Spec((B, A))
        # Sampler: p = softmax(x @ W). softmax_xent_grad(logits, 0) is
        # (p - onehot(0)) / B, so p = B * that + onehot(0).
        self.s_logits = s.program("matmul", x, w)
        self.s_xgrad = s.program("softmax_xent_grad", bxa, self.zero_labels)
        self.s_scale = s.program("scale", bxa, factor=float(B))
        self.s_add = s.program("add", bxa, bxa)
        # Reward: r = x @ T, reward = sum(p * r) / B.
        self.r_scores = rw.program("matmul", x, self.teacher)
        self.r_mul = rw.program("mul", bxa, bxa)
        self.r_sum = rw.program("reduce_sum", bxa)
        self.r_mean = rw.program("scale", plexus.Spec(()), factor=1.0 / B)
        # Trainer: advantage r - sum_a p r, gradient x^T (p * adv), ascent.
        self.t_mul = t.program("mul", bxa, bxa)
        self.t_rowsum = t.program("matmul", bxa, self.ones)
        self.t_neg = t.program("scale", bxa, factor=-1.0)
        self.t_add = t.program("add", bxa, bxa)
        self.t_grad = t.program("matmul", x, bxa, transpose_a=1)
        self.t_update = t.program("sgd_update", w, w, lr=-lr / B)

    def sample(self, w, k):
        x = self.pool[k % POOL]
        p = self.s_add(self.s_scale(self.s_xgrad(self.s_logits(x, w),
                                                 self.zero_labels)),
                       self.onehot0)
        return x, p

    def reward(self, batch):
        x, p = batch
        r = self.r_scores(x, self.teacher)
        return r, self.r_mean(self.r_sum(self.r_mul(p, r)))

    def train(self, w, batch, rewards):
        x, p = batch
        r, _ = rewards
        advantage = self.t_add(r, self.t_neg(self.t_rowsum(self.t_mul(p, r),
                                                           self.ones)))
        grad = self.t_grad(x, self.t_mul(p, advantage))
        return self.t_update(w, grad)

    def loop(self, sync_every, sequential=False):
        return plexus.rl.AsyncRLLoop(
            self.sample, self.reward, self.train, self.w0,
            sampler_slice=self.sampler, sync_every=sync_every,
            sequential=sequential)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--sync-every", type=int, default=1,
                        help="send the trainer's weights to the sampler every "
                        "n steps (0: on-policy, staleness 0)")
    parser.add_argument("--lr", type=float, default=2.0)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sequential", action="store_true",
                        help="block on every stage before the next")
    add_cluster_args(parser)
    args = parser.parse_args(argv)

    pool, teacher, w0 = make_task(args.seed)
    with example_client(args, "rl-loop", hosts=3,
                        devices_per_host=1) as client:
        task = RLTask(client, args.lr, pool, teacher, w0)
        print("sampler, reward, trainer on (host, device): "
              + ", ".join(map(str, task.devices)))
        loop = task.loop(args.sync_every, args.sequential)
        rewards = {}
        t0 = time.perf_counter()

        def on_step(step):
            rewards[step.k] = step.rewards[1]  # a future; read below
            if step.k % args.log_every == 0 or step.k == args.steps - 1:
                got = float(np.asarray(step.rewards[1]))  # waits for it
                best = best_reward(pool, teacher, step.k)
                print(f"step {step.k:4d}  reward {got:.4f}  of best "
                      f"{best:.4f}: {got / best:6.1%}  (sampler "
                      f"weights from step {step.weights_step}; "
                      f"{time.perf_counter() - t0:.2f} s)", flush=True)

        final_w = np.asarray(loop.run(args.steps, on_step))
        elapsed = time.perf_counter() - t0
        got = [float(np.asarray(rewards[k])) for k in range(args.steps)]
    save_results(args, rewards=np.array(got, np.float32), final_w=final_w)
    print(f"{args.steps} steps in {elapsed:.2f} s "
          f"({elapsed / args.steps * 1e3:.2f} ms/step), sync_every "
          f"{args.sync_every}, {loop.syncs} weight transfers to the sampler")

    ref_rewards, _, ref_w = reference_run(pool, teacher, w0, args.lr,
                                          args.steps, args.sync_every)
    err = max(np.max(np.abs(np.array(got) - ref_rewards)),
              np.max(np.abs(final_w - ref_w)) / np.max(np.abs(ref_w)))
    print(f"matches the numpy loop: max error {err:.1e}")
    last = args.steps - 1
    ratio = got[last] / best_reward(pool, teacher, last)
    if err > 1e-4:
        print(f"FAILED: Plexus and numpy differ by {err:.1e} (> 1e-4)")
        return 1
    print(f"final reward {got[last]:.4f} = {ratio:.3f} of the best "
          f"(threshold {REWARD_THRESHOLD})")
    return 0 if ratio > REWARD_THRESHOLD else 1


if __name__ == "__main__":
    sys.exit(main())
