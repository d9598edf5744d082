"""Matrix product C[b] = A[b] @ B[b] for row-major A (M x K), B (K x N): register-blocked.

The core computes an MR x NR block of C in vector registers (NR = NV vectors of W lanes):
per k it loads NV vectors of B's row k, broadcasts MR elements of A's column k and issues
MR * NV FMAs, so each loaded element is used MR or NV times. K is split into blocks of KC
and rows into panels of MC: a panel of A (MC x KC, in L2) meets every strip of B (KC x NR,
in L1) in turn, and each strip serves the whole panel before the next is loaded. Rows and columns that do not fill a
block go through a plain i-k-j loop (vectorised by LLVM along j), which is also what tiny
products use. All shapes are static, so every bound is a constant.
"""

from llvmlite import ir

from . import loops
from .emitter import Emitter
from .engine import vector_bytes
from .types import I32, I64, ITEMSIZE, REG, const, declare, mangle

MR = 4
KC = 256
MC = 64


def _layout(dtype, M, N):
    """(W, NV): lanes per vector and vectors per block row for these sizes on this host."""
    w = vector_bytes() // ITEMSIZE[dtype]
    while w > 1 and w > N:
        w //= 2
    return w, (2 if N >= 2 * w else 1)


def matmul(b, ptrs, dtype, batch, M, K, N):
    A, B, C = ptrs
    if not (batch and M and N):
        return
    W, NV = _layout(dtype, M, N)
    NR = W * NV
    Mb, Nb = (M // MR * MR, N // NR * NR) if W > 1 and M >= MR and K else (0, 0)
    e = Emitter(b)

    def one(bi, _):
        a0, b0, c0 = (b.mul(bi[0], I64(n)) for n in (M * K, K * N, M * N))
        if Mb and Nb:
            for k0 in range(0, K, KC):
                _blocks(b, e, (A, B, C), (a0, b0, c0), dtype, W, NV, Mb, Nb, K, N, k0, min(KC, K - k0))
        if Nb < N:
            _ikj(b, e, (A, B, C), (a0, b0, c0), dtype, (0, M), (Nb, N), K, N)
        if Mb < M and Nb:
            _ikj(b, e, (A, B, C), (a0, b0, c0), dtype, (Mb, M), (0, Nb), K, N)
        return ()
    loops.nest(b, [batch], one)


def _blocks(b, e, ptrs, base, dtype, W, NV, Mb, Nb, K, N, k0, kc):
    """C[:Mb, :Nb] (+)= A[:Mb, k0:k0+kc] @ B[k0:k0+kc, :Nb] in MR x (W*NV) register blocks."""
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
        c_at = [[b.add(c0, b.add(b.mul(b.add(i0, I64(r)), I64(N)), b.add(j0, I64(v * W)))) for v in range(NV)]
                for r in range(MR)]
        if k0 == 0:
            init = [ir.Constant(vty, None)] * (MR * NV)
        else:
            init = [b.load(vptr(C, c_at[r][v]), typ=vty, align=ITEMSIZE[dtype]) for r in range(MR) for v in range(NV)]

        def step(kk, acc):
            k = b.add(kk[0], I64(k0))
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
        loops.nest(b, [Nb // NR, rows // MR], lambda ji, _: block(m0, ji, _))
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
        i = b.add(ii[0], I64(r0))
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
            loops.nest(b, [K], over_k)
        return ()
    loops.nest(b, [r1 - r0], row)
