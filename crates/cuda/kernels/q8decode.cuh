// An item's weights decoded once for the dots of several tokens (the token-tile products:
// an MTP verification, a short prompt). Q8Dot<B>::dot(raw, item, q, d8) redoes, for each
// token, the work that depends on the weights alone: for IQ2_XXS, IQ2_XS and IQ1_M the four
// codebook lookups (and sign masks), for Q4_K / Q5_K the scale and min unpacking and the
// nibble (and fifth-bit) extraction, for all the f16 scales. A 4-token verification's products spent their time
// there (the LM head of 4 rows took 3.1 times a row's, thirty-ninth session's timeline).
//
// Q8Decode<B>::decode(raw, item) gives the item's weights as the dot consumes them and
// Q8Decode<B>::dot(decoded, item, q, d8) the rest: the same integer sums (exact) and the
// same float expression as Q8Dot<B>::dot, so the same bits. Types without a
// specialization forward to Q8Dot<B>. Q8Dot<B>::dot keeps its one-call form (the one-token
// kernels' code as measured), so the specializations repeat its sums: the host emulator's
// small-batch cases hold the two to the same bits. REDLITE_Q8_DECODE_ONCE=0 (a compile
// option) leaves every type forwarding: the per-token decoding, for A/B and parity. Needs
// q8dot.cuh before it.

#ifndef REDLITE_Q8_DECODE_ONCE
#define REDLITE_Q8_DECODE_ONCE 1
#endif

template <class B>
struct Q8Decode {
    typedef typename Q8Dot<B>::Raw Decoded;
    static __device__ __forceinline__ Decoded decode(const typename Q8Dot<B>::Raw& r, int) {
        return r;
    }
    static __device__ __forceinline__ float dot(const Decoded& e, int item, const i8* q,
                                                float d8) {
        return Q8Dot<B>::dot(e, item, q, d8);
    }
};

#if REDLITE_Q8_DECODE_ONCE
// The codebooks read here are the global ones (through L1) whatever REDLITE_Q8_SHARED_TABLES
// says, and the tile products copy none to shared memory: a batch's CTAs are short and many
// (1,024 a projection), each copy is a load and a barrier in front of its work, and with the
// tables copied batches of 2-4 tokens were 4-6 % slower while one token was faster (H100,
// fortieth session).
// Group l: its grid bytes as two words and the same words masked to the negative values
// (iq2_group_dot's operands), then the item's f16 scale and odd multiplier.
template <>
struct Q8Decode<IQ2XXS> {
    struct Decoded {
        u32 grid[4][2], negative[4][2];
        float d;
        int scale;
    };
    static __device__ __forceinline__ Decoded decode(const Q8Dot<IQ2XXS>::Raw& r, int) {
        Decoded e;
        const u32 a = r.a.value(), s = r.s.value();
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u64 grid = iq2xxs_grid[(a >> (8 * l)) & 0xff];
            u32 m_lo, m_hi;
            iq2_sign_masks(ksigns_iq2xs, (s >> (7 * l)) & 127, m_lo, m_hi);
            e.grid[l][0] = u32(grid);
            e.grid[l][1] = u32(grid >> 32);
            e.negative[l][0] = u32(grid) & m_lo;
            e.negative[l][1] = u32(grid >> 32) & m_hi;
        }
        e.d = f16_to_f32(r.d);
        e.scale = 2 * int(s >> 28) + 1;
        return e;
    }
    static __device__ __forceinline__ float dot(const Decoded& e, int item, const i8* q,
                                                float d8) {
        const int4 x0 = load_q8x16(q + 32 * item), x1 = load_q8x16(q + 32 * item + 16);
        const int xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        int sumi = 0;
        int neg = 0;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            sumi = __dp4a(int(e.grid[l][0]), xs[2 * l], sumi);
            sumi = __dp4a(int(e.grid[l][1]), xs[2 * l + 1], sumi);
            neg = __dp4a(int(e.negative[l][0]), xs[2 * l], neg);
            neg = __dp4a(int(e.negative[l][1]), xs[2 * l + 1], neg);
        }
        sumi -= 2 * neg;
        return 0.125f * e.d * d8 * float(sumi * e.scale);
    }
};

