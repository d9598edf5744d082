"""`custom_vjp`: a function whose gradient is the user's rule, not that of its recorded ops.

JAX's semantics: `f = custom_vjp(fun)`, `f.defvjp(fwd, bwd)` with fwd(*args) -> (out, residuals)
and bwd(residuals, out_cotangent) -> one cotangent per argument (a tuple; None for none). Under
a trace, calling f records fwd's ops like any others (so they compile and fuse with the rest)
and marks each output leaf by a fresh `id` node; grad's walk (autodiff.backward) meets those
nodes first and calls bwd once for all of them, instead of walking into fwd's ops. In a loop
body the rules go with the body (control.Body.rules): reverse mode replays an iteration's graph
and rebinds them to the replayed nodes (`Rule.rebound`). Outside a trace, f runs fun on the
reference backend (as grad does).
"""

import functools

from . import ops as F
from . import pytree
from .errors import TracingError
from .tracer import Tracer, bind, current_trace, describe, lift, user_src

__all__ = ["custom_vjp"]


class Rule:
    """One call's backward: bwd, its residuals, the arguments and the marked outputs (traced
    leaves all graph values of the call's trace, `graph_values`)."""

    def __init__(self, trace, bwd, residuals, args, outs, out_tree):
        self.trace, self.bwd, self.residuals, self.args, self.outs, self.out_tree = \
            trace, bwd, residuals, args, outs, out_tree
        for o in outs:
            trace.custom_vjps[o.node] = self

    def arg_nodes(self):
        return [x.node for x in pytree.flatten(self.args)[0] if isinstance(x, Tracer)]

    def rebound(self, env):
        """This rule over a replay of its trace's graph (loop_reverse.replay): each value of
        its trace taken to env[its node], so bwd reads the replayed residuals."""
        new = lambda t: env[t.node] if isinstance(t, Tracer) and t.trace is self.trace else t  # noqa: E731
        return Rule(current_trace(), self.bwd, pytree.tree_map(new, self.residuals), pytree.tree_map(new, self.args),
                    [new(o) for o in self.outs], self.out_tree)


def graph_values(trace, tree):
    """tree with each traced leaf a graph node of `trace`: a loop body's own input for a captured
    value; a scalar region's value exported (before fwd runs, so an argument's node precedes the
    marks grad's walk reaches first; and a loop body's regions are sealed before a replay)."""
    def value(t):
        if not isinstance(t, Tracer):
            return t
        t = trace.own(t)
        return Tracer(trace, t.node, t.shape, t.dtype)
    return pytree.tree_map(value, tree)


class custom_vjp:
    def __init__(self, fun):
        functools.update_wrapper(self, fun)
        self.fun, self.fwd, self.bwd = fun, None, None

    def defvjp(self, fwd, bwd):
        self.fwd, self.bwd = fwd, bwd
        return self

    def __call__(self, *args):
        trace = current_trace()
        if trace is None:  # as grad outside a trace: run fun on the reference backend
            from .jit import compile as _compile
            return _compile(self.fun, backend="reference")(*args)
        name = getattr(self.fun, "__name__", "custom_vjp")
        if self.fwd is None:
            raise TracingError(f"{describe(user_src())}\n  {name}: custom_vjp needs defvjp(fwd, bwd) before a call")
        args = graph_values(trace, args)
        result = self.fwd(*args)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TracingError(f"{describe(user_src())}\n  {name}: fwd must return (output, residuals)")
        out, residuals = result
        residuals = graph_values(trace, residuals)
        leaves, out_tree = pytree.flatten(out)
        outs = [bind("id", [lift(x)]) for x in leaves]
        Rule(trace, self.bwd, residuals, args, outs, out_tree)
        return pytree.unflatten(out_tree, outs)


def cotangents(rule, ct, src):
    """bwd's cotangents as {argument leaf node: cotangent}, the output cotangents taken out of
    `ct` (zeros for an output nothing used)."""
    gs = [ct.pop(o.node, None) for o in rule.outs]
    gs = [F.zeros_like(o) if g is None else g for o, g in zip(rule.outs, gs)]
    cts = rule.bwd(rule.residuals, pytree.unflatten(rule.out_tree, gs))
    if not isinstance(cts, (tuple, list)) or len(cts) != len(rule.args):
        raise TracingError(f"{describe(src)}\n  custom_vjp: bwd must return a tuple of {len(rule.args)} "
                           f"cotangent(s), one per argument, got {type(cts).__name__}")
    out = {}
    for arg, c in zip(rule.args, cts):
        if c is None:
            continue
        a_leaves, a_tree = pytree.flatten(arg)
        c_leaves, c_tree = pytree.flatten(c)
        if c_tree != a_tree:
            raise TracingError(f"{describe(src)}\n  custom_vjp: a cotangent's structure differs from its argument's")
        for x, g in zip(a_leaves, c_leaves):
            if not isinstance(x, Tracer):
                continue
            g = lift(g, x)
            if g.shape != x.shape:
                raise TracingError(f"{describe(src)}\n  custom_vjp: a cotangent of shape {g.shape} for an argument "
                                   f"of shape {x.shape}")
            out[x.node] = out[x.node] + g if x.node in out else g
    return out
