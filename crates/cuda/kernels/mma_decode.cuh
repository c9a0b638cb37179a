// Weight blocks decoded for the int8 tensor-core products of mma.cu: one item is 32 values
// (values 32 * item .. of a 256-value block) turned into 32 int8 codes plus the f32 scales of
// its sub-blocks, such that value = ds[s] * code + dm[s] exactly as the CPU reference's
// integer dot groups them: Σ_v value_v x_v = Σ_s ds[s] Σ_{v in s} code_v x_v + dm[s] Σ_{v in s}
// x_v, each inner sum an exact integer. SUB is the sub-block length (16 for the types whose
// scales change every 16 values: mma.cu then uses k16 products), HAS_MIN whether dm is
// nonzero (a min or an offset that is not folded into the codes).
//
// `codes` is 4-byte aligned shared memory for 8 words; `ds` / `dm` are the row's 16-entry
// scale arrays (sub-block index within the block). Needs common.cuh, the tables and
// q8dot.cuh (iq2_sign_masks, scale_min_k4_int) before it.

template <class B>
struct MmaDecode;

// Grid values times signs, kept as bytes: each byte negated where its sign is (sign_index:
// the group's 7-bit sign index, iq2_sign_masks' argument).
static __device__ __forceinline__ void mma_iq2_group(u64 grid, u32 sign_index, u32* codes) {
    u32 m_lo, m_hi;
    iq2_sign_masks(Q8_KSIGNS, sign_index, m_lo, m_hi);
    codes[0] = __vsub4(u32(grid) ^ m_lo, m_lo);
    codes[1] = __vsub4(u32(grid >> 32) ^ m_hi, m_hi);
}

// value = 0.125 d (2 s + 1) · grid · sign, one 4-bit s per 32 values.
template <>
struct MmaDecode<IQ2XXS> {
    static constexpr int SUB = 32;
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void decode(const u8* b, int item, u32* codes, float* ds,
                                                  float*) {
        const float d = f16_to_f32(load_u16(b));
        const u32 a = load_u32_a2(b + 2 + 8 * item), s = load_u32_a2(b + 6 + 8 * item);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            mma_iq2_group(Q8_IQ2XXS_GRID[(a >> (8 * l)) & 0xff], (s >> (7 * l)) & 127,
                          codes + 2 * l);
        }
        ds[item] = 0.125f * d * float(2 * int(s >> 28) + 1);
    }
};

// As IQ2_XXS with a 9-bit grid index and a 4-bit scale per 16 values.
template <>
struct MmaDecode<IQ2XS> {
    static constexpr int SUB = 16;
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void decode(const u8* b, int item, u32* codes, float* ds,
                                                  float*) {
        const float d = f16_to_f32(load_u16(b));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 word = load_u16(b + 2 + 8 * item + 2 * l);
            mma_iq2_group(Q8_IQ2XS_GRID[word & 511], word >> 9, codes + 2 * l);
        }
        const u32 sc = b[66 + item];
        ds[2 * item] = 0.125f * d * float(2 * int(sc & 0x0f) + 1);
        ds[2 * item + 1] = 0.125f * d * float(2 * int(sc >> 4) + 1);
    }
};

// value = d (2 ls + 1) (g ± 1/8) = (d (2 ls + 1) / 8) · (8 g ± 1): the per-8 delta folds into
// the code (|code| ≤ 9), one 3-bit ls per 16 values.
template <>
struct MmaDecode<IQ1M> {
    static constexpr int SUB = 16;
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void decode(const u8* b, int item, u32* codes, float* ds,
                                                  float*) {
        const u16 w0 = load_u16(b + 48), w1 = load_u16(b + 50);
        const u16 w2 = load_u16(b + 52), w3 = load_u16(b + 54);
        const float d = f16_to_f32(u16((w0 >> 12) | ((w1 >> 8) & 0x00f0) |
                                       ((w2 >> 4) & 0x0f00) | (w3 & 0xf000)));
        const u32 word = load_u16(b + 48 + 2 * (item >> 1));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 nibble = (b[32 + 2 * item + l / 2] >> (4 * (l % 2))) & 0x0f;
            const u64 grid = iq1s_grid[u32(b[4 * item + l]) | ((nibble & 7) << 8)];
            const int delta = nibble & 8 ? -1 : 1;
#pragma unroll
            for (int w = 0; w < 2; ++w) {
                u32 packed = 0;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int g = int(i8(u8(grid >> (8 * (4 * w + j)))));
                    packed |= (u32(8 * g + delta) & 0xffu) << (8 * j);
                }
                codes[2 * l + w] = packed;
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int ls = 2 * int((word >> (6 * (item % 2) + 3 * h)) & 7) + 1;
            ds[2 * item + h] = 0.125f * d * float(ls);
        }
    }
};

