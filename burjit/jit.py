"""`@burjit.compile`: the front door. Flatten, look up the cache, trace on a miss, run.

Arguments are pytrees; keyword arguments are bound to their positions first (the fast path
hands a keyword call to the general one); keyword-only parameters and **kwargs become two more
arguments, a dict of their values and a static tuple of the static ones (`_bind`). numpy arrays and numpy scalars are traced inputs;
Python bool/int/float leaves (and arguments listed in static_argnums or static_argnames) are
static: they are baked into the graph and are part of the cache key, by type and bit pattern (so 1, 1.0 and True, or 0.0 and -0.0,
trace apart, and a NaN hits its own entry). Each compiled function keeps at most
`cache_size` signatures (default DEFAULT_CACHE_SIZE, or $BURJIT_CACHE_SIZE), dropping the least
recently used one; dropping an entry frees its native code. `donate_argnums` lets the step update those arguments' arrays
in place: an output (a top-level element of the returned tuple, or the whole result) with
the same structure, shapes and dtypes as a donated argument is written into its buffers and
returned as those very arrays; on the fast path a donated argument returned whole is returned
as the caller's own container.

A call of the signature called last takes a fast path (`_fast_path`): one generated function
that flattens the arguments by their known structure and hands the leaves to the native entry,
which checks each of them (codegen/lowering.py); any other call, or a leaf the entry refuses,
goes through `_signature`, the cache and, on a miss, tracing. The fast path is the compiled
function's `__call__` itself: each CompiledFunction is the one instance of its own subclass, so
a call runs one generated Python function, not a method that calls it (~0.1 us of ~0.5); it
takes fn's own parameters where it can, so a keyword call binds for free and no **kwargs dict
is made per call (~0.08 us).

A backend is `build(graph) -> executable`, with `executable(inputs) -> outputs` (lists of
arrays). It must raise before writing anything when a step fails. A `build` with a TIER
attribute traces every step at that tier, whatever tier is asked (mlir: "straight"). Its executable may offer
`fast_path(prelude)`: the arguments -> the result, or what the prelude says with nothing run
(codegen/native.py), the prelude's lines making the inputs list from the arguments and its
expression the result from the outputs.
"""

import collections
import functools
import inspect
import os
import re
import weakref

import numpy as np

from . import pytree, staged
from .errors import TracingError
from .graph import TIERS, collector_paused, tier as graph_tier, value_key
from .tracer import Trace, Tracer, check_dtype, lift

BACKENDS = {}  # name -> (build, default pass names or None for the pipeline's default)
_TREEDEFS = {}  # treedef -> (its generated flattener, a small int standing for it in cache keys, itself)


DEFAULT_CACHE_SIZE = 64


def register_backend(name, build, passes=None):
    """`build(graph) -> executable`; when `build` is the executable's class, its public methods
    (llvm_ir, asm, ...) become inspectors of the compiled function."""
    BACKENDS[name] = (build, passes)


def default_backend():
    return os.environ.get("BURJIT_BACKEND") or ("native" if "native" in BACKENDS else "reference")


