"""XLA programs on an NVIDIA GPU through the CUDA PJRT plugin: the worker
loads jax-cuda13-pjrt's plugin, compiles plexus.jit programs for "cuda" and
runs them on the GPU. Skipped, with the reason, where there is no GPU or no
plugin (tests/gpu/run.sh installs it)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("PLEXUS_BIN_DIR", str(ROOT / "build" / "bin"))

import plexus  # noqa: E402
from plexus._binaries import cuda_pjrt_plugin, nvidia_library_dirs  # noqa: E402


def _gpu_reason():
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi: no NVIDIA GPU on this machine"
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if r.returncode != 0 or "GPU" not in r.stdout:
        return f"nvidia-smi lists no GPU ({r.stderr.strip() or r.stdout.strip()})"
    if cuda_pjrt_plugin() is None:
        return "the CUDA PJRT plugin (jax-cuda13-pjrt) is not installed: run tests/gpu/run.sh"
    return None


REASON = _gpu_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def use_nvidia_libraries():
    """The nvidia-* wheels' library folders on LD_LIBRARY_PATH, for the
    workers the cluster starts (the CUDA plugin links against them)."""
    libs = ":".join(nvidia_library_dirs())
    if libs and libs not in os.environ.get("LD_LIBRARY_PATH", ""):
        os.environ["LD_LIBRARY_PATH"] = libs + ":" + os.environ.get("LD_LIBRARY_PATH", "")


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    use_nvidia_libraries()
    log = tmp_path_factory.mktemp("logs") / "cluster.log"
    with plexus.local(hosts=1, devices_per_host=1, pjrt_plugin=cuda_pjrt_plugin(),
                      log_level="info", log_file=str(log)) as c:
        yield c


def test_jit_runs_on_the_gpu_and_matches_the_cpu(gpu_cluster):
    import jax
    import jax.numpy as jnp

    def f(x, w):
        h = jnp.tanh(jnp.matmul(x, w, precision=jax.lax.Precision.HIGHEST))
        return jnp.sum(h, axis=0), h

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 128)).astype(np.float32)
    w = (rng.standard_normal((128, 64)) / 12).astype(np.float32)
    client = gpu_cluster.connect()
    s = client.slice(1)
    prog = plexus.jit(f, s, platform="cuda")
    col, h = prog(x, w)
    want_col, want_h = jax.jit(f)(x, w)  # this process: CPU
    np.testing.assert_allclose(np.asarray(h), want_h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(col), want_col, rtol=1e-4, atol=1e-4)
    st = gpu_cluster.status(fresh=True)["workers"][0]["stats"]
    assert st["xla_platform"] == "cuda", st
    compiles = st["xla_compiles"]
    for _ in range(3):
        col, h = prog(x, w)
    np.asarray(h)
    assert gpu_cluster.status(fresh=True)["workers"][0]["stats"]["xla_compiles"] == compiles
