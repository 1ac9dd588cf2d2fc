"""Progress of long waits in the client's console.

A blocking wait of this process (a fetch, `plexus.wait`, a slice request)
that lasts longer than a second shows one line on stderr, redrawn twice a
second, saying what the server says it waits for: the slice request's
`waiting_for`, the root of this client's longest wait (`plexus why`),
a recovery under way ("host host0 lost: ...; 1 slice remapped, 3 calls
recomputed"). The line is erased when the wait ends.

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

AFTER_S = 1.0    # a wait shows after this long
EVERY_S = 0.5    # and is redrawn this often

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
                    width = _columns() - 1
                    _write("\r\x1b[K" + line[:width])
                    self.drawn = True
                self.cond.wait(EVERY_S)


def _columns():
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
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
    from . import _core
    from ._api import _decode_status
    return _decode_status(_core.cluster_status(client._address))


def _recovery(st, client):
    """What a recovery that touches this client is doing, or None."""
    mine = [s for s in st.get("slices", [])
            if s.get("client_id") == client.id and s.get("awaiting")]
    if mine:
        s = mine[0]
        return (f"slice {s['slice_id']} lost a host and waits for another "
                f"({s['awaiting']}; "
                f"{int(s.get('awaiting_left_ms', 0)) / 1000:.0f} s left)")
    return None


def describe_wait(client, seconds):
    """A fetch or wait: the root of this client's longest wait."""
    if client._address is None:
        return None
    st = _status(client)
    head = f"plexus: waiting {seconds:.0f} s"
    rec = _recovery(st, client)
    if rec:
        return f"{head}: {rec}"
    why = [e for e in st.get("why", []) if e.get("client_id") == client.id]
    if why:
        return f"{head}: {why[0]['reason']}"
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
