"""Matrix product C[b] = A[b] @ B[b] for row-major A (M x K), B (K x N): register-blocked.

The core computes an MR x NR block of C in vector registers (NR = NV vectors of W lanes):
per k it loads NV vectors of B's row k, broadcasts MR elements of A's column k and issues
MR * NV FMAs, so each loaded element is used MR or NV times. K is split into blocks of KC
(the full ones in one loop, so code does not grow with K) and rows into panels of MC: a
panel of A (MC x KC, in L2) meets every strip of B (KC x NR, in L1) in turn, and each strip
serves the whole panel before the next is loaded. Rows and columns that do not fill a block
go through a plain i-k-j loop (vectorised by LLVM along j), which is also what tiny
products use. The batch count and M may be values passed at run time (lowering.py), so that
one function serves every batch size; the code around them is then the general case.
"""

from llvmlite import ir

from . import loops
from .emitter import Emitter
from .engine import vector_bytes
from .types import I32, I64, ITEMSIZE, REG, const, declare, i64, mangle

MR = 4
KC = 256
MC = 64


def _layout(dtype, N):
    """(W, NV): lanes per vector and vectors per block row for N columns on this host. Blocks
    that fill N's columns exactly come first (two vectors, or three with 32 vector registers,
    or one; of the widest vectors, else of half as wide): a column left over goes to the i-k-j
    loop, which ran 1.5-2x slower on BurTorch's GPT products of 24 columns, and is more code."""
    widest = vector_bytes() // ITEMSIZE[dtype]
    while widest > 1 and widest > N:
        widest //= 2
    for w in (widest, widest // 2) if widest > 2 else (widest,):
        for nv in (2, 3, 1) if vector_bytes() == 64 else (2, 1):
            if N % (nv * w) == 0:
                return w, nv
    return widest, (2 if N >= 2 * widest else 1)


def matmul(b, ptrs, dtype, batch, M, K, N):
    """batch: an int, or an i64 value of at least 1; M: an int, or an i64 value of at least MR;
    K and N: ints."""
    A, B, C = ptrs
    if not (batch and M and N):
        return
    W, NV = _layout(dtype, N)
    NR = W * NV
    rows = isinstance(M, ir.Value)
    Nb = N // NR * NR if W > 1 and K and (rows or M >= MR) else 0
    # With one block along K, rows M - MR.. M go in a last register block, which may overlap
    # the one before: the rows they share are computed alike and written twice, the same. With
    # more, C accumulates, so the rows that fill no block go through _ikj instead.
    overlap = rows and K <= KC
    Mb = (b.mul(b.udiv(b.add(M, I64(MR - 1)) if overlap else M, I64(MR)), I64(MR)) if rows
          else M // MR * MR if Nb else 0)
    e = Emitter(b)

    def one(bi):
        a0, b0, c0 = (I64(0),) * 3 if bi is None else (b.mul(bi, I64(n)) for n in (M * K, K * N, M * N))
        if Nb and (rows or Mb):
            def blocks(k0, kc):
                _blocks(b, e, (A, B, C), (a0, b0, c0), dtype, W, NV, Mb, Nb, K, N, k0, kc,
                        b.sub(M, I64(MR)) if overlap else None)
            full, rest = divmod(K, KC)
            if full > 1:  # one copy of the block code for all full K blocks: IR not growing with K
                loops.nest(b, [full], lambda kb, _: (blocks(b.mul(kb[0], I64(KC)), KC), ())[1])
            elif full:
                blocks(0, KC)
            if rest:
                blocks(full * KC, rest)
        if Nb < N:
            _ikj(b, e, (A, B, C), (a0, b0, c0), dtype, (0, M), (Nb, N), K, N)
        if Nb and (rows and not overlap or not rows and Mb < M):
            _ikj(b, e, (A, B, C), (a0, b0, c0), dtype, (Mb, M), (0, Nb), K, N)
    if batch == 1:
        one(None)
    else:
        loops.nest(b, [batch], lambda bi, _: (one(bi[0]), ())[1])


def _blocks(b, e, ptrs, base, dtype, W, NV, Mb, Nb, K, N, k0, kc, last=None):
    """C[:Mb, :Nb] (+)= A[:Mb, k0:k0+kc] @ B[k0:k0+kc, :Nb] in MR x (W*NV) register blocks, adding
    to C unless k0 is 0 (k0 an int or an i64 value); no block starts past row `last` if given
    (an i64 value): those starting later start there."""
    A, B, C = ptrs
    a0, b0, c0 = base
    ty = REG[dtype]
    vty = ir.VectorType(ty, W)
    fma = declare(b.module, f"llvm.fma.{mangle(vty)}", vty, [vty, vty, vty])
    zero_mask = ir.Constant(ir.VectorType(I32, W), None)
    NR = W * NV

    def vptr(ptr, index):
        return b.gep(ptr, [index], inbounds=True, source_etype=ty)

    def block(m0, ji, _):
        i0, j0 = b.add(m0, b.mul(ji[1], I64(MR))), b.mul(ji[0], I64(NR))
        if last is not None:
            i0 = b.select(b.icmp_unsigned(">", i0, last), last, i0)
        c_at = [[b.add(c0, b.add(b.mul(b.add(i0, I64(r)), I64(N)), b.add(j0, I64(v * W)))) for v in range(NV)]
                for r in range(MR)]
        zero = ir.Constant(vty, None)
        if isinstance(k0, int) and k0 == 0:
            init = [zero] * (MR * NV)
        else:
            init = [b.load(vptr(C, c_at[r][v]), typ=vty, align=ITEMSIZE[dtype]) for r in range(MR) for v in range(NV)]
            if not isinstance(k0, int):  # C is not yet written in the first block: its loads are unused
                first = b.icmp_unsigned("==", k0, I64(0))
                init = [b.select(first, zero, a) for a in init]

        def step(kk, acc):
            k = b.add(kk[0], i64(k0))
            brow = b.add(b0, b.add(b.mul(k, I64(N)), j0))
            bv = [b.load(vptr(B, b.add(brow, I64(v * W))), typ=vty, align=ITEMSIZE[dtype]) for v in range(NV)]
            out = []
            for r in range(MR):
                a = e.load(A, dtype, b.add(a0, b.add(b.mul(b.add(i0, I64(r)), I64(K)), k)))
                av = b.shuffle_vector(b.insert_element(ir.Constant(vty, ir.Undefined), a, I32(0)),
                                      ir.Constant(vty, ir.Undefined), zero_mask)
                out.extend(b.call(fma, [av, bv[v], acc[r * NV + v]]) for v in range(NV))
            return out
        acc = loops.nest(b, [kc], step, init)
        for r in range(MR):
            for v in range(NV):
                b.store(acc[r * NV + v], vptr(C, c_at[r][v]), align=ITEMSIZE[dtype])
        return ()

    def panel(m0, rows):
        loops.nest(b, [Nb // NR, rows // MR if isinstance(rows, int) else b.udiv(rows, I64(MR))],
                   lambda ji, _: block(m0, ji, _))
    if isinstance(Mb, ir.Value):  # one panel's code for all, each of min(MC, rows left) rows

        def some(p, _):
            m0 = b.mul(p[0], I64(MC))
            left = b.sub(Mb, m0)
            panel(m0, b.select(b.icmp_unsigned("<", left, I64(MC)), left, I64(MC)))
            return ()
        loops.nest(b, [b.udiv(b.add(Mb, I64(MC - 1)), I64(MC))], some)
        return
    full, rest = divmod(Mb, MC)
    if full:
        loops.nest(b, [full], lambda p, _: (panel(b.mul(p[0], I64(MC)), MC), ())[1])
    if rest:
        panel(I64(full * MC), rest)


def _ikj(b, e, ptrs, base, dtype, rows, cols, K, N):
    """C[rows, cols] = A[rows, :] @ B[:, cols], accumulating along contiguous rows of B and C."""
    A, B, C = ptrs
    a0, b0, c0 = base
    (r0, r1), (j0, j1) = rows, cols
    zero = const(REG[dtype], 0)

    def row(ii, _):
        i = b.add(ii[0], i64(r0))
        crow = b.add(c0, b.add(b.mul(i, I64(N)), I64(j0)))
        loops.nest(b, [j1 - j0], lambda jj, __: (e.store(zero, C, dtype, b.add(crow, jj[0])), ())[1])

        def over_k(kk, __):
            a = e.load(A, dtype, b.add(a0, b.add(b.mul(i, I64(K)), kk[0])))
            brow = b.add(b0, b.add(b.mul(kk[0], I64(N)), I64(j0)))

            def over_j(jj, ___):
                at = b.add(crow, jj[0])
                e.store(e.add(e.load(C, dtype, at), e.mul(a, e.load(B, dtype, b.add(brow, jj[0])))), C, dtype, at)
                return ()
            loops.nest(b, [j1 - j0], over_j)
            return ()
        if K:
            loops.nest(b, [K], over_k, unroll=True)
        return ()
    loops.nest(b, [b.sub(r1, i64(r0)) if isinstance(r1, ir.Value) else r1 - r0], row)
