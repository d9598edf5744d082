"""Reverse mode through a loop node (control.py): the adjoint is a reverse scan over stored carries.

For `scan` and `fori_loop` with a fixed trip count n, the VJP of the loop node is two loops
traced into the same graph, each an ordinary loop node:
  1. residuals: the body replayed forward from the initial carry, stacking the carry that
     enters each iteration (n x the carry's size: all the adjoint needs, as every other value
     of an iteration is recomputed from it; `memory_plan()` shows it as that loop's vector);
  2. the adjoint: a scan in the opposite order whose carry is the cotangent of the carry (and
     the cotangents of the captured outer values, summed over iterations), and whose body
     replays one iteration from its stored carry and differentiates it (autodiff.backward of
     the sum of each output times its cotangent), stacking the cotangent of each row of xs.
The body is replayed by binding its graph's nodes again (`replay`), so the adjoint is built from
the registry's VJP rules like any other. Each iteration's forward runs three times (the loop
itself, the residual loop, the adjoint's replay): a cost in time traded for memory and for one
mechanism; while_loop (no trip count) and carries of several dtypes refuse clearly.
"""

import numpy as np

from . import primitives as P
from .control import _loop, _unpack
from .errors import TracingError
from .tracer import bind, current_trace, describe, lift


def _scan(f, init, xs, body, role, reverse):
    """scan(f, init, xs, reverse=reverse), its loop node marked as made for `body`'s `role`."""
    return _loop(lambda i, c, x: f(c, x), init, xs, None, reverse, 0, body.src, "scan", role=role)


def replay(graph, args):
    """graph's outputs with its inputs bound to `args`, each node bound again in the current trace."""
    env = dict(zip(graph.inputs, args))
    for n in graph.topo():
        if n not in env:
            a = graph[n]
            env[n] = bind(a["op"], [env[o] for o in graph.operands(n)], **a["attrs"])
    return [env[o] for o in graph.outputs]


def vjp(F, g, out, operands, needs, attrs):
    body = attrs["body"]
    if body.length is None or body.dtype not in P.FLOATS:
        why = ("a while_loop has no trip count to reverse over; use fori_loop or scan with a fixed length"
               if body.length is None else
               "its carry and outputs mix dtypes (or are not floats); keep a differentiated loop's carry "
               "in one float dtype")
        raise TracingError(f"{describe(body.src)}\n  gradients through this loop are not supported: {why}")
    from .autodiff import backward
    nc, nx = body.n_carry, body.n_xs
    carry0, xs, caps = list(operands[:nc]), list(operands[nc:nc + nx]), list(operands[nc + nx:])
    cts = [_unpack(g, off, shape, d) for off, shape, d in body.leaves]
    if body.length == 0:
        return cts[:nc] + [F.zeros_like(x) for x in xs] + [None] * len(caps)
    index = lift(np.arange(body.start, body.start + body.length, dtype=np.int64))
    float_x = [k for k, x in enumerate(xs) if x.dtype in P.FLOATS]
    float_caps = [k for k, c in enumerate(caps) if c.dtype in P.FLOATS]

    def forward(c, row):
        i, x = row
        return tuple(replay(body.graph, list(c) + [i] + list(x) + caps)[:nc]), c
    _, carries = _scan(forward, tuple(carry0), (index, tuple(xs)), body, "residuals", body.reverse)

    def adjoint(acc, row):
        ct_carry, ct_caps = acc
        i, c, x, ct_y = row
        fresh = [bind("id", [current_trace().own(t)]) for t in list(c) + [x[k] for k in float_x]
                 + [caps[k] for k in float_caps]]
        c_in, rest = fresh[:nc], iter(fresh[nc:])
        x_in = [next(rest) if k in float_x else v for k, v in enumerate(x)]
        cap_in = [next(rest) if k in float_caps else v for k, v in enumerate(caps)]
        outs = replay(body.graph, c_in + [i] + x_in + cap_in)
        loss = sum(F.sum(o * w) for o, w in zip(outs, list(ct_carry) + list(ct_y)))
        grads = backward(loss, fresh)
        d_caps = tuple(a + d for a, d in zip(ct_caps, grads[nc + len(float_x):]))
        return (tuple(grads[:nc]), d_caps), tuple(grads[nc:nc + len(float_x)])
    zeros = tuple(F.zeros_like(caps[k]) for k in float_caps)
    (ct_init, ct_caps), ct_xs = _scan(adjoint, (tuple(cts[:nc]), zeros),
                                      (index, carries, tuple(xs), tuple(cts[nc:])), body, "adjoint", not body.reverse)
    d_xs, d_caps = dict(zip(float_x, ct_xs)), dict(zip(float_caps, ct_caps))
    return list(ct_init) + [d_xs.get(k) for k in range(len(xs))] + [d_caps.get(k) for k in range(len(caps))]
