"""Finding plexus-server and plexus-worker."""
import os
import shutil
from pathlib import Path


def bin_dir() -> Path:
    """The folder holding plexus-server and plexus-worker.

    Order: $PLEXUS_BIN_DIR, the package's own bin/ (pip install), the
    development build (build/bin in the source tree), then $PATH.
    """
    candidates = []
    if os.environ.get("PLEXUS_BIN_DIR"):
        candidates.append(Path(os.environ["PLEXUS_BIN_DIR"]))
    here = Path(__file__).resolve().parent
    candidates.append(here / "bin")
    candidates.append(here.parent.parent / "build" / "bin")
    for c in candidates:
        if (c / "plexus-server").exists() and (c / "plexus-worker").exists():
            return c
    found = shutil.which("plexus-server")
    if found:
        return Path(found).parent
    raise FileNotFoundError(
        "plexus-server not found: looked in "
        + ", ".join(str(c) for c in candidates)
        + " and $PATH; build with `make build` or `pip install .`")


def default_pjrt_plugin():
    """The PJRT plugin workers load for XLA programs: $PLEXUS_PJRT_PLUGIN, or
    the CPU plugin of the xla-cpu-pjrt wheel (scripts/setup.sh installs it);
    None if neither is there (XLA calls then fail with that reason)."""
    if os.environ.get("PLEXUS_PJRT_PLUGIN"):
        return os.environ["PLEXUS_PJRT_PLUGIN"]
    return _package_file("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so")


def _package_file(package, name):
    """Path of `name` inside an installed package (not imported), or None."""
    import importlib.util
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:  # its parent package is missing
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / name
    return str(path) if path.exists() else None


def cuda_pjrt_plugin():
    """The NVIDIA GPU PJRT plugin of the jax-cuda13-pjrt wheel, or None."""
    return _package_file("jax_plugins.xla_cuda13", "xla_cuda_plugin.so")


def nvidia_library_dirs():
    """lib/ folders of the nvidia-* wheels (CUDA runtime, cuBLAS, cuDNN,
    NCCL) that the GPU plugin links against: a worker process finds them
    through LD_LIBRARY_PATH (JAX preloads them in-process instead)."""
    import importlib.util
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    dirs = []
    for root in spec.submodule_search_locations:
        dirs.extend(str(p) for p in sorted(Path(root).glob("*/lib")) if p.is_dir())
    return dirs
