// One struct per weight type: its block geometry and `decode`, which turns one thread
// item of a block into values and hands each to `emit(index_in_block, value)`.
// Decoding mirrors crates/quant/src (the CPU reference) float product by float product.
// An item is the unit one thread decodes; its loads are coalesced across a warp because
// consecutive lanes take consecutive items of consecutive blocks.
//
// Needs common.cuh and the generated tables (iq2xxs_grid, iq2xs_grid, iq1s_grid,
// ksigns_iq2xs) before it.

// Every kernel that decodes blocks of B calls B::prepare() first, with all threads of the
// CTA and before any early return. With REDLITE_SHARED_TABLES (a compile option, on unless
// REDLITE_SHARED_TABLES=0 in the environment) IQ2_XXS and IQ2_XS copy their codebooks to
// shared memory there: a warp's 32 data-dependent lookups touch up to 32 L1 lines of a
// global table, but only a few banks' worth of shared memory. Other types do nothing.
struct NoTables {
    static __device__ __forceinline__ void prepare() {}
};

#if REDLITE_SHARED_TABLES
__shared__ u64 iq2xxs_grid_s[256];
__shared__ u64 iq2xs_grid_s[512];
__shared__ u8 ksigns_s[128];
#define IQ2XXS_GRID iq2xxs_grid_s
#define IQ2XS_GRID iq2xs_grid_s
#define KSIGNS ksigns_s
#else
#define IQ2XXS_GRID iq2xxs_grid
#define IQ2XS_GRID iq2xs_grid
#define KSIGNS ksigns_iq2xs
#endif

template <int N>
static __device__ __forceinline__ void copy_tables(u64* grid_s, const u64* grid) {
#if REDLITE_SHARED_TABLES
    for (int i = threadIdx.x; i < N; i += blockDim.x) grid_s[i] = grid[i];
    for (int i = threadIdx.x; i < 128; i += blockDim.x) ksigns_s[i] = ksigns_iq2xs[i];
    __syncthreads();
#endif
}

// A small unsigned integer (< 2^23) as a float, exactly, without the quarter-rate
// integer-to-float conversion: 2^23 + v has v in its low mantissa bits; subtracting 2^23 is
// exact. `byte_to_f32(word, j)` is byte j of `word` that way (one byte permute).
static __device__ __forceinline__ float small_to_f32(u32 v) {
    return __uint_as_float(0x4b000000u | v) - 8388608.0f;
}

static __device__ __forceinline__ float byte_to_f32(u32 word, int j) {
    return __uint_as_float(__byte_perm(word, 0x4b000000u, 0x7440 | j)) - 8388608.0f;
}

struct F32 : NoTables {
    static constexpr int VALUES = 1, BYTES = 4, ITEMS = 1;
    template <class Emit>
    static __device__ __forceinline__ void decode(const u8* b, int, Emit&& emit) {
        emit(0, __int_as_float(int(load_u32(b))));
    }
};

struct F16 : NoTables {
    static constexpr int VALUES = 1, BYTES = 2, ITEMS = 1;
    template <class Emit>
    static __device__ __forceinline__ void decode(const u8* b, int, Emit&& emit) {
        emit(0, f16_to_f32(load_u16(b)));
    }
};

// F32 / F16 rows read 16 bytes per item (4 or 8 values): the dense matvecs use these for
// rows whose length is a multiple of 4 (8), the row starts then being 16-byte aligned.
struct F32x4 : NoTables {
    static constexpr int VALUES = 4, BYTES = 16, ITEMS = 1;
    template <class Emit>
    static __device__ __forceinline__ void decode(const u8* b, int, Emit&& emit) {
        const uint4 v = load_u128(b);
        emit(0, __int_as_float(int(v.x)));
        emit(1, __int_as_float(int(v.y)));
        emit(2, __int_as_float(int(v.z)));
        emit(3, __int_as_float(int(v.w)));
    }
};

struct F16x8 : NoTables {
    static constexpr int VALUES = 8, BYTES = 16, ITEMS = 1;
    template <class Emit>
    static __device__ __forceinline__ void decode(const u8* b, int, Emit&& emit) {
        const uint4 v = load_u128(b);
        const u32 words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            emit(2 * w, f16_to_f32(u16(words[w] & 0xffff)));
            emit(2 * w + 1, f16_to_f32(u16(words[w] >> 16)));
        }
    }
};

// d f16 @0, 32 int8 @2. Item: 8 values.
struct Q8_0 : NoTables {
    static constexpr int VALUES = 32, BYTES = 34, ITEMS = 4;
    template <class Emit>
    static __device__ __forceinline__ void decode(const u8* b, int item, Emit&& emit) {
        const float d = f16_to_f32(load_u16(b));
        const u8* q = b + 2 + 8 * item;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const u16 pair = load_u16(q + 2 * w);
            emit(8 * item + 2 * w, d * (small_to_f32(u32(int(i8(pair & 0xff)) + 128)) - 128.0f));
            emit(8 * item + 2 * w + 1, d * (small_to_f32(u32(int(i8(pair >> 8)) + 128)) - 128.0f));
        }
    }
};

