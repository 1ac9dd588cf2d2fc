"""MPMD pipeline-parallel training: S stages, each on its own slice, M
micro-batches per step, scheduled GPipe or 1F1B.

A stage is three callables written with ordinary Plexus programs compiled
for the stage's slice (built-in kernels today, `plexus.jit` programs just the
same); the library never looks inside them, it only decides *when* each is
called and which futures it hands over:

    forward(params, x)            -> (y, saved)       every stage but the last
    forward(params, x, target)    -> (loss, saved)    the last stage
    backward(params, saved, dy)   -> (dx, grads)      dy is None on the last
                                                      stage; dx is ignored on
                                                      the first
    update(params, grads)         -> new params       optional
    update(params, grads, state)  -> (new params, new state)
                                   when the pipeline carries optimizer state
                                   for the stage (Pipeline(opt_state=...))

`params`, `saved` and `grads` are pytrees (dicts, lists, tuples, None) of
futures; `x`, `y`, `dx`, `dy` are single futures (or pytrees of them). A
stage's futures live on its slice; passing stage s's `y` to stage s+1's
programs is all it takes for the runtime to move it worker to worker.

    stages = [Stage(slice1, fwd1, bwd1, update1),
              Stage(slice2, fwd2, bwd2, update2)]
    pipe = Pipeline(stages, params=[p1, p2], schedule="1f1b")
    out = pipe.step(micro_batches, targets)  # one graph; returns at once
    print(float(np.asarray(out.loss)))       # pipe.params: the new params

Optimizer state (Adam's moments, a step count) is a pytree of futures per
stage, given as Pipeline(opt_state=[state1, state2]); a stage with state has
its update called as update(params, grads, state) -> (params, state), and
pipe.opt_state (and the step's result) holds the new state.

Recovery: in a cluster with spares, a stage's values keep their lineage
(the calls that made them, and their inputs) so that a lost stage host is
recomputed on a spare. So that this lineage reaches back one step, not to
the start of training, each step snapshots the stages' new parameters,
optimizer state and the loss on another host (Pipeline(snapshot=False)
turns it off: a loss then recomputes from the last values the client put).

Gradients are summed over micro-batches pytree-wide: one call per
micro-batch per stage (a plexus.jit program adding the whole tree, the last
one also scaling by 1/M), whatever the number of tensors; trees with partial
leaves (or without JAX) are added leaf by leaf with the built-in `add`.

One step is recorded as ONE program graph. The calls are issued in an order
that follows the schedule on every stage (each device runs its calls in FIFO
order, so the device sees its forwards and backwards exactly in schedule
order), gradients are summed over micro-batches on their stage and averaged,
the updates are applied, and every activation future is dropped as soon as
the call that last reads it has been recorded — so the object store frees it
as soon as that call has run, and 1F1B's bound on live activations is real.
"""
from ._future import Future, wait

__all__ = ["Stage", "Pipeline", "StepResult", "gpipe", "one_f_one_b",
           "schedule_actions", "check_schedule", "peak_in_flight",
           "issue_order", "simulate", "SCHEDULES"]


# ---------------------------------------------------------------- schedules


def gpipe(num_stages, num_microbatches):
    """GPipe: every stage runs all M forwards, then all M backwards (last
    micro-batch first). Returns one list of ("F", m) / ("B", m) per stage.
    Peak activations per stage: M."""
    S, M = _check_sizes(num_stages, num_microbatches)
    return [[("F", m) for m in range(M)] +
            [("B", m) for m in reversed(range(M))] for _ in range(S)]


