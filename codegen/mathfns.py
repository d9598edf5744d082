"""exp, log and tanh as branch-free polynomials, so loops that use them still vectorise.

LLVM's llvm.exp/llvm.log become scalar libm calls, which stop the loop vectoriser. These use
only arithmetic, selects, bit casts and llvm.rint, all of which have vector forms.
Accuracy: a few ulp in float64 and float32 over the whole range, with numpy's results for
inf, -inf, NaN, 0, negative arguments (log) and subnormal results (exp).
"""

import math
from fractions import Fraction

from .types import F32, F64, I32, I64, const

# Per float type: (int type, mantissa bits, exponent bias, exp's argument clamp, Taylor degree of
# expm1 on |r| <= ln2/2, number of odd atanh terms for log, split ln2).
_SPEC = {
    F64: (I64, 52, 1023, 1100.0, 13, 10, 0.6931471803691238, 1.9082149292705877e-10),
    F32: (I32, 23, 127, 160.0, 7, 5, 0.693359375, -2.12194440e-4),
}
TANH_SMALL = 0.1733  # below this 2|x| <= ln2/2, so tanh = q/(q+2) with q = expm1(2|x|) directly


def _horner(e, x, coeffs):
    acc = const(x.type, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = e.add(e.mul(acc, x), const(x.type, c))
    return acc


def _expm1_reduced(e, r):
    """exp(r) - 1 for |r| <= ln2/2, without cancellation: r * (1 + r/2 + r^2/6 + ...)."""
    degree = _SPEC[r.type][4]
    coeffs = [float(Fraction(1, math.factorial(k + 1))) for k in range(degree)]
    return e.mul(r, _horner(e, r, coeffs))


def _pow2(e, n, ity, mant, bias, fty):
    """2**n for integer n in the normal exponent range, by building the float's bits."""
    return e.b.bitcast(e.b.shl(e.b.add(n, const(ity, bias)), const(ity, mant)), fty)


def exp(e, x):
    ty = x.type
    ity, mant, bias, clamp, _, _, ln2_hi, ln2_lo = _SPEC[ty]
    b = e.b
    x = b.select(b.fcmp_ordered("<", x, const(ty, -clamp)), const(ty, -clamp), x)
    x = b.select(b.fcmp_ordered(">", x, const(ty, clamp)), const(ty, clamp), x)  # NaN passes through
    n = e.call("llvm.rint", e.mul(x, const(ty, 1 / math.log(2))))
    r = e.sub(e.sub(x, e.mul(n, const(ty, ln2_hi))), e.mul(n, const(ty, ln2_lo)))
    p = e.add(const(ty, 1), _expm1_reduced(e, r))
    k = b.fptosi(n, ity)
    k1 = b.ashr(k, const(ity, 1))  # two factors keep each power of two normal near over/underflow
    k2 = b.sub(k, k1)
    return e.mul(e.mul(p, _pow2(e, k1, ity, mant, bias, ty)), _pow2(e, k2, ity, mant, bias, ty))


def log(e, x):
    ty = x.type
    ity, mant, bias, _, _, terms, ln2_hi, ln2_lo = _SPEC[ty]
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


def tanh(e, x):
    ty = x.type
    a = e.abs(x)
    q = _expm1_reduced(e, e.add(a, a))
    small = e.div(q, e.add(q, const(ty, 2)))
    large = e.sub(const(ty, 1), e.div(const(ty, 2), e.add(exp(e, e.add(a, a)), const(ty, 1))))
    t = e.b.select(e.b.fcmp_ordered("<", a, const(ty, TANH_SMALL)), small, large)
    return e.call("llvm.copysign", t, x)
