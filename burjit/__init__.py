"""burjit: trace a whole training step, differentiate it in the graph, compile it to native code.

Public API:
    compile(fn, backend=None, static_argnums=(), donate_argnums=(), passes=None)
    grad(f, argnums=0, has_aux=False), value_and_grad(f, argnums=0, has_aux=False)
    fori_loop(lower, upper, body_fun, init_val), scan(f, init, xs=None, length=None, reverse=False),
    while_loop(cond_fun, body_fun, init_val)
    export(step, *example_args, path): the compiled step as a C library (.so, .h, .json)
    ops (also burjit.numpy): numpy-style functions on traced values
    nn, optim: functional layers and optimizers
    TracingError, ShapeError
"""

from . import ops
from . import numpy
from . import reference
from . import nn, optim
from .autodiff import grad, value_and_grad
from .control import fori_loop, scan, while_loop
from .jit import compile, register_backend
from .export import export
from .errors import ShapeError, TracingError
from .graph import Graph
from .reference import evaluate

register_backend("reference", reference.ReferenceExecutable, passes=())
from . import codegen as _codegen  # noqa: E402,F401  (registers the "native" backend)

__all__ = ["compile", "grad", "value_and_grad", "ops", "numpy", "evaluate", "Graph",
           "TracingError", "ShapeError", "register_backend", "nn", "optim", "fori_loop", "scan", "while_loop",
           "export"]