def one_f_one_b(num_stages, num_microbatches):
    """1F1B (PipeDream-flush): stage s runs min(S-s-1, M) warm-up forwards,
    then alternates one forward and one backward, then drains the remaining
    backwards. Same bubble as GPipe, but at most S-s micro-batches (<= S) of
    activations are alive on stage s."""
    S, M = _check_sizes(num_stages, num_microbatches)
    per_stage = []
    for s in range(S):
        warmup = min(S - s - 1, M)
        actions = [("F", m) for m in range(warmup)]
        for i in range(M - warmup):
            actions += [("F", warmup + i), ("B", i)]
        actions += [("B", m) for m in range(M - warmup, M)]
        per_stage.append(actions)
    return per_stage


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def schedule_actions(schedule, num_stages, num_microbatches):
    """The per-stage action lists of `schedule`: a name in SCHEDULES or a
    function (S, M) -> per-stage lists. Checked with check_schedule."""
    if isinstance(schedule, str):
        try:
            fn = SCHEDULES[schedule.lower()]
        except KeyError:
            raise ValueError(f"unknown pipeline schedule {schedule!r}; choose "
                             f"one of {sorted(SCHEDULES)} or pass a function "
                             "(S, M) -> per-stage action lists") from None
    elif callable(schedule):
        fn = schedule
    else:
        raise TypeError(f"schedule must be a name or a function, not "
                        f"{type(schedule).__name__}")
    actions = [list(a) for a in fn(num_stages, num_microbatches)]
    check_schedule(actions, num_stages, num_microbatches)
    return actions


def check_schedule(per_stage, num_stages, num_microbatches):
    """Raises ValueError unless every stage runs each micro-batch's forward
    exactly once, then its backward exactly once, and the stages together
    can be issued without waiting on each other forever."""
    S, M = num_stages, num_microbatches
    if len(per_stage) != S:
        raise ValueError(f"schedule has {len(per_stage)} stages, expected {S}")
    for s, actions in enumerate(per_stage):
        want = {("F", m) for m in range(M)} | {("B", m) for m in range(M)}
        got = [tuple(a) for a in actions]
        if len(got) != 2 * M or set(got) != want:
            raise ValueError(f"stage {s} of the schedule must run F and B of "
                             f"micro-batches 0..{M - 1} once each, got {got}")
        for m in range(M):
            if got.index(("B", m)) < got.index(("F", m)):
                raise ValueError(f"stage {s} runs B{m} before F{m}")
    issue_order(per_stage)  # raises if the stages wait on each other forever


def peak_in_flight(actions):
    """Most micro-batches whose forward has run and backward has not, over
    one stage's action list: the activations that stage must keep."""
    live = peak = 0
    for kind, _ in actions:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def simulate(per_stage, fwd, bwd, latency=0.0):
    """The step time of a schedule on ideal devices: each stage runs its
    actions in order, a forward takes `fwd`, a backward `bwd` (numbers, or
    functions (stage, m) -> duration), and a value crossing from one stage
    to the next arrives `latency` after it is computed. Returns (step
    time, per-stage busy time). With latency 0 and uniform times both
    GPipe and 1F1B take (M + S - 1) * (fwd + bwd)."""
    dur = {"F": fwd if callable(fwd) else (lambda s, m: fwd),
           "B": bwd if callable(bwd) else (lambda s, m: bwd)}
    S = len(per_stage)
    end = {}
    free = [0.0] * S
    busy = [0.0] * S
    for s, kind, m in issue_order(per_stage):
        start = free[s]
        if kind == "F" and s > 0:
            start = max(start, end[(s - 1, "F", m)] + latency)
        if kind == "B" and s < S - 1:
            start = max(start, end[(s + 1, "B", m)] + latency)
        d = dur[kind](s, m)
        end[(s, kind, m)] = free[s] = start + d
        busy[s] += d
    return max(free), busy


def issue_order(per_stage):
    """A global order of (stage, kind, m) that keeps each stage's actions in
    schedule order and issues every action after the ones it reads from:
    F(s, m) after F(s-1, m); B(s, m) after F(s, m) and B(s+1, m)."""
    S = len(per_stage)
    done = set()
    nxt = [0] * S
    order = []
    total = sum(len(a) for a in per_stage)
    while len(order) < total:
        progressed = False
        for s in range(S):
            while nxt[s] < len(per_stage[s]):
                kind, m = per_stage[s][nxt[s]]
                deps = [(s, "F", m)] if kind == "B" else []
                if kind == "F" and s > 0:
                    deps.append((s - 1, "F", m))
                if kind == "B" and s < S - 1:
                    deps.append((s + 1, "B", m))
                if not all(d in done for d in deps):
                    break
                done.add((s, kind, m))
                order.append((s, kind, m))
                nxt[s] += 1
                progressed = True
        if not progressed:
            stuck = {s: per_stage[s][nxt[s]] for s in range(S)
                     if nxt[s] < len(per_stage[s])}
            raise ValueError(f"schedule deadlocks: each stage's next action "
                             f"waits on another's: {stuck}")
    return order