// scales[16] @0, qs[64] @16, d @80, dmin @82. Item = sub-block s of 16 values:
// value 128H + 32p + 16k + t takes bits 2p of qs[32H + 16k + t] (s = 8H + 2p + k).
struct Q2K : NoTables {
    static constexpr int VALUES = 256, BYTES = 84, ITEMS = 16;
    template <class Emit>
    static __device__ __forceinline__ void decode(const u8* b, int item, Emit&& emit) {
        const u32 dd = load_u32(b + 80);
        const u8 sc = b[item];
        const float dl = f16_to_f32(u16(dd & 0xffff)) * float(sc & 0x0f);
        const float ml = f16_to_f32(u16(dd >> 16)) * float(sc >> 4);
        const int half = item >> 3, p = (item >> 1) & 3, k = item & 1;
        const u8* q = b + 16 + 32 * half + 16 * k;
        const int base = 128 * half + 32 * p + 16 * k;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const u32 word = load_u32(q + 4 * w);
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const u32 code = (word >> (8 * t + 2 * p)) & 3;
                emit(base + 4 * w + t, dl * small_to_f32(code) - ml);
            }
        }
    }
};

// The 6-bit scale and min of sub-block j of Q4_K / Q5_K (ggml's get_scale_min_k4).
static __device__ __forceinline__ void scale_min_k4(int j, const u8* packed, float& sc, float& m) {
    if (j < 4) {
        sc = float(packed[j] & 63);
        m = float(packed[j + 4] & 63);
    } else {
        sc = float((packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4));
        m = float((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4));
    }
}

// Q4_K: d @0, dmin @2, scales[12] @4, qs[128] @16. Q5_K adds qh[32] @16, qs moves to @48.
// Item (c, h) = (item >> 1, item & 1): the 16 bytes qs[32c + 16h ..] (one 16-byte load),
// low nibbles are values 64c + 16h + t (sub-block 2c), high nibbles 64c + 32 + 16h + t
// (sub-block 2c + 1); Q5_K's fifth bit of value 32s + l is bit s of qh[l].
template <bool FIVE_BITS>
struct QKAffine : NoTables {
    static constexpr int VALUES = 256, BYTES = FIVE_BITS ? 176 : 144, ITEMS = 8;
    template <class Emit>
    static __device__ __forceinline__ void decode(const u8* b, int item, Emit&& emit) {
        const u32 dd = load_u32(b);
        const float d = f16_to_f32(u16(dd & 0xffff)), dmin = f16_to_f32(u16(dd >> 16));
        const int c = item >> 1, h = item & 1;
        float sc_lo, m_lo, sc_hi, m_hi;
        scale_min_k4(2 * c, b + 4, sc_lo, m_lo);
        scale_min_k4(2 * c + 1, b + 4, sc_hi, m_hi);
        const float d_lo = d * sc_lo, min_lo = dmin * m_lo;
        const float d_hi = d * sc_hi, min_hi = dmin * m_hi;
        const uint4 qs = load_u128(b + (FIVE_BITS ? 48 : 16) + 32 * c + 16 * h);
        uint4 qh = make_uint4(0, 0, 0, 0);
        if (FIVE_BITS) qh = load_u128(b + 16 + 16 * h);
        const u32 qs_words[4] = {qs.x, qs.y, qs.z, qs.w};
        const u32 qh_words[4] = {qh.x, qh.y, qh.z, qh.w};
        const int base = 64 * c + 16 * h;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const u32 byte = (qs_words[w] >> (8 * t)) & 0xff;
                const u32 high = (qh_words[w] >> (8 * t)) & 0xff;
                u32 lo = byte & 0x0f, hi = byte >> 4;
                if (FIVE_BITS) {
                    lo |= ((high >> (2 * c)) & 1) << 4;
                    hi |= ((high >> (2 * c + 1)) & 1) << 4;
                }
                emit(base + 4 * w + t, d_lo * small_to_f32(lo) - min_lo);
                emit(base + 32 + 4 * w + t, d_hi * small_to_f32(hi) - min_hi);
            }
        }
    }
};
typedef QKAffine<false> Q4K;
typedef QKAffine<true> Q5K;

