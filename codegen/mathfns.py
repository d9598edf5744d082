"""exp, log, log1p and tanh as branch-free polynomials, so loops that use them still vectorise.

LLVM's llvm.exp/llvm.log become scalar libm calls, which stop the loop vectoriser. These use
only arithmetic, selects, bit casts and llvm.rint, all of which have vector forms.
Accuracy, max error in ulp over the whole range (`python -m benchmarks.ulp`, ~2^20-point sweeps
against numpy in a wider type), float64 / float32: exp 0.94 / 0.98, log 1.67 / 1.80,
log1p 2.23 / 2.23, tanh 1.47 / 1.47 (softplus, built on exp and log1p: 2.54 / 2.83); with
numpy's results for inf, -inf, NaN, 0, arguments outside the domain and subnormal results.
"""

import itertools
import math
from fractions import Fraction

from .types import F32, F64, I32, I64, const

# Per float type: (int type, mantissa bits, exponent bias, exp's argument clamp, number of odd atanh
# terms for log, split ln2).
_SPEC = {
    F64: (I64, 52, 1023, 1100.0, 10, 0.6931471803691238, 1.9082149292705877e-10),
    F32: (I32, 23, 127, 160.0, 5, 0.693359375, -2.12194440e-4),
}
TANH_SMALL = 0.3  # below, tanh's reduction has n = 0 and it takes the |x| + correction form (< ln2/2)
TANH_ONE = 20.0  # tanh(x) rounds to 1 from x = 19.06 (float64), 9.01 (float32); keeps expm1(2x) finite


