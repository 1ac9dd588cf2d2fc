"""A cluster started the way an operator starts one after `pip install .`:
`plexus-server` and `plexus-worker` by name from PATH (the console scripts,
which exec the binaries), on loopback; a client connects and runs a
program; SIGTERM stops the worker, then the server, and each must exit 0.

    python tests/installed_cluster.py FOLDER    # FOLDER: the venv's bin/

The client is this process's `plexus` (under `make test-install`, the
venv's). tests/test_console_scripts.py uses CommandsCluster directly.
Every wait has a deadline."""
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import plexus

TIMEOUT_S = 60


class CommandsCluster:
    """A server and one worker started from the commands in `folder` (put
    first on PATH); a context manager. Inside it, `address` is the
    server's, `server` and `worker` the processes (Popen), `exe` the file
    each process runs (/proc/PID/exe: the binary, once the launcher has
    exec'd it). Leaving it stops both with SIGTERM and raises unless both
    exit 0 (`exit_codes`); leaving with an error kills them."""

    def __init__(self, folder, log_dir, env=None):
        self.folder = Path(folder).absolute()
        self.log_dir = Path(log_dir)
        self.env = dict(os.environ if env is None else env)
        self.env["PATH"] = f"{self.folder}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["PLEXUS_CLUSTER_SECRET"] = secrets.token_hex(32)
        self.server = self.worker = None
        self.exe = {}
        self.exit_codes = {}

    def _spawn(self, name, args):
        found = shutil.which(name, path=self.env["PATH"])
        if found != str(self.folder / name):
            raise RuntimeError(f"{name} on PATH is {found}, not {self.folder / name}")
        read_end, write_end = os.pipe()
        log = open(self.log_dir / f"{name}.log", "ab")
        try:
            proc = subprocess.Popen(
                [name, *args, "--ready-fd", str(write_end), "--log-level", "info",
                 "--die-with-parent"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                pass_fds=(write_end,), env=self.env)
        finally:
            os.close(write_end)
            log.close()
        try:
            ready, _, _ = select.select([read_end], [], [], TIMEOUT_S)
            line = os.read(read_end, 256).decode().strip() if ready else ""
        finally:
            os.close(read_end)
        if not line:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{name} was not ready within {TIMEOUT_S} s "
                               f"(exit code {proc.returncode}): {self._log(name)}")
        self.exe[name] = os.readlink(f"/proc/{proc.pid}/exe")
        return proc, line

    def _log(self, name):
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def __enter__(self):
        try:
            self.server, self.address = self._spawn(
                "plexus-server", ["--listen", "127.0.0.1:0"])
            self.worker, _ = self._spawn(
                "plexus-worker", ["--server", self.address, "--devices", "1",
                                  "--data-host", "127.0.0.1"])
        except BaseException:
            self._kill()
            raise
        return self

    def _kill(self):
        for proc in (self.worker, self.server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()

    def __exit__(self, kind, value, traceback):
        if kind is not None:
            self._kill()
            return False
        for name, proc in (("plexus-worker", self.worker), ("plexus-server", self.server)):
            proc.send_signal(signal.SIGTERM)
            try:
                self.exit_codes[name] = proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._kill()
                raise RuntimeError(f"{name} did not exit within {TIMEOUT_S} s of "
                                   f"SIGTERM: {self._log(name)}")
        for name, code in self.exit_codes.items():
            if code != 0:
                raise RuntimeError(f"{name} exited with {code} after SIGTERM: "
                                   f"{self._log(name)}")
        return False


def run_a_program(address):
    """Connects to `address`, doubles a value on one device, returns it."""
    client = plexus.connect(address, name="installed commands")
    try:
        s = client.slice(1)
        x = s.put(np.arange(4, dtype=np.float32))
        double = s.program("scale", x, factor=2.0)
        return np.asarray(double(x))
    finally:
        client.close()


def main(folder):
    with tempfile.TemporaryDirectory(prefix="plexus-installed-") as logs:
        with CommandsCluster(folder, logs) as cluster:
            y = run_a_program(cluster.address)
            np.testing.assert_array_equal(y, 2 * np.arange(4))
            print(f"plexus-server ({cluster.exe['plexus-server']}) at "
                  f"{cluster.address}, plexus-worker "
                  f"({cluster.exe['plexus-worker']}): scale gave {y}")
        print("SIGTERM: both exited 0")


if __name__ == "__main__":
    main(sys.argv[1])
