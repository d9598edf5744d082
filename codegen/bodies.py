"""Loop nodes (burjit/control.py) in the driver: the body is a step of its own, called once per iteration.

A loop body is planned and lowered like a step (native.py's _Lowered: its own passes, plan,
arena and kernels); its step function is emitted into the driver's module (named for the step
and the loop node) and its kernels join the step's. The body's arena is an array of its own,
its address written into this step's arena (`Lowering.loop_slots`), so no object code holds a
process address. The driver copies the initial carry into the loop node's vector, points the
body's argv at it (carry inputs and outputs alike: the body updates its carry in place,
graph.aliases), at the index and at each capture, then per iteration stores the index, points
argv at row i of each xs and ys leaf and calls the body; a nonzero code from the body (an index
out of range) returns at once, as `Lowering.errors` maps it.
"""

import math

from llvmlite import ir

from burjit.primitives import ITEMSIZE

from .types import I8, I32, I64, MEM, declare, is_float

PTR = ir.PointerType()


def argv_bytes(body):
    """Arena bytes a loop needs for its body's argv and the index it passes."""
    return 8 * (body.arena_slot + 1) + 8


def emit(low, b, node):
    """The driver code of loop node `node` of Lowering `low`, at builder b."""
    g, spec, body = low.graph, low.graph[node]["attrs"]["body"], low.bodies[node]
    if len(spec.graph.outputs) != len(spec.leaves):  # a broken invariant must not write past the vector
        raise AssertionError(f"loop {node}: its body has {len(spec.graph.outputs)} outputs for {len(spec.leaves)} leaves")
    size = ITEMSIZE[spec.dtype]
    vec = low._main_ptr(b, low.ref(node))
    operands = g.operands(node)
    nc, nx = spec.n_carry, spec.n_xs
    until = spec.length is None  # a while loop: operand nc holds cond(init), its flag ends the vector
    argv = low._main_ptr(b, ("arg", low.arena_slot, low.loop_argv[node]))
    index = b.gep(argv, [I64(8 * (body.arena_slot + 1))], source_etype=I8)

    def at(p, k):
        return b.gep(p, [I64(k)], source_etype=I8) if k else p

    def put(k, ptr):
        b.store(ptr, b.gep(argv, [I64(k)], source_etype=PTR))

    def nonzero(ptr):  # the while flag, in its leaf's dtype
        v = b.load(ptr, typ=MEM[spec.leaves[-1][2]])
        return b.fcmp_ordered("!=", v, v.type(0)) if is_float(v.type) else b.icmp_unsigned("!=", v, v.type(0))
    for k in range(nc):
        off = spec.leaves[k][0]
        carry = at(vec, off * size)
        low._memcpy(b, carry, low._main_ptr(b, low.ref(operands[k])), g.nbytes(operands[k]))
        put(k, carry)
        put(body.n_in + k, carry)
    put(nc, index)
    for c, operand in enumerate(operands[nc + nx + until:]):
        put(nc + 1 + nx + c, low._main_ptr(b, low.ref(operand)))
    put(body.arena_slot, b.load(low._main_ptr(b, ("arg", low.arena_slot, low.loop_slots[node])), typ=PTR))
    step = declare(low.mod, _add_body(low, node, body), I32, [PTR])
    if spec.length == 0:
        return
    xs = [(low._main_ptr(b, low.ref(x)), g.nbytes(x) // spec.length) for x in operands[nc:nc + nx]]
    ys = [(at(vec, off * size), ITEMSIZE[d] * math.prod(shape[1:])) for off, shape, d in spec.leaves[nc:]]
    flag = ys[0][0] if until else None
    if until:
        put(body.n_in + nc, flag)
    fn = b.function
    start, loop, done = b.block, fn.append_basic_block("loop"), fn.append_basic_block("loop_done")
    if until:
        b.cbranch(nonzero(low._main_ptr(b, low.ref(operands[nc]))), loop, done)
    else:
        b.branch(loop)
    b.position_at_end(loop)
    k = b.phi(I64)
    k.add_incoming(I64(0), start)
    i = b.sub(I64(spec.length - 1), k) if spec.reverse else k
    b.store(b.add(i, I64(spec.start)), index)
    for j, (base, row) in enumerate(xs):
        put(nc + 1 + j, b.gep(base, [b.mul(i, I64(row))], source_etype=I8))
    for j, (base, row) in enumerate([] if until else ys):
        put(body.n_in + nc + j, b.gep(base, [b.mul(i, I64(row))], source_etype=I8))
    rc = b.call(step, [argv])
    # body error e is this step's error code + e - 1
    low._fail_if(b, b.icmp_unsigned("!=", rc, I32(0)), b.add(rc, I32(low.loop_errors[node] - 1)))
    more = b.add(k, I64(1))
    k.add_incoming(more, b.block)
    b.cbranch(nonzero(flag) if until else b.icmp_unsigned("<", more, I64(spec.length)), loop, done)
    b.position_at_end(done)


def _add_body(low, node, body):
    """The symbol of `body`'s step function, emitted into `low`'s module (compiled with the
    driver: a module of its own cost a compile server ~20 ms on a cold start), its kernels
    added to `low`'s."""
    symbol = f"{low.symbol}_loop{node}"
    body.module(*low._target, symbol=symbol, into=low.mod)
    low.inline += body.inline
    for k, k_text in body.kernels.items():
        low.add_kernel(k, k_text, body.calls[k])
    return symbol
