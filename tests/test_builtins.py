"""plexus.builtins and docs/PROGRAMS.md: every built-in program, documented
once next to its C++ registration; the doc matches its generator, every
example runs and checks its result on a real cluster, and s.program takes
specs (plexus.Spec, jax.ShapeDtypeStruct) as readily as example values."""
import runpy
from pathlib import Path

import numpy as np
import pytest

import plexus
from plexus import _core

ROOT = Path(__file__).resolve().parent.parent


def test_every_kernel_is_listed_with_its_rules():
    assert sorted(plexus.builtins) == sorted(_core.kernels())
    scale = plexus.builtins["scale"]
    assert plexus.builtins.scale is scale
    assert [a.name for a in scale.attrs] == ["factor", "repeat"]
    assert scale.attrs[0].default is None and scale.attrs[1].default == "1"
    assert "float32, float64, int32 or int64" in scale.inputs
    assert plexus.builtins.all_reduce.collective
    assert "matmul" in repr(plexus.builtins)
    assert "transpose_a (int, default 0)" in str(plexus.builtins.matmul)
    with pytest.raises(KeyError, match="no built-in program 'nope'"):
        plexus.builtins["nope"]


def test_programs_md_is_generated_from_the_registry():
    script = runpy.run_path(str(ROOT / "scripts" / "programs_md.py"))
    assert (ROOT / "docs" / "PROGRAMS.md").read_text() == script["render"](), (
        "docs/PROGRAMS.md is out of date: run "
        "PYTHONPATH=python python3 scripts/programs_md.py")


@pytest.mark.parametrize("name", sorted(_core.kernels()))
def test_every_example_runs(client, name):
    s = client.slice(2, placement="spread")
    exec(plexus.builtins[name].example,
         {"s": s, "np": np, "plexus": plexus})


def test_program_takes_specs_like_example_values(client):
    jax = pytest.importorskip("jax")
    s = client.slice(2, placement="spread")
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    by_value = s.program("scale", x, factor=2.0)
    by_spec = s.program("scale", plexus.Spec((4, 2), "float32"), factor=2.0)
    by_struct = s.program("scale", jax.ShapeDtypeStruct((4, 2), np.float32),
                          factor=2.0)
    by_jax_array = s.program("scale", jax.numpy.asarray(x), factor=2.0)
    split = s.program("scale", plexus.Spec((4, 2), "float32", plexus.split(0)),
                      factor=2.0)
    for prog in (by_value, by_spec, by_struct, by_jax_array):
        assert prog.input_specs == [((4, 2), np.float32, "replicated")]
        np.testing.assert_array_equal(np.asarray(prog(x)), 2 * x)
    assert split.input_specs == [((4, 2), np.float32, "split(0)")]
    np.testing.assert_array_equal(np.asarray(split(x)), 2 * x)
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"program 'scale' argument 0: .*model"):
        s.program("scale", plexus.Spec((4,), "float32", plexus.P("model")),
                  factor=2.0)
    listed = s.program("scale", [1.0, 2.0], factor=2.0)  # as numpy reads it
    assert listed.input_specs == [((2,), np.float64, "replicated")]
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"unsupported dtype '<U5'"):
        s.program("scale", "hello", factor=2.0)