def _horner(e, x, coeffs):
    acc = const(x.type, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = e.add(e.mul(acc, x), const(x.type, c))
    return acc


def _expm1_tail(e, r, bound):
    """exp(r) - 1 - r = r^2 (1/2 + r/6 + ...) for |r| <= bound, kept apart from r so r + tail rounds
    once and tanh can use it alone. Taylor degree: the first whose next term is below 1/8 ulp of 1
    at the bound (13 in float64, 7 in float32 for exp's ln2/2)."""
    mant = _SPEC[r.type][1]
    degree = next(d for d in itertools.count(2) if bound ** (d + 1) / math.factorial(d + 1) < 2.0 ** -(mant + 3))
    coeffs = [float(Fraction(1, math.factorial(k + 2))) for k in range(degree - 1)]
    return e.mul(e.mul(r, r), _horner(e, r, coeffs))


def _pow2(e, n, ity, mant, bias, fty):
    """2**n for integer n in the normal exponent range, by building the float's bits."""
    return e.b.bitcast(e.b.shl(e.b.add(n, const(ity, bias)), const(ity, mant)), fty)


def _reduce(e, x, shift=0.0):
    """(n, hi, lo) with x = n ln2 + r, r = hi - lo, n = rint(x/ln2 - shift) (a float), so
    -ln2 (1/2 - shift) <= r <= ln2 (1/2 + shift); hi = x - n ln2_hi is exact and lo = n ln2_lo tiny."""
    ty = x.type
    ln2_hi, ln2_lo = _SPEC[ty][5:]
    n = e.call("llvm.rint", e.sub(e.mul(x, const(ty, 1 / math.log(2))), const(ty, shift)))
    return n, e.sub(x, e.mul(n, const(ty, ln2_hi))), e.mul(n, const(ty, ln2_lo))


def exp(e, x):
    ty = x.type
    ity, mant, bias, clamp = _SPEC[ty][:4]
    b = e.b
    x = b.select(b.fcmp_ordered("<", x, const(ty, -clamp)), const(ty, -clamp), x)
    x = b.select(b.fcmp_ordered(">", x, const(ty, clamp)), const(ty, clamp), x)  # NaN passes through
    n, hi, lo = _reduce(e, x)
    r = e.sub(hi, lo)
    p = e.add(const(ty, 1), e.add(r, _expm1_tail(e, r, math.log(2) / 2)))
    k = b.fptosi(n, ity)
    k1 = b.ashr(k, const(ity, 1))  # two factors keep each power of two normal near over/underflow
    k2 = b.sub(k, k1)
    return e.mul(e.mul(p, _pow2(e, k1, ity, mant, bias, ty)), _pow2(e, k2, ity, mant, bias, ty))


def log(e, x):
    ty = x.type
    ity, mant, bias, _, terms, ln2_hi, ln2_lo = _SPEC[ty]
    b = e.b
    tiny = b.fcmp_ordered("<", x, const(ty, 2.0 ** (1 - bias)))  # subnormal: scale into the normal range
    xs = b.select(tiny, e.mul(x, const(ty, 2.0 ** (mant + 2))), x)
    bits = b.bitcast(xs, ity)
    ex = b.sub(b.lshr(bits, const(ity, mant)), const(ity, bias))
    ex = b.select(tiny, b.sub(ex, const(ity, mant + 2)), ex)
    m = b.bitcast(b.or_(b.and_(bits, const(ity, (1 << mant) - 1)), const(ity, bias << mant)), ty)  # [1, 2)
    big = b.fcmp_ordered(">", m, const(ty, math.sqrt(2)))
    m = b.select(big, e.mul(m, const(ty, 0.5)), m)
    ex = b.select(big, b.add(ex, const(ity, 1)), ex)
    f = e.sub(m, const(ty, 1))
    s = e.div(f, e.add(f, const(ty, 2)))  # log(m) = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...)
    s2 = e.mul(s, s)
    tail = e.mul(s2, _horner(e, s2, [1 / (2 * k + 3) for k in range(terms)]))
    two_s = e.add(s, s)
    log_m = e.add(two_s, e.mul(two_s, tail))
    n = b.sitofp(ex, ty)
    r = e.add(e.mul(n, const(ty, ln2_hi)), e.add(e.mul(n, const(ty, ln2_lo)), log_m))
    r = b.select(b.fcmp_ordered("==", x, const(ty, math.inf)), x, r)
    r = b.select(b.fcmp_ordered("==", x, const(ty, 0)), const(ty, -math.inf), r)
    return b.select(b.fcmp_unordered("<", x, const(ty, 0)), const(ty, math.nan), r)  # x < 0 or NaN


def log1p(e, u):
    """log(1 + u), also where 1 + u rounds: with w = 1 + u rounded and c = (1 + u) - w exactly (2Sum),
    log(1 + u) = log(w) + log(1 + c/w) = log(w) + c/w, as |c/w| <= 2^-(mant+1) leaves the dropped
    (c/w)^2/2 under half an ulp of the result."""
    ty = u.type
    one = const(ty, 1)
    w = e.add(one, u)
    v = e.sub(w, one)
    c = e.add(e.sub(one, e.sub(w, v)), e.sub(u, v))
    lw = log(e, w)
    # c == 0 (1 + u exact, also w == 0) needs no correction; c is NaN only when w or u is infinite or NaN.
    # log1p(u) has u's sign (or is NaN): copysign keeps log1p(-0) = -0.
    r = e.b.select(e.b.fcmp_unordered("==", c, const(ty, 0)), lw, e.add(lw, e.div(c, w)))
    return e.call("llvm.copysign", r, u)


def tanh(e, x):
    """q / (q + 2) with q = expm1(2|x|) = 2^n (1 + r + tail) - 1, where 2|x| = n ln2 + r; for |x| <
    TANH_SMALL (n = 0, r = 2|x|) as |x| + (tail (1 - |x|) - 2x^2) / (q + 2), the same value minus |x|
    written without cancellation, so only the final sum rounds at full weight."""
    ty = x.type
    ity, mant, bias = _SPEC[ty][:3]
    b = e.b
    a = e.min(e.abs(x), const(ty, TANH_ONE))  # NaN-propagating
    n, hi, lo = _reduce(e, e.add(a, a), TANH_SMALL * 2 / math.log(2) - 0.5)
    tail = _expm1_tail(e, e.sub(hi, lo), 2 * TANH_SMALL)
    k = b.fptosi(n, ity)
    # 2^n (1 + r + tail) - 1 = 2^n (h + hi - lo + tail) with h = 1 - 2^-n exact. For n > 0, h is in
    # [1/2, 1) and |hi| <= 2 TANH_SMALL < 1, so h + hi = s + err exactly (Fast2Sum; n = 0: s = hi, err = 0)
    # and the sum rounds once.
    h = e.sub(const(ty, 1), _pow2(e, b.neg(k), ity, mant, bias, ty))
    s = e.add(h, hi)
    err = e.sub(hi, e.sub(s, h))
    q = e.mul(e.add(s, e.add(e.sub(err, lo), tail)), _pow2(e, k, ity, mant, bias, ty))
    d = e.add(q, const(ty, 2))
    small = e.add(a, e.div(e.sub(e.mul(tail, e.sub(const(ty, 1), a)), e.mul(e.add(a, a), a)), d))
    t = b.select(b.fcmp_ordered("==", n, const(ty, 0)), small, e.div(q, d))
    return e.call("llvm.copysign", t, x)
