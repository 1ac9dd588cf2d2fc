"""plexus.jit supports jax 0.10.2 to 0.12.x (python/plexus/_jax_version.py,
JAX_OLDEST and JAX_NEWEST): CI runs its suites on both ends (make
test-python on 0.10.2, make test-jax-next on 0.12.x). A jax outside the
range is refused when a program is first traced, naming the version and the
range, where it would have lowered with primitives and parameters nobody
checked."""
import numpy as np
import pytest

import plexus
from plexus import _jit

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402


@pytest.mark.parametrize("version", [
    "0.10.2", "0.11.0", "0.11.2", "0.12.0", "0.12.0.1", "0.12.9"])
def test_a_supported_jax_is_taken(version):
    _jit.check_jax_version(version)


@pytest.mark.parametrize("version", [
    "0.10.1", "0.9.2", "0.4.38", "0.13.0", "0.13.0.dev20260101", "1.0.0"])
def test_a_jax_outside_the_range_is_refused_naming_both(version):
    with pytest.raises(plexus.UnimplementedError) as e:
        _jit.check_jax_version(version)
    assert str(e.value) == (
        f"plexus.jit supports jax 0.10.2 to 0.12.x; this is jax {version}. "
        "Install one in that range: pip install 'jax>=0.10.2,<0.13' "
        "'jaxlib>=0.10.2,<0.13'")


def test_the_jax_this_suite_runs_is_supported_and_runs(client):
    _jit.check_jax_version(jax.__version__)
    f = plexus.jit(lambda x: jnp.tanh(x) + 1, client.slice(1))
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(f(x)), np.tanh(x) + 1, rtol=1e-6)


def test_plexus_jit_refuses_an_unsupported_jax_before_tracing(
        client, monkeypatch):
    monkeypatch.setattr(_jit, "_JAX", None)  # imported (and checked) anew
    monkeypatch.setattr(jax, "__version__", "0.13.0")
    traced = []
    f = plexus.jit(lambda x: traced.append(x) or x * 2, client.slice(1))
    with pytest.raises(plexus.UnimplementedError,
                       match=r"plexus\.jit supports jax 0\.10\.2 to 0\.12\.x; "
                             r"this is jax 0\.13\.0"):
        f(np.ones(4, np.float32))
    assert traced == []
