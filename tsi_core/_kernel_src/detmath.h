/* exp and log with one fixed sequence of IEEE-754 operations: the same bits on every machine.
 *
 * A C library's exp and log may differ in the last bit between versions, CPUs and SIMD
 * widths (numpy's AVX-512 exp does), and the switching classes amplify one bit into a
 * different arm within a few thousand rounds. These functions use only +, -, *, /, bit moves,
 * frexp and ldexp (exact or correctly rounded by IEEE 754) in an order the compiler may not
 * change: the extension is built without fast-math and without fused multiply-add
 * contraction (setup.py). Error below 1 ulp (tests/core/test_kernel.py measures it).
 *
 * exp is table-driven (2^(j/64) from exp_table.h, generated with exact decimals) with a
 * short polynomial; log is the classic method (Cody & Waite reduction and a minimax
 * rational approximation, as in Sun's fdlibm): log(x) = k ln2 + log(1 + f), 1 + f in
 * [sqrt(2)/2, sqrt(2)).
 */
#ifndef TSI_DETMATH_H
#define TSI_DETMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "exp_table.h"

/* ln 2 split so that k * LN2_HI is exact for |k| < 2^20 */
static const double TSI_LN2_HI = 6.93147180369123816490e-01;
static const double TSI_LN2_LO = 1.90821492927058770002e-10;
static const double TSI_SQRT_HALF = 7.07106781186547524401e-01;

/* log: minimax coefficients of (log(1+f) - 2s)/s, s = f/(2+f), a polynomial in s^2 */
static const double TSI_LG1 = 6.666666666666735130e-01;
static const double TSI_LG2 = 3.999999999940941908e-01;
static const double TSI_LG3 = 2.857142874366239149e-01;
static const double TSI_LG4 = 2.222219843214978396e-01;
static const double TSI_LG5 = 1.818357216161805012e-01;
static const double TSI_LG6 = 1.531383769920937332e-01;
static const double TSI_LG7 = 1.479819860511658591e-01;

static inline uint64_t tsi_bits(double x)
{
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static inline double tsi_double(uint64_t b)
{
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* e^x; exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN. No division, no libm call.
 * x = (64 k + j) ln2/64 + r with |r| <= ln2/128: e^x = 2^k 2^(j/64) e^r, 2^(j/64) from the
 * table as head + tail, e^r by its Taylor polynomial to r^5 (truncation < 0.4 ulp). */
static inline double tsi_exp(double x)
{
    const double shift = 0x1.8p52; /* adding it rounds to an integer kept in the low bits */
    double z, kd, r, head, y;
    int64_t ki, k, k1;
    if (x != x)
        return x;
    if (x > 709.782712893383973096)
        return INFINITY;
    if (x < -745.13321910194110842)
        return 0.0;
    z = x * TSI_64_LN2 + shift;
    kd = z - shift;
    ki = (int64_t)(tsi_bits(z) - tsi_bits(shift));
    r = (x - kd * TSI_LN2_64_HI) - kd * TSI_LN2_64_LO;
    head = TSI_EXP2_HEAD[ki & 63];
    y = head + (TSI_EXP2_TAIL[ki & 63]
                + head * (r + r * r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0))))));
    /* 2^k as two normal factors: one rounding, also into the subnormals */
    k = ki >> 6;
    k1 = k >> 1;
    return (y * tsi_double((uint64_t)(k1 + 1023) << 52)) * tsi_double((uint64_t)(k - k1 + 1023) << 52);
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
