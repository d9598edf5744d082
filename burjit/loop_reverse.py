"""Reverse mode through a loop node (control.py): the adjoint is a reverse scan over stored carries.

For `scan` and `fori_loop` with a fixed trip count n, the VJP of the loop node:
  1. residuals: the loop itself is made to store the carry entering each iteration, stacked
     after its own outputs (n x the carry's size: all the adjoint needs, as every other value
     of an iteration is recomputed from it; `memory_plan()["loops"]` states the bytes);
  2. the adjoint: a scan in the opposite order whose carry is the cotangent of the carry (and
     the cotangents of the captured outer values, summed over iterations), and whose body
     replays one iteration from its stored carry and differentiates it (autodiff.backward of
     the sum of each output times its cotangent), stacking the cotangent of each row of xs.
The body is replayed by binding its graph's nodes again (`replay`), so the adjoint is built from
the registry's VJP rules like any other. Each iteration's forward so runs twice (the loop, the
adjoint's replay): time traded for memory, with one mechanism; while_loop (no trip count) and
carries of several dtypes refuse clearly.
"""

import numpy as np

from . import primitives as P
from . import region
from .control import Body, _loop, _unpack, layout
from .errors import TracingError
from .tracer import Tracer, bind, current_trace, describe, lift


def _stored_carries(out):
    """The carry entering each iteration of loop node `out`, stacked by row: the loop itself is
    made to store them, as more outputs of its body (the carry inputs) after its own, so the
    slices that read its vector stay valid. A second gradient of the same loop reuses them."""
    graph, node = out.trace.graph, out.node
    body = graph[node]["attrs"]["body"]
    if body.stored is None:
        nc, g = body.n_carry, body.graph.annotated()  # its nodes may be another loop node's too (a replayed body's)
        g.outputs = g.outputs + g.inputs[:nc]
        leaves = body.leaves + layout([(body.length,) + shape for _, shape, _ in body.leaves[:nc]],
                                      [d for _, _, d in body.leaves[:nc]], body.dtype, body.size)
        stored = Body(g, body.length, body.start, body.reverse, nc, body.n_xs, body.dtype, leaves, body.src, body.role)
        stored.stored = len(body.leaves)
        graph[node]["attrs"] = {**graph[node]["attrs"], "body": stored}
        graph[node]["shape"] = (stored.size,)
        body = stored
    vec = Tracer(out.trace, node, (body.size,), body.dtype)
    return tuple(_unpack(vec, off, shape, d) for off, shape, d in body.leaves[body.stored:])


def replay(graph, args):
    """graph's outputs with its inputs bound to `args`, each node bound again in the current trace."""
    env = dict(zip(graph.inputs, args))
    for n in graph.topo():
        if n not in env:
            a = graph[n]
            operands = [env[o] for o in graph.operands(n)]
            # a scalar region's records name nodes of the graph they were traced in: bind them one by one
            env[n] = region.rebind(a["attrs"], operands) if a["op"] == "region" else bind(a["op"], operands, **a["attrs"])
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
    xs, caps = list(operands[nc:nc + nx]), list(operands[nc + nx:])
    cts = [_unpack(g, off, shape, d) for off, shape, d in body.leaves]
    if body.length == 0:
        return cts[:nc] + [F.zeros_like(x) for x in xs] + [None] * len(caps)
    index = lift(np.arange(body.start, body.start + body.length, dtype=np.int64))
    float_x = [k for k, x in enumerate(xs) if x.dtype in P.FLOATS]
    float_caps = [k for k, c in enumerate(caps) if c.dtype in P.FLOATS]

    carries = _stored_carries(out)

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
    (ct_init, ct_caps), ct_xs = _loop(lambda i, c, x: adjoint(c, x), (tuple(cts[:nc]), zeros),
                                      (index, carries, tuple(xs), tuple(cts[nc:])), None, not body.reverse, 0,
                                      body.src, "scan", role="adjoint")
    d_xs, d_caps = dict(zip(float_x, ct_xs)), dict(zip(float_caps, ct_caps))
    return list(ct_init) + [d_xs.get(k) for k in range(len(xs))] + [d_caps.get(k) for k in range(len(caps))]
