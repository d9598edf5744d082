"""burjit: trace a whole training step, differentiate it in the graph, compile it to native code.

Public API:
    compile(fn, backend=None, static_argnums=(), donate_argnums=(), passes=None)
    grad(f, argnums=0, has_aux=False), value_and_grad(f, argnums=0, has_aux=False)
    custom_vjp(fun) with fun.defvjp(fwd, bwd): a function with its own gradient rule
    fori_loop(lower, upper, body_fun, init_val), scan(f, init, xs=None, length=None, reverse=False),
    while_loop(cond_fun, body_fun, init_val)
    export(step, *example_args, path): the compiled step as a C library (.so, .h, .json)
    load(path): an exported library as a callable, on ctypes and numpy alone
    ops (also burjit.numpy): numpy-style functions on traced values
    nn, optim: functional layers and optimizers
    tree: pytree utilities (flatten, map, key paths, register custom nodes)
    random: counter-based random numbers (Threefry-2x32) with explicit keys
    distributed: data-parallel training on MPI (mpi4py; `pip install -e ".[mpi]"`)
    TracingError, ShapeError

The compiler's modules load on first use of one of their names: a process that only
`load()`s exported steps never imports llvmlite or networkx (58 MB more, measured).
"""

import importlib

from .errors import ShapeError, TracingError
from .library import load

_HOMES = {"compile": "jit", "register_backend": "jit", "grad": "autodiff", "value_and_grad": "autodiff",
          "fori_loop": "control", "scan": "control", "while_loop": "control", "export": "export",
          "Graph": "graph", "evaluate": "reference", "custom_vjp": "custom"}

__all__ = ["compile", "grad", "value_and_grad", "ops", "numpy", "evaluate", "Graph",
           "TracingError", "ShapeError", "register_backend", "nn", "optim", "fori_loop", "scan", "while_loop",
           "export", "load", "distributed", "tree", "custom_vjp", "random"]


def __getattr__(name):
    """A public name or a submodule (burjit.ops, burjit.nn, ...), imported when first asked for."""
    if name in _HOMES:
        value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value
