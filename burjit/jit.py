"""`@burjit.compile`: the front door. Flatten, look up the cache, trace on a miss, run.

Arguments are pytrees. numpy arrays and numpy scalars are traced inputs; Python bool/int/float
leaves (and arguments listed in static_argnums) are static: they are baked into the graph
and are part of the cache key. `donate_argnums` lets the step update those arguments' arrays
in place: an output (a top-level element of the returned tuple, or the whole result) with
the same structure, shapes and dtypes as a donated argument is written into its buffers and
returned as those very arrays.

A backend is `build(graph) -> executable`, with `executable(inputs) -> outputs` (lists of
arrays). It must raise before writing anything when a step fails.
"""

import functools
import os

import numpy as np

from . import pytree
from .errors import TracingError
from .tracer import Trace, Tracer, bind, check_dtype, lift

BACKENDS = {}  # name -> (build, default pass names or None for the pipeline's default)
_TREEDEFS = {}  # treedef -> (its generated flattener, a small int standing for it in cache keys)


def register_backend(name, build, passes=None):
    BACKENDS[name] = (build, passes)


def default_backend():
    return os.environ.get("BURJIT_BACKEND") or ("native" if "native" in BACKENDS else "reference")


class Lowered:
    """One cache entry: the traced-and-passed graph, its executable, and how to map pytrees."""

    def __init__(self, graph, executable, out_tree):
        self.graph, self.executable, self.out_tree = graph, executable, out_tree
        self.rebuild = pytree.unflattener(out_tree)


