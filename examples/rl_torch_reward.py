"""RL with a PyTorch reward model and a JAX policy in one job: the sampler
and the trainer are JAX functions (plexus.jit), the reward model is a
torch.nn MLP (plexus.torch), each on its own slice, overlapped with
plexus.rl.AsyncRLLoop. Nothing passes through the client: the batch goes
from the sampler's worker to the reward model's, the rewards from there to
the trainer's, and the trainer's weights back to the sampler's, as futures
that the runtime moves worker to worker.

The task is the contextual bandit of examples/rl_loop.py, with a learned
(here: frozen, randomly initialised) reward model in place of the linear
teacher.
- sampler (JAX, its own slice): a linear policy W[D, A]; for a batch of
  prompts x[B, D] from a fixed pool (rotated by step) it "generates" the
  action distribution p = softmax(x @ W), a deterministic stand-in for
  drawing samples. The batch is (x, p).
- reward model (PyTorch, its own slice): an nn.Module MLP scores every
  action, r = mlp(x)[B, A]; the batch's reward is the policy's expected
  score, mean_b sum_a p[b, a] r[b, a]. plexus.torch lowers the module's
  forward through torchax; its parameters live on the reward slice only.
- trainer (JAX, its own slice): a policy-gradient step, jax.grad of the
  surrogate mean_b sum_a stop_gradient(p (r - sum_a p r)) log softmax(x W),
  with the p the sampler saw (ascent, learning rate lr).
Every `--sync-every` steps the trainer's W is sent worker to worker to the
sampler (0: on-policy, no overlap). The run is checked against the same
loop in one process: jax.jit for the policy and the trainer, eager PyTorch
for the reward model, the same weights rule.

    python examples/rl_torch_reward.py --steps 60 --sync-every 1 --lr 10
"""
import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import plexus  # noqa: E402
import plexus.rl  # noqa: E402
import plexus.torch as pt  # noqa: E402
from example_cluster import (add_cluster_args, example_client,  # noqa: E402
                             save_results)

D, A, B, H, POOL = 8, 4, 32, 16, 8  # features, actions, batch, hidden, pool
TOLERANCE = 1e-4  # relative, against the one-process loop
REWARD_THRESHOLD = 0.85  # final reward / best achievable must exceed this


class RewardModel(torch.nn.Module):
    """Scores every action of every prompt, and the expected reward of the
    policy's distribution p: (scores[B, A], mean_b sum_a p r)."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.hidden = torch.nn.Linear(D, H)
        self.out = torch.nn.Linear(H, A)

    def forward(self, x, p):
        scores = self.out(torch.tanh(self.hidden(x)))
        return scores, (p * scores).sum(dim=1).mean()


# The JAX policy and its update: the same functions run on the workers
# (plexus.jit) and in the one-process reference (jax.jit).
def sample_fn(w, x):
    """The policy's action distribution p = softmax(x @ W)."""
    return jax.nn.softmax(x @ w, axis=-1)


def train_fn(w, x, p, scores, lr):
    """One policy-gradient ascent step from the sampler's batch (x, p)."""
    advantage = scores - (p * scores).sum(axis=1, keepdims=True)
    weight = jax.lax.stop_gradient(p * advantage)

    def surrogate(w):
        return (weight * jax.nn.log_softmax(x @ w, axis=-1)).sum() / B
    return w + lr * jax.grad(surrogate)(w)


def make_task(seed=0):
    """The prompt pool float32[POOL, B, D], the reward model, and the
    initial policy float32[D, A]."""
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal((POOL, B, D)).astype(np.float32)
    w0 = (0.01 * rng.standard_normal((D, A))).astype(np.float32)
    return pool, RewardModel(seed), w0


def best_reward(pool, model, k):
    """Batch k's reward for a policy that always picks the best action."""
    with torch.no_grad():
        scores, _ = model(torch.from_numpy(pool[k % POOL]),
                          torch.zeros(B, A))
    return float(scores.max(dim=1).values.mean())


def reference_run(pool, model, w0, lr, steps, sync_every):
    """The same loop in one process, one stage after the other: jax.jit for
    the sampler and the trainer, the eager torch module for the rewards.
    Returns (reward per step, weights step used per step, final W)."""
    sample, train = jax.jit(sample_fn), jax.jit(train_fn)
    w = {0: jnp.asarray(w0)}  # W_m by training step
    rewards, used = [], []
    for k in range(steps):
        m = plexus.rl.sampler_weights_step(k, sync_every)
        x = pool[k % POOL]
        p = np.array(sample(w[m], x))  # writable, for torch.from_numpy
        with torch.no_grad():
            scores, reward = model(torch.from_numpy(x), torch.from_numpy(p))
        rewards.append(float(reward))
        used.append(m)
        w[k + 1] = train(w[k], x, p, scores.numpy(), lr)
    return rewards, used, np.asarray(w[steps])