def _check_sizes(S, M):
    S, M = int(S), int(M)
    if S < 1 or M < 1:
        raise ValueError(f"need at least 1 stage and 1 micro-batch, got "
                         f"S={S}, M={M}")
    return S, M


# ---------------------------------------------------------------- pytrees


def _leaves(tree):
    if tree is None:
        return []
    if isinstance(tree, dict):
        return [l for k in sorted(tree) for l in _leaves(tree[k])]
    if isinstance(tree, (list, tuple)):
        return [l for t in tree for l in _leaves(t)]
    return [tree]


def _map2(fn, a, b):
    """fn over the leaves of two pytrees of the same structure."""
    if a is None and b is None:
        return None
    if isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            raise ValueError(f"gradient trees differ: keys {sorted(a)} vs "
                             f"{sorted(b) if isinstance(b, dict) else b!r}")
        return {k: _map2(fn, a[k], b[k]) for k in a}
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            raise ValueError("gradient trees differ in structure")
        return type(a)(_map2(fn, x, y) for x, y in zip(a, b))
    return fn(a, b)


def _map(fn, a):
    if a is None:
        return None
    if isinstance(a, dict):
        return {k: _map(fn, v) for k, v in a.items()}
    if isinstance(a, (list, tuple)):
        return type(a)(_map(fn, v) for v in a)
    return fn(a)


class _Builtins:
    """Built-in kernels on one slice, compiled once per (kernel, attributes,
    input specs): the library's own sums and scales of gradients and
    losses. Built-in kernels read any future on the slice, whichever
    program produced it."""

    def __init__(self, slice_):
        self.slice = slice_
        self._programs = {}

    def call(self, kernel, *args, **attrs):
        key = (kernel, tuple(sorted(attrs.items())),
               tuple((a.shape, str(a.dtype), a.sharding) for a in args))
        prog = self._programs.get(key)
        if prog is None:
            prog = self._programs[key] = self.slice.program(
                kernel, *args, name=f"pipeline_{kernel}", **attrs)
        return prog(*args)


# ---------------------------------------------------------------- stages


class Stage:
    """One pipeline stage: its slice and its callables (see the module
    docstring for their signatures).

    accumulate(acc, grads) -> acc sums one micro-batch's gradients into the
    running sum. The default is one call per micro-batch: a plexus.jit
    program that adds the whole tree on the stage's slice (the last one also
    scales by 1/M), or, for trees with partial leaves or without JAX, the
    built-in `add` leaf by leaf (so it works for any program's outputs).
    """

    def __init__(self, slice, forward, backward, update=None,
                 accumulate=None, name=None):
        if not callable(forward) or not callable(backward):
            raise TypeError("Stage needs callable forward and backward")
        if update is not None and not callable(update):
            raise TypeError("Stage update must be callable or None")
        self.slice = slice
        self.forward = forward
        self.backward = backward
        self.update = update
        self.accumulate = accumulate
        self.name = name
        self._k = _Builtins(slice)
        self._tree_programs = {}  # (kind, factor, shardings) -> Jitted

    def _add(self, acc, grads, factor=1.0):
        """acc + grads, times `factor` (the mean's 1/M, on the last one)."""
        if acc is None:
            return self._scale(grads, factor)
        if self.accumulate is not None:
            return self._scale(self.accumulate(acc, grads), factor)
        if _tree_program_fits(acc, grads):
            return self._tree_program("add", factor, acc)(acc, grads)
        return self._scale(
            _map2(lambda a, b: self._k.call("add", a, b), acc, grads), factor)

    def _scale(self, tree, factor):
        if factor == 1.0 or tree is None:
            return tree
        if _tree_program_fits(tree):
            return self._tree_program("scale", factor, tree)(tree)
        return _map(lambda a: self._k.call("scale", a, factor=factor), tree)

    def _tree_program(self, kind, factor, like):
        """One plexus.jit program over a whole tree of futures shaped like
        `like`: (acc, grads) -> (acc + grads) * factor, or tree -> tree *
        factor; each output keeps its leaf's sharding and dtype."""
        import jax
        from ._jit import jit
        shardings = _map(lambda f: f._f.sharding, like)
        key = (kind, factor, repr(shardings))
        prog = self._tree_programs.get(key)
        if prog is None:
            def times(x):
                if factor == 1.0:
                    return x
                return (x * factor).astype(x.dtype)

            if kind == "add":
                def fn(acc, grads):
                    return jax.tree_util.tree_map(
                        lambda a, g: times(a + g), acc, grads)
            else:
                def fn(tree):
                    return jax.tree_util.tree_map(times, tree)
            prog = self._tree_programs[key] = jit(
                fn, self.slice, out_shardings=shardings,
                name=f"pipeline_{kind}_tree")
        return prog

    def __repr__(self):
        name = f"{self.name} " if self.name else ""
        return f"Stage({name}on {self.slice!r})"


