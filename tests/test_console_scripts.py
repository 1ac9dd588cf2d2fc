"""`plexus-server` and `plexus-worker` on PATH after `pip install .`: console
scripts ([project.scripts]) that exec the binaries (plexus/_binaries.py).

A real `pip install` of this tree into a fresh venv, without the C++ build
(scikit-build-core's wheel.cmake=false: the wheel holds the Python package
and the console scripts); the extension this test process runs is linked
into the installed package, and the binaries are the tree's (bin_dir(),
given as $PLEXUS_BIN_DIR) where a test says so. `make test-install` does
the full build instead. About 5 s."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import plexus
from plexus._binaries import bin_dir

from installed_cluster import CommandsCluster, run_a_program

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 30
BINARIES = ("plexus-server", "plexus-worker")


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """bin/ of a fresh venv where this tree is pip-installed."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                    "--without-pip", str(root)], check=True, timeout=TIMEOUT_S)
    python = root / "bin" / "python"
    env = _env()
    # The system's pip and scikit-build-core (--system-site-packages); no
    # index, no dependencies, no build isolation: nothing is downloaded.
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", "--no-cache-dir",
                    "--disable-pip-version-check", "-C", "wheel.cmake=false",
                    "-C", f"build-dir={root / 'skbuild'}", str(ROOT)],
                   check=True, timeout=120, env=env)
    installed = subprocess.run(
        [str(python), "-c", "import importlib.util as u; "
         "print(u.find_spec('plexus').submodule_search_locations[0])"],
        check=True, timeout=TIMEOUT_S, env=env, capture_output=True, text=True)
    package = Path(installed.stdout.strip())
    assert package.is_relative_to(root), package
    assert not (package / "bin").exists()  # CMake did not run
    for ext in Path(plexus.__file__).parent.glob("_core*.so"):
        (package / ext.name).symlink_to(ext)
    return root / "bin"


def _env(**extra):
    """This environment without the tree's package and binaries, plus
    `extra` (None: unset)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PLEXUS_BIN_DIR")}
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _run(args, env, timeout=TIMEOUT_S):
    return subprocess.run([str(a) for a in args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_commands_run_the_binaries(venv):
    env = _env(PLEXUS_BIN_DIR=str(bin_dir()))
    for name in BINARIES:
        launched = _run([venv / name, "--help"], env)
        direct = _run([bin_dir() / name, "--help"], env)
        assert launched.returncode == 0, launched.stderr
        assert launched.stdout.startswith(f"{name}: "), launched.stdout
        # The same text but the usage line, which names argv[0].
        assert launched.stdout.replace(str(venv / name), "NAME") == \
            direct.stdout.replace(str(bin_dir() / name), "NAME")
    # The binary's own exit code and message for a usage error.
    launched = _run([venv / "plexus-worker"], env)
    direct = _run([bin_dir() / "plexus-worker"], env)
    assert launched.returncode == direct.returncode != 0
    assert "--server is required" in launched.stderr


def test_a_cluster_from_the_commands_on_path(venv, tmp_path):
    env = _env(PLEXUS_BIN_DIR=str(bin_dir()))
    with CommandsCluster(venv, tmp_path, env) as cluster:
        # No Python process in between: each process is the binary itself.
        for name in BINARIES:
            assert Path(cluster.exe[name]) == (bin_dir() / name).resolve()
        np.testing.assert_array_equal(run_a_program(cluster.address),
                                      2 * np.arange(4))
    # SIGTERM reached the binaries, whose exit codes the launchers did not
    # replace (CommandsCluster raises unless both are 0).
    assert cluster.exit_codes == {"plexus-worker": 0, "plexus-server": 0}


def test_a_command_skips_itself_on_path(venv):
    # No $PLEXUS_BIN_DIR and no binaries in the package: $PATH holds the
    # launchers first, then the binaries.
    env = _env(PATH=f"{venv}{os.pathsep}{bin_dir()}")
    for name in BINARIES:
        assert shutil.which(name, path=env["PATH"]) == str(venv / name)
        r = _run([name, "--help"], env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"{name}: "), r.stdout


def test_without_binaries_a_command_says_where_it_looked(venv):
    # Only the launchers anywhere, even as $PLEXUS_BIN_DIR: exit 127 at
    # once, naming each place (an exec loop would run out the timeout).
    env = _env(PATH=str(venv), PLEXUS_BIN_DIR=str(venv))
    for name in BINARIES:
        r = _run([venv / name, "--help"], env, timeout=10)
        assert r.returncode == 127, (r.returncode, r.stdout, r.stderr)
        assert r.stdout == ""
        assert r.stderr.startswith(f"{name}: no plexus-server and plexus-worker "
                                   "binaries found: looked in "), r.stderr
        assert f"{venv} ($PLEXUS_BIN_DIR)" in r.stderr
        assert "plexus/bin (the package's bin/)" in r.stderr
        assert f"$PATH ({venv})" in r.stderr
