"""Isolation between the parties of one cluster, against real processes:
only the operator shuts the server down, only a process holding the
cluster secret joins as a worker, a client session opens only as a tenant
it proves, a client's buffers open to its own session only on either
carrier of the data plane, and the secret and credentials show up nowhere
they could leak (status, logs, command lines)."""
import json
import os
import re
import select
import socket
import stat
import subprocess
import sys

import numpy as np
import pytest

import plexus
from plexus import _core
from plexus._binaries import bin_dir

import dataplane
from conftest import PLEXUS_PYTHONPATH
from tls_cert import self_signed


def environment(secret=None):
    """This process's environment with `secret` as the cluster secret (or
    none at all)."""
    env = dict(os.environ)
    env.pop("PLEXUS_CLUSTER_SECRET", None)
    if secret is not None:
        env["PLEXUS_CLUSTER_SECRET"] = secret
    return env


def spawn(args, log, env):
    """A plexus binary with --ready-fd: (process, read end of the pipe)."""
    read_end, write_end = os.pipe()
    args = [a.replace("{READY_FD}", str(write_end)) for a in args]
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=out, pass_fds=(write_end,), env=env)
    os.close(write_end)
    return proc, read_end


def ready_line(read_end, timeout=30):
    """The line a process writes on its --ready-fd once ready; "" when it
    exits first."""
    ready, _, _ = select.select([read_end], [], [], timeout)
    line = os.read(read_end, 256).decode().strip() if ready else None
    os.close(read_end)
    assert line is not None, f"no ready line within {timeout} s"
    return line


def worker_args(address, host_name, *extra):
    return [str(bin_dir() / "plexus-worker"), "--server", address,
            "--host-name", host_name, "--ready-fd", "{READY_FD}",
            "--log-level", "info", "--die-with-parent", *extra]


def roundtrip(cluster):
    """A client puts a value and reads it back: the cluster serves."""
    client = cluster.connect(name="probe")
    try:
        s = client.slice(1)
        x = np.arange(8, dtype=np.float32)
        np.testing.assert_array_equal(np.asarray(s.put(x)), x)
    finally:
        client.close()


def assert_hidden(secret, *texts, where=""):
    for text in texts:
        assert secret not in text, f"the cluster secret appears in {where}"
        assert secret.upper() not in text, f"the cluster secret appears in {where}"


def test_shutdown_needs_the_admin_credential(tmp_path, monkeypatch):
    log = tmp_path / "cluster.log"
    with plexus.local(hosts=2, log_level="info", log_file=str(log)) as cluster:
        other = _core.new_cluster_secret()
        with pytest.raises(plexus.PermissionDeniedError,
                           match="refused to shut down"):
            _core.shutdown_server(cluster.address, other)
        # Without a secret of its own, the binding reads the environment's.
        monkeypatch.delenv("PLEXUS_CLUSTER_SECRET", raising=False)
        with pytest.raises(plexus.NotFoundError, match="no cluster secret"):
            _core.shutdown_server(cluster.address)
        roundtrip(cluster)  # still serving, both workers up
        assert all(w["alive"] for w in cluster.status()["workers"])
        # down() asks with the right credential: a clean, prompt exit (a
        # refused request would leave the server running, and down() would
        # report it killed).
    text = log.read_text(errors="replace")
    assert "refused a shutdown request" in text
    assert "shutdown requested" in text


