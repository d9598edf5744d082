"""Kernels that are not one affine loop nest: gather (take) and scatter_add, pad, concatenate.

take/scatter rows are contiguous runs of R elements, so each index moves a row with a
vectorisable inner loop. `check` (a callable emitting `return code if cond`) is given when
the index operand is computed inside the step and so could not be checked up front.
"""

from . import loops
from .emitter import Emitter
from .program import Program
from .types import I64, REG, const


def _row(b, e, idx_ptr, idx_dtype, p, n, check):
    row = e.cast(e.load(idx_ptr, idx_dtype, p), "int64")
    if check is not None:
        check(b, b.or_(b.icmp_signed("<", row, I64(0)), b.icmp_signed(">=", row, I64(n))))
    return row


def take(b, ptrs, dtype, idx_dtype, count, row_len, n, check):
    """out[p, r] = table[idx[p], r] for p < count, r < row_len."""
    table, idx, out = ptrs
    e = Emitter(b)

    def per_index(pi, _):
        p = pi[0]
        row = b.mul(_row(b, e, idx, idx_dtype, p, n, check), I64(row_len))
        dst = b.mul(p, I64(row_len))
        loops.nest(b, [row_len], lambda r, __: (e.store(e.load(table, dtype, b.add(row, r[0])), out, dtype,
                                                         b.add(dst, r[0])), ())[1])
        return ()
    if count and row_len:
        loops.nest(b, [count], per_index)


def scatter_add(b, ptrs, dtype, idx_dtype, count, row_len, n, check):
    """out = zeros(n, row_len); out[idx[p], r] += updates[p, r]."""
    updates, idx, out = ptrs
    e = Emitter(b)
    if not n * row_len:
        return
    loops.nest(b, [n * row_len], lambda i, _: (e.store(const(REG[dtype], 0), out, dtype, i[0]), ())[1])

    def per_index(pi, _):
        p = pi[0]
        row = b.mul(_row(b, e, idx, idx_dtype, p, n, check), I64(row_len))
        src = b.mul(p, I64(row_len))

        def add(r, __):
            at = b.add(row, r[0])
            e.store(e.add(e.load(out, dtype, at), e.load(updates, dtype, b.add(src, r[0]))), out, dtype, at)
            return ()
        loops.nest(b, [row_len], add)
        return ()
    if count and row_len:
        loops.nest(b, [count], per_index)


def pad_programs(ctx, node):
    """Zero the output, then write the operand at positions start + step * i."""
    g = ctx.graph
    a = g[node]
    (x,) = g.operands(node)
    out, dtype = ctx.ref(node), a["dtype"]
    zero = Program(ctx, a["shape"])
    zero.store(out, dtype, zero.constant(dtype, 0))
    put = Program(ctx, g[x]["shape"])
    forms = tuple((st, tuple(sp if k == d else 0 for k in range(len(a["shape"]))))
                  for d, (st, sp) in enumerate(zip(a["attrs"]["starts"], a["attrs"]["steps"])))
    put.store(out, dtype, put.value(x), loops.dot(forms, loops.contiguous_strides(a["shape"]), put.rank))
    return [zero, put]


def concatenate_programs(ctx, node):
    """Copy each operand into its slab of the output along the axis."""
    g = ctx.graph
    a = g[node]
    axis, strides = a["attrs"]["axis"], loops.contiguous_strides(a["shape"])
    out, offset, programs = ctx.ref(node), 0, []
    for x in g.operands(node):
        p = Program(ctx, g[x]["shape"])
        p.store(out, a["dtype"], p.value(x), loops.dot(p.identity, strides, p.rank, offset * strides[axis]))
        programs.append(p)
        offset += g[x]["shape"][axis]
    return programs
