"""The lowered module as the workers take it: written for the oldest
StableHLO version the slice's workers read, and the inputs it aliases to
outputs (donation). Used by plexus.jit (_jit.py) as it compiles.
"""
import re

from . import _core


def _version(text):
    return tuple(int(x) for x in text.split("."))


def serialized(exported, slice_, what):
    """The module's portable artifact, for the oldest StableHLO the slice's
    workers read (each reports its PJRT plugin's stablehlo_current_version)
    where that is older than what jax writes (a plugin built before this
    jax: the pinned CPU plugin reads 1.13, jax 0.12 writes 1.18), as jax
    itself does for a plugin backend."""
    from jax._src.lib import _jax
    from jax._src.lib.mlir.dialects import hlo
    written = hlo.get_version_from_compatibility_requirement(
        hlo.StablehloCompatibilityRequirement.WEEK_4)
    read = [d.get("stablehlo_version") for d in slice_.devices]
    read = [v for v in read if v]
    if not read:
        return exported.mlir_module_serialized
    target = min(read, key=_version)
    if _version(target) >= _version(written):
        return exported.mlir_module_serialized
    if _version(target) < _version(hlo.get_minimum_version()):
        raise _core.InvalidArgumentError(
            f"{what}: the workers' PJRT plugin reads StableHLO {target}, "
            f"older than any this jax writes ({hlo.get_minimum_version()})")
    try:
        return _jax.mlir.serialize_portable_artifact(
            exported.mlir_module(), target, True)
    except Exception as e:  # noqa: BLE001 - a feature the target lacks
        raise _core.InvalidArgumentError(
            f"{what}: the module cannot be written for StableHLO {target}, "
            f"the newest the workers' PJRT plugin reads (jax writes "
            f"{written}): {e}") from e


_ALIAS = re.compile(r"%arg(\d+):[^%]*?tf\.aliasing_output = (\d+)")


def aliased_inputs(exported):
    """(input, output) pairs the exported module aliases: each argument of
    its main function with `tf.aliasing_output`, as jax.jit lowers donated
    arguments it can pair with an output."""
    text = exported.mlir_module()
    start = text.find("@main(")
    if start < 0:
        return []
    end = text.find(") ->", start)
    signature = text[start:end if end > 0 else None]
    return [(int(i), int(o)) for i, o in _ALIAS.findall(signature)]