// IQ2_XS: the same operands as IQ2_XXS (a 9-bit grid index per group, its own sign index),
// then the two halves' odd scales.
template <>
struct Q8Decode<IQ2XS> {
    struct Decoded {
        u32 grid[4][2], negative[4][2];
        float d;
        int scale_lo, scale_hi;
    };
    static __device__ __forceinline__ Decoded decode(const Q8Dot<IQ2XS>::Raw& r, int) {
        Decoded e;
        const u32 w01 = r.w01.value(), w23 = r.w23.value();
        const u32 index[4] = {w01 & 511, (w01 >> 16) & 511, w23 & 511, (w23 >> 16) & 511};
        const u32 sign[4] = {(w01 >> 9) & 127, w01 >> 25, (w23 >> 9) & 127, w23 >> 25};
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u64 grid = iq2xs_grid[index[l]];
            u32 m_lo, m_hi;
            iq2_sign_masks(ksigns_iq2xs, sign[l], m_lo, m_hi);
            e.grid[l][0] = u32(grid);
            e.grid[l][1] = u32(grid >> 32);
            e.negative[l][0] = u32(grid) & m_lo;
            e.negative[l][1] = u32(grid >> 32) & m_hi;
        }
        e.d = f16_to_f32(r.d);
        e.scale_lo = int(2 * (u32(r.sc) & 0x0f) + 1);
        e.scale_hi = int(2 * (u32(r.sc) >> 4) + 1);
        return e;
    }
    static __device__ __forceinline__ float dot(const Decoded& e, int item, const i8* q,
                                                float d8) {
        const int4 x0 = load_q8x16(q + 32 * item), x1 = load_q8x16(q + 32 * item + 16);
        const int xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        int half[2] = {0, 0}, neg[2] = {0, 0};
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            half[l / 2] = __dp4a(int(e.grid[l][0]), xs[2 * l], half[l / 2]);
            half[l / 2] = __dp4a(int(e.grid[l][1]), xs[2 * l + 1], half[l / 2]);
            neg[l / 2] = __dp4a(int(e.negative[l][0]), xs[2 * l], neg[l / 2]);
            neg[l / 2] = __dp4a(int(e.negative[l][1]), xs[2 * l + 1], neg[l / 2]);
        }
        const int low = half[0] - 2 * neg[0], high = half[1] - 2 * neg[1];
        const int sumi = low * e.scale_lo + high * e.scale_hi;
        return 0.125f * e.d * d8 * float(sumi);
    }
};

