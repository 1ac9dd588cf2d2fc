"""plexus.builtins: every built-in program, from the C++ kernel registry.

    >>> list(plexus.builtins)[:3]
    ['add', 'all_reduce', 'assert_finite']
    >>> print(plexus.builtins.scale)        # or plexus.builtins["scale"]

Each entry says what the program computes, its attributes (name, kind,
default, meaning), what its inputs may be, what its outputs are, and an
example. The documentation is written next to each kernel's registration
(src/plexus/executors/builtin, KernelDoc); docs/PROGRAMS.md is generated
from the same entries (scripts/programs_md.py).
"""
import collections.abc
import textwrap

from . import _core


class Attr(collections.namedtuple("Attr", "name kind default meaning")):
    """An attribute of a built-in program; default None: required."""

    def __str__(self):
        default = ("required" if self.default is None
                   else f"default {self.default}")
        return f"{self.name} ({self.kind}, {default}): {self.meaning}"


class Builtin(collections.namedtuple(
        "Builtin", "name summary attrs inputs outputs example collective "
        "mesh_shardings")):
    """One built-in program: s.program(name, *inputs, **attrs)."""

    def __str__(self):
        lines = [f"{self.name}: {self.summary}"]
        if self.mesh_shardings:
            lines.append("  takes PartitionSpecs over meshes of several axes")
        if self.attrs:
            lines.append("  attributes:")
            lines += [f"    {a}" for a in self.attrs]
        lines.append(textwrap.fill(f"inputs: {self.inputs}", 78,
                                   initial_indent="  ",
                                   subsequent_indent="    "))
        lines.append(textwrap.fill(f"outputs: {self.outputs}", 78,
                                   initial_indent="  ",
                                   subsequent_indent="    "))
        lines.append("  example (s: a slice of 2 devices):")
        lines += ["    " + line for line in self.example.splitlines()]
        return "\n".join(lines)


class Builtins(collections.abc.Mapping):
    """Every built-in program by name, sorted: plexus.builtins["matmul"],
    plexus.builtins.matmul, `in`, iteration; print() shows a table."""

    def __init__(self):
        self._by_name = None

    def _entries(self):
        if self._by_name is None:
            self._by_name = {}
            for d in _core.kernel_docs():
                attrs = tuple(Attr(n, k, v or None, m)
                              for n, k, v, m in d["attrs"])
                self._by_name[d["name"]] = Builtin(
                    d["name"], d["summary"], attrs, d["inputs"],
                    d["outputs"], d["example"], d["collective"],
                    d["mesh_shardings"])
        return self._by_name

    def __getitem__(self, name):
        try:
            return self._entries()[name]
        except KeyError:
            raise KeyError(f"no built-in program {name!r} (there are: "
                           f"{', '.join(self._entries())})") from None

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(str(e)) from None

    def __iter__(self):
        return iter(self._entries())

    def __len__(self):
        return len(self._entries())

    def __dir__(self):
        return list(self._entries()) + ["keys", "items", "values", "get"]

    def __repr__(self):
        width = max(len(n) for n in self._entries())
        return "\n".join(f"{b.name:<{width}}  {b.summary}"
                         for b in self._entries().values())


builtins = Builtins()
