"""Isolation between the parties of one cluster, against real processes:
only the operator shuts the server down, only a process holding the
cluster secret joins as a worker, and the secret shows up nowhere it could
leak (status, logs, command lines)."""
import json
import os
import select
import stat
import subprocess
import sys

import numpy as np
import pytest

import plexus
from plexus import _core
from plexus._binaries import bin_dir

from conftest import PLEXUS_PYTHONPATH


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