class CompiledFunction:
    def __init__(self, fn, backend=None, static_argnums=(), donate_argnums=(), passes=None):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.backend = backend
        self.static_argnums = _as_tuple(static_argnums)
        self.donate_argnums = _as_tuple(donate_argnums)
        self.passes = passes
        self._cache = {}
        self._flatteners = {}
        self._last = None

    def __call__(self, *args):
        key, arrays = self._signature(args)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._cache[key] = self._lower(args, arrays)
        self._last = entry
        return entry.rebuild(entry.executable(arrays))

    # -- inspection (for the given arguments' signature, or the last one called) ----------------
    def lower(self, *args):
        if not args:
            if self._last is None:
                raise TracingError("call the step (or pass example arguments) before inspecting it")
            return self._last
        key, arrays = self._signature(args)
        if key not in self._cache:
            self._cache[key] = self._lower(args, arrays)
        self._last = self._cache[key]
        return self._last

    def graph(self, *args):
        """The graph after passes (print it for a jaxpr-like listing)."""
        return self.lower(*args).graph

    def __getattr__(self, name):
        # llvm_ir, asm, memory_plan...: whatever the backend's executable offers.
        if name.startswith("_") or name in ("fn", "backend", "passes"):
            raise AttributeError(name)
        def inspect(*args, **kw):
            exe = self.lower(*args).executable
            if not hasattr(exe, name):
                raise AttributeError(f"the {self._backend()} backend has no {name}()")
            return getattr(exe, name)(**kw)
        return inspect

    # -- internals ----------------------------------------------------------------------------
    def _backend(self):
        return self.backend or default_backend()

    def _flatten(self, i, arg):
        """pytree.flatten, through a generated flattener for the structure argument i had last time."""
        fast = self._flatteners.get(i)
        leaves = fast[0](arg) if fast is not None else None
        if leaves is not None:
            return leaves, fast[1]
        leaves, td = pytree.flatten(arg)
        known = _TREEDEFS.get(td)
        if known is None:  # once per structure: a small int keys the cache (no deep hashing)
            known = _TREEDEFS[td] = (pytree.flattener(td), len(_TREEDEFS))
        self._flatteners[i] = known
        return leaves, known[1]

    def _signature(self, args):
        """Cache key and input arrays. On the hot path: dtype support is checked when tracing."""
        key, arrays, donated = [], [], []
        for i, arg in enumerate(args):
            if i in self.static_argnums:
                key.append(("static", _hashable(arg)))
                continue
            leaves, token = self._flatten(i, arg)
            sig = [token]
            donating = i in self.donate_argnums
            for leaf in leaves:
                if type(leaf) is np.ndarray:
                    if not leaf.flags.c_contiguous:
                        if donating:
                            raise ValueError(f"donated argument {i} has a non-contiguous array; its buffer "
                                             "cannot be updated in place (pass np.ascontiguousarray(x))")
                        leaf = np.ascontiguousarray(leaf)  # documented copy
                    elif donating:
                        donated.append((i, leaf))
                    arrays.append(leaf)
                    sig.append((leaf.shape, leaf.dtype))
                elif isinstance(leaf, np.generic):
                    arrays.append(np.asarray(leaf))
                    sig.append(((), leaf.dtype))
                elif isinstance(leaf, (bool, int, float)):
                    sig.append(("py", type(leaf), leaf))
                elif isinstance(leaf, Tracer):
                    raise TracingError("a compiled step was called with traced values; call the plain "
                                       "function inside another trace instead")
                else:
                    raise TracingError(f"argument {i}: unsupported leaf of type {type(leaf).__name__} "
                                       "(use numpy arrays, Python scalars, or static_argnums)")
            key.append(tuple(sig))
        if donated:
            _check_donated(donated, arrays)
        return tuple(key), arrays

    def _lower(self, args, arrays):
        from .passes import pipeline
        with Trace() as t:
            g = t.graph
            traced, in_leaf_pos, k = [], {}, 0
            for i, arg in enumerate(args):
                if i in self.static_argnums:
                    traced.append(arg)
                    continue
                leaves, td = pytree.flatten(arg)
                new = []
                for leaf in leaves:
                    if isinstance(leaf, (np.ndarray, np.generic)):
                        a = arrays[k]
                        dtype = check_dtype(a.dtype, f"argument {i}")
                        x = bind("input", [], index=k, shape=a.shape, dtype=dtype)
                        g.inputs.append(x.node)
                        in_leaf_pos.setdefault(i, []).append(k)
                        k += 1
                        new.append(x)
                    else:
                        new.append(leaf)
                traced.append(pytree.unflatten(td, new))
            result = self.fn(*traced)
            out_leaves, out_tree = pytree.flatten(result)
            outs = []
            for leaf in out_leaves:
                if isinstance(leaf, Tracer) and leaf.trace is not t:
                    raise TracingError("the step returned a traced value from another trace")
                if not isinstance(leaf, (Tracer, np.ndarray, np.generic, bool, int, float)):
                    raise TracingError(f"the step returned a {type(leaf).__name__}; return arrays, "
                                       "scalars or pytrees of them")
                outs.append(lift(leaf).node)
            g.outputs = outs
        g.aliases = self._aliases(args, arrays, in_leaf_pos, out_tree, g)
        build, default_passes = BACKENDS[self._backend()]
        names = self.passes if self.passes is not None else default_passes
        graph = pipeline.run(g, names)
        return Lowered(graph, build(graph), out_tree)

    def _aliases(self, args, arrays, in_leaf_pos, out_tree, g):
        aliases, offset, taken = {}, 0, set()
        children = pytree.top_level(out_tree)
        for child in children:
            n = pytree.num_leaves(child)
            for i in self.donate_argnums:
                if i in taken or i >= len(args):
                    continue
                pos = in_leaf_pos.get(i, [])
                if child != pytree.flatten(args[i])[1] or n != len(pos):
                    continue
                outs = g.outputs[offset:offset + n]
                if all(g[o]["shape"] == arrays[p].shape and g[o]["dtype"] == str(arrays[p].dtype)
                       for o, p in zip(outs, pos)):
                    aliases.update({offset + j: p for j, p in enumerate(pos)})
                    taken.add(i)
                    break
            offset += n
        missing = set(self.donate_argnums) - taken
        if missing:
            raise TracingError(f"donate_argnums {sorted(missing)}: no output has the same structure, shapes "
                               "and dtypes as that argument, so it cannot be updated in place")
        return aliases


def compile(fn=None, *, backend=None, static_argnums=(), donate_argnums=(), passes=None):
    """Compile a whole step. Use as @compile or @compile(backend="reference", donate_argnums=0)."""
    if fn is None:
        return lambda f: CompiledFunction(f, backend, static_argnums, donate_argnums, passes)
    return CompiledFunction(fn, backend, static_argnums, donate_argnums, passes)


def _check_donated(donated, arrays):
    """A donated buffer is overwritten in place, so it must be writable and not also read elsewhere."""
    for i, x in donated:
        if not x.flags.writeable:
            raise ValueError(f"donated argument {i} has a read-only array")
    if len(set(map(id, arrays))) == len(arrays):
        return
    uses = {}
    for a in arrays:
        uses[id(a)] = uses.get(id(a), 0) + 1
    for i, x in donated:
        if uses[id(x)] > 1:
            raise ValueError(f"an array of donated argument {i} is also passed elsewhere; "
                             "it would be overwritten while still being read")


def _as_tuple(x):
    return (x,) if isinstance(x, int) else tuple(x)


def _hashable(v):
    try:
        hash(v)
    except TypeError:
        raise TracingError(f"static argument {v!r} is not hashable") from None
    return v
