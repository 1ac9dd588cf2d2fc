"""The Python API: clients and their slices, and connect() and status().

Futures (_future.py), programs and graphs (_program.py) and shardings
(_sharding.py) are modules of their own below this one.
"""
import contextlib
import weakref

import numpy as np

from . import _core
from . import _trace
from ._future import Future, _leaves, _put
from ._program import Graph, Program, Spec
from ._progress import describe_slice, waiting
from ._sharding import _sharding
from ._state import current_address, state_secret
from ._status import cluster_status


# ---------------------------------------------------------------- slices


class Slice:
    """A set of virtual devices with a mesh shape, like a jax Mesh."""

    def __init__(self, core_slice, client):
        self._s = core_slice
        self._client = client

    @property
    def id(self):
        """The server's id for the slice in the client's current session (a
        reconnect asks for the slice again, under a new id)."""
        return self._s.id

    @property
    def num_devices(self):
        return self._s.num_devices

    @property
    def num_hosts(self):
        return self._s.num_hosts

    @property
    def generation(self):
        """The version of the map from the slice's virtual devices to
        physical ones: 0 when granted, +1 each time the server remapped the
        slice onto a spare after losing one of its hosts (`devices` then
        names the spare). The slice, its programs and futures stay valid."""
        return self._s.generation

    epoch = generation  # the name the elastic issue uses for it

    @property
    def resizes(self):
        """How many times the slice was resized (`resize`): a loop that
        scales its batch or learning rate with the slice polls it."""
        return self._s.resizes

    def resize(self, num_devices, axis=None):
        """Changes the slice to `num_devices` devices while the job runs,
        along mesh axis `axis` (a name or index; default the first, the
        data-parallel one by convention); the other axes keep their sizes,
        so `num_devices` is a multiple of their product. The devices along
        the axis up to its new length stay; a shrink hands the rest back,
        a growth takes free devices, off the slice's hosts first. Every
        live value of the slice moves onto the new map after the calls
        issued before (replicated ones from a copy, split ones re-split
        over the new size); its futures stay valid. plexus.jit programs
        compile again for the new size on their next call (other compiled
        XLA programs are refused). Returns {"values_moved", "bytes_moved"}
        once the server has ordered the moves (plexus.wait on the futures
        waits for them). Refused, with nothing changed, naming what and why: a
        value whose split dimension the new size does not divide (with the
        sizes that would), a partial value, a value laid out by a
        multi-axis PartitionSpec (not supported yet), too few free
        devices."""
        names = list(self.axis_names)
        if axis is None:
            index = 0
        elif isinstance(axis, str):
            if axis not in names:
                raise _core.InvalidArgumentError(
                    f"resize: slice {self.id} has no mesh axis {axis!r} "
                    f"(its axes: {names})")
            index = names.index(axis)
        else:
            index = int(axis)
        return self._s.resize(int(num_devices), index)

    def suspend(self, to_files=False):
        """Parks the slice: calls and puts on it are refused (naming the
        slice) until `resume`; its devices count against no quota and claim
        nothing for its tenant's priority, so other jobs and tenants can
        have them; its values stay where they are (in the workers' memory:
        on CPU workers that is where they were) and its futures stay valid
        and readable. Calls issued before go on. `client.suspend()` parks
        every slice of the client.

        With `to_files=True`, every live value is also written to files of
        the server's park directory (`plexus-server --park-dir`, one
        directory every worker shares; `plexus.local` makes one) and
        released from the workers' memory: the call returns once every file
        is written and synced, with {"values_parked", "bytes_parked"} (over
        all devices). Its futures then raise FailedPrecondition ("parked")
        until `resume` reads the values back, on whichever hosts it gets,
        the workers restarted meanwhile or not."""
        return self._s.suspend(to_files=to_files)

    def resume(self):
        """Places a suspended slice again, at its size and mesh: on its own
        devices while no other slice took them (nothing moves), else on the
        least loaded ones its tenant may hold, where every live value
        moves under a new id, as for `resize` (its futures follow; plexus.jit
        programs compile again for the new hosts on their next call).
        Returns {"values_moved", "bytes_moved"}. Refused, the slice staying
        suspended, while too few devices are free."""
        return self._s.resume()

    @property
    def suspended(self):
        return self._s.suspended

    @property
    def preempted(self):
        """Why the server holds the slice suspended for a higher priority
        (on_preempt="suspend"), or None: its calls and puts wait at the
        server until it resumes."""
        return self._s.preempted or None

    @property
    def islands(self):
        """The islands (hosts) the slice spans, in shard order. The default
        placement keeps a slice inside one island where one can hold it."""
        return list(dict.fromkeys(d["host"] for d in self.devices))

    @property
    def devices(self):
        return self._s.describe()["devices"]

    @property
    def mesh_shape(self):
        return self._s.describe()["mesh_shape"]

    @property
    def axis_names(self):
        return self._s.describe()["axis_names"]

    @property
    def mesh(self):
        """{axis name: size}, in mesh order (the devices row-major)."""
        d = self._s.describe()
        return dict(zip(d["axis_names"], d["mesh_shape"]))

    @property
    def dcn_axes(self):
        """The mesh axes that cross islands (client.slice(dcn_axes=...));
        the others lie inside each island."""
        return self._client._dcn_axes.get(self._s.first_id, ())

    def put(self, array, sharding=None):
        """Copies a numpy array onto this slice's devices."""
        a = np.require(array, requirements="C")  # keeps 0-d arrays 0-d
        return Future(_put(self._client, self._s, a,
                           _sharding(sharding, self, a.ndim)), self._client)

    def program(self, kernel, *inputs, name=None, **attrs):
        """Compiles the built-in program `kernel` (see plexus.builtins) for
        this slice; returns a Program to call with arrays or futures.

        `inputs` describe its arguments: specs (plexus.Spec(shape, dtype,
        sharding), jax.ShapeDtypeStruct: replicated), or example values
        (futures keep their sharding; arrays are replicated). Only their
        shape, dtype and sharding are read (a list or a scalar as numpy
        reads it). Output specs are inferred from the kernel; `attrs` are
        its attributes.
        """
        what = f"program '{name or kernel}'"
        args = []
        for i, x in enumerate(inputs):
            if isinstance(x, Future):
                args.append((x._f.dtype, x._f.shape, x._f.sharding))
                continue
            if isinstance(x, Spec):
                shape, dtype, sh = x.shape, x.dtype, x.sharding
            elif hasattr(x, "shape") and hasattr(x, "dtype"):
                # numpy and jax arrays, jax.ShapeDtypeStruct
                shape, dtype, sh = tuple(x.shape), x.dtype, None
            else:  # a scalar or a list, as numpy reads it
                a = np.asarray(x)
                shape, dtype, sh = a.shape, a.dtype, None
            try:
                dtype = np.dtype(dtype)
                args.append((dtype, tuple(int(d) for d in shape),
                             _sharding(sh, self, len(shape))))
            except (TypeError, ValueError) as e:
                raise _core.InvalidArgumentError(
                    f"{what} argument {i}: {e}") from e
        return Program(self._client._core.compile(
            self._s, name or kernel, kernel, attrs, args), self._client)

    def close(self):
        self._s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        islands = self.islands
        return (f"Slice(id={self.id}, devices={self.num_devices}, "
                f"mesh={dict(zip(self.axis_names, self.mesh_shape))}, "
                f"hosts={sorted(islands)}, {len(islands)} island"
                f"{'' if len(islands) == 1 else 's'})")


