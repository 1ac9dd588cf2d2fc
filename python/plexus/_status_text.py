"""The cluster status (_status.py's dict) as text a person reads: the
tables of `plexus status`, the sentences of `plexus why`; `plexus top`
draws its frames with the same pieces.

Pure functions of the status dict: no I/O, no imports from the package.
"""


def human(n):
    """A byte count in words: "512 B", "1.5 GiB"."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def table(headers, rows):
    """`rows` under `headers`, each column as wide as its widest cell."""
    widths = [len(h) for h in headers]
    for r in rows:
        widths = [max(w, len(str(c))) for w, c in zip(widths, r)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))
    return "\n".join([line(headers)] + [line(r) for r in rows])


def format_status(st):
    """The cluster status as tables a person can scan."""
    workers = st.get("workers", [])
    out = [_workers_table(st, workers)]
    xla = [w for w in workers if w.get("stats", {}).get("xla_platform") or
           w.get("stats", {}).get("xla_compiles")]
    if xla:
        out += ["", _xla_table(xla)]
    down = [w for w in workers if not w["alive"] and w.get("down_reason")]
    for w in down:
        out.append(f"  worker {w['worker_id']} down: {w['down_reason']}")
    slices = st.get("slices", [])
    if slices:
        out += ["", _slices_table(slices)]
    r = st.get("recovery", {})
    if int(r.get("hosts_lost", 0)):
        out += ["", _recovery_line(r)]
    pending = st.get("pending_slices", [])
    if pending:
        out += ["", _pending_table(pending)]
    clients = st.get("clients", [])
    if clients:
        out += ["", _clients_table(clients)]
    out.append("")
    out.append(f"server {st.get('address')}: scheduler {st.get('scheduler', '?')}, "
               f"{st.get('epoch', 0)} batches ordered, {st.get('calls_routed', 0)} "
               f"calls routed, {human(st.get('control_bytes_in', 0))} of "
               f"control messages in, {human(st.get('data_bytes', 0))} of "
               "buffer data through the server")
    return "\n".join(out)


def silent_ms(st, w):
    """How long an alive worker has not been heard from, if for three
    heartbeat periods or more (stopped, starved); else None."""
    age = int(w.get("stats_age_ms", 0))
    period = int(st.get("heartbeat_interval_ms", 0)) or 100
    return age if w.get("alive") and age >= 3 * period else None


def _state(st, w):
    """A worker's STATE: up, spare or DOWN; alive but silent, for how
    long."""
    if not w["alive"]:
        return "DOWN"
    state = "spare" if w.get("spare") else "up"
    silent = silent_ms(st, w)
    return state if silent is None else f"{state} (silent {silent / 1000:.1f} s)"


def _workers_table(st, workers):
    rows = []
    for w in workers:
        s = w.get("stats", {})
        rows.append([
            w["host_name"], w["worker_id"], w["pid"], _state(st, w),
            len(w.get("devices", [])),
            s.get("live_buffers", 0), human(s.get("live_bytes", 0)),
            s.get("calls_executed", 0), s.get("calls_failed", 0),
            human(s.get("bytes_sent", 0)), human(s.get("bytes_received", 0)),
            human(s.get("bytes_from_clients", 0)),
            human(s.get("bytes_to_clients", 0))])
    return table(["HOST", "WORKER", "PID", "STATE", "DEVICES", "BUFFERS",
                  "LIVE", "CALLS", "FAILED", "SENT", "RECEIVED",
                  "FROM-CLIENTS", "TO-CLIENTS"], rows)


def _xla_table(xla):
    """The workers that run XLA programs. Loaded: executables loaded from a
    peer's serialized bytes instead of compiled (a spare's). In device
    memory: shards XLA left there; the bytes copied each way between host
    and device memory since the worker started; the shards moved by each
    path (alias / device-to-device / through host memory / CUDA IPC /
    NCCL)."""
    rows = []
    for w in xla:
        s = w["stats"]
        rows.append([w["host_name"], w["worker_id"],
                     s.get("xla_platform", "") or "-",
                     s.get("xla_compiles", 0), s.get("xla_cache_hits", 0),
                     s.get("xla_serialized_loads", 0),
                     f"{s.get('xla_compile_micros', 0) / 1000:.0f} ms",
                     s.get("device_memory_shards", 0),
                     human(s.get("bytes_host_to_device", 0)),
                     human(s.get("bytes_device_to_host", 0)),
                     "/".join(str(s.get(f"transfers_{k}", 0)) for k in
                              ("alias", "device_to_device", "host_staged",
                               "ipc", "nccl"))])
    return table(["HOST", "WORKER", "XLA PLATFORM", "COMPILES",
                  "CACHE-HITS", "LOADED", "COMPILE-TIME", "ON-DEVICE",
                  "TO-DEVICE", "TO-HOST",
                  "PATHS A/D2D/HOST/IPC/NCCL"], rows)


def _slices_table(slices):
    """Where each virtual device is: one row per host a slice uses, its
    virtual devices in mesh order with the device each maps to."""
    rows = []
    for s in slices:
        by_host = {}
        for v, d in enumerate(s.get("devices", [])):
            key = (d.get("host_name", ""), d.get("worker_id", 0))
            by_host.setdefault(key, []).append(f"{v}->{d.get('device', 0)}")
        islands = len({host for host, _ in by_host})
        for i, ((host, worker), maps) in enumerate(by_host.items()):
            rows.append([s["slice_id"] if i == 0 else "",
                         s["client_id"] if i == 0 else "",
                         len(s.get("devices", [])) if i == 0 else "",
                         host, worker, " ".join(maps),
                         # remaps onto spares; BROKEN: lost a host, no
                         # spare; WAITING: for a host to take its place;
                         # PREEMPTED: suspended for a higher priority
                         ("BROKEN" if s.get("broken") else
                          f"WAITING ({int(s.get('awaiting_left_ms', 0)) / 1000:.1f} s left)"
                          if s.get("awaiting") else
                          "PREEMPTED" if s.get("preempted") else
                          "SUSPENDED" if s.get("suspended") else
                          s.get("generation", 0)) if i == 0 else "",
                         islands if i == 0 else ""])
    return table(["SLICE", "CLIENT", "DEVICES", "HOST", "WORKER",
                  "VIRTUAL->DEVICE", "GENERATION", "ISLANDS"], rows)


def _recovery_line(r):
    return (f"recovery: {r.get('hosts_lost', 0)} host(s) lost, "
            f"{r.get('slices_remapped', 0)} slice remap(s), "
            f"{r.get('slices_broken', 0)} broken; "
            f"{r.get('calls_recomputed', 0)} call(s) run again, "
            f"{r.get('buffers_restored', 0)} buffer(s) restored, "
            f"{r.get('shards_reput', 0)} shard(s) put again, "
            f"{r.get('buffers_failed', 0)} lost")


def _pending_table(pending):
    rows = [[p["client_id"], p.get("request_id", 0), p.get("num_devices", 0),
             f"{p.get('waited_ms', 0) / 1000:.1f} s",
             f"{p.get('left_ms', 0) / 1000:.1f} s", p.get("waiting_for", "")]
            for p in pending]
    return table(["WAITING CLIENT", "REQUEST", "DEVICES", "WAITED",
                  "LEFT", "WAITING FOR"], rows)


def _clients_table(clients):
    rows = []
    for c in clients:
        s = c.get("stats", {})
        rows.append([c["client_id"], c["name"], c.get("tenant", ""),
                     c["slices"],
                     s.get("calls", 0), s.get("live_futures", 0),
                     human(s.get("bytes_put", 0)),
                     human(s.get("bytes_fetched", 0)),
                     # How its ops reach the server: frames on the ops
                     # listener, or its gRPC stream (TLS, a listener it
                     # could not reach, --client-ops-on-grpc).
                     "frames" if c.get("ops_on_frames") else "stream"])
    return table(["CLIENT", "NAME", "TENANT", "SLICES", "CALLS",
                  "FUTURES",
                  "PUT", "FETCHED", "OPS"], rows)


def why_lines(st, after=1.0):
    """What `plexus why` says of status `st`: (client id, sentence) for each
    slice request waiting for capacity, and each of the server's
    explanations (server/why/why.h) that has waited longer than `after`
    seconds: a call, a client's calls at admission, a slice waiting for a
    host."""
    names = {c["client_id"]: c["name"] for c in st.get("clients", [])}
    lines = []
    for p in st.get("pending_slices", []):
        if p.get("waited_ms", 0) >= after * 1000:
            lines.append((p.get("client_id"), (
                f"a slice request for {p.get('num_devices')} device(s) has "
                f"waited {p.get('waited_ms', 0) / 1000:.1f} s "
                f"({p.get('left_ms', 0) / 1000:.1f} s left): waiting for "
                f"{p.get('waiting_for')}")))
    lines += [(e.get("client_id"), e["reason"]) for e in st.get("why", [])
              if e.get("waited_ms", 0) >= after * 1000]
    return [(cid, f"client {cid} ({names.get(cid, '?')}): {line}")
            for cid, line in lines]
