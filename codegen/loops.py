"""Loop nests (trip counts constant, or passed to the kernel at run time), and affine maps from
loop indices to element offsets.

An affine is `(const, coeffs)`: the value const + sum(coeffs[d] * i_d) over the loop indices.
Every data movement the kernels need (broadcast, transpose, slice, reshape of a contiguous
value, iota) is affine, so one kernel shape covers them all. `collapse` merges loop dimensions
that every affine walks contiguously, so an elementwise kernel over contiguous buffers becomes
one flat loop, the form the loop vectoriser likes best.
"""

from llvmlite import ir

from .types import I1, I32, I64, i64

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


def collapse(sizes, affines, keep_first=False):
    """(sizes', affines'): drop size-1 dimensions (but the first if keep_first, so that a leading
    batch of 1 keeps the form larger batches have) and merge neighbours every affine treats as one."""
    keep = [d for d, s in enumerate(sizes) if s != 1 or (keep_first and d == 0)]
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


def nest(b, sizes, body, carried=(), interleave=False, across=False, unroll=False):
    """Loops i_0 < sizes[0], ... around body(idx, carried) -> new carried values; each size is an
    int >= 1 or an i64 value known at run time (a loop that may then run 0 times).

    Loop-carried values (reduction accumulators) start as `carried`; the values after the last
    iteration are returned. With no sizes, body runs once in the current block. `interleave`
    asks the vectoriser to keep INTERLEAVE vector iterations of the innermost loop in flight:
    its own cost model picks 1 for long fused bodies, which then run latency-bound (a fused
    chain of 18 tanh ran 3x slower than the same ops unfused). Outer loops (with loops inside,
    the nest's own or the body's) are never unrolled (that made BurTorch's GPT at batch 64 take
    27 s to compile, against 6 s, for steps no faster) and, unless `across`, never vectorised
    (_loop_id). A reduction's accumulating loops go `across`: their sums split over lanes, which
    float32 totals rely on for their accuracy (program.py). `unroll` lets LLVM unroll them all
    the same, for a loop around a few trips that LLVM flattens, which is then the innermost loop
    in all but name: a product's columns past its last register block (matmul.py; forbidden,
    BurTorch's GPT float32 steps ran 12% more instructions at batch 1, 21% at batch 16).
    """
    if not sizes:
        return list(body([], list(carried)))
    return _level(b, sizes, 0, [], body, list(carried), interleave, "no unroll" if across else
                  "no vectorise" if unroll else "outer")


def _loop_id(module, hint):
    """A fresh self-referential loop ID: `interleave` asks for INTERLEAVE-way interleaving;
    `no unroll` forbids unrolling, `no vectorise` vectorising, `outer` both. A vectorised outer loop
    (once its inner loops are fully unrolled: a layer norm's rows of 24) gathers across rows:
    one such kernel took LLVM 250 ms and 5 kB of code, against 17 ms and 768 bytes vectorised
    along the row."""
    no_unroll = [ir.MetaDataString(module, "llvm.loop.unroll.disable")]
    no_vectorise = [ir.MetaDataString(module, "llvm.loop.vectorize.enable"), I1(0)]
    nodes = {"interleave": [[ir.MetaDataString(module, "llvm.loop.interleave.count"), I32(INTERLEAVE)]],
             "no unroll": [no_unroll], "no vectorise": [no_vectorise], "outer": [no_unroll, no_vectorise]}[hint]
    hints = [module.add_metadata(n) for n in nodes]
    tag = module.add_metadata([ir.MetaDataString(module, f"burjit.loop.{len(module.metadata)}")])
    md = module.add_metadata([tag, *hints])
    md.operands = (md, tag, *hints)  # LLVM ignores a loop ID whose first operand is not itself
    return md


def _level(b, sizes, d, idx, body, carried, interleave, outer):
    pre = b.block
    loop = b.append_basic_block(f"l{d}")
    size = sizes[d]
    run_time = isinstance(size, ir.Value)
    if run_time:  # a count of 0 skips the loop
        exit_ = b.append_basic_block(f"x{d}")
        b.cbranch(b.icmp_unsigned("==", size, I64(0)), exit_, loop)
    else:
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
        new = _level(b, sizes, d + 1, inner, body, phis, interleave, outer)
    nxt = b.add(i, I64(1), flags=("nuw", "nsw"))
    latch = b.block
    if not run_time:
        exit_ = b.append_basic_block(f"x{d}")
    br = b.cbranch(b.icmp_unsigned("!=" if run_time else "<", nxt, i64(size)), loop, exit_)
    if latch is not loop:  # loops inside, this nest's or the body's own
        br.set_metadata("llvm.loop", _loop_id(b.module, outer))
    elif interleave:
        br.set_metadata("llvm.loop", _loop_id(b.module, "interleave"))
    i.add_incoming(nxt, latch)
    for p, v in zip(phis, new):
        p.add_incoming(v, latch)
    b.position_at_end(exit_)
    if run_time:  # after no trips, the carried values are the initial ones
        merged = []
        for c, v in zip(carried, new):
            m = b.phi(v.type)
            m.add_incoming(c, pre)
            m.add_incoming(v, latch)
            merged.append(m)
        new = merged
    return new