// ql[128] @0, qh[64] @128, scales[16] int8 @192, d @208. Item (H, k) = (item >> 2,
// item & 3) covers l = 8k..8k+8 of half H: values 128H + l + 32g for g = 0..4.
struct Q6K : NoTables {
    static constexpr int VALUES = 256, BYTES = 210, ITEMS = 8;
    template <class Emit>
    static __device__ __forceinline__ void decode(const u8* b, int item, Emit&& emit) {
        const float d = f16_to_f32(load_u16(b + 208));
        const int half = item >> 2, l0 = 8 * (item & 3);
        const u8* ql = b + 64 * half + l0;
        const u8* qh = b + 128 + 32 * half + l0;
        const i8* scales = reinterpret_cast<const i8*>(b + 192 + 8 * half + l0 / 16);
        float dl[4];
#pragma unroll
        for (int g = 0; g < 4; ++g) dl[g] = d * float(scales[2 * g]);
        const int base = 128 * half + l0;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const u16 lo = load_u16(ql + 2 * w), hi = load_u16(ql + 32 + 2 * w);
            const u16 hb = load_u16(qh + 2 * w);
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const u32 a = (lo >> (8 * t)) & 0xff, c = (hi >> (8 * t)) & 0xff;
                const u32 h = (hb >> (8 * t)) & 0xff;
                const int l = base + 2 * w + t;
                emit(l, dl[0] * (small_to_f32((a & 0x0f) | ((h & 3) << 4)) - 32.0f));
                emit(l + 32, dl[1] * (small_to_f32((c & 0x0f) | (((h >> 2) & 3) << 4)) - 32.0f));
                emit(l + 64, dl[2] * (small_to_f32((a >> 4) | (((h >> 4) & 3) << 4)) - 32.0f));
                emit(l + 96, dl[3] * (small_to_f32((c >> 4) | (((h >> 6) & 3) << 4)) - 32.0f));
            }
        }
    }
};

// 8 values `db * grid[j] * sign[j]` of one IQ2 group.
template <class Emit>
static __device__ __forceinline__ void emit_iq2_group(int base, float db, u64 grid, u32 signs,
                                                      Emit&& emit) {
    const u32 lo = u32(grid), hi = u32(grid >> 32);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        // db * g * (±1): the sign flip is exact, so it is applied to the sign bit.
        const float value = db * byte_to_f32(j < 4 ? lo : hi, j & 3);
        emit(base + j, __uint_as_float(__float_as_uint(value) ^ ((signs << (31 - j)) & 0x80000000u)));
    }
}

// d @0, qs u16[32] @2. Item = sub-block ib: words A (4 grid indices) and B (4 x 7 sign
// bits, scale in bits 28..32).
struct IQ2XXS {
    static constexpr int VALUES = 256, BYTES = 66, ITEMS = 8;
    static __device__ __forceinline__ void prepare() {
#if REDLITE_SHARED_TABLES
        copy_tables<256>(iq2xxs_grid_s, iq2xxs_grid);
#endif
    }
    template <class Emit>
    static __device__ __forceinline__ void decode(const u8* b, int item, Emit&& emit) {
        const float d = f16_to_f32(load_u16(b));
        const u32 a = load_u32_a2(b + 2 + 8 * item), s = load_u32_a2(b + 6 + 8 * item);
        const float db = d * (0.5f + float(s >> 28)) * 0.25f;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            emit_iq2_group(32 * item + 8 * l, db, IQ2XXS_GRID[(a >> (8 * l)) & 0xff],
                           KSIGNS[(s >> (7 * l)) & 127], emit);
        }
    }
};

// d @0, qs u16[32] @2 (9-bit grid index, 7-bit sign index), scales[8] @66.
struct IQ2XS {
    static constexpr int VALUES = 256, BYTES = 74, ITEMS = 8;
    static __device__ __forceinline__ void prepare() {
#if REDLITE_SHARED_TABLES
        copy_tables<512>(iq2xs_grid_s, iq2xs_grid);
#endif
    }
    template <class Emit>
    static __device__ __forceinline__ void decode(const u8* b, int item, Emit&& emit) {
        const float d = f16_to_f32(load_u16(b));
        const u8 scale = b[66 + item];
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u16 word = load_u16(b + 2 + 8 * item + 2 * l);
            const float db = d * (0.5f + float((scale >> (4 * (l / 2))) & 0x0f)) * 0.25f;
            emit_iq2_group(32 * item + 8 * l, db, IQ2XS_GRID[word & 511], KSIGNS[word >> 9],
                           emit);
        }
    }
};

// qs[32] @0, qh[16] @32, four u16 scale words @48 whose top nibbles hold the f16 scale.
struct IQ1M : NoTables {
    static constexpr int VALUES = 256, BYTES = 56, ITEMS = 8;
    template <class Emit>
    static __device__ __forceinline__ void decode(const u8* b, int item, Emit&& emit) {
        const u16 w0 = load_u16(b + 48), w1 = load_u16(b + 50);
        const u16 w2 = load_u16(b + 52), w3 = load_u16(b + 54);
        const float d = f16_to_f32(u16((w0 >> 12) | ((w1 >> 8) & 0x00f0) |
                                       ((w2 >> 4) & 0x0f00) | (w3 & 0xf000)));
        const u16 word = load_u16(b + 48 + 2 * (item >> 1));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 nibble = (b[32 + 2 * item + l / 2] >> (4 * (l % 2))) & 0x0f;
            const u32 index = u32(b[4 * item + l]) | ((nibble & 7) << 8);
            const i32 scale = 2 * i32((word >> (6 * (item % 2) + 3 * (l / 2))) & 7) + 1;
            const float dl = d * float(scale);
            const float delta = nibble & 8 ? -0.125f : 0.125f;
            const u64 grid = iq1s_grid[index];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float g = small_to_f32(u32(int(i8(u8(grid >> (8 * j)))) + 1)) - 1.0f;
                emit(32 * item + 8 * l + j, dl * (g + delta));
            }
        }
    }
};