// IQ1_M: each group's grid bytes, its odd scale, and the scale signed by the group's delta
// bit (the sum of the codes enters with the sign the delta gives it), then the block's
// f16 scale assembled from the top nibbles of its scale words.
template <>
struct Q8Decode<IQ1M> {
    struct Decoded {
        u32 grid[4][2];
        int ls[4], delta_ls[4];
        float d;
    };
    static __device__ __forceinline__ Decoded decode(const Q8Dot<IQ1M>::Raw& r, int item) {
        Decoded e;
        const u32 w0 = r.scales.x & 0xffff, w1 = r.scales.x >> 16;
        const u32 w2 = r.scales.y & 0xffff, w3 = r.scales.y >> 16;
        e.d = f16_to_f32(u16((w0 >> 12) | ((w1 >> 8) & 0x00f0) | ((w2 >> 4) & 0x0f00) |
                             (w3 & 0xf000)));
        const u32 word = item < 4 ? (item < 2 ? w0 : w1) : (item < 6 ? w2 : w3);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 nibble = (u32(r.qh) >> (4 * l)) & 0x0f;
            const u64 grid = iq1s_grid[((r.qs >> (8 * l)) & 0xff) | ((nibble & 7) << 8)];
            e.grid[l][0] = u32(grid);
            e.grid[l][1] = u32(grid >> 32);
            e.ls[l] = 2 * int((word >> (6 * (item % 2) + 3 * (l / 2))) & 7) + 1;
            e.delta_ls[l] = nibble & 8 ? -e.ls[l] : e.ls[l];
        }
        return e;
    }
    static __device__ __forceinline__ float dot(const Decoded& e, int item, const i8* q,
                                                float d8) {
        const int4 x0 = load_q8x16(q + 32 * item), x1 = load_q8x16(q + 32 * item + 16);
        const int xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        int sumi = 0, sum_delta = 0;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            int grid_sum = __dp4a(int(e.grid[l][0]), xs[2 * l], 0);
            grid_sum = __dp4a(int(e.grid[l][1]), xs[2 * l + 1], grid_sum);
            int code_sum = __dp4a(0x01010101, xs[2 * l], 0);
            code_sum = __dp4a(0x01010101, xs[2 * l + 1], code_sum);
            sumi += grid_sum * e.ls[l];
            sum_delta += code_sum * e.delta_ls[l];
        }
        return e.d * d8 * (float(sumi) + 0.125f * float(sum_delta));
    }
};

// The item's low and high codes (with Q5_K's fifth bit), its two sub-blocks' scales and
// mins, and the block's f16 scale and min.
template <bool FIVE_BITS>
struct Q8Decode<QKAffine<FIVE_BITS>> {
    struct Decoded {
        u32 lo[4], hi[4];
        int sc_lo, m_lo, sc_hi, m_hi;
        float d, dmin;
    };
    static __device__ __forceinline__ Decoded decode(
        const typename Q8Dot<QKAffine<FIVE_BITS>>::Raw& r, int item) {
        Decoded e;
        const int c = item >> 1;
        scale_min_k4_words(2 * c, r.packed, e.sc_lo, e.m_lo);
        scale_min_k4_words(2 * c + 1, r.packed, e.sc_hi, e.m_hi);
        const u32 qs_w[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w};
        const u32 qh_w[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            u32 lo = qs_w[w] & 0x0f0f0f0fu, hi = (qs_w[w] >> 4) & 0x0f0f0f0fu;
            if (FIVE_BITS) {
                lo |= ((qh_w[w] >> (2 * c)) & 0x01010101u) << 4;
                hi |= ((qh_w[w] >> (2 * c + 1)) & 0x01010101u) << 4;
            }
            e.lo[w] = lo;
            e.hi[w] = hi;
        }
        e.d = f16_to_f32(u16(r.dd & 0xffff));
        e.dmin = f16_to_f32(u16(r.dd >> 16));
        return e;
    }
    static __device__ __forceinline__ float dot(const Decoded& e, int item, const i8* q,
                                                float d8) {
        const int c = item >> 1, h = item & 1;
        const int4 x_lo = load_q8x16(q + 64 * c + 16 * h);
        const int4 x_hi = load_q8x16(q + 64 * c + 32 + 16 * h);
        const int xl[4] = {x_lo.x, x_lo.y, x_lo.z, x_lo.w};
        const int xh[4] = {x_hi.x, x_hi.y, x_hi.z, x_hi.w};
        int sum_lo = 0, sum_hi = 0;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            sum_lo = __dp4a(int(e.lo[w]), xl[w], sum_lo);
            sum_hi = __dp4a(int(e.hi[w]), xh[w], sum_hi);
        }
        const int scaled = e.sc_lo * sum_lo + e.sc_hi * sum_hi;
        const int mins = e.m_lo * q8_sum16(x_lo) + e.m_hi * q8_sum16(x_hi);
        return d8 * (e.d * float(scaled) - e.dmin * float(mins));
    }
};
#endif  // REDLITE_Q8_DECODE_ONCE
