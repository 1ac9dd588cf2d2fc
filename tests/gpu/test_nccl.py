"""all_reduce between GPU islands on the GPUs with NCCL: two workers, each
on its own GPU, sum XLA outputs that stay in device memory. NCCL refuses two
ranks on one GPU, so this needs at least two GPUs; it skips, saying why,
where there are fewer (the one-GPU machine this project borrows), no CUDA
plugin, or no NCCL library (the nvidia-nccl wheel jax[cuda13] brings).
    tests/gpu/run.sh            (or: python3 -m pytest -q -rs tests/gpu/test_nccl.py)"""
import glob
import os
import subprocess

import numpy as np
import pytest

from test_xla_gpu import REASON as GPU_REASON
from test_xla_gpu import cuda_pjrt_plugin, use_nvidia_libraries

import plexus
from plexus._binaries import nvidia_library_dirs


def _reason():
    if GPU_REASON is not None:  # no GPU or no CUDA plugin
        return GPU_REASON
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    gpus = [line for line in r.stdout.splitlines() if line.startswith("GPU ")]
    if len(gpus) < 2:
        return (f"NCCL needs a GPU per rank and nvidia-smi lists {len(gpus)} "
                "GPU(s): the NCCL all_reduce needs two or more")
    if not any(glob.glob(os.path.join(d, "libnccl.so*")) for d in nvidia_library_dirs()):
        return "no libnccl.so.2 beside the CUDA plugin (the nvidia-nccl wheel)"
    return None


REASON = _reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def nccl_count(cluster):
    st = cluster.status(fresh=True)
    return sum(int(w["stats"].get("transfers_nccl", 0)) for w in st["workers"])


@pytest.fixture(scope="module")
def two_gpu_cluster(tmp_path_factory):
    use_nvidia_libraries()
    log = tmp_path_factory.mktemp("logs") / "cluster.log"
    # Each worker sees both GPUs (devices 0 and 1, its devices from the plugin).
    with plexus.local(hosts=2, gpus=[0, 1], device_memory_mib=4096,
                      pjrt_plugin=cuda_pjrt_plugin(), log_level="info",
                      log_file=str(log)) as c:
        yield c


def test_all_reduce_between_gpu_islands_runs_on_the_gpus(two_gpu_cluster):
    import jax.numpy as jnp
    client = two_gpu_cluster.connect(name="nccl")
    try:
        # host0's device 0 (GPU 0) is taken, so the slice gets host0's GPU 1
        # and host1's GPU 0: a GPU per rank, as NCCL needs.
        hold = client.slice(1, hosts=["host0"])
        s = client.slice(2, placement="spread")
        assert len({d["worker"] for d in s.devices}) == 2
        x = np.random.default_rng(3).standard_normal((2, 1 << 16)).astype(np.float32)
        addend = plexus.jit(lambda a: jnp.sum(a, axis=0) * 2.0, s,
                            in_shardings=plexus.split(0),
                            out_shardings=plexus.partial())
        reduce = None
        before = nccl_count(two_gpu_cluster)
        for step in range(3):  # the first makes the communicator, then reused
            part = addend(x + step)
            reduce = reduce or s.program("all_reduce", part)
            total = reduce(part)
            np.testing.assert_allclose(np.asarray(total), (x + step).sum(0) * 2.0,
                                       rtol=1e-5)
        # One NCCL all-reduce per shard: two ranks, three calls.
        assert nccl_count(two_gpu_cluster) - before == 6

        # A value in host memory (a put) takes the host path, counted as before.
        put = s.put(x[:1].sum(0))
        mid = nccl_count(two_gpu_cluster)
        total = s.program("all_reduce", put)(put)  # both shards hold it
        np.testing.assert_allclose(np.asarray(total), x[:1].sum(0) * 2.0,
                                   rtol=1e-5)
        assert nccl_count(two_gpu_cluster) == mid
        assert hold.devices  # held to the end
    finally:
        client.close()
