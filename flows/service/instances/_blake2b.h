/*
 * BLAKE2b (RFC 7693), unkeyed, for flows/service/_draw.pyx.
 *
 * Adapted from the BLAKE2 reference implementation, ref/blake2b-ref.c of
 * https://github.com/BLAKE2/BLAKE2 (Copyright 2012, Samuel Neves; licensed under CC0 1.0
 * Universal, the OpenSSL Licence or the Apache License 2.0, at your option; used here under
 * CC0 1.0). Kept from it: the IV, the sigma schedule, the G function and the round order,
 * the parameter block (digest_length, key_length = 0, fanout = 1, depth = 1, the rest 0),
 * and update's rule that a full buffer is compressed only when more input follows, so the
 * last block (even a full one) is compressed by final with the last-block flag set.
 * Dropped: keys, salt, personalisation, tree hashing (last_node), error returns.
 *
 * digest_length is part of the parameter block, so an 8-byte digest is NOT the first
 * 8 bytes of the 64-byte digest: tsi_blake2b_init(S, 8) gives what
 * hashlib.blake2b(..., digest_size=8) gives.
 */
#ifndef TSI_BLAKE2B_H
#define TSI_BLAKE2B_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define TSI_BLAKE2B_BLOCKBYTES 128

typedef struct {
    uint64_t h[8];
    uint64_t t[2];
    uint64_t f[2];
    uint8_t buf[TSI_BLAKE2B_BLOCKBYTES];
    size_t buflen;
} tsi_blake2b_state;

static const uint64_t tsi_blake2b_IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

static const uint8_t tsi_blake2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

/* little-endian load, independent of the host's byte order (compilers make it one load) */
static inline uint64_t tsi_blake2b_load64(const uint8_t *p)
{
    return ((uint64_t)p[0]) | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16)
           | ((uint64_t)p[3] << 24) | ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40)
           | ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}

static inline uint64_t tsi_blake2b_rotr64(uint64_t w, unsigned c)
{
    return (w >> c) | (w << (64 - c));
}

static void tsi_blake2b_compress(tsi_blake2b_state *S, const uint8_t block[TSI_BLAKE2B_BLOCKBYTES])
{
    uint64_t m[16];
    uint64_t v[16];
    int i;

    for (i = 0; i < 16; ++i) m[i] = tsi_blake2b_load64(block + 8 * i);
    for (i = 0; i < 8; ++i) v[i] = S->h[i];
    v[8] = tsi_blake2b_IV[0];
    v[9] = tsi_blake2b_IV[1];
    v[10] = tsi_blake2b_IV[2];
    v[11] = tsi_blake2b_IV[3];
    v[12] = S->t[0] ^ tsi_blake2b_IV[4];
    v[13] = S->t[1] ^ tsi_blake2b_IV[5];
    v[14] = S->f[0] ^ tsi_blake2b_IV[6];
    v[15] = S->f[1] ^ tsi_blake2b_IV[7];

#define TSI_G(r, i, a, b, c, d)                                  \
    do {                                                         \
        a = a + b + m[tsi_blake2b_sigma[r][2 * (i) + 0]];        \
        d = tsi_blake2b_rotr64(d ^ a, 32);                       \
        c = c + d;                                               \
        b = tsi_blake2b_rotr64(b ^ c, 24);                       \
        a = a + b + m[tsi_blake2b_sigma[r][2 * (i) + 1]];        \
        d = tsi_blake2b_rotr64(d ^ a, 16);                       \
        c = c + d;                                               \
        b = tsi_blake2b_rotr64(b ^ c, 63);                       \
    } while (0)
#define TSI_ROUND(r)                                             \
    do {                                                         \
        TSI_G(r, 0, v[0], v[4], v[8], v[12]);                    \
        TSI_G(r, 1, v[1], v[5], v[9], v[13]);                    \
        TSI_G(r, 2, v[2], v[6], v[10], v[14]);                   \
        TSI_G(r, 3, v[3], v[7], v[11], v[15]);                   \
        TSI_G(r, 4, v[0], v[5], v[10], v[15]);                   \
        TSI_G(r, 5, v[1], v[6], v[11], v[12]);                   \
        TSI_G(r, 6, v[2], v[7], v[8], v[13]);                    \
        TSI_G(r, 7, v[3], v[4], v[9], v[14]);                    \
    } while (0)
    TSI_ROUND(0);
    TSI_ROUND(1);
    TSI_ROUND(2);
    TSI_ROUND(3);
    TSI_ROUND(4);
    TSI_ROUND(5);
    TSI_ROUND(6);
    TSI_ROUND(7);
    TSI_ROUND(8);
    TSI_ROUND(9);
    TSI_ROUND(10);
    TSI_ROUND(11);
#undef TSI_G
#undef TSI_ROUND

    for (i = 0; i < 8; ++i) S->h[i] = S->h[i] ^ v[i] ^ v[i + 8];
}

/* unkeyed init for an outlen-byte digest (1..64); the parameter block's first word is
   digest_length | key_length << 8 | fanout << 16 | depth << 24, its other words are 0 */
static inline void tsi_blake2b_init(tsi_blake2b_state *S, uint8_t outlen)
{
    int i;
    memset(S, 0, sizeof(*S));
    for (i = 0; i < 8; ++i) S->h[i] = tsi_blake2b_IV[i];
    S->h[0] ^= (uint64_t)outlen | ((uint64_t)0 << 8) | ((uint64_t)1 << 16) | ((uint64_t)1 << 24);
}

static inline void tsi_blake2b_update(tsi_blake2b_state *S, const uint8_t *in, size_t inlen)
{
    while (inlen > 0) {
        size_t left = S->buflen;
        size_t fill = TSI_BLAKE2B_BLOCKBYTES - left;
        if (inlen > fill) {
            /* more input follows this block: it is not the last one */
            memcpy(S->buf + left, in, fill);
            S->t[0] += TSI_BLAKE2B_BLOCKBYTES;
            S->t[1] += (S->t[0] < TSI_BLAKE2B_BLOCKBYTES);
            tsi_blake2b_compress(S, S->buf);
            S->buflen = 0;
            in += fill;
            inlen -= fill;
        } else {
            memcpy(S->buf + left, in, inlen);
            S->buflen += inlen;
            inlen = 0;
        }
    }
}

/* finishes the hash; returns h[0], whose little-endian bytes are the digest's first 8 */
static inline uint64_t tsi_blake2b_final_h0(tsi_blake2b_state *S)
{
    S->t[0] += S->buflen;
    S->t[1] += (S->t[0] < S->buflen);
    S->f[0] = (uint64_t)-1;
    memset(S->buf + S->buflen, 0, TSI_BLAKE2B_BLOCKBYTES - S->buflen);
    tsi_blake2b_compress(S, S->buf);
    return S->h[0];
}

/* the 8-byte digest read as a big-endian integer: int.from_bytes(digest, "big") */
static inline uint64_t tsi_blake2b_digest8_be(uint64_t h0)
{
    uint64_t r = 0;
    int i;
    for (i = 0; i < 8; ++i) r = (r << 8) | ((h0 >> (8 * i)) & 0xff);
    return r;
}

#endif /* TSI_BLAKE2B_H */
