"""The timeline: every process's ring of events (src/plexus/timeline),
collected through the server and written as a Chrome trace-event file that
Perfetto (ui.perfetto.dev) and TensorBoard open.

    with client.trace("job.json"):
        ...                                  # calls, puts, fetches
    plexus trace --seconds 10 -o job.json    # the whole cluster

docs/observability.md ("The timeline") says what the trace shows.
"""
import json
import os
import sys
import time

from . import _core

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# PLEXUS_CALL_SITES=0: calls carry no source line (a frame walk and a dict
# lookup per call saved).
_CALL_SITES = os.environ.get("PLEXUS_CALL_SITES", "1") != "0"


def call_site(client, depth=2):
    """The id of where the caller's stack leaves this package: the first
    source line outside it and the line that called that one
    ("train.py:42 in step > layers.py:7 in dense": a helper that wraps
    calls does not hide who called it), registered once per pair with the
    client (0 when off or unknown)."""
    if not _CALL_SITES:
        return 0
    f = sys._getframe(depth)
    while f is not None and f.f_code.co_filename.startswith(_PACKAGE):
        f = f.f_back
    if f is None:
        return 0
    g = f.f_back
    # Code objects by identity (hashing one hashes its bytecode); the
    # entry keeps them alive, so an id is never reused for another. Keyed
    # by the instruction, not the line: f_lineno decodes the code's line
    # table on every read (9% of a tiny plexus.jit call's client CPU);
    # two instructions of one line register the same text, one id.
    key = (id(f.f_code), f.f_lasti, id(g.f_code) if g else 0,
           g.f_lasti if g else 0)
    sites = client._sites
    entry = sites.get(key)
    if entry is None:
        text = _line(f)
        if g is not None:
            text = _line(g) + " > " + text
        entry = sites[key] = (client._core.call_site(text), f.f_code,
                              g.f_code if g else None)
    return entry[0]


def _line(frame):
    code = frame.f_code
    return (f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in "
            f"{code.co_name}")


def server_now(address):
    """The server's timeline clock now (ns)."""
    return _core.trace_now(address)


def write(address, path, since_ns=0, timeout=10.0, secret=None, client=None):
    """Collects every ring's events that end at or after `since_ns` (the
    server's clock; 0: all they hold) and writes them to `path`: every
    client's with the operator's credential (`secret`, hex; None:
    $PLEXUS_CLUSTER_SECRET's), or with `client` (a core client) that
    client's own, and the client's own ring as one more process. Returns
    the trace's "plexus" summary: per process its
    clock offset and bound, events kept, recorded and dropped; flows;
    workers missing."""
    if client is not None:
        data = client.trace(since_ns, timeout)
    else:
        data = _core.trace(address, since_ns, timeout, secret)
    with open(path, "wb") as f:
        f.write(data)
    return json.loads(data)["plexus"]


def describe(summary, path):
    events = sum(p["events"] for p in summary["processes"])
    dropped = sum(p["dropped"] for p in summary["processes"])
    line = (f"wrote {path}: {events} events from "
            f"{len(summary['processes'])} processes, {summary['flows']} "
            f"transfer flows; open it in https://ui.perfetto.dev or "
            f"TensorBoard")
    if dropped:
        line += (f" ({dropped} older events were overwritten: the rings "
                 f"keep the last --timeline-events of each process)")
    for m in summary.get("missing", []):
        line += f"\n  missing: {m}"
    return line


def collect_for(address, seconds, path, last=False, timeout=10.0,
                secret=None):
    """`plexus trace`: the next `seconds` (or, with `last`, the past ones,
    from what the rings hold) written to `path`, with the operator's
    credential (`secret`). Forward, it says on stderr when it starts
    recording; an interrupt (Ctrl-C, SIGINT) ends the recording early and
    writes what it holds."""
    if last:
        since = server_now(address) - int(seconds * 1e9)
    else:
        since = server_now(address)
        print(f"plexus: recording the next {seconds:g} s (Ctrl-C ends it "
              "early)", file=sys.stderr, flush=True)
        try:
            time.sleep(seconds)
        except KeyboardInterrupt:
            pass
    return write(address, path, since, timeout, secret=secret)