def test_a_worker_without_the_cluster_secret_is_refused(tmp_path):
    log = tmp_path / "cluster.log"
    with plexus.local(hosts=1, log_level="info", log_file=str(log)) as cluster:
        secret = cluster._secret
        intruders = {
            "another-secret": environment(_core.new_cluster_secret()),
            "no-secret": environment(None),
        }
        for name, env in intruders.items():
            wlog = tmp_path / f"{name}.log"
            proc, ready = spawn(worker_args(cluster.address, name), wlog, env)
            assert ready_line(ready) == "", f"worker {name} came up"
            code = proc.wait(timeout=30)
            assert code != 0, f"worker {name} exited with 0"
            text = wlog.read_text(errors="replace")
            assert_hidden(secret, text, where=f"the log of worker {name}")
        hosts = [w["host_name"] for w in cluster.status()["workers"]]
        assert hosts == ["host0"], hosts
        assert "refused a worker registration from host another-secret" in (
            log.read_text(errors="replace"))

        # The same worker with the cluster's secret joins.
        proc, ready = spawn(worker_args(cluster.address, "friend"),
                            tmp_path / "friend.log", environment(secret))
        try:
            assert ready_line(ready) != ""
            st = cluster.wait_until(
                lambda st: any(w["host_name"] == "friend" and w["alive"]
                               for w in st["workers"]),
                what="worker friend to register")
            assert len(st["workers"]) == 2
            # The secret is in the worker's environment, never its command
            # line (which every user can read).
            cmdline = open(f"/proc/{proc.pid}/cmdline", "rb").read()
            assert secret.encode() not in cmdline
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        pids = [w["pid"] for w in cluster.status()["workers"]
                if w["host_name"] == "host0"]
        for pid in pids + [cluster.process.pid]:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
            assert secret.encode() not in cmdline
        roundtrip(cluster)
    assert_hidden(secret, log.read_text(errors="replace"),
                  where="the cluster's log")