# ---------------------------------------------------------------- client


class Client:
    """The single controller's connection to a Plexus cluster."""

    def __init__(self, core_client, address=None):
        self._core = core_client
        self._address = address  # the server's, for why()
        self._dcn_axes = {}  # slice's first id -> its DCN axes
        self._sites = {}  # (code, line) -> call site id (_trace.call_site)
        self._slices = []  # weak references to the slices it asked for

    @property
    def id(self):
        """The client id of the current session (a reconnect changes it)."""
        return self._core.client_id

    @property
    def state(self):
        """"open", "reconnecting" (the session ended; the client is opening
        a new one), "gave_up" (it could not within reconnect_timeout) or
        "closed"."""
        return self._core.state

    @property
    def session_ends(self):
        """The sessions with the server that ended under this client, oldest
        first: a dict each, with what was lost ("lost_futures": futures of
        the session alive when it ended, now raising ServerRestartedError,
        unless the next server resumed the session: "resumed", for a server
        that keeps a journal), why ("reason"), and what the reconnect did
        ("reconnected",
        "new_client_id", "down_s", "attempts", "slices_restored",
        "slices_lost", "programs_restored", "programs_lost", "gave_up"),
        and a one-line "summary" (the warning the client logged)."""
        return self._core.session_ends()

    def slice(self, n=None, mesh=None, axis_names=None, placement="any",
              hosts=None, avoid=None, timeout=30.0, dcn_axes=(),
              on_loss="wait", min_devices=None, grow=False,
              elastic_axis=None, on_preempt=None):
        """Asks the server for a slice of `n` virtual devices.

        mesh: the device mesh, as a dict {axis name: size} in order (like
        jax.make_mesh; `n` defaults to its size), or its shape with
        `axis_names` (default: (n,), ("devices",)). The virtual devices are
        the mesh's points in row-major order. dcn_axes: the mesh axes that
        cross islands (JAX's hybrid mesh, MaxText's dcn_* axes): each
        island (the slice's devices on one host) must hold exactly the
        devices of one point of those axes, so that the other axes lie
        inside an island; otherwise the slice is refused, saying so.
        placement: "any", "one_host" or "spread" (over hosts);
        hosts: only devices of these hosts (names as `plexus status` shows
        them; an island is the devices of one host); avoid: slices (or slice
        ids) of this client whose hosts it must not use.

        A request the cluster cannot meet now (too few live devices or hosts
        for the placement, or over the tenant's max_devices) waits at the
        server up to `timeout` seconds for capacity to appear, then fails
        with DEADLINE_EXCEEDED saying what it waited for; timeout=0 raises
        ResourceExhaustedError at once. A bad request (mesh, unknown host)
        raises at once. `plexus status` lists the requests that wait.

        on_loss: what the slice does when one of its hosts is lost and no
        spare is free to take its place (a free spare always does):
        "wait" for one (the server's --spare-wait-ms; then break), "break"
        at once, or "shrink": the slice goes on without the positions of
        mesh axis `elastic_axis` (a name or index; default the first, the
        data-parallel one) that had a device there, no smaller than
        `min_devices`. Replicated values move onto the smaller map (done
        or still being computed); split and partial ones are lost
        (DeviceLostError, naming them), so a loop keeps its last good
        state until a step is done. grow=True: the slice grows back, up to `n`, as hosts join
        or come free. Each change adds 1 to `slice.resizes`; plexus.jit
        programs compile again for the new size (docs/scheduling.md).

        on_preempt: what the slice does when a slice of a higher-priority
        tenant (the operator's tenants file) is mapped to its devices:
        "share" them (time-sharing), "shrink" off them along
        `elastic_axis` down to `min_devices` (values moved, none lost;
        grow=True grows back once they free), or "suspend": the server
        suspends the slice, its values kept in the workers' memory
        (`slice.suspended`, and `slice.preempted` says for whom); calls
        and puts on it wait at the server rather than fail, and run, in
        order, once it resumes on its own devices when they free; or
        "park": suspended so, its values also written to the server's park
        directory (plexus-server --park-dir) and released from the
        workers' memory, as slice.suspend(to_files=True) does (reads of
        them fail, saying parked, until it resumes and reads them back;
        without a park directory, as "suspend"). The default shrinks where
        on_loss does, else shares.
        """
        if isinstance(mesh, dict):
            if axis_names is not None:
                raise _core.InvalidArgumentError(
                    "slice: give the mesh as a dict or as a shape with "
                    "axis_names, not both")
            axis_names = list(mesh)
            mesh = [int(v) for v in mesh.values()]
        if n is None:
            if not mesh:
                raise _core.InvalidArgumentError(
                    "slice: give the number of devices or a mesh")
            n = int(np.prod(mesh))
        if isinstance(dcn_axes, str):
            dcn_axes = (dcn_axes,)
        dcn_axes = tuple(dcn_axes)
        if dcn_axes and placement == "any":
            # The default keeps a slice that fits inside one island; one
            # with DCN axes is meant to cross islands.
            placement = "spread"
        if isinstance(hosts, str):
            hosts = [hosts]
        if isinstance(avoid, Slice):
            avoid = [avoid]
        avoid_ids = [a.id if isinstance(a, Slice) else int(a) for a in (avoid or [])]
        if isinstance(elastic_axis, str):
            names = list(axis_names or ["devices"])
            if elastic_axis not in names:
                raise _core.InvalidArgumentError(
                    f"slice: elastic_axis {elastic_axis!r} is not a mesh "
                    f"axis (the axes: {names})")
            elastic_axis = names.index(elastic_axis)
        with waiting(self, describe_slice):
            core_slice = self._core.slice(
                n, list(mesh or []), list(axis_names or []), placement,
                list(hosts or []), avoid_ids, float(timeout),
                on_loss=str(on_loss), min_devices=int(min_devices or 0),
                grow=bool(grow), elastic_axis=int(elastic_axis or 0),
                on_preempt=str(on_preempt or ""))
        s = Slice(core_slice, self)
        self._slices = [r for r in self._slices if r() is not None]
        self._slices.append(weakref.ref(s))
        if dcn_axes:
            try:
                _check_dcn_axes(s, dcn_axes)
            except Exception:
                s.close()
                raise
            self._dcn_axes[s._s.first_id] = dcn_axes
        return s

    def graph(self):
        return Graph(self)

    def _open_slices(self):
        return [s for s in (r() for r in self._slices)
                if s is not None and not s._s.closed]

    def suspend(self, to_files=False):
        """Suspends every open slice of the client that is not suspended
        (`Slice.suspend`: calls and puts refused, devices counted for no
        quota or priority, values kept; with `to_files`, in files of the
        server's park directory); returns how many."""
        slices = [s for s in self._open_slices() if not s.suspended]
        for s in slices:
            s.suspend(to_files=to_files)
        return len(slices)

    def resume(self):
        """Resumes every suspended slice of the client (`Slice.resume`);
        returns {"slices", "values_moved", "bytes_moved"} over them. A
        refusal raises after the slices before it were resumed (they stay
        so; the rest stay suspended)."""
        total = {"slices": 0, "values_moved": 0, "bytes_moved": 0}
        for s in self._open_slices():
            if not s.suspended:
                continue
            moved = s.resume()
            total["slices"] += 1
            total["values_moved"] += moved["values_moved"]
            total["bytes_moved"] += moved["bytes_moved"]
        return total

    def _wrap_slice(self, core_slice):
        """The Slice of this client around `core_slice` (a future's)."""
        return Slice(core_slice, self)

    def counters(self):
        return self._core.counters()

    def flush(self):
        self._core.flush()

    def why(self, after=1.0):
        """Why this client's work is stuck: each call routed more than
        `after` seconds ago (at least 1) and not done, the longest wait
        first, as a dict with `reason` (one sentence: the chain of calls it
        waits for and the root cause, naming the host), `cause` (the root
        cause alone), `blame_host`, `waited_ms`, `program`, `site`,
        `call_id`, `root_call_id`, `slice_id` and `output_ids` (the
        buffers it holds up). Its calls waiting at admission are one entry
        (its oldest call's, with all their outputs), and a slice of it
        waiting for a host one (call_id 0). The server follows its records
        (docs/observability.md, "Why is it stuck"); `plexus why` shows
        every client's."""
        if self._address is None:
            raise RuntimeError("this client does not know its server's "
                               "address")
        st = cluster_status(self._address)
        return [e for e in st.get("why", [])
                if int(e.get("client_id", 0)) == self.id
                and int(e.get("waited_ms", 0)) >= after * 1000]

    def snapshot(self, tree):
        """Asks for an in-memory copy of every future in the pytree on
        another host of its slice (for a slice on one host, on another host
        of the cluster), made peer to peer after the calls issued before
        it, never through the client or the server (a future that already
        has a complete snapshot keeps it). It counts once every shard's
        copy has arrived; from then on the future no longer holds the
        inputs it was computed from. Should a host be lost, the shards it
        held are restored from these copies (the server's recovery) rather
        than recomputed or lost. Asynchronous: returns at once. Futures
        replicated over more than one host need none (their other shards
        are copies); a cluster that never had a spare takes none (it
        cannot recover)."""
        self._core.snapshot([f._f for f in _leaves(tree)])
        return tree

    @contextlib.contextmanager
    def trace(self, path, timeout=10.0):
        """Writes a timeline of what this client's calls did on the whole
        cluster while the block ran to `path` (the operator's `plexus
        trace` shows every client's): a Chrome trace-event file that Perfetto
        (ui.perfetto.dev) and TensorBoard open, with one track per host and
        device, each call named by its program and the source line that
        issued it (and its graph, if any), flows from each transfer to the
        task that reads it, and this process's own track: the calls it
        issued and its puts, fetches and waits, on the server's clock
        (docs/observability.md, "The timeline"). Collected as the block
        ends: wait for the results you want to see inside it. Returns (as
        the `with` target) a dict that holds the trace's summary once the
        block has ended."""
        if self._address is None:
            raise RuntimeError("this client does not know its server's "
                               "address")
        since = _trace.server_now(self._address)
        summary = {}
        try:
            yield summary
        finally:
            summary.update(_trace.write(self._address, path, since, timeout,
                                        client=self._core))

    def close(self):
        self._core.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _check_dcn_axes(s, dcn_axes):
    """Raises unless each island of `s` holds exactly the devices of one
    point of the DCN axes."""
    axes, sizes = tuple(s.axis_names), tuple(s.mesh_shape)
    mesh = ", ".join(f"{a!r}: {n}" for a, n in zip(axes, sizes))
    for a in dcn_axes:
        if a not in axes:
            raise _core.InvalidArgumentError(
                f"slice: dcn_axes names {a!r}, which is not an axis of the "
                f"mesh {{{mesh}}}")
    coords = np.indices(sizes).reshape(len(sizes), -1).T  # row-major
    idx = [axes.index(a) for a in dcn_axes]
    islands = {}  # DCN point -> workers holding its devices
    workers = {}  # worker -> DCN points it holds
    for c, d in zip(coords, s.devices):
        point = tuple(int(c[i]) for i in idx)
        islands.setdefault(point, set()).add(d["worker"])
        workers.setdefault(d["worker"], set()).add(point)
    if (any(len(w) > 1 for w in islands.values())
            or any(len(p) > 1 for p in workers.values())):
        layout = "; ".join(f"{d['host']} holds devices " + ", ".join(
            str(i) for i, e in enumerate(s.devices) if e["worker"] == w)
            for w, d in {d["worker"]: d for d in s.devices}.items())
        inner = int(np.prod([n for a, n in zip(axes, sizes)
                             if a not in dcn_axes]))
        raise _core.InvalidArgumentError(
            f"slice: dcn_axes {dcn_axes} of the mesh {{{mesh}}} need each "
            f"island (host) to hold the {inner} devices of one point of "
            f"those axes, but {layout} (virtual devices are row-major over "
            "the mesh: put the DCN axes first, and ask for hosts with that "
            "many devices, e.g. placement='spread')")