def _lookup_backend(name):
    if name not in BACKENDS:
        where = "" if name != os.environ.get("BURJIT_BACKEND") else " (from $BURJIT_BACKEND)"
        raise ValueError(f"unknown backend {name!r}{where}; known backends: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name]


_UNKNOWN = object()   # an entry's fast path, not yet made


class Lowered:
    """One cache entry: the traced-and-passed graph, its executable, and how to map pytrees;
    `fast`: its fast path (CompiledFunction._fast_path), once known."""

    def __init__(self, graph, executable, out_tree):
        self.graph, self.executable, self.out_tree = graph, executable, out_tree
        self.rebuild = pytree.unflattener(out_tree)
        self.fast = _UNKNOWN


class CompiledFunction:
    def __new__(cls, *args, **kwargs):
        # its own subclass, whose __call__ becomes the fast path of the signature called last
        own = type(cls.__name__, (cls,), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
        return object.__new__(own)

    def __init__(self, fn, backend=None, static_argnums=(), donate_argnums=(), passes=None, cache_size=None,
                 tier=None, static_argnames=()):
        functools.update_wrapper(self, fn)
        self.fn = fn
        if backend is not None:
            _lookup_backend(backend)
        self.backend = backend
        self.static_argnames = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        # None, or (for a function with keyword-only parameters or **kwargs) its static keyword names
        self._keywords = self._keyword_params()
        self.static_argnums = _argnums(static_argnums, "static_argnums") + self._argnames(self.static_argnames)
        self.donate_argnums = _argnums(donate_argnums, "donate_argnums")
        self.passes = passes
        if cache_size is None:
            cache_size = _env_int("BURJIT_CACHE_SIZE", DEFAULT_CACHE_SIZE)
        if not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"cache_size must be a positive int, got {cache_size!r}")
        self.cache_size = cache_size
        if tier is not None and tier not in TIERS:
            raise ValueError(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")
        self.tier = tier
        self._cache = collections.OrderedDict()  # signature -> Lowered, least recently used first
        self._flatteners = {}
        self._last = None
        self._nums = {}  # number of arguments -> (static positions, donated positions), negatives resolved

    def __call__(self, *args, **kwargs):
        """The general call; the fast path (type(self).__call__, once known) comes here for
        arguments of another signature, and for keyword arguments."""
        if kwargs or self._keywords is not None:
            args = self._bind(args, kwargs)
        key, arrays = self._signature(args)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._insert(key, self._lower(args, arrays))
        elif entry is not self._last:
            self._cache.move_to_end(key)
        self._last = entry
        type(self).__call__ = (entry.fast if entry.fast is not _UNKNOWN else self._fast_path(entry, args)) \
            or CompiledFunction.__call__
        return entry.rebuild(entry.executable(arrays))

    def __reduce__(self):
        # copy, deepcopy and pickle give a fresh compiled function of the same step (compiled code
        # is process-local: the copy compiles again on first use, or hits the disk cache).
        return (CompiledFunction, (self.fn, self.backend, self.static_argnums, self.donate_argnums,
                                   self.passes, self.cache_size, self.tier, self.static_argnames))

    # -- inspection (for the given arguments' signature, or the last one called) ----------------
    def lower(self, *args, **kwargs):
        if not args and not kwargs:
            if self._last is None:
                raise TracingError("call the step (or pass example arguments) before inspecting it")
            return self._last
        if kwargs or self._keywords is not None:
            args = self._bind(args, kwargs)
        key, arrays = self._signature(args)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._insert(key, self._lower(args, arrays))
        self._last = entry
        return entry

    def graph(self, *args):
        """The graph after passes (print it for a jaxpr-like listing)."""
        return self.lower(*args).graph

    def __getattr__(self, name):
        # llvm_ir, asm, memory_plan...: the public methods of the backend's executable class.
        build = BACKENDS.get(self.__dict__.get("backend") or default_backend(), (None,))[0]
        if name.startswith("_") or not isinstance(build, type) or not callable(getattr(build, name, None)):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r} (the "
                                 f"{self.__dict__.get('backend') or default_backend()} backend has no {name}())")

        def inspect(*args, **kw):
            return getattr(self.lower(*args).executable, name)(**kw)
        inspect.__name__ = name
        return inspect

    # -- internals ----------------------------------------------------------------------------
    def _backend(self):
        return self.backend or default_backend()

    def _insert(self, key, entry):
        self._cache[key] = entry
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return entry

    @functools.cached_property
    def _fn_signature(self):
        """fn's signature, read once: keyword calls bind with it on every call."""
        try:
            return inspect.signature(self.fn)
        except (TypeError, ValueError):
            raise TypeError(f"{self.__name__}: its signature cannot be read, so it takes no keyword "
                            "arguments or static_argnames") from None

    def _keyword_params(self):
        """None for a function whose parameters all have positions; else the static_argnames that
        name its keyword-only parameters (or keys of its **kwargs). Such a function's calls are
        always bound (`_bind`)."""
        try:
            params = self._fn_signature.parameters.values()
        except TypeError:
            return None
        kinds = {p.kind for p in params}
        if not kinds & {inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD}:
            return None
        ordinary = {p.name for p in params if p.kind in _ORDINARY}
        return frozenset(n for n in self.static_argnames if n not in ordinary)

    def _argnames(self, names):
        """static_argnames of ordinary parameters as positions (a keyword argument is bound to its
        position first); those of keyword-only ones stay names (`_keywords`)."""
        if not names:
            return ()
        params = list(self._fn_signature.parameters.values())
        var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        nums = []
        for name in names:
            where = [i for i, p in enumerate(params) if p.name == name]
            if where and params[where[0]].kind in _ORDINARY:
                nums.append(where[0])
            elif not (where and params[where[0]].kind is inspect.Parameter.KEYWORD_ONLY) and not var_keyword:
                raise ValueError(f"static_argnames: {self.__name__} has no parameter {name!r}")
        return tuple(nums)

    def _bind(self, args, kwargs):
        """Keyword arguments (and then defaults) moved to their positions: a call is its positions.
        A function with keyword-only parameters or **kwargs gets two more, last: a dict of the
        keyword values given, traced like any argument, and a tuple of (name, value) of the static
        ones (a static argument)."""
        try:
            bound = self._fn_signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.__name__}: {e}") from None
        kw = bound.kwargs  # those given: the others keep fn's defaults, which may be of any type
        bound.apply_defaults()
        if self._keywords is None:
            return bound.args
        return bound.args + ({k: v for k, v in kw.items() if k not in self._keywords},
                             tuple(sorted((k, kw[k]) for k in self._keywords if k in kw)))

    def _positions(self, n):
        """(static, donated) argument positions for a call with n arguments; negatives count from the end."""
        nums = self._nums.get(n)
        if nums is None:
            m = n if self._keywords is None else n - 2  # the positions before the keywords' (`_bind`)
            nums = tuple(frozenset(i % m if -m <= i < 0 else i for i in s) for s in (self.static_argnums, self.donate_argnums))
            if self._keywords is not None:
                nums = (nums[0] | {n - 1}, nums[1])
            self._nums[n] = nums
            if nums[0] & nums[1]:
                raise ValueError(f"arguments {sorted(nums[0] & nums[1])} are both static and donated")
        return nums

    def _flatten(self, i, arg):
        """pytree.flatten, through a generated flattener for the structure argument i had last time."""
        fast = self._flatteners.get(i)
        leaves = fast[0](arg) if fast is not None else None
        if leaves is not None:
            return leaves, fast[1]
        leaves, td = pytree.flatten(arg)
        known = _TREEDEFS.get(td)
        if known is None:  # once per structure: a small int keys the cache (no deep hashing)
            known = _TREEDEFS[td] = (pytree.flattener(td), len(_TREEDEFS), td)
        self._flatteners[i] = known
        return leaves, known[1]

    def _fast_path(self, entry, args):
        """The type's __call__ (a staticmethod) -> the result of entry's step, or of the general
        call, with nothing run, for args of another signature (or None: no fast path). It flattens
        args as this call's flatteners did (another structure goes to the general call) and hands
        the leaves to the native entry, both in the one function the executable's fast_path
        generates; the entry checks each leaf as _signature would. It takes fn's own parameters
        where it can (`_own_params`): Python then binds keywords for free and words its errors
        as for fn; else (*a, **k), a keyword call going to the general one. Only for steps
        without static arguments or Python-scalar leaves, whose values are part of the signature."""
        make = getattr(entry.executable, "fast_path", None)
        entry.fast = None
        static, donated = self._positions(len(args))
        if self._keywords is not None:  # only a call with no keywords: its two keyword arguments are empty
            if args[-2] or args[-1]:
                return None
            args, static = args[:-2], static - {len(args) - 1}
        if make is None or static:
            return None
        trees = [self._flatteners[i][2] for i in range(len(args))]
        if not all(type(x) is np.ndarray or isinstance(x, np.generic)
                   for td, a in zip(trees, args) for x in pytree.flatten(a)[0]):
            return None
        # the general call gets the compiled function by a weak reference: no cycle through its type
        scope, items = {"G": CompiledFunction.__call__, "s": weakref.ref(self), "D": _NOT_GIVEN}, []
        own = self._own_params(len(args))
        if own is not None:  # a parameter with a default is D when not given: given or not as traced, or general
            names, required, optional = own
            params = ", ".join(required + [f"{n}=D" for n in optional])
            general = f"G(s(), {', '.join(names)})"
            other = [f"{n} is D" for n in optional if n in names] + [f"{n} is not D" for n in optional if n not in names]
            pairs = "".join(f"({n!r}, {n}), " for n in optional)
            lines = [f"if {' or '.join(other)}: return G(s(), {''.join(f'{n}, ' for n in required)}"
                     f"**{{k: v for k, v in ({pairs}) if v is not D}})"] if other else []
        else:
            names = [f"a{i}" for i in range(len(args))]
            params, general = "*a, **k", "G(s(), *a)"
            # unpacking checks the argument count (free unless it fails): cheaper than len(a) == n
            lines = ["if k: return G(s(), *a, **k)"] + ([
                "try:", f"    {''.join(f'{n}, ' for n in names)}= a", "except ValueError:",
                f"    return {general}"] if args else [f"if a: return {general}"])
        given = self._returned_whole(entry, trees, donated)
        result, scope["c"] = pytree.rebuild_source(entry.out_tree, {m: names[d] for m, d in given.items()})
        for i, td in enumerate(trees):  # a leaf argument goes in as it is: the entry checks its type
            if td == pytree.LEAF:
                items.append(names[i])
                continue
            scope[f"f{i}"] = pytree.flattener(td, leaves_checked=False)
            lines += [f"l{i} = f{i}({names[i]})", f"if l{i} is None: return {general}"]
            items.append(f"*l{i}")
        lines.append(f"i = [{', '.join(items)}]")
        run = make(prelude=(scope, params, lines, result, general))
        name = self.__name__ if isinstance(getattr(self, "__name__", None), str) else "step"
        run.__name__ = run.__qualname__ = name  # its TypeErrors name fn, as fn's own would
        entry.fast = staticmethod(run)
        return entry.fast

    def _own_params(self, n):
        """(fn's first n parameter names, those without defaults, those with), when all are
        ordinary, all from n on have defaults, and no name is one the fast path's code uses."""
        try:
            params = list(self._fn_signature.parameters.values())
        except TypeError:
            return None
        if (len(params) < n or any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
                or any(p.default is inspect.Parameter.empty for p in params[n:])
                or any(_GENERATED.fullmatch(p.name) for p in params)):
            return None
        empty = inspect.Parameter.empty
        return ([p.name for p in params[:n]], [p.name for p in params if p.default is empty],
                [p.name for p in params if p.default is not empty])

    def _returned_whole(self, entry, trees, donated):
        """{top-level result position m: donated argument d} where the step returns argument d
        whole: the same structure, each leaf the donated input leaf it was updated into. On the
        fast path those leaves are the caller's own arrays, so the result holds the caller's
        container itself: rebuilding a GPT's 60 parameter dicts per call cost as much as the
        rest of the call."""
        out = entry.out_tree
        if out == pytree.LEAF or out[0] not in ("tuple", "list"):
            return {}
        starts = np.cumsum([0] + [pytree.num_leaves(td) for td in trees]).tolist()
        aliases, given, at = entry.graph.aliases, {}, 0
        for m, td in enumerate(out[2]):
            n = pytree.num_leaves(td)
            for d in donated - set(given.values()):
                if td == trees[d] and all(aliases.get(at + t) == starts[d] + t for t in range(n)):
                    given[m] = d
                    break
            at += n
        return given

    def _signature(self, args):
        """Cache key and input arrays. On the hot path: dtype support is checked when tracing."""
        key, arrays, donated, views = [], [], [], False
        static, donate = self._positions(len(args))
        for i, arg in enumerate(args):
            if i in static:
                key.append(("static", _static_key(arg)))
                continue
            leaves, token = self._flatten(i, arg)
            sig = [token]
            donating = i in donate
            for leaf in leaves:
                if type(leaf) is np.ndarray:
                    if not leaf.flags.c_contiguous:
                        if donating:
                            raise ValueError(f"donated argument {i} has a non-contiguous array; its buffer "
                                             "cannot be updated in place (pass np.ascontiguousarray(x))")
                        leaf = np.ascontiguousarray(leaf)  # documented copy
                    elif donating:
                        donated.append((i, leaf))
                    if donate and leaf.base is not None:
                        views = True
                    arrays.append(leaf)
                    sig.append((leaf.shape, leaf.dtype))
                elif isinstance(leaf, np.generic):
                    arrays.append(np.asarray(leaf))
                    sig.append(((), leaf.dtype))
                elif isinstance(leaf, (bool, int, float)):
                    sig.append(_static_key(leaf))
                elif isinstance(leaf, Tracer):
                    raise TracingError("a compiled step was called with traced values; call the plain "
                                       "function inside another trace instead")
                elif isinstance(leaf, (dict, list, tuple)) or leaf is None:
                    # a container where the generated flattener expected a leaf (an OrderedDict or a
                    # namedtuple where an array was): forget that flattener and flatten in full
                    del self._flatteners[i]
                    return self._signature(args)
                else:
                    what = "keyword arguments" if self._keywords is not None and i == len(args) - 2 else f"argument {i}"
                    raise TracingError(f"{what}: unsupported leaf of type {type(leaf).__name__} "
                                       "(use numpy arrays, Python scalars, or static_argnums)")
            key.append(tuple(sig))
        if donated:
            _check_donated(donated, arrays, views)
        return tuple(key), arrays

    def _lower(self, args, arrays):
        from .passes import pipeline
        with collector_paused():
            build, default_passes = _lookup_backend(self._backend())
            tier = getattr(build, "TIER", None)  # a backend that runs one tier only (mlir: straight)
            traced = self._trace(args, arrays, tier or self.tier)
            if tier or self.tier:
                traced[0].meta["tier"] = tier or self.tier
            names = self.passes if self.passes is not None else default_passes
            if staged.wanted(traced[0]):  # collectives on the host, between compiled stages
                whole = pipeline.run(traced.pop(0), [n for n in (pipeline.DEFAULT if names is None else names) if n == "simplify"])
                return Lowered(whole, staged.Staged(whole, lambda g: build(pipeline.run(g, names))), traced.pop())
            # pop: nothing but the first pass holds the traced graph, so it goes once copied
            graph = pipeline.run(traced.pop(0), names)
            out_tree = traced.pop()
        return Lowered(graph, build(graph), out_tree)

    def _trace(self, args, arrays, tier):
        with Trace(graph_tier(tier)) as t:
            g = t.graph
            traced, in_leaf_pos, k = [], {}, 0
            static, _ = self._positions(len(args))
            for i, arg in enumerate(args):
                if i in static:
                    traced.append(arg)
                    continue
                leaves, td = pytree.flatten(arg)
                new = []
                for leaf in leaves:
                    if isinstance(leaf, (np.ndarray, np.generic)):
                        a = arrays[k]
                        dtype = check_dtype(a.dtype, f"argument {i}")
                        x = t.input(a.shape, dtype)  # input k
                        in_leaf_pos.setdefault(i, []).append(k)
                        k += 1
                        new.append(x)
                    else:
                        new.append(leaf)
                traced.append(pytree.unflatten(td, new))
            if self._keywords is None:
                result = self.fn(*traced)
            else:
                result = self.fn(*traced[:-2], **traced[-2], **dict(traced[-1]))
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
        g.meta["donated"] = sorted(k for i in self._positions(len(args))[1] for k in in_leaf_pos.get(i, ()))
        return [g, out_tree]

    def _aliases(self, args, arrays, in_leaf_pos, out_tree, g):
        aliases, offset, taken = {}, 0, set()
        _, donate = self._positions(len(args))
        for i in sorted(donate):
            if i >= len(args):
                raise TracingError(f"donate_argnums: argument {i} was donated but the step got {len(args)} arguments")
            static = [type(x).__name__ for x in pytree.flatten(args[i])[0] if not isinstance(x, (np.ndarray, np.generic))]
            if static:
                raise TracingError(f"donated argument {i} holds Python {', '.join(sorted(set(static)))} leaves: they are "
                                   "static (compiled into the step) and have no buffer to update in place; pass "
                                   "them as numpy arrays (np.asarray(x)) or do not donate that argument")
        children = pytree.top_level(out_tree)
        for child in children:
            n = pytree.num_leaves(child)
            for i in sorted(donate):
                if i in taken:
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
        missing = donate - taken
        if missing:
            raise TracingError(f"donate_argnums {sorted(missing)}: no output has the same structure, shapes "
                               "and dtypes as that argument, so it cannot be updated in place")
        return aliases


