"""The jax releases plexus.jit supports, and the check that refuses
another by name."""
from . import _core

# The jax releases plexus.jit supports: from 0.10.2, the newest for Python
# 3.11 and the one pinned with the workers' CPU plugin (scripts/setup.sh),
# to 0.12.x, the newest there is (Python 3.12). CI runs plexus.jit's suites
# on both ends (make test-jax-next). plexus.jit reads jax's jaxprs (the
# check across islands follows each primitive and its parameters) and
# lowers with jax.export, both of which change between releases: jax 0.12
# added primitives (one_minus_square, log2, polynomial) and moved scan's
# operand counts, which the check refused until it learned them.
JAX_OLDEST, JAX_NEWEST = (0, 10, 2), (0, 12)  # the newest: any 0.12.x


def _release(version):
    """(major, minor, patch) of a jax version string ('0.12.0.1',
    '0.13.0.dev20260101'): its leading numbers."""
    numbers = []
    for part in version.split(".")[:3]:
        digits = part[:len(part) - len(part.lstrip("0123456789"))]
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers + [0] * (3 - len(numbers)))


def check_jax_version(version):
    """Raises UnimplementedError naming jax `version` and the supported
    range unless it is from JAX_OLDEST to any patch of JAX_NEWEST."""
    release = _release(version)
    if JAX_OLDEST <= release and release[:2] <= JAX_NEWEST:
        return
    oldest = ".".join(map(str, JAX_OLDEST))
    major, minor = JAX_NEWEST
    raise _core.UnimplementedError(
        f"plexus.jit supports jax {oldest} to {major}.{minor}.x; this is "
        f"jax {version}. Install one in that range: pip install "
        f"'jax>={oldest},<{major}.{minor + 1}' 'jaxlib>={oldest},"
        f"<{major}.{minor + 1}'")
