"""plexus.jit writes each module for the oldest StableHLO its slice's
workers read: each worker reports its PJRT plugin's
stablehlo_current_version at registration (SliceDevice.stablehlo_version),
and a jax newer than the plugin (jax 0.12 writes 1.18 by default, the pinned
CPU plugin reads 1.13) gets its module written down to that version, as jax
does for a plugin backend."""
import re

import numpy as np
import pytest

import plexus
from plexus import _stablehlo

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax._src.lib.mlir.dialects import hlo  # noqa: E402


def written_for(module):
    return re.findall(rb"StableHLO_v([0-9.]+)", module)[0].decode()


def exported():
    return jax.export.export(jax.jit(lambda x: x * 2), platforms=["cpu"])(
        jax.ShapeDtypeStruct((4,), jnp.float32))


class FakeSlice:  # what serialized reads of a slice: its devices
    def __init__(self, *versions):
        self.devices = [{"stablehlo_version": v} for v in versions]


def test_workers_report_their_plugins_stablehlo_version(client):
    s = client.slice(2)
    versions = {d["stablehlo_version"] for d in s.devices}
    assert len(versions) == 1 and re.fullmatch(r"\d+\.\d+\.\d+",
                                               versions.pop())


def test_a_module_is_written_for_the_oldest_version_of_its_workers():
    e = exported()
    jax_writes = written_for(e.mlir_module_serialized)
    # Older than what jax writes: written down to the oldest reader.
    assert written_for(_stablehlo.serialized(
        e, FakeSlice("1.13.3", "1.14.0"), "program 'f'")) == "1.13.3"
    # As new as jax's, or not said: jax's own bytes.
    assert _stablehlo.serialized(e, FakeSlice("99.0.0"), "program 'f'") == \
        e.mlir_module_serialized
    assert _stablehlo.serialized(e, FakeSlice(""), "program 'f'") == \
        e.mlir_module_serialized
    assert jax_writes
    # Older than any this jax can write: a clear error naming both.
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"program 'f': the workers' PJRT plugin reads "
                             r"StableHLO 0\.1\.0, older than any this jax "
                             r"writes \(" + re.escape(
                                 str(hlo.get_minimum_version()))):
        _stablehlo.serialized(e, FakeSlice("0.1.0"), "program 'f'")


def test_a_program_runs_whatever_jax_writes_by_default(client):
    s = client.slice(1)
    f = plexus.jit(lambda x: jnp.tanh(x) * 2, s)
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(f(x)), np.tanh(x) * 2, rtol=1e-6)
