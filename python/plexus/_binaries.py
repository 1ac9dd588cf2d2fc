"""Finding plexus-server and plexus-worker, and the console scripts of the
same names that `pip install` puts on PATH."""
import os
import signal
import sys
from pathlib import Path

BINARIES = ("plexus-server", "plexus-worker")


def _search_folders():
    """Where bin_dir() looks, in order, each with what it is (for the
    message when nothing is found)."""
    folders = []
    if os.environ.get("PLEXUS_BIN_DIR"):
        folders.append((Path(os.environ["PLEXUS_BIN_DIR"]), "$PLEXUS_BIN_DIR"))
    here = Path(__file__).resolve().parent
    folders.append((here / "bin", "the package's bin/"))
    root = here.parent.parent
    if (root / "pyproject.toml").exists():  # a source tree, not site-packages
        folders.append((root / "build" / "bin", "the source tree's build/bin"))
    folders.extend((Path(p), "$PATH") for p in os.get_exec_path() if p)
    return folders


def _is_binary(path) -> bool:
    """Whether `path` is an executable ELF file. The console scripts
    plexus-server and plexus-worker are Python text files: a folder holding
    them is never taken for one holding the binaries, so a launcher never
    runs itself (or the other) again."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError:  # missing, a folder, unreadable
        return False
    return magic == b"\x7fELF" and os.access(path, os.X_OK)


def bin_dir() -> Path:
    """The folder holding the plexus-server and plexus-worker binaries: the
    first of $PLEXUS_BIN_DIR, the package's own bin/ (pip install), the
    development build (build/bin in the source tree), then each folder of
    $PATH, where both are executable ELF files (not the console scripts of
    the same names, nor any other script)."""
    folders = _search_folders()
    for folder, _ in folders:
        if all(_is_binary(folder / name) for name in BINARIES):
            return folder
    looked = [f"{folder} ({what})" for folder, what in folders if what != "$PATH"]
    on_path = [str(folder) for folder, what in folders if what == "$PATH"]
    raise FileNotFoundError(
        "no plexus-server and plexus-worker binaries found: looked in "
        + ", ".join(looked)
        + (" and $PATH (" + ":".join(on_path) + ")" if on_path else "")
        + "; build them with `make build` or `pip install .`, or set "
        "$PLEXUS_BIN_DIR to the folder holding them")


def _exec_binary(name):
    """Replaces this process with the binary `name`, given this process's
    arguments: the binary then has this process's id, stdin, stdout,
    stderr and inherited descriptors, receives its signals and exits with
    its own code; no Python process stays in between. Returns only when
    it cannot: 127 (as a shell for a missing command) when no binary is
    found, 126 when the binary does not start."""
    try:
        path = bin_dir() / name
    except FileNotFoundError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 127
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays
    # ignored across exec: give the binary their default dispositions, as
    # when a shell starts it.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execv(path, sys.argv)  # argv[0]: the command as it was run
    except OSError as e:
        print(f"{name}: cannot run {path}: {e}", file=sys.stderr)
        return 126


def server_main():
    """The `plexus-server` console script ([project.scripts])."""
    return _exec_binary("plexus-server")


def worker_main():
    """The `plexus-worker` console script ([project.scripts])."""
    return _exec_binary("plexus-worker")


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
