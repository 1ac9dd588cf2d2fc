"""Progress of long waits in the client's console.

A blocking wait of this process (a fetch, `plexus.wait`, a slice request)
that lasts longer than a second shows one line on stderr, redrawn twice a
second, saying what the server says it waits for: the slice request's
`waiting_for`, the root of this client's longest wait (`plexus why`: a call
running, queued behind another, or waiting for its program's compile on a
host), a recovery under way ("host3 lost; remapped onto host5; recomputing
12 calls"). A put or fetch of at least TRANSFER_LINE_BYTES shows its bytes
instead, from the client's own counters as they move ("put
float32[32768, 32768] 1.2 of 4.0 GiB, 850 MB/s"; a fetch whose value is
not ready yet shows the wait's line until its bytes start to come). The
line is erased when the wait ends.

Only where stderr is a terminal (never in a pipe, a file or a notebook's
captured stream); $PLEXUS_PROGRESS=0 turns it off. One daemon thread per
process draws every line and sleeps while nothing waits; entering and
leaving a wait costs a lock and a dict operation, and nothing at all where
progress is off.
"""
import os
import sys
import threading
import time

from . import _core
from ._status import cluster_status

AFTER_S = 1.0    # a wait shows after this long
EVERY_S = 0.5    # and is redrawn this often
# Puts and fetches at least this large count their bytes as they move
# (a TransferProgress: two atomics the client's data plane adds to).
TRANSFER_LINE_BYTES = 64 << 20
# A recovery is a wait's line for this long after the client heard of it;
# then the wait's root (`plexus why`) says more.
RECOVERY_LINE_S = 10.0

_enabled = None


def enabled():
    global _enabled
    if _enabled is None:
        try:
            tty = sys.stderr.isatty()
        except (AttributeError, ValueError):
            tty = False
        _enabled = tty and os.environ.get("PLEXUS_PROGRESS", "1") != "0"
    return _enabled


class _Board:
    """The waits under way, and the thread that draws the oldest."""

    def __init__(self):
        self.cond = threading.Condition()
        self.waits = {}     # token -> (start, client, describe)
        self.drawn = False  # a line is on the terminal
        self.next = 0
        self.thread = None

    def enter(self, client, describe):
        with self.cond:
            self.next += 1
            self.waits[self.next] = (time.monotonic(), client, describe)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="plexus-progress", daemon=True)
                self.thread.start()
            self.cond.notify()
            return self.next

    def leave(self, token):
        with self.cond:
            self.waits.pop(token, None)
            if self.drawn and not self.waits:
                _write("\r\x1b[K")
                self.drawn = False

    def _run(self):
        with self.cond:
            while True:
                while not self.waits:
                    self.cond.wait()
                token, (start, client, describe) = min(
                    self.waits.items(), key=lambda kv: kv[1][0])
                due = start + AFTER_S - time.monotonic()
                if due > 0:
                    self.cond.wait(due)
                    continue
                self.cond.release()
                try:
                    line = describe(client, time.monotonic() - start)
                except Exception:  # noqa: BLE001 - progress is best effort
                    line = None
                finally:
                    self.cond.acquire()
                if line and token in self.waits:
                    width = _columns()
                    _write("\r\x1b[K" + (line[:width - 1] if width else line))
                    self.drawn = True
                    self.cond.notify_all()  # for who waits to see it drawn
                self.cond.wait(EVERY_S)


