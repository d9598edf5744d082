"""Reverse-mode autodiff as a graph transformation.

`grad(f)` traces f on fresh `id` nodes of its arguments, then walks the recorded nodes from
the output back to those arguments, appending each op's VJP (written in traced ops) to the
same graph. There is no runtime tape: the adjoint is ordinary graph, compiled with the rest.
A loss recorded in a scalar region (region.py) is walked back inside that region first.
Called outside a trace, grad compiles itself with the reference backend and runs eagerly.
"""

import functools

from . import ops as F
from . import primitives as P
from . import custom, pytree, region
from .errors import TracingError
from .tracer import Tracer, bind, current_trace, describe, user_src


def grad(f, argnums=0, has_aux=False):
    """d f / d args[argnums] for a scalar-valued f; returns a pytree like those arguments."""
    vg = value_and_grad(f, argnums, has_aux)

    @functools.wraps(f)
    def g(*args, **kwargs):
        value, grads = vg(*args, **kwargs)
        return (grads, value[1]) if has_aux else grads
    return g


def value_and_grad(f, argnums=0, has_aux=False):
    """(f(*args), grad) in one trace; with has_aux, f returns (loss, aux) and this ((loss, aux), grad)."""
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)

    @functools.wraps(f)
    def vg(*args, **kwargs):
        if current_trace() is None:
            from .jit import compile as _compile
            return _compile(lambda *a: vg(*a, **kwargs), backend="reference")(*args)
        args = list(args)
        bad = [i for i in nums if not -len(args) <= i < len(args)]
        if bad:
            raise TracingError(f"{describe(user_src())}\n  argnums {bad[0]} is out of range: "
                               f"{getattr(f, '__name__', 'f')} was called with {len(args)} positional arguments")
        wrt = []
        for i in nums:
            leaves, td = pytree.flatten(args[i])
            fresh = [_fresh(x) for x in leaves]
            wrt.append((td, fresh))
            args[i] = pytree.unflatten(td, fresh)
        result = f(*args, **kwargs)
        if has_aux and not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TracingError(f"{describe(user_src())}\n  has_aux=True needs f to return a pair (loss, aux), "
                               f"got {type(result).__name__}"
                               + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""))
        loss = result[0] if has_aux else result
        loss = loss if isinstance(loss, Tracer) else F.astype(loss, "float64")
        if loss.shape != () or loss.dtype not in P.FLOATS:
            raise TracingError(f"{describe(user_src())}\n  grad needs f to return a float scalar, "
                               f"got shape {loss.shape} dtype {loss.dtype}")
        cts = backward(loss, [x for _, xs in wrt for x in xs])
        it = iter(cts)
        grads = [pytree.unflatten(td, [next(it) for _ in xs]) for td, xs in wrt]
        return result, (grads[0] if isinstance(argnums, int) else tuple(grads))
    return vg


def _fresh(x):
    if not isinstance(x, Tracer):
        x = F.lift(x) if not isinstance(x, (int, float)) else F.astype(F.lift(float(x)), "float64")
    if x.dtype not in P.FLOATS:
        raise TracingError(f"{describe(user_src())}\n  grad w.r.t. a {x.dtype} value; only float inputs "
                           "have gradients")
    return bind("id", [x])


def backward(out, wrt):
    """Cotangents of scalar `out` w.r.t. each Tracer in `wrt` (zeros where out does not depend on it)."""
    if not wrt:  # e.g. grad with respect to an empty dict
        return []
    graph = out.trace.graph
    wrt_nodes = {x.node for x in wrt}
    # Nodes on a path from wrt. Node ids grow while tracing, so id order is topological.
    live = set(wrt_nodes)
    for n in range(min(wrt_nodes), graph._next):
        if n in graph.nx and any(o in live for o in graph.operands(n)):
            live.add(n)
    if region.recording(out):  # a scalar loss: its region's records are walked back in place
        seeds = region.backward(out, lambda nodes: [n in live for n in nodes])
    else:
        seeds = {out.node: F.ones_like(out)}
    ct = {n: c for n, c in seeds.items() if n in live}
    needed = set(ct)
    rules = out.trace.custom_vjps
    for n in range(max(ct, default=-1), min(wrt_nodes) - 1, -1):
        if n in needed:
            needed.update(o for o in graph.operands(n) if o in live)
            if n in rules:  # the rule's cotangents go to the call's arguments, whatever fwd read
                needed.update(o for o in rules[n].arg_nodes() if o in live)
    active = live & needed
    tracers = {}

    def T(n):
        if n not in tracers:
            a = graph[n]
            tracers[n] = Tracer(out.trace, n, a["shape"], a["dtype"])
        return tracers[n]

    for n in sorted(active - wrt_nodes, reverse=True):  # wrt nodes keep their accumulated cotangent
        rule = rules.get(n)
        if rule is not None:  # the user's rule, for all of the call's outputs at once
            if n in ct or any(o.node in ct for o in rule.outs):
                for o, c in custom.cotangents(rule, ct, graph[n].get("src")).items():
                    if o in active:
                        ct[o] = ct[o] + c if o in ct else c
            continue
        g = ct.pop(n, None)
        a = graph[n]
        prim = P.PRIMITIVES[a["op"]]
        if g is None or prim.vjp is None:
            continue
        operands = graph.operands(n)
        needs = [o in active for o in operands]
        try:
            cts = prim.vjp(F, g, T(n), [T(o) for o in operands], needs, a["attrs"])
        except TracingError as e:  # a rule that refuses (allreduce's): name the op's line
            raise TracingError(f"{describe(a.get('src'))}\n  {e}") from None
        for o, c, need in zip(operands, cts, needs):
            if need and c is not None:
                ct[o] = ct[o] + c if o in ct else c
    return [F.zeros_like(x) if ct.get(x.node) is None else ct[x.node] for x in wrt]
