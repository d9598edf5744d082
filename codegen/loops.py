"""Loop nests over static index spaces, and affine maps from loop indices to element offsets.

An affine is `(const, coeffs)`: the value const + sum(coeffs[d] * i_d) over the loop indices.
Every data movement the kernels need (broadcast, transpose, slice, reshape of a contiguous
value, iota) is affine, so one kernel shape covers them all. `collapse` merges loop dimensions
that every affine walks contiguously, so an elementwise kernel over contiguous buffers becomes
one flat loop, the form the loop vectoriser likes best.
"""

from llvmlite import ir

from .types import I32, I64

INTERLEAVE = 4


def contiguous_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def identity_forms(shape):
    """Per-dimension affines of the loop indices over `shape` itself."""
    n = len(shape)
    return tuple((0, tuple(1 if k == d else 0 for k in range(n))) for d in range(n))


def dot(forms, strides, rank, const=0):
    """The affine const + sum(strides[d] * forms[d]) over `rank` loop indices."""
    c, coeffs = const, [0] * rank
    for (fc, fk), s in zip(forms, strides):
        c += fc * s
        for d, k in enumerate(fk):
            coeffs[d] += k * s
    return c, tuple(coeffs)


def collapse(sizes, affines):
    """(sizes', affines'): drop size-1 dimensions and merge neighbours every affine treats as one."""
    keep = [d for d, s in enumerate(sizes) if s != 1]
    sizes = [sizes[d] for d in keep]
    coeffs = [[k[d] for d in keep] for _, k in affines]
    d = len(sizes) - 2
    while d >= 0:
        if all(k[d] == k[d + 1] * sizes[d + 1] for k in coeffs):
            sizes[d:d + 2] = [sizes[d] * sizes[d + 1]]
            for k in coeffs:
                k[d:d + 2] = [k[d + 1]]
        d -= 1
    return sizes, [(c, tuple(k)) for (c, _), k in zip(affines, coeffs)]


def evaluate(b, affine, idx):
    """The affine as an i64 value at loop indices `idx`."""
    c, coeffs = affine
    acc = None
    for k, i in zip(coeffs, idx):
        if k:
            term = i if k == 1 else b.mul(i, I64(k))
            acc = term if acc is None else b.add(acc, term)
    if acc is None:
        return I64(c)
    return b.add(acc, I64(c)) if c else acc


def nest(b, sizes, body, carried=(), interleave=False):
    """Loops i_0 < sizes[0], ... (all sizes >= 1) around body(idx, carried) -> new carried values.

    Loop-carried values (reduction accumulators) start as `carried`; the values after the last
    iteration are returned. With no sizes, body runs once in the current block. `interleave`
    asks the vectoriser to keep INTERLEAVE vector iterations of the innermost loop in flight:
    its own cost model picks 1 for long fused bodies, which then run latency-bound (a fused
    chain of 18 tanh ran 3x slower than the same ops unfused). Outer loops are never unrolled:
    that copied whole inner loops, so object code and O3 time grew with the trip counts (BurTorch's
    GPT at batch 64: 27 s to compile before, 6 s after, steps no slower).
    """
    if not sizes:
        return list(body([], list(carried)))
    return _level(b, sizes, 0, [], body, list(carried), interleave)


def _loop_id(module, hint):
    """A fresh self-referential loop ID carrying one hint: `interleave` asks for INTERLEAVE-way
    interleaving, `no unroll` forbids unrolling."""
    node = ([ir.MetaDataString(module, "llvm.loop.interleave.count"), I32(INTERLEAVE)] if hint == "interleave"
            else [ir.MetaDataString(module, "llvm.loop.unroll.disable")])
    hint = module.add_metadata(node)
    tag = module.add_metadata([ir.MetaDataString(module, f"burjit.loop.{len(module.metadata)}")])
    md = module.add_metadata([tag, hint])
    md.operands = (md, tag, hint)  # LLVM ignores a loop ID whose first operand is not itself
    return md


def _level(b, sizes, d, idx, body, carried, interleave):
    pre = b.block
    loop = b.append_basic_block(f"l{d}")
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(I64, name=f"i{d}")
    i.add_incoming(I64(0), pre)
    phis = []
    for v in carried:
        p = b.phi(v.type)
        p.add_incoming(v, pre)
        phis.append(p)
    inner = idx + [i]
    innermost = d + 1 == len(sizes)
    if innermost:
        new = list(body(inner, phis))
    else:
        new = _level(b, sizes, d + 1, inner, body, phis, interleave)
    nxt = b.add(i, I64(1), flags=("nuw", "nsw"))
    latch = b.block
    exit_ = b.append_basic_block(f"x{d}")
    br = b.cbranch(b.icmp_unsigned("<", nxt, I64(sizes[d])), loop, exit_)
    if interleave and innermost:
        br.set_metadata("llvm.loop", _loop_id(b.module, "interleave"))
    elif not innermost:  # unrolled outer loops copy whole inner loops: code (and O3 time) grew with
        br.set_metadata("llvm.loop", _loop_id(b.module, "no unroll"))  # trip counts, for no speed
    i.add_incoming(nxt, latch)
    for p, v in zip(phis, new):
        p.add_incoming(v, latch)
    b.position_at_end(exit_)
    return new