def _columns():
    """The terminal's width; None where it does not say (0 columns: a
    bare pseudo-terminal), where the line is not cut."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns or None
    except (OSError, ValueError, AttributeError):
        return 100


def _write(text):
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


_board = _Board()


class waiting:
    """`with waiting(client, describe):` around a blocking wait of
    `client`: after a second, `describe(client, seconds)` gives the line to
    show (None: none), redrawn twice a second."""
    __slots__ = ("token",)

    def __init__(self, client, describe):
        self.token = (_board.enter(client, describe)
                      if enabled() and client is not None else None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.token is not None:
            _board.leave(self.token)
        return False


# ---------------------------------------------------------------- lines

def _status(client):
    return cluster_status(client._address)


def _recovery(st, client):
    """What a recovery that touches this client is doing, or None: a slice
    waiting for a host to take a lost one's place, or the recovery the
    client heard of in the last RECOVERY_LINE_S, in words ("host3 lost;
    remapped onto host5; recomputing 12 calls")."""
    mine = [s for s in st.get("slices", [])
            if s.get("client_id") == client.id and s.get("awaiting")]
    if mine:
        s = mine[0]
        return (f"a host of slice {s['slice_id']} lost ({s['awaiting']}); "
                f"waiting for another to take its place, "
                f"{int(s.get('awaiting_left_ms', 0)) / 1000:.0f} s left")
    r = client._core.last_recovery()
    if r is None or r["seconds_ago"] > RECOVERY_LINE_S:
        return None
    parts = [f"{r['lost_host']} lost"]
    if r["remapped_onto"]:
        parts.append("remapped onto " + ", ".join(r["remapped_onto"]))
    if r["slices_broken"]:
        parts.append(f"{r['slices_broken']} slice(s) broken, no host took "
                     f"its place")
    if r["calls_recomputed"]:
        parts.append(f"recomputing {r['calls_recomputed']} call"
                     f"{'' if r['calls_recomputed'] == 1 else 's'}")
    if r["values_lost"]:
        parts.append(f"{r['values_lost']} value(s) lost")
    return "; ".join(parts)


def describe_wait(client, seconds):
    """A fetch or wait: a recovery under way, else the root of this
    client's longest wait (the root call and its cause, `plexus why`)."""
    if client._address is None:
        return None
    st = _status(client)
    head = f"plexus: waiting {seconds:.0f} s"
    rec = _recovery(st, client)
    if rec:
        return f"{head}: {rec}"
    why = [e for e in st.get("why", []) if e.get("client_id") == client.id]
    if why:
        return f"{head}: {why[0].get('root_reason') or why[0]['reason']}"
    r = st.get("recovery", {})
    if int(r.get("snapshots_incomplete", 0)) or \
            int(r.get("snapshot_recopies_pending", 0)):
        return f"{head}: the server is copying snapshots after a loss"
    return f"{head} (nothing at the server has waited longer than 1 s)"


def describe_slice(client, seconds):
    """A slice request: what the server says it lacks."""
    if client._address is None:
        return None
    st = _status(client)
    for p in st.get("pending_slices", []):
        if p.get("client_id") == client.id:
            return (f"plexus: waiting {seconds:.0f} s for a slice of "
                    f"{p.get('num_devices')} device(s): "
                    f"{p.get('waiting_for')} "
                    f"({int(p.get('left_ms', 0)) / 1000:.0f} s left)")
    return None


def transfer_progress(nbytes):
    """The counters for a put or fetch of `nbytes` bytes that shows its
    bytes as they move, or None: smaller, or progress off (the transfer
    then counts nothing)."""
    if nbytes < TRANSFER_LINE_BYTES or not enabled():
        return None
    return _core.TransferProgress()


def _in_units(n, unit):
    return f"{n / unit:.1f}"


def describe_transfer(kind, what, progress):
    """A put or fetch (`kind`) of `what`: bytes done of total and the rate
    since the line was last drawn ("put float32[32768, 32768] 1.2 of 4.0
    GiB, 850 MB/s"). A fetch that has received nothing waits for its value
    to be made: the wait's line says why."""
    last = [0.0, 0]  # when the line was last drawn, and the bytes done then

    def describe(client, seconds):
        done, total = progress.done_bytes, progress.total_bytes
        if done == 0 and kind == "fetch":
            return describe_wait(client, seconds)
        then, done_then = last
        rate = (done - done_then) / (seconds - then) if seconds > then else 0
        last[:] = [seconds, done]
        unit, name = (1 << 30, "GiB") if total >= 1 << 30 else (1 << 20, "MiB")
        return (f"plexus: {kind} {what} {_in_units(done, unit)} of "
                f"{_in_units(total, unit)} {name}, {rate / 1e6:.0f} MB/s")
    return describe
