"""A worker busy on its ops for seconds is not a lost worker.

With a server list ("PRIMARY,STANDBY") the worker's channel to the server
pings it every second and gives the connection up when a ping goes a
second unanswered (common/tls.cc); with TLS the server's ops ride that
channel's stream. Its ops are applied by a thread of their own, so an op
that waits (here, TEST ONLY, the first EXECUTE is applied 3 s late:
$PLEXUS_TEST_STALL_FIRST_EXECUTE_MS) leaves the stream's reader free to
keep the connection answered, and the call completes.
"""
import os

import numpy as np

import plexus
from plexus import _core
from plexus._binaries import bin_dir

from test_membership import _ready_line, _spawn
from tls_cert import self_signed

STALL_MS = 3000


def test_a_worker_whose_ops_wait_past_its_keepalive_keeps_its_session(
        tmp_path):
    cert, key = self_signed(tmp_path, "IP:127.0.0.1")
    env = dict(os.environ, PLEXUS_CLUSTER_SECRET=_core.new_cluster_secret())
    env.pop("PLEXUS_TLS_CA", None)
    server_log = tmp_path / "server.log"
    server, ready = _spawn(
        [str(bin_dir() / "plexus-server"), "--listen", "127.0.0.1:0",
         "--tls-cert", str(cert), "--tls-key", str(key),
         "--ready-fd", "{READY_FD}", "--log-level", "info",
         "--die-with-parent"], server_log, env)
    worker = None
    try:
        address = _ready_line(ready)
        worker_log = tmp_path / "worker.log"
        worker, ready = _spawn(
            [str(bin_dir() / "plexus-worker"),
             "--server", f"{address},{address}", "--tls-ca", str(cert),
             "--host-name", "busy", "--devices", "1",
             "--ready-fd", "{READY_FD}", "--log-level", "info",
             "--die-with-parent"], worker_log,
            dict(env, PLEXUS_TEST_STALL_FIRST_EXECUTE_MS=str(STALL_MS)))
        _ready_line(ready)
        c = plexus.connect(address, name="busy", tls_ca=str(cert))
        try:
            s = c.slice(1)
            x = s.put(np.arange(5, dtype=np.float32))
            y = s.program("scale", x, factor=2.0)(x)  # applied 3 s late
            np.testing.assert_array_equal(
                np.asarray(y), 2 * np.arange(5, dtype=np.float32))
            assert "applying an EXECUTE 3s late" in worker_log.read_text()
            # Still its first session: a second call on the same slice.
            z = s.program("scale", y, factor=3.0)(y)
            np.testing.assert_array_equal(
                np.asarray(z), 6 * np.arange(5, dtype=np.float32))
        finally:
            c.close()
        assert "lost its connection" not in server_log.read_text(), (
            server_log.read_text())
    finally:
        for p in (worker, server):
            if p is not None:
                p.terminate()
                p.wait(timeout=30)
