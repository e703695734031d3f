/* Sums over the arms in two-lane vectors, with the bits of four scalar chains.
 *
 * ``fixed_sum``'s order (four running sums over x[0::4] .. x[3::4], then (s0 + s1) + (s2 + s3))
 * is kept exactly: lanes (s0, s1) and (s2, s3) of two 2-double vectors. Every lane operation
 * (+, -, *, /) is the IEEE-754 one, so the results are those of the scalar chains on every
 * machine; a two-lane division (SSE2's divpd, baseline x86-64; NEON's on aarch64) does two
 * for the price of one. GCC and Clang vector extensions: no intrinsics, no target flags.
 */
#ifndef TSI_LANES_H
#define TSI_LANES_H

#include <stddef.h>
#include <string.h>

typedef double tsi_v2d __attribute__((vector_size(16)));

static inline tsi_v2d tsi_load2(const double* x) {
    tsi_v2d v;
    memcpy(&v, x, sizeof v);
    return v;
}

/* The smallest of x[0..n) (n >= 1) in four independent chains (one chain waits on each
 * comparison in turn): the minimum does not depend on the order. */
static inline double tsi_min_of(const double* x, ptrdiff_t n) {
    double a = x[0], b = x[0], c = x[0], d = x[0];
    ptrdiff_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a = x[i] < a ? x[i] : a;
        b = x[i + 1] < b ? x[i + 1] : b;
        c = x[i + 2] < c ? x[i + 2] : c;
        d = x[i + 3] < d ? x[i + 3] : d;
    }
    for (; i < n; i++)
        a = x[i] < a ? x[i] : a;
    a = b < a ? b : a;
    c = d < c ? d : c;
    return c < a ? c : a;
}

/* f = Σr², g = Σr³ with r_i = 2/(y_i - z), in ``fixed_sum``'s order. */
static inline void tsi_power_sums(const double* y, ptrdiff_t n, double z, double* f, double* g) {
    const tsi_v2d two = {2.0, 2.0}, zz = {z, z};
    tsi_v2d fa = {0.0, 0.0}, fb = fa, ga = fa, gb = fa;
    double r;
    ptrdiff_t i = 0;
    for (; i + 4 <= n; i += 4) {
        tsi_v2d ra = two / (tsi_load2(y + i) - zz), rb = two / (tsi_load2(y + i + 2) - zz);
        tsi_v2d sa = ra * ra, sb = rb * rb;
        fa += sa;
        fb += sb;
        ga += sa * ra;
        gb += sb * rb;
    }
    for (; i < n; i++) { /* the tail goes to the first chain */
        r = 2.0 / (y[i] - z);
        fa[0] += r * r;
        ga[0] += r * r * r;
    }
    *f = (fa[0] + fa[1]) + (fb[0] + fb[1]);
    *g = (ga[0] + ga[1]) + (gb[0] + gb[1]);
}

#endif
