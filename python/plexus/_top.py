"""`plexus top`: the live page's view (web/web_server.h) in a terminal.

One frame per interval from two statuses `interval` apart: hosts with each
device's busy share over the interval and its memory, clients with their
admission queues and device time, slices, and the `plexus why` list. On a
terminal it redraws in place until interrupted; otherwise (a pipe, a file)
it prints `iterations` frames one after the other, 1 by default.
"""
import sys
import time

from ._status import cluster_status
from ._status_text import human, table, why_lines


def _busy(before, after, seconds):
    """{(worker_id, device index): busy %} over the interval between the
    statuses `before` and `after`."""
    old = {w["worker_id"]: w.get("stats", {}).get("device_busy_micros", [])
           for w in before.get("workers", [])}
    out = {}
    for w in after.get("workers", []):
        new = w.get("stats", {}).get("device_busy_micros", [])
        prev = old.get(w["worker_id"], [])
        for i, micros in enumerate(new):
            was = prev[i] if i < len(prev) else None
            if was is not None and micros >= was and seconds > 0:
                out[(w["worker_id"], i)] = 100 * (micros - was) / 1e6 / seconds
    return out


def frame(before, after, seconds):
    """The text of one frame: what changed from `before` to `after`, two
    statuses `seconds` apart."""
    busy = _busy(before, after, seconds)
    routed = (int(after.get("calls_routed", 0)) -
              int(before.get("calls_routed", 0))) / max(seconds, 1e-9)
    workers = after.get("workers", [])
    alive = sum(1 for w in workers if w.get("alive"))
    out = [f"plexus top - {after.get('address', '?')}  "
           f"{time.strftime('%H:%M:%S')}  hosts {alive} up / "
           f"{len(workers) - alive} down  calls {routed:.0f}/s  "
           f"slices {len(after.get('slices', []))}  "
           f"clients {len(after.get('clients', []))}"]
    rows = []
    for w in workers:
        s = w.get("stats", {})
        live = s.get("device_live_bytes", [])
        devices = []
        for d in w.get("devices", []):
            i = int(d.get("index", 0))
            b = busy.get((w["worker_id"], i))
            devices.append(
                f"{i}:{'-' if b is None else f'{b:3.0f}%'} "
                f"{human(live[i] if i < len(live) else 0)}")
        state = (("spare" if w.get("spare") else "up") if w.get("alive")
                 else "DOWN")
        rows.append([w["host_name"], w["worker_id"], state,
                     "  ".join(devices), s.get("calls_executed", 0),
                     s.get("calls_failed", 0), s.get("xla_compiles", 0)])
    out += ["", table(["HOST", "WORKER", "STATE", "DEVICES (BUSY, LIVE)",
                        "CALLS", "FAILED", "COMPILES"], rows)]
    clients = after.get("clients", [])
    if clients:
        rows = [[c["client_id"], c["name"], c.get("tenant", ""),
                 f"{float(c.get('weight', 1) or 1):g}", c.get("slices", 0),
                 c.get("calls_pending", 0), c.get("calls_in_flight", 0),
                 f"{int(c.get('device_micros', 0)) / 1e6:.2f} s",
                 human(c.get("live_bytes", 0))] for c in clients]
        out += ["", table(["CLIENT", "NAME", "TENANT", "WEIGHT", "SLICES",
                            "PENDING", "IN-FLIGHT", "DEVICE-TIME", "LIVE"],
                           rows)]
    slices = after.get("slices", [])
    if slices:
        rows = [[s["slice_id"], s["client_id"], len(s.get("devices", [])),
                 " ".join(sorted({d.get("host_name", "")
                                  for d in s.get("devices", [])})),
                 "BROKEN" if s.get("broken") else
                 "WAITING" if s.get("awaiting") else "ok"] for s in slices]
        out += ["", table(["SLICE", "CLIENT", "DEVICES", "HOSTS", "STATE"],
                           rows)]
    why = why_lines(after)
    out += ["", "why: " + (f"{len(why)} wait(s)" if why else
                           "nothing has waited longer than 1 s")]
    out += [f"  {line}" for _, line in why]
    return "\n".join(out)


def run(address, interval=1.0, iterations=None, out=sys.stdout):
    """Prints frames of the cluster at `address` every `interval` seconds:
    `iterations` of them (None: until interrupted on a terminal, 1
    otherwise)."""
    tty = out.isatty()
    if iterations is None:
        iterations = 0 if tty else 1
    n = 0
    before = cluster_status(address)
    t0 = time.monotonic()
    try:
        while iterations == 0 or n < iterations:
            time.sleep(interval)
            after = cluster_status(address)
            t1 = time.monotonic()
            text = frame(before, after, t1 - t0)
            if tty:
                out.write("\x1b[H\x1b[2J")  # home, clear
            out.write(text + "\n")
            if not tty:
                out.write("\n")
            out.flush()
            before, t0, n = after, t1, n + 1
    except KeyboardInterrupt:
        pass
    return 0
