/* exp and log with one fixed sequence of IEEE-754 operations: the same bits on every machine.
 *
 * A C library's exp and log may differ in the last bit between versions, CPUs and SIMD
 * widths (numpy's AVX-512 exp does), and the switching classes amplify one bit into a
 * different arm within a few thousand rounds. These functions use only +, -, *, /, truncation,
 * frexp and ldexp (exact or correctly rounded by IEEE 754) in an order the compiler may not
 * change: the extension is built without fast-math and without fused multiply-add
 * contraction (setup.py). Error below 1 ulp (tests/core/test_kernel.py measures it).
 *
 * The method is the classic one (Cody & Waite argument reduction, then a minimax rational
 * approximation, as in Sun's fdlibm): exp(x) = 2^k exp(r) with |r| <= ln2/2, and
 * log(x) = k ln2 + log(1 + f) with 1 + f in [sqrt(2)/2, sqrt(2)).
 */
#ifndef TSI_DETMATH_H
#define TSI_DETMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* 2^k for a normal result (-1022 <= k <= 1023), built from its bits: exact. */
static inline double tsi_pow2(int k)
{
    uint64_t bits = (uint64_t)(k + 1023) << 52;
    double out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* ln 2 split so that k * LN2_HI is exact for |k| < 2^20 */
static const double TSI_LN2_HI = 6.93147180369123816490e-01;
static const double TSI_LN2_LO = 1.90821492927058770002e-10;
static const double TSI_INV_LN2 = 1.44269504088896338700e+00;
static const double TSI_SQRT_HALF = 7.07106781186547524401e-01;

/* exp: minimax coefficients of R(r^2) ~ r (e^r + 1)/(e^r - 1) on [0, (ln2/2)^2] */
static const double TSI_P1 = 1.66666666666666019037e-01;
static const double TSI_P2 = -2.77777777770155933842e-03;
static const double TSI_P3 = 6.61375632143793436117e-05;
static const double TSI_P4 = -1.65339022054652515390e-06;
static const double TSI_P5 = 4.13813679705723846039e-08;

/* log: minimax coefficients of (log(1+f) - 2s)/s, s = f/(2+f), a polynomial in s^2 */
static const double TSI_LG1 = 6.666666666666735130e-01;
static const double TSI_LG2 = 3.999999999940941908e-01;
static const double TSI_LG3 = 2.857142874366239149e-01;
static const double TSI_LG4 = 2.222219843214978396e-01;
static const double TSI_LG5 = 1.818357216161805012e-01;
static const double TSI_LG6 = 1.531383769920937332e-01;
static const double TSI_LG7 = 1.479819860511658591e-01;

/* e^x; exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN. */
static inline double tsi_exp(double x)
{
    double kd, hi, lo, r, t, c, y;
    if (x != x)
        return x;
    if (x > 709.782712893383973096)
        return INFINITY;
    if (x < -745.13321910194110842)
        return 0.0;
    /* k = nearest integer to x/ln2 (halves away from 0), by truncation: no libm call */
    kd = (double)(int)(x * TSI_INV_LN2 + (x < 0.0 ? -0.5 : 0.5));
    hi = x - kd * TSI_LN2_HI;
    lo = kd * TSI_LN2_LO;
    r = hi - lo;
    t = r * r;
    c = r - t * (TSI_P1 + t * (TSI_P2 + t * (TSI_P3 + t * (TSI_P4 + t * TSI_P5))));
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
    if (kd > -1021.0 && kd < 1023.0)
        return y * tsi_pow2((int)kd); /* exact: y in [0.7, 1.42], the result is normal */
    return ldexp(y, (int)kd);         /* near overflow or into the subnormals: one rounding */
}

/* Natural log; log(0) = -inf, log(inf) = inf, log of a negative number or NaN is NaN. */
static inline double tsi_log(double x)
{
    int k;
    double m, f, s, z, w, t1, t2, big_r, hfsq, dk;
    if (x != x || x < 0.0)
        return NAN;
    if (x == 0.0)
        return -INFINITY;
    if (x == INFINITY)
        return x;
    if (x >= 2.2250738585072014e-308) { /* normal: split the bits, m = mantissa in [0.5, 1) */
        uint64_t bits;
        memcpy(&bits, &x, sizeof bits);
        k = (int)(bits >> 52) - 1022;
        bits = (bits & 0x000fffffffffffffULL) | 0x3fe0000000000000ULL;
        memcpy(&m, &bits, sizeof m);
    } else {
        m = frexp(x, &k); /* subnormal: x = m 2^k exactly */
    }
    if (m < TSI_SQRT_HALF) {
        m = m * 2.0;
        k = k - 1;
    }
    f = m - 1.0; /* exact (Sterbenz) */
    s = f / (2.0 + f);
    z = s * s;
    w = z * z;
    t1 = w * (TSI_LG2 + w * (TSI_LG4 + w * TSI_LG6));
    t2 = z * (TSI_LG1 + w * (TSI_LG3 + w * (TSI_LG5 + w * TSI_LG7)));
    big_r = t2 + t1;
    hfsq = 0.5 * f * f;
    dk = (double)k;
    return dk * TSI_LN2_HI - ((hfsq - (s * (hfsq + big_r) + dk * TSI_LN2_LO)) - f);
}

#endif
