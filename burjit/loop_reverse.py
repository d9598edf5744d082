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
adjoint's replay): time traded for memory, with one mechanism; while_loop (no trip count)
refuses clearly. A loop whose leaves mix dtypes holds them as raw words (control.PACKED), which
cannot carry sums of cotangents: its cotangent is a float64 vector instead, leaf elements at
CT_SLOTS times their word offset (`_bitcast_vjp` writes it, `_cotangents` reads it); only float
leaves have cotangents.
"""

import numpy as np

from . import primitives as P
from . import region
from .control import PACKED, Body, _loop, _unpack, layout
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
        stored.stored, stored.rules = len(body.leaves), body.rules
        graph[node]["attrs"] = {**graph[node]["attrs"], "body": stored}
        graph[node]["shape"] = (stored.size,)
        body = stored
    vec = Tracer(out.trace, node, (body.size,), body.dtype)
    return tuple(_unpack(vec, off, shape, d) for off, shape, d in body.leaves[body.stored:])


def replay(graph, args, rules):
    """graph's outputs with its inputs bound to `args`, each node bound again in the current
    trace, and its custom_vjp `rules` ({node: rule}) rebound to the new nodes."""
    env = dict(zip(graph.inputs, args))
    for n in graph.topo():
        if n not in env:
            a = graph[n]
            operands = [env[o] for o in graph.operands(n)]
            # a scalar region's records name nodes of the graph they were traced in: bind them one by one
            env[n] = region.rebind(a["attrs"], operands) if a["op"] == "region" else bind(a["op"], operands, **a["attrs"])
    for rule in {id(r): r for r in rules.values()}.values():
        rule.rebound(env)
    return [env[o] for o in graph.outputs]


CT_SLOTS = 8 // min(P.ITEMSIZE[d] for d in P.FLOATS)  # a packed word holds at most this many float elements


def _cotangents(F, g, body):
    """Each leaf's cotangent read from the loop's cotangent vector `g` (None for a leaf that is not a float)."""
    if body.dtype != PACKED:
        return [_unpack(g, off, shape, d) if d in P.FLOATS else None for off, shape, d in body.leaves]
    return [F.astype(_unpack(g, CT_SLOTS * off, shape, "float64"), d) if d in P.FLOATS else None
            for off, shape, d in body.leaves]


def bitcast_vjp(F, g, out, xs, needs, attrs):
    """A packed leaf's cotangent placed in its loop's float64 cotangent vector (module docstring)."""
    if attrs["dtype"] not in P.FLOATS:
        return [None]
    at, n, size = CT_SLOTS * attrs["start"], g.size, CT_SLOTS * xs[0].shape[0]
    parts = [F.zeros_like(g, "float64", (at,)), F.reshape(F.astype(g, "float64"), (n,)),
             F.zeros_like(g, "float64", (size - at - n,))]
    return [F.concatenate([p for p in parts if p.shape[0]])]


def vjp(F, g, out, operands, needs, attrs):
    body = attrs["body"]
    if body.length is None:
        raise TracingError(f"{describe(body.src)}\n  gradients through this loop are not supported: a while_loop "
                           "has no trip count to reverse over; use fori_loop or scan with a fixed length")
    from .autodiff import backward
    nc, nx = body.n_carry, body.n_xs
    xs, caps = list(operands[nc:nc + nx]), list(operands[nc + nx:])
    cts = _cotangents(F, g, body)
    if body.length == 0:
        return cts[:nc] + [F.zeros_like(x) if x.dtype in P.FLOATS else None for x in xs] + [None] * len(caps)
    index = lift(np.arange(body.start, body.start + body.length, dtype=np.int64))
    float_c = [k for k in range(nc) if cts[k] is not None]
    float_y = [k for k in range(nc, len(cts)) if cts[k] is not None]
    float_x = [k for k, x in enumerate(xs) if x.dtype in P.FLOATS]
    float_caps = [k for k, c in enumerate(caps) if c.dtype in P.FLOATS]

    carries = _stored_carries(out)

    def adjoint(acc, row):
        ct_carry, ct_caps = acc
        i, c, x, ct_y = row
        fresh = [bind("id", [current_trace().own(t)]) for t in [c[k] for k in float_c] + [x[k] for k in float_x]
                 + [caps[k] for k in float_caps]]
        rest = iter(fresh)
        c_in = [next(rest) if k in float_c else v for k, v in enumerate(c)]
        x_in = [next(rest) if k in float_x else v for k, v in enumerate(x)]
        cap_in = [next(rest) if k in float_caps else v for k, v in enumerate(caps)]
        outs = replay(body.graph, c_in + [i] + x_in + cap_in, body.rules)
        loss = sum(F.sum(outs[k] * w) for k, w in zip(float_c + float_y, list(ct_carry) + list(ct_y)))
        grads = backward(loss, fresh)
        nf, nfx = len(float_c), len(float_x)
        d_caps = tuple(a + d for a, d in zip(ct_caps, grads[nf + nfx:]))
        return (tuple(grads[:nf]), d_caps), tuple(grads[nf:nf + nfx])
    zeros = tuple(F.zeros_like(caps[k]) for k in float_caps)
    (ct_init, ct_caps), ct_xs = _loop(lambda i, c, x: adjoint(c, x), (tuple(cts[k] for k in float_c), zeros),
                                      (index, carries, tuple(xs), tuple(cts[k] for k in float_y)), None,
                                      not body.reverse, 0, body.src, "scan", role="adjoint")
    d_init, d_xs, d_caps = dict(zip(float_c, ct_init)), dict(zip(float_x, ct_xs)), dict(zip(float_caps, ct_caps))
    return ([d_init.get(k) for k in range(nc)] + [d_xs.get(k) for k in range(len(xs))]
            + [d_caps.get(k) for k in range(len(caps))])
