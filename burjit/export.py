"""`burjit.export(step, *example_args, path=...)`: a compiled step as a C library for programs without Python.

The step is lowered for the example arguments' signature (as a call would), then its backend
writes the library (codegen/export.py): name.so, name.o, name.h (the C ABI) and name.json (the
same in data, with the pytrees, so burjit.load (library.py) rebuilds the step's interface).
"""

from importlib import metadata

from . import pytree
from .jit import CompiledFunction


def export(step, *example_args, path):
    """Write the library of `step` (a burjit.compile'd function) for these arguments' shapes and
    dtypes at `path` ("dir/name": dir/name.so, .o, .h, .json); returns {kind: Path}."""
    if not isinstance(step, CompiledFunction):
        raise TypeError(f"burjit.export takes a burjit.compile'd step, got {type(step).__name__}")
    entry = step.lower(*example_args)
    write = getattr(entry.executable, "export", None)
    if write is None:
        raise ValueError(f"burjit.export: the {step._backend()!r} backend cannot export; use the native backend")
    static, _ = step._positions(len(example_args))
    if static:
        raise ValueError("burjit.export: static arguments are baked into the library; export a step without "
                         "static_argnums (close over the values instead)")
    in_tree = pytree.flatten(example_args)[1]
    inputs = [_name(("arg",) + p) for p in pytree.leaf_paths(in_tree)]
    outputs = [_name(("out",) + p) for p in pytree.leaf_paths(entry.out_tree)]
    if len(inputs) != len(entry.graph.inputs):
        raise ValueError("burjit.export: the example arguments must be arrays or numpy scalars only (a Python "
                         "scalar would be baked into the library)")
    try:  # name.json carries both pytrees, for burjit.load
        trees = dict(in_tree=pytree.to_data(in_tree), out_tree=pytree.to_data(entry.out_tree))
    except TypeError as e:
        raise ValueError(f"burjit.export: {e}") from None
    return write(path, dict(inputs=inputs, outputs=outputs, version=_version(), **trees))


def _name(path):
    return ".".join(str(k) for k in path)


def _version():
    try:
        return metadata.version("burjit")
    except metadata.PackageNotFoundError:
        return "unknown"
