"""The RL post-training loop: a sampler, a reward program and a trainer on
three slices, overlapped, with the trainer's weights sent to the sampler
every `sync_every` steps.

    loop = plexus.rl.AsyncRLLoop(sample, reward, train, state,
                                 sampler_slice=sampler, sync_every=1)
    state = loop.run(100, on_step=lambda s: ...)

The three stages are plain Python functions that call Plexus programs (each
on its own slice) and return futures (or pytrees of futures: dicts, lists,
tuples):

    sample(weights, k)             -> batch     on the sampler's slice
    reward(batch)                  -> rewards   on the reward program's slice
    train(state, batch, rewards)   -> state     on the trainer's slice

`weights(state)` picks the sampler's weights out of the trainer's state
(default: the state itself). Nothing is fetched: the loop passes futures
from stage to stage and the runtime moves them worker to worker, so the
client issues step k+1's sampling before step k's training has run, and the
devices overlap.

Which weights the sampler uses (W_m = the weights after m training steps):

    sync_every = n >= 1   sample k uses W_m, m = the largest multiple of n
                          that is <= k - 1 (m = 0 for k = 0). The trainer's
                          weights after every n-th step are sent to the
                          sampler; they are at most n steps old when used.
                          Sample k + 1 never needs training step k, so the
                          sampler produces batch k + 1 while the trainer
                          learns from batch k.
    sync_every = 0        staleness 0, on-policy: sample k uses W_k, the
                          newest weights. Sample k + 1 must wait for training
                          step k, so sampling does not overlap training;
                          dispatch stays asynchronous (no client round trip
                          between stages) but the devices take turns.

`sampler_weights_step(k, n)` gives that m. `sequential=True` runs the same
computation (same values, same weights rule) but blocks on every stage's
result before issuing the next: the loop as it runs without asynchronous
dispatch, for comparison.
"""
import collections

from ._future import Future

__all__ = ["AsyncRLLoop", "Step", "sampler_weights_step", "tree_map",
           "tree_leaves"]


def sampler_weights_step(k, sync_every):
    """The m of the weights W_m that sample k uses under `sync_every`."""
    if sync_every < 0:
        raise ValueError(f"sync_every must be >= 0, got {sync_every}")
    if sync_every == 0:
        return k
    if k == 0:
        return 0
    return (k - 1) // sync_every * sync_every


# ------------------------------------------------------------------ pytrees