def test_server_without_a_secret_refuses_to_start(tmp_path):
    server = str(bin_dir() / "plexus-server")
    r = subprocess.run([server, "--listen", "127.0.0.1:0"],
                       env=environment(None), capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1
    assert "no cluster secret" in r.stdout + r.stderr
    r = subprocess.run([server, "--listen", "127.0.0.1:0"],
                       env=environment("not hex"), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 1
    assert "PLEXUS_CLUSTER_SECRET" in r.stdout + r.stderr


def test_server_writes_a_new_secret_file_for_its_workers(tmp_path):
    secret_file = tmp_path / "cluster.secret"
    proc, ready = spawn(
        [str(bin_dir() / "plexus-server"), "--listen", "127.0.0.1:0",
         "--secret-file", str(secret_file), "--ready-fd", "{READY_FD}",
         "--die-with-parent"], tmp_path / "server.log", environment(None))
    worker = None
    try:
        address = ready_line(ready)
        assert address, (tmp_path / "server.log").read_text()
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
        secret = secret_file.read_text().strip()
        assert len(secret) == 64 and int(secret, 16) >= 0
        # A worker started separately reads the same file.
        worker, wready = spawn(
            worker_args(address, "standalone", "--secret-file",
                        str(secret_file)),
            tmp_path / "worker.log", environment(None))
        assert ready_line(wready), (tmp_path / "worker.log").read_text()
        st = json.loads(_core.cluster_status(address))
        assert [w["host_name"] for w in st["workers"]] == ["standalone"]
        _core.shutdown_server(address, secret)
        assert proc.wait(timeout=30) == 0
        assert worker.wait(timeout=30) == 0
        for log in ("server.log", "worker.log"):
            assert_hidden(secret, (tmp_path / log).read_text(errors="replace"),
                          where=log)
    finally:
        for p in (worker, proc):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_cli_keeps_the_secret_to_its_state_file(tmp_path):
    env = dict(environment(None), PLEXUS_STATE_DIR=str(tmp_path),
               PYTHONPATH=PLEXUS_PYTHONPATH)

    def run(*args):
        return subprocess.run([sys.executable, "-m", "plexus", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    up = run("up", "--hosts", "2")
    assert up.returncode == 0, up.stderr
    state_file = tmp_path / "cluster.json"
    try:
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        secret = json.loads(state_file.read_text())["secret"]
        assert len(secret) == 64
        # A client works as before, with no secret of its own.
        c = plexus.connect(json.loads(state_file.read_text())["address"])
        try:
            s = c.slice(2)
            x = np.ones(4, dtype=np.float32)
            np.testing.assert_array_equal(np.asarray(s.put(x)), x)
            for args in (("status",), ("status", "--json")):
                st = run(*args)
                assert st.returncode == 0, st.stderr
                assert_hidden(secret, st.stdout, st.stderr,
                              where=f"`plexus {' '.join(args)}`")
        finally:
            c.close()
    finally:
        down = run("down")
    assert down.returncode == 0, down.stderr
    # By the admin credential, not by the fallback to signals.
    assert "shutdown request failed" not in down.stderr, down.stderr
    assert not state_file.exists()
    assert_hidden(secret, (tmp_path / "cluster.log").read_text(errors="replace"),
                  where="the cluster's log")


def hidden_credentials(secret, client_ids=(), tenants=("default",)):
    """Every credential of this cluster a log could leak, as hex: the
    secret, the worker and admin credentials, each client's, each tenant's
    token."""
    creds = [dataplane.credential(secret, "worker"),
             dataplane.credential(secret, "admin")]
    creds += [dataplane.credential(secret, "client", c) for c in client_ids]
    creds += [dataplane.credential(secret, "tenant", t) for t in tenants]
    return [secret] + [c.hex() for c in creds]


def assert_no_credentials(texts, secret, **kwargs):
    for where, text in texts.items():
        lowered = text.lower()
        for h in hidden_credentials(secret, **kwargs):
            assert h not in lowered, f"a credential appears in {where}"


def data_plane_socket(worker, log_text, unix):
    """A raw connection to `worker`'s data plane: its abstract unix socket
    (named in its log line "data plane listening on ... and unix @NAME"),
    or TCP."""
    if not unix:
        return dataplane.connect(worker["data_address"])
    names = re.findall(
        r"data plane listening on " + re.escape(worker["data_address"]) +
        r" and unix @(\S+)", log_text)
    assert names, "the worker's log names no unix socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    sock.connect("\0" + names[-1])
    return sock


@pytest.mark.parametrize("shared_memory", [True, False],
                         ids=["unix-shm", "tcp"])
def test_client_b_knowing_as_ids_gets_nothing_on_either_carrier(
        tmp_path, shared_memory):
    log = tmp_path / "cluster.log"
    with plexus.local(hosts=2, shared_memory=shared_memory, log_level="info",
                      log_file=str(log)) as cluster:
        secret = cluster._secret
        a = cluster.connect(name="a", shared_memory=shared_memory)
        b = cluster.connect(name="b", shared_memory=shared_memory)
        s = a.slice(2, placement="spread")
        want = np.arange(64, dtype=np.float32)
        x = s.put(want, plexus.P("devices"))
        x.block_until_ready()
        text = log.read_text(errors="replace")
        for worker in cluster.status()["workers"]:
            # B proves its own session (its credential, as its client
            # holds it) on the carrier its client uses.
            sock = data_plane_socket(worker, text, unix=shared_memory)
            with sock:
                refused = dataplane.handshake(
                    sock, "client", b.id,
                    dataplane.credential(secret, "client", b.id))
                assert refused is None, refused
                for shard in (0, 1):
                    for request in (dataplane.FETCH, dataplane.WAIT):
                        sock.sendall(dataplane.frame(request, x._f.buffer_id,
                                                     shard))
                        kind, message = dataplane.read_reply(sock)
                        assert kind == dataplane.ERROR, kind
                        assert f"belongs to client {a.id}" in message, message
                    sock.sendall(dataplane.frame(dataplane.PUT,
                                                 x._f.buffer_id, shard,
                                                 b"\0" * 128))
                    kind, message = dataplane.read_reply(sock)
                    assert kind == dataplane.ERROR
                    assert f"belongs to client {a.id}" in message, message
                    # A push error (a worker's request) is dropped, logged.
                    sock.sendall(dataplane.frame(dataplane.PUSH_ERROR,
                                                 x._f.buffer_id, shard,
                                                 b"poisoned"))
            # No handshake, or a proof for A's session without A's
            # credential: the connection is refused before any request.
            with data_plane_socket(worker, text, unix=shared_memory) as sock:
                sock.sendall(dataplane.frame(dataplane.FETCH, x._f.buffer_id))
                assert dataplane.read_reply(sock)[0] == dataplane.CHALLENGE
                kind, message = dataplane.read_reply(sock)
                assert kind == dataplane.ERROR and "expected HELLO" in message
            with data_plane_socket(worker, text, unix=shared_memory) as sock:
                refused = dataplane.handshake(
                    sock, "client", a.id,
                    dataplane.credential(secret, "client", b.id))
                assert refused and "proof does not match" in refused, refused
        # A's value is intact, through A's own client on its carrier.
        np.testing.assert_array_equal(np.asarray(x), want)
        client_ids = [a.id, b.id]
    text = log.read_text(errors="replace")
    assert "refused: PERMISSION_DENIED" in text
    assert_no_credentials({"the cluster's log": text}, secret,
                          client_ids=client_ids)


def test_a_session_must_prove_its_tenant(tmp_path, monkeypatch):
    secret = _core.new_cluster_secret()
    log = tmp_path / "server.log"
    proc, ready = spawn(
        [str(bin_dir() / "plexus-server"), "--listen", "127.0.0.1:0",
         "--local-workers", "1", "--require-tenant", "--ready-fd",
         "{READY_FD}", "--log-level", "info", "--die-with-parent"],
        log, environment(secret))
    for name in ("PLEXUS_CLUSTER_SECRET", "PLEXUS_TENANT",
                 "PLEXUS_TENANT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    env = dict(environment(None), PYTHONPATH=PLEXUS_PYTHONPATH,
               PLEXUS_STATE_DIR=str(tmp_path))
    try:
        address = ready_line(ready)
        assert address, log.read_text()
        # The operator's token, printed from the secret file.
        secret_file = tmp_path / "secret"
        secret_file.write_text(secret + "\n")
        r = subprocess.run([sys.executable, "-m", "plexus", "token",
                            "--tenant", "research", "--secret-file",
                            str(secret_file)], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        token = r.stdout.strip()
        assert token == _core.tenant_token("research", secret)
        assert len(token) == 32

        with pytest.raises(plexus.PermissionDeniedError,
                           match="PLEXUS_TENANT_TOKEN"):
            plexus.connect(address, name="anonymous")
        with pytest.raises(plexus.PermissionDeniedError,
                           match="does not match tenant 'ops'"):
            plexus.connect(address, tenant="ops", token=token)
        other = _core.tenant_token("research", _core.new_cluster_secret())
        with pytest.raises(plexus.PermissionDeniedError,
                           match="does not match tenant 'research'"):
            plexus.connect(address, tenant="research", token=other)
        with pytest.raises(plexus.InvalidArgumentError, match="32 hex digits"):
            plexus.connect(address, tenant="research", token="not-a-token")

        # From the environment, as a tenant's user gets it.
        monkeypatch.setenv("PLEXUS_TENANT", "research")
        monkeypatch.setenv("PLEXUS_TENANT_TOKEN", token)
        c = plexus.connect(address, name="user")
        try:
            s = c.slice(1)
            np.testing.assert_array_equal(np.asarray(s.put(np.arange(4.0))),
                                          np.arange(4.0))
            st = subprocess.run([sys.executable, "-m", "plexus", "status",
                                 "--address", address], env=env,
                                capture_output=True, text=True, timeout=60)
            assert st.returncode == 0, st.stderr
            row = [ln for ln in st.stdout.splitlines() if " user " in ln]
            assert row and "research" in row[0], st.stdout
            assert token not in st.stdout
            client_id = c.id
        finally:
            c.close()
        # A process that holds the secret derives the token itself: for
        # $PLEXUS_TENANT, else "default".
        monkeypatch.delenv("PLEXUS_TENANT_TOKEN")
        monkeypatch.setenv("PLEXUS_CLUSTER_SECRET", secret)
        for tenant in ("research", None):
            if tenant is None:
                monkeypatch.delenv("PLEXUS_TENANT")
            with plexus.connect(address, name="holder") as c:
                (row,) = [cl for cl in plexus.status(address)["clients"]
                          if cl["name"] == "holder"]
                assert row["tenant"] == (tenant or "default"), row
        _core.shutdown_server(address, secret)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    assert "refused client 'anonymous'" in text
    assert_no_credentials({"the server's log": text}, secret,
                          client_ids=[client_id], tenants=("research", "ops"))


def test_tls_on_loopback_with_local_workers(tmp_path, monkeypatch):
    # A self-signed certificate for 127.0.0.1 (its own CA).
    cert, key = self_signed(tmp_path, "IP:127.0.0.1")
    secret = _core.new_cluster_secret()
    monkeypatch.delenv("PLEXUS_TLS_CA", raising=False)
    log = tmp_path / "server.log"
    # Its local workers dial it over TLS, trusting its certificate.
    proc, ready = spawn(
        [str(bin_dir() / "plexus-server"), "--listen", "127.0.0.1:0",
         "--local-workers", "1", "--tls-cert", str(cert), "--tls-key",
         str(key), "--ready-fd", "{READY_FD}", "--log-level", "info",
         "--die-with-parent"], log, environment(secret))
    try:
        address = ready_line(ready)
        assert address, log.read_text()
        with pytest.raises(plexus.UnavailableError, match="no Plexus server"):
            plexus.status(address)  # plain text gets no answer
        env = dict(environment(None), PYTHONPATH=PLEXUS_PYTHONPATH)
        st = subprocess.run([sys.executable, "-m", "plexus", "status",
                             "--address", address, "--tls-ca", str(cert)],
                            env=env, capture_output=True, text=True,
                            timeout=60)
        assert st.returncode == 0, st.stderr
        assert "host" in st.stdout, st.stdout
        c = plexus.connect(address, name="tls", tls_ca=str(cert))
        try:
            s = c.slice(1)
            np.testing.assert_array_equal(np.asarray(s.put(np.arange(5.0))),
                                          np.arange(5.0))
            # A call's ops reach the worker on its encrypted stream: the
            # data plane, which does not encrypt, does not carry them.
            x = s.put(np.arange(5, dtype=np.float32))
            y = s.program("scale", x, factor=2.0)(x)
            np.testing.assert_array_equal(
                np.asarray(y), 2 * np.arange(5, dtype=np.float32))
            # Nor the client's ops to the server: no ops listener under TLS.
            counters = c.counters()
            assert counters["messages_sent"] >= 1, counters
            assert counters["messages_sent_as_frames"] == 0, counters
        finally:
            c.close()
        # A worker that trusts another CA is refused by the handshake, and
        # says so: not only "cannot reach the server".
        other, _ = self_signed(tmp_path, "IP:127.0.0.1", stem="other",
                               common_name="another")
        wrong = subprocess.run(
            [str(bin_dir() / "plexus-worker"), "--server", address,
             "--host-name", "wrong-ca", "--reconnect-timeout-s", "1"],
            env=dict(environment(secret), PLEXUS_TLS_CA=str(other)),
            capture_output=True, text=True, timeout=60)
        assert wrong.returncode == 1, wrong.stderr  # cannot start
        assert re.search(r"cannot reach the server at 127\.0\.0\.1:\d+: .*"
                         r"(?i:ssl|handshake|certificate)", wrong.stderr), \
            wrong.stderr
        monkeypatch.setenv("PLEXUS_TLS_CA", str(cert))
        _core.shutdown_server(address, secret)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "(TLS;" in text
    assert "ops now on its data plane" not in text
    assert "the server's ops now come on the data plane" not in text