// Item i = 4H + p: values 128H + 32p + j are bits 2p of qs[32H + j]; sub-blocks 2i, 2i + 1
// (16 values each) have value = d sc · code - dmin m.
template <>
struct MmaDecode<Q2K> {
    static constexpr int SUB = 16;
    static constexpr bool HAS_MIN = true;
    static __device__ __forceinline__ void decode(const u8* b, int item, u32* codes, float* ds,
                                                  float* dm) {
        const int half = item >> 2, p = item & 3;
        const u8* qs = b + 16 + 32 * half;
#pragma unroll
        for (int w = 0; w < 8; ++w) codes[w] = (load_u32(qs + 4 * w) >> (2 * p)) & 0x03030303u;
        const u32 dd = load_u32(b + 80);
        const float d = f16_to_f32(u16(dd & 0xffff)), dmin = f16_to_f32(u16(dd >> 16));
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const u32 sc = b[2 * item + k];
            ds[2 * item + k] = d * float(int(sc & 0x0f));
            dm[2 * item + k] = -dmin * float(int(sc >> 4));
        }
    }
};

// Item j = sub-block j (32 values): the low (j even) or high nibbles of qs[32 (j / 2) + l],
// Q5_K's fifth bit is bit j of qh[l]; value = d sc_j · code - dmin m_j.
template <bool FIVE_BITS>
struct MmaDecode<QKAffine<FIVE_BITS>> {
    static constexpr int SUB = 32;
    static constexpr bool HAS_MIN = true;
    static __device__ __forceinline__ void decode(const u8* b, int item, u32* codes, float* ds,
                                                  float* dm) {
        const int c = item >> 1, high = item & 1;
        const u8* qs = b + (FIVE_BITS ? 48 : 16) + 32 * c;
#pragma unroll
        for (int v = 0; v < 2; ++v) {
            const uint4 q = load_u128(qs + 16 * v);
            uint4 h = make_uint4(0, 0, 0, 0);
            if (FIVE_BITS) h = load_u128(b + 16 + 16 * v);
            const u32 qw[4] = {q.x, q.y, q.z, q.w};
            const u32 hw[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                u32 code = (qw[w] >> (4 * high)) & 0x0f0f0f0fu;
                if (FIVE_BITS) code |= ((hw[w] >> item) & 0x01010101u) << 4;
                codes[4 * v + w] = code;
            }
        }
        const u32 dd = load_u32(b);
        int sc, m;
        scale_min_k4_int(item, b + 4, sc, m);
        ds[item] = f16_to_f32(u16(dd & 0xffff)) * float(sc);
        dm[item] = -f16_to_f32(u16(dd >> 16)) * float(m);
    }
};

// Item i = 4H + g: values 128H + 32g + l take ql[64H + 32 (g & 1) + l] (low nibble for g < 2)
// and bits 2g of qh[32H + l]; code - 32 fits int8, so no offset term; int8 scales per 16.
template <>
struct MmaDecode<Q6K> {
    static constexpr int SUB = 16;
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void decode(const u8* b, int item, u32* codes, float* ds,
                                                  float*) {
        const int half = item >> 2, g = item & 3;
        const u8* ql = b + 64 * half + 32 * (g & 1);
        const u8* qh = b + 128 + 32 * half;
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const u32 low = (load_u32_a2(ql + 4 * w) >> (4 * (g >> 1))) & 0x0f0f0f0fu;
            const u32 top = ((load_u32_a2(qh + 4 * w) >> (2 * g)) & 0x03030303u) << 4;
            codes[w] = __vsub4(low | top, 0x20202020u);
        }
        const float d = f16_to_f32(load_u16(b + 208));
        const i8* scales = reinterpret_cast<const i8*>(b + 192);
        ds[2 * item] = d * float(scales[2 * item]);
        ds[2 * item + 1] = d * float(scales[2 * item + 1]);
    }
};
