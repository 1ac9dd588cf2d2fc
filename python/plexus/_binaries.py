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