def compile(fn=None, *, backend=None, static_argnums=(), donate_argnums=(), passes=None, cache_size=None,
            tier=None, static_argnames=()):
    """Compile a whole step. Use as @compile or @compile(backend="reference", donate_argnums=0).

    Keyword arguments bind to their parameters' positions (then defaults fill the rest), so
    static_argnums and donate_argnums count them too; static_argnames names static parameters,
    keyword-only ones (and keys of **kwargs) included.
    cache_size bounds how many signatures (shapes, dtypes, static values) stay compiled at once.
    tier ("auto", "straight" or "tape") says how scalar programs run, over $BURJIT_TIER."""
    if fn is None:
        return lambda f: CompiledFunction(f, backend, static_argnums, donate_argnums, passes, cache_size, tier,
                                          static_argnames)
    return CompiledFunction(fn, backend, static_argnums, donate_argnums, passes, cache_size, tier, static_argnames)


def _check_donated(donated, arrays, views):
    """A donated buffer is overwritten in place, so it must be writable and not also read elsewhere.

    Views are caught too (a slice of a donated array passed beside it, or two overlapping donated
    slices): only when some array is a view (`views`) or repeats does the per-pair memory check
    run. Every array here is C-contiguous, so its bytes are one span: sorted by start, each span
    is compared only with those that start before it ends (a GPT's 73 donated leaves beside
    sharded views: 3 ms per call pair by pair).
    """
    for i, x in donated:
        if not x.flags.writeable:
            raise ValueError(f"donated argument {i} has a read-only array")
    if not views and len(set(map(id, arrays))) == len(arrays):
        return
    argument = {id(x): i for i, x in donated}
    spans = sorted((a.ctypes.data, a.ctypes.data + a.nbytes, id(a)) for a in arrays if a.nbytes)
    for n, (_, end, a) in enumerate(spans):
        for start, _, b in spans[n + 1:]:
            if start >= end:
                break
            i = argument.get(a, argument.get(b))
            if i is not None:
                raise ValueError(f"an array of donated argument {i} shares memory with another argument (the "
                                 "same array or a view of it); it would be overwritten while still being read")


_ORDINARY = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_NOT_GIVEN = object()  # the default the fast path gives the parameters a call may leave out
# the names the fast path's code reads (jit's and codegen/native.py's fast_path, pytree's
# rebuild_source): a parameter of one of these names makes it take (*a, **k)
_GENERATED = re.compile(r"[GsDciorACE]|fail|dict|zip|[flsd]\d+")


def _argnums(x, what):
    nums = (x,) if isinstance(x, int) else tuple(x)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in nums):
        raise TypeError(f"{what} must be an int or a sequence of ints, got {x!r}")
    return nums


def _env_int(name, default):
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {value!r}") from None


def _static_key(v):
    try:
        return value_key(v)
    except TypeError:
        raise TracingError(f"static argument {v!r} is not hashable") from None


# The built-in backends, registered wherever an import of the compiler starts (burjit's own
# __init__ imports nothing of it until used: burjit.load stays free of LLVM and networkx).
from . import reference as _reference  # noqa: E402
register_backend("reference", _reference.ReferenceExecutable, passes=())
from . import codegen as _codegen  # noqa: E402,F401  (registers the "native" backend, the default)