def connect(address=None, name="python", shared_memory=True,
            sequential_dispatch=False, tenant=None, token=None, tls_ca=None,
            reconnect_timeout=None):
    """Connects to a Plexus server (default: $PLEXUS_ADDRESS, or the cluster
    started by `plexus up`).

    The client outlives a restart of its server. When its session ends
    without close() (the server restarted, or the connection broke), it
    opens a new one at the same address, with back-off, for up to
    `reconnect_timeout` seconds (default 60; 0: never; the cluster `plexus
    up` started, whose workers end with its server: 0). Its slices and
    programs are asked for and registered again there and keep working;
    futures of the old session raise ServerRestartedError (a kind of
    DeviceLostError) naming the server and the buffer; `client.session_ends`
    records what each ended session lost. Calls, puts and slice requests
    made while it reconnects wait for it (at most reconnect_timeout; a
    slice request at most its timeout), then raise UnavailableError naming
    the server and how long they waited.

    The session opens as a tenant, whose share and quotas the operator set:
    `tenant` and `token` (what `plexus token --tenant NAME` prints), else
    $PLEXUS_TENANT and $PLEXUS_TENANT_TOKEN. A process that holds the
    cluster secret ($PLEXUS_CLUSTER_SECRET, or the cluster `plexus up`
    started) derives the token itself. Without either the session is
    anonymous, which only a server on loopback admits (as tenant
    "default"). `tls_ca`: the CA file that the server's TLS certificate is
    checked against (else $PLEXUS_TLS_CA; neither: plain text).
    """
    secret = None
    if address is None:
        address = current_address()
        secret = state_secret(address)
    if reconnect_timeout is None:
        # `plexus up`'s cluster (its state holds the secret) is embedded:
        # its workers end with its server.
        reconnect_timeout = 0.0 if secret is not None else 60.0
    return Client(_core.Client.connect(
        address, name, shared_memory, sequential_dispatch,
        tenant=tenant or "", tenant_token=token or "", secret_hex=secret,
        tls_ca=tls_ca or "", reconnect_timeout=float(reconnect_timeout)),
        address)


def status(address=None):
    """The server's view of the cluster, as a dict."""
    if address is None:
        address = current_address()
    return cluster_status(address)