def tree_map(fn, tree):
    """Applies `fn` to every leaf of nested dicts, lists and tuples."""
    if isinstance(tree, dict):
        return {key: tree_map(fn, v) for key, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # namedtuple
        return type(tree)(*(tree_map(fn, v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_map(fn, v) for v in tree)
    return fn(tree)


def tree_leaves(tree):
    leaves = []
    tree_map(leaves.append, tree)
    return leaves


def _block(tree):
    """Waits until every future in `tree` is computed (raises its error)."""
    for leaf in tree_leaves(tree):
        if isinstance(leaf, Future):
            leaf.block_until_ready()
    return tree


class _SendToSlice:
    """Copies a pytree of futures onto `slice_` with `identity` programs
    (compiled once per spec): the runtime moves each shard worker to worker,
    once per sync, and the sampler's programs then read the local copy."""

    def __init__(self, slice_):
        self.slice = slice_
        self._programs = {}

    def _send(self, x):
        if not isinstance(x, Future):
            return x
        key = (x.shape, str(x.dtype), x.sharding)
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = self.slice.program(
                "identity", x, name="rl_send_weights")
        return program(x)

    def __call__(self, weights):
        return tree_map(self._send, weights)


Step = collections.namedtuple("Step", "k batch rewards state weights_step")
Step.__doc__ = """One step of the loop, as futures: `batch` and `rewards` of
step k, the trainer's `state` after it (W_{k+1}), and `weights_step`, the m
of the weights W_m the sampler used for this batch."""


class AsyncRLLoop:
    """Runs sample -> reward -> train, step after step, overlapped.

    sample, reward, train: the stages (see the module's doc).
    state: the trainer's initial state (futures on the trainer's slice).
    weights: state -> the weights the sampler needs (default: the state).
    sampler_slice: where the sampler runs; at every sync the weights are
        copied there once (`identity`, worker to worker). Without it the
        sampler's programs read the trainer's futures directly and the
        runtime moves them at every use.
    send: weights -> weights on the sampler's side; overrides sampler_slice.
    sync_every: n >= 1 sends the weights every n steps (at most n steps
        stale, overlapped); 0 is on-policy (staleness 0, not overlapped).
    sequential: block on each stage's result before issuing the next.
    max_in_flight: how many steps the client may run ahead of the trainer
        before it waits (bounds the futures alive on the workers); None for
        no bound.
    """

    def __init__(self, sample, reward, train, state, *, weights=None,
                 sampler_slice=None, send=None, sync_every=1,
                 sequential=False, max_in_flight=4):
        if sync_every < 0:
            raise ValueError(f"sync_every must be >= 0, got {sync_every}")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(
                f"max_in_flight must be >= 1 or None, got {max_in_flight}")
        self.sample_fn = sample
        self.reward_fn = reward
        self.train_fn = train
        self.weights_fn = weights or (lambda s: s)
        if send is None:
            send = _SendToSlice(sampler_slice) if sampler_slice else (lambda w: w)
        self.send_fn = send
        self.sync_every = sync_every
        self.sequential = sequential
        self.max_in_flight = max_in_flight
        self.state = state
        self.step = 0  # training steps done (issued)
        self.syncs = 0  # weights sent to the sampler
        # Weights produced at sync points, by training step: {m: W_m}.
        self._synced = {0: self.weights_fn(state)}
        self._sampler_weights = None  # (m, weights on the sampler's side)

    @property
    def max_staleness(self):
        """The most training steps the sampler's weights can lag behind."""
        return self.sync_every

    # -- one stage at a time --------------------------------------------
    def _stage(self, tree):
        return _block(tree) if self.sequential else tree

    def _weights_for(self, k):
        m = sampler_weights_step(k, self.sync_every)
        if self._sampler_weights is None or self._sampler_weights[0] != m:
            self._sampler_weights = (m, self._stage(self.send_fn(self._synced[m])))
            self.syncs += 1
            # Older weights are never needed again.
            for old in [s for s in self._synced if s < m]:
                del self._synced[old]
        return self._sampler_weights

    def _sample(self, k):
        m, weights = self._weights_for(k)
        return m, self._stage(self.sample_fn(weights, k))

    def _train(self, batch, rewards):
        self.state = self._stage(self.train_fn(self.state, batch, rewards))
        self.step += 1
        if self.sync_every == 0 or self.step % self.sync_every == 0:
            self._synced[self.step] = self.weights_fn(self.state)
        return self.state

    # -- the loop ----------------------------------------------------------
    def run(self, num_steps, on_step=None):
        """Runs `num_steps` steps and returns the trainer's final state (a
        future: nothing is waited for unless `sequential` or
        `max_in_flight` asks). `on_step(Step)` is called once per step,
        right after its training call is issued; fetching in it blocks the
        client (not the devices) until that value is computed.

        Issue order, for step k: sample k + 1 (when its weights do not need
        training step k), train k, then reward k + 1. The devices each run
        their calls in that order, so the sampler's device works on batch
        k + 1 while the trainer's works on batch k.
        """
        first, last = self.step, self.step + num_steps
        if num_steps <= 0:
            return self.state
        in_flight = collections.deque()
        nxt = self._sample(first)
        nxt = (nxt[0], nxt[1], self._stage(self.reward_fn(nxt[1])))
        for k in range(first, last):
            m, batch, rewards = nxt
            ahead = None
            if k + 1 < last and sampler_weights_step(k + 1, self.sync_every) <= k:
                ahead = self._sample(k + 1)  # overlaps train(k)
            state = self._train(batch, rewards)
            if k + 1 < last:
                if ahead is None:
                    ahead = self._sample(k + 1)  # on-policy: after train(k)
                nxt = (ahead[0], ahead[1],
                       self._stage(self.reward_fn(ahead[1])))
            if on_step is not None:
                on_step(Step(k, batch, rewards, state, m))
            if self.max_in_flight is not None and not self.sequential:
                in_flight.append(state)
                if len(in_flight) > self.max_in_flight:
                    _block(in_flight.popleft())
        return self.state