class TorchRewardRL:
    """The three stages on three slices: the JAX sampler, the torch reward
    model, the JAX trainer. Data is put once, where it is used."""

    def __init__(self, sampler, rewarder, trainer, pool, model, w0, lr):
        self.sampler, self.rewarder, self.trainer = sampler, rewarder, trainer
        self.pool = [sampler.put(batch) for batch in pool]
        reward_model = pt.Functional(model)
        # The reward model's parameters: only the reward slice holds them.
        self.reward_params = {k: rewarder.put(v) for k, v in
                              reward_model.init_params().items()}
        self.w0 = trainer.put(w0)
        self.lr = float(lr)
        self.s_sample = plexus.jit(sample_fn, sampler, name="policy_sample")
        self.r_score = pt.jit(reward_model, rewarder)
        self.t_train = plexus.jit(train_fn, trainer, static_argnums=4,
                                  name="policy_train")

    def sample(self, w, k):
        x = self.pool[k % POOL]
        return x, self.s_sample(w, x)

    def reward(self, batch):
        x, p = batch  # futures on the sampler's slice; moved here
        return self.r_score(self.reward_params, x, p)  # (scores, reward)

    def train(self, w, batch, rewards):
        x, p = batch
        scores, _ = rewards  # futures on the reward slice; moved here
        return self.t_train(w, x, p, scores, self.lr)

    def loop(self, sync_every, sequential=False):
        return plexus.rl.AsyncRLLoop(
            self.sample, self.reward, self.train, self.w0,
            sampler_slice=self.sampler, sync_every=sync_every,
            sequential=sequential)


def three_slices(client):
    """One device each, on three different devices (hosts, with 3 hosts)."""
    slices = [client.slice(1, placement="one_host") for _ in range(3)]
    devices = [(d["host"], d["device"]) for s in slices for d in s.devices]
    assert len(set(devices)) == 3, f"stages share a device: {devices}"
    return slices, devices


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sync-every", type=int, default=1,
                        help="send the trainer's weights to the sampler every "
                        "n steps (0: on-policy, staleness 0)")
    parser.add_argument("--lr", type=float, default=10.0)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    add_cluster_args(parser)
    args = parser.parse_args(argv)

    pool, model, w0 = make_task(args.seed)
    with example_client(args, "rl-torch-reward", hosts=3,
                        devices_per_host=1) as client:
        slices, devices = three_slices(client)
        print("JAX sampler, torch reward model, JAX trainer on (host, "
              "device): " + ", ".join(map(str, devices)))
        task = TorchRewardRL(*slices, pool, model, w0, args.lr)
        loop = task.loop(args.sync_every)
        rewards = {}
        before = client.counters()
        t0 = time.perf_counter()

        def on_step(step):
            rewards[step.k] = step.rewards[1]  # a future; read after the run

        final = loop.run(args.steps, on_step)
        final.block_until_ready()
        elapsed = time.perf_counter() - t0
        after = client.counters()
        final_w = np.asarray(final)
        got = [float(np.asarray(rewards[k])) for k in range(args.steps)]
    through_client = {k: after[k] - before[k]
                      for k in ("bytes_put", "bytes_fetched")}
    save_results(args, rewards=np.array(got, np.float32), final_w=final_w)
    for k in range(0, args.steps, args.log_every):
        print(f"step {k:4d}  reward {got[k]:.4f}  of best "
              f"{best_reward(pool, model, k):.4f}")
    print(f"{args.steps} steps in {elapsed:.2f} s "
          f"({elapsed / args.steps * 1e3:.2f} ms/step, the first compiles), "
          f"sync_every {args.sync_every}, {loop.syncs} weight transfers to "
          f"the sampler; through the client during the loop: "
          f"{through_client['bytes_put']} bytes put, "
          f"{through_client['bytes_fetched']} bytes fetched")

    ref_rewards, _, ref_w = reference_run(pool, model, w0, args.lr,
                                          args.steps, args.sync_every)
    err = max(np.max(np.abs(np.array(got) - ref_rewards)
                     / np.max(np.abs(ref_rewards))),
              np.max(np.abs(final_w - ref_w)) / np.max(np.abs(ref_w)))
    print(f"max relative error vs one process (jax.jit + eager PyTorch) "
          f"{err:.2e}")
    last = args.steps - 1
    ratio = got[last] / best_reward(pool, model, last)
    print(f"final reward {got[last]:.4f} = {ratio:.3f} of the best "
          f"(threshold {REWARD_THRESHOLD})")
    ok = (err <= TOLERANCE and ratio > REWARD_THRESHOLD
          and not any(through_client.values()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