class StepResult:
    """What one pipeline step produced, all futures (nothing waited on):
    loss (mean over micro-batches, or None if the last stage returns none),
    grads (per stage, mean over micro-batches), params (per stage, after
    the update) and opt_state (per stage, after the update; None for a
    stage without). block_until_ready() waits for the whole step, one
    round trip per worker."""

    def __init__(self, loss, grads, params, tails, order, opt_state=None):
        self.loss = loss
        self.grads = grads
        self.params = params
        self.opt_state = opt_state or [None] * len(params)
        self.order = order  # [(stage, "F"|"B", m)] in the order recorded
        self._tails = tails  # the last backward's outputs

    def block_until_ready(self):
        wait([f for f in [self.loss] + _leaves(self.grads) +
              _leaves(self.params) + _leaves(self.opt_state) + self._tails
              if isinstance(f, Future)])
        return self

    def __iter__(self):  # loss, grads, params = pipe.step(...)
        return iter((self.loss, self.grads, self.params))


class Pipeline:
    """Pipeline-parallel training over `stages` (one Stage per slice).

    params: one pytree of futures per stage (on that stage's slice).
    schedule: "1f1b" (default), "gpipe", or a function (S, M) -> per-stage
    lists of ("F", m) / ("B", m). average: divide summed gradients and
    losses by M (the default: with equal micro-batches whose losses are
    means, this makes one pipeline step one whole-batch step).
    opt_state: one pytree of futures per stage (None for a stage without
    state): the optimizer state its update takes and returns.
    snapshot: after each step, snapshot the new parameters, optimizer
    state and loss (client.snapshot), which bounds what recovery keeps to
    one step (see the module's docstring).
    """

    def __init__(self, stages, params=None, schedule="1f1b", average=True,
                 opt_state=None, snapshot=True):
        self.stages = list(stages)
        if not self.stages:
            raise ValueError("a pipeline needs at least one stage")
        for i, s in enumerate(self.stages):
            if not isinstance(s, Stage):
                raise TypeError(f"stage {i} is a {type(s).__name__}, not a "
                                "plexus.pipeline.Stage")
        clients = {id(s.slice._client) for s in self.stages}
        if len(clients) != 1:
            raise ValueError("all stages' slices must belong to one client")
        self.client = self.stages[0].slice._client
        if params is None:
            params = [None] * len(self.stages)
        if len(params) != len(self.stages):
            raise ValueError(f"{len(params)} parameter trees for "
                             f"{len(self.stages)} stages")
        self.params = list(params)
        if opt_state is None:
            opt_state = [None] * len(self.stages)
        if len(opt_state) != len(self.stages):
            raise ValueError(f"{len(opt_state)} optimizer states for "
                             f"{len(self.stages)} stages")
        for s, (st, state) in enumerate(zip(self.stages, opt_state)):
            if state is not None and st.update is None:
                raise ValueError(f"stage {s} has optimizer state but no "
                                 "update to take it")
        self.opt_state = list(opt_state)
        self.schedule = schedule
        self.average = average
        self.snapshot = snapshot

    @property
    def num_stages(self):
        return len(self.stages)

    def actions(self, num_microbatches):
        """The per-stage action lists this pipeline runs for M
        micro-batches."""
        return schedule_actions(self.schedule, self.num_stages,
                                num_microbatches)

    def step(self, micro_batches, targets=None):
        """One training step over the micro-batches, recorded as one program
        graph and submitted; returns a StepResult of futures at once and
        replaces self.params with the updated parameters.

        micro_batches: M inputs of the first stage (futures on its slice, or
        arrays); targets: M extra inputs of the last stage's forward (or
        None: then the last forward is called as forward(params, x))."""
        xs = list(micro_batches)
        M, S = len(xs), self.num_stages
        if M == 0:
            raise ValueError("step needs at least one micro-batch")
        if targets is not None:
            targets = list(targets)
            if len(targets) != M:
                raise ValueError(f"{M} micro-batches but {len(targets)} "
                                 "targets")
        plan = issue_order(self.actions(M))
        with self.client.graph():
            result = self._record(plan, xs, targets, M, S)
        del xs, targets
        self.params = result.params
        self.opt_state = result.opt_state
        if self.snapshot:
            # After the step's graph: copies of what the next step reads.
            self.client.snapshot([result.params, result.opt_state,
                                  result.loss])
        return result

    def _record(self, plan, xs, targets, M, S):
        stages, params = self.stages, self.params
        # Futures in flight, dropped as soon as their last reader is issued.
        acts = [dict() for _ in range(S)]   # acts[s][m]: stage s's input x
        cots = [dict() for _ in range(S)]   # cots[s][m]: stage s's dy
        saved = [dict() for _ in range(S)]  # saved[s][m]
        acts[0] = dict(enumerate(xs))
        grad_sum = [None] * S
        grads_seen = [0] * S  # backwards recorded per stage
        factor = 1.0 / M if self.average else 1.0
        loss_sum = None
        tail = None  # stage 0's last dx: the step's last action's output
        for s, kind, m in plan:
            st = stages[s]
            if kind == "F":
                x = acts[s].pop(m)
                if s == S - 1:
                    args = (params[s], x) if targets is None else \
                        (params[s], x, targets[m])
                    loss, saved[s][m] = _pair(st.forward(*args), st, "forward")
                    if loss is not None:
                        loss_sum = loss if loss_sum is None else \
                            st._k.call("add", loss_sum, loss)
                    del loss
                else:
                    acts[s + 1][m], saved[s][m] = _pair(
                        st.forward(params[s], x), st, "forward")
                del x
            else:
                dy = cots[s].pop(m) if s < S - 1 else None
                dx, grads = _pair(st.backward(params[s], saved[s].pop(m), dy),
                                  st, "backward")
                del dy
                if s > 0:
                    cots[s - 1][m] = dx
                else:
                    tail = dx
                del dx
                grads_seen[s] += 1
                if grads is not None:
                    # The last micro-batch's sum also takes the mean.
                    grad_sum[s] = st._add(
                        grad_sum[s], grads,
                        factor if grads_seen[s] == M else 1.0)
                del grads
        grads_out, params_out, state_out = [], [], []
        for s, st in enumerate(stages):
            g = grad_sum[s]
            grads_out.append(g)
            state = self.opt_state[s]
            if st.update is not None and g is not None:
                if state is None:
                    params_out.append(st.update(params[s], g))
                else:
                    new = st.update(params[s], g, state)
                    if not isinstance(new, (tuple, list)) or len(new) != 2:
                        raise TypeError(
                            f"{st!r}: update with optimizer state must "
                            "return a pair (params, state), got "
                            f"{type(new).__name__}")
                    params_out.append(new[0])
                    state = new[1]
            else:
                params_out.append(params[s])
            state_out.append(state)
        loss = stages[-1]._scale(loss_sum, factor) if loss_sum is not None \
            else None
        return StepResult(loss, grads_out, params_out,
                          [] if tail is None else _leaves(tail), plan,
                          state_out)

    def __repr__(self):
        return (f"Pipeline({self.num_stages} stages, schedule="
                f"{self.schedule!r})")


def _tree_program_fits(*trees):
    """Whether a plexus.jit program can take these trees whole: JAX is
    there and every leaf is a future that is not partial (XLA programs take
    replicated or split inputs)."""
    leaves = [l for t in trees for l in _leaves(t)]
    if not leaves or not all(isinstance(l, Future) and
                             l._f.sharding[0] != "partial" for l in leaves):
        return False
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


def _pair(out, stage, what):
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        pair = "(y, saved)" if what == "forward" else "(dx, grads)"
        raise TypeError(f"{stage!r}: {what} must return a pair {pair}, got "
                        f"{type(out).__name__}")
    return out
