// Integer dot products against activations quantized to Q8_K: the CPU backend's
// `Precision::Ggml` math (llama.cpp's activation format for the k-quant and IQ types).
// Every kernel that uses them quantizes its input once per CTA into shared memory
// (`quantize_q8k_shared`, bit-identical to the CPU's Q8_K quantization), then each weight
// item is an integer sum of code x q8 products (dp4a: exact, the CPU's integers) scaled
// in f32. Results differ from the CPU's by the float order of the scaled sums only.
// A value is read as one int8 instead of one f32 and four products take one instruction:
// the float kernels of blocks.cuh spend most of their time on x loads and conversions.
//
// Needs common.cuh, the tables, blocks.cuh and reduce.cuh before it.

#define Q8K_VALUES 256

// The q8 kernels copy the IQ2 codebooks to shared memory (B::prepare) and read them there,
// unless REDLITE_Q8_SHARED_TABLES=0 (a compile option from the environment) leaves them in
// global memory (L1-resident after the first lookups). The copy is one more load and
// barrier in front of every CTA's work, but a warp's 32 data-dependent lookups of a
// 2-4 KB table touch up to 32 L1 lines: on the H100 (fortieth session) decode measured
// 3.5-5.6 % faster with the copies (the twelfth and thirteenth sessions, on the H200 and
// before the launches overlapped, had measured no gain). Batches of 2-4 tokens were 5-7 %
// slower with them, so the token tiles (q8decode.cuh) and the expert kernels of batches
// (the `moe_batch` module, built with this define forced off) read them from global memory.
// `q8_prepare<B>()` stands for B::prepare() in the q8 kernels.
#if REDLITE_Q8_SHARED_TABLES
#define Q8_IQ2XXS_GRID IQ2XXS_GRID
#define Q8_IQ2XS_GRID IQ2XS_GRID
#define Q8_KSIGNS KSIGNS
#else
#define Q8_IQ2XXS_GRID iq2xxs_grid
#define Q8_IQ2XS_GRID iq2xs_grid
#define Q8_KSIGNS ksigns_iq2xs
#endif

template <class B>
static __device__ __forceinline__ void q8_prepare() {
#if REDLITE_Q8_SHARED_TABLES
    B::prepare();
#endif
}

// Bytes of the shared-memory staging of `values` activation values: the f32 block scales
// first (padded to 16 bytes), then the int8 codes (16-byte aligned).
static __device__ __forceinline__ int q8_scales_bytes(int values) {
    return ((values / Q8K_VALUES) * 4 + 15) & ~15;
}

// Quantizes `values` f32 (whole 256-value blocks) into `d` (a scale per block) and `q` as
// the CPU's Q8_K: the signed value of largest magnitude (the first one on ties) maps to
// -127; code = round-half-even(x * (-127 / max)) capped at 127; d = 1 / (-127 / max); an
// all-zero block has d = 0. One warp per block, up to Q8_UNROLL blocks per warp with all
// their loads issued before the first reduction (the prologue is a latency chain that
// every weight load of the kernel waits behind). Ends with a CTA barrier.
#define Q8_UNROLL 4

// `blocks` blocks of 256 values, block b read from `source(b)`, staged back to back;
// Q8_UNROLL blocks a warp at a time.
template <class Source>
static __device__ __forceinline__ void quantize_q8k_blocks(Source source, int blocks, float* d,
                                                           i8* q) {
    constexpr int UNROLL = Q8_UNROLL;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
#if REDLITE_PROBE_Q8_NO_QUANTIZE
    // Measurement probe (compile.rs): zero codes and scales without reading the input, so
    // a kernel's time without its quantization prologue (every q8 product is then 0).
    for (int b = warp; b < blocks; b += warps) {
        *reinterpret_cast<uint2*>(q + b * Q8K_VALUES + 8 * lane) = make_uint2(0, 0);
        if (lane == 0) d[b] = 0.0f;
    }
    __syncthreads();
    return;
#endif
    for (int first = warp; first < blocks; first += UNROLL * warps) {
        float v[UNROLL][8];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int b = first + u * warps;
            const float* xb = source(b < blocks ? b : 0) + 8 * lane;
            const bool wide = (reinterpret_cast<u64>(xb) & 15) == 0;
            if (b < blocks && wide) {
                const float4 lo = *reinterpret_cast<const float4*>(xb);
                const float4 hi = *reinterpret_cast<const float4*>(xb + 4);
                v[u][0] = lo.x, v[u][1] = lo.y, v[u][2] = lo.z, v[u][3] = lo.w;
                v[u][4] = hi.x, v[u][5] = hi.y, v[u][6] = hi.z, v[u][7] = hi.w;
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) v[u][j] = b < blocks ? xb[j] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int b = first + u * warps;
            if (b >= blocks) break;
            float amax = 0.0f, signed_max = 0.0f;
            int at = Q8K_VALUES;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                if (fabsf(v[u][j]) > amax) {
                    amax = fabsf(v[u][j]);
                    signed_max = v[u][j];
                    at = 8 * lane + j;
                }
            }
#pragma unroll
            for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
                const float other_amax = __shfl_xor_sync(0xffffffffu, amax, offset);
                const float other_max = __shfl_xor_sync(0xffffffffu, signed_max, offset);
                const int other_at = __shfl_xor_sync(0xffffffffu, at, offset);
                if (other_amax > amax || (other_amax == amax && other_at < at)) {
                    amax = other_amax;
                    signed_max = other_max;
                    at = other_at;
                }
            }
            u32 words[2] = {0, 0};
            float scale = 0.0f;
            if (amax != 0.0f) {
                const float iscale = -127.0f / signed_max;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const int code = min(127, __float2int_rn(iscale * v[u][j]));
                    words[j / 4] |= (u32(code) & 0xffu) << (8 * (j % 4));
                }
                scale = 1.0f / iscale;
            }
            *reinterpret_cast<uint2*>(q + b * Q8K_VALUES + 8 * lane) =
                make_uint2(words[0], words[1]);
            if (lane == 0) d[b] = scale;
        }
    }
    __syncthreads();
}

// The input is `values` from `x` then `values2` from `x2` (both whole blocks; `x2` may be
// null when `values2` is 0), staged back to back.
static __device__ __forceinline__ void quantize_q8k_shared(const float* __restrict__ x,
                                                           int values,
                                                           const float* __restrict__ x2,
                                                           int values2, float* d, i8* q) {
    const int blocks1 = values / Q8K_VALUES;
    quantize_q8k_blocks(
        [=](int b) {
            return b < blocks1 ? x + i64(b) * Q8K_VALUES : x2 + i64(b - blocks1) * Q8K_VALUES;
        },
        blocks1 + values2 / Q8K_VALUES, d, q);
}

// The Q8_K input of `tokens` consecutive rows of `cols` values starting at row `t0`: the
// codes and scales in global memory when the kernel that wrote x left them there (`gq` not
// null: `rms_norm_q8_kernel`, the same codes), else quantized here into shared memory
// `staging` (ending with a CTA barrier). Both layouts put row j's codes at `xq + j * cols`
// and its scales at `xd + j * (cols / 256)`.
static __device__ __forceinline__ void q8_input(const float* __restrict__ x,
                                                const float* __restrict__ gd,
                                                const i8* __restrict__ gq, i64 t0, int tokens,
                                                int cols, float4* staging, const float*& xd,
                                                const i8*& xq) {
    if (gq != nullptr) {
        xd = gd + t0 * (cols / Q8K_VALUES);
        xq = gq + t0 * cols;
        return;
    }
    float* sd = reinterpret_cast<float*>(staging);
    i8* sq = reinterpret_cast<i8*>(staging) + q8_scales_bytes(tokens * cols);
    quantize_q8k_shared(x + t0 * cols, tokens * cols, nullptr, 0, sd, sq);
    xd = sd;
    xq = sq;
}

// Asks L2 for `bytes` bytes from `p` (one 128-byte line per lane and step), so the weight
// loads after the quantization prologue hit L2 instead of waiting on DRAM.
//
// A kernel that reads its input already quantized (`gq`: no prologue) skips it: its weight
// loads follow at once and already cover whole lines, so the prefetch was only instructions
// (some 40 a warp, in 64-bit arithmetic, before the first load; +1.2 % decode without it,
// twelfth session).
static __device__ __forceinline__ bool prefetch_before_input(const i8* gq) {
    return gq == nullptr;
}

static __device__ __forceinline__ void prefetch_l2(const u8* p, i64 bytes, int lane, int lanes) {
    for (i64 at = i64(lane) * 128; at < bytes; at += i64(lanes) * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + at));
    }
}

// 16 codes from 16-byte aligned shared memory.
static __device__ __forceinline__ int4 load_q8x16(const i8* p) {
    return *reinterpret_cast<const int4*>(p);
}

// Σ of 4 x 4 codes (the offsets of the types with a min or a -32 bias).
static __device__ __forceinline__ int q8_sum16(int4 x) {
    int s = __dp4a(0x01010101, x.x, 0);
    s = __dp4a(0x01010101, x.y, s);
    s = __dp4a(0x01010101, x.z, s);
    return __dp4a(0x01010101, x.w, s);
}

// Byte j of x's top bit spread over byte j: PRMT's sign mode (selector nibbles 8 + j), or
// with REDLITE_SIGN_PRMT=0 (a compile option, for A/B) a shift, a mask and a multiply by 0xff.
#ifndef REDLITE_SIGN_PRMT
#define REDLITE_SIGN_PRMT 1
#endif
static __device__ __forceinline__ u32 byte_tops_to_masks(u32 x) {
#if REDLITE_SIGN_PRMT
    u32 masks;
    asm("prmt.b32 %0, %1, 0, 0xBA98;" : "=r"(masks) : "r"(x));
    return masks;
#else
    return ((x >> 7) & 0x01010101u) * 0xffu;
#endif
}

// Byte masks from 4 sign bits: byte j is 0xff where bit j is set. The multiply moves bit j to
// bit 8j + 7, the top of byte j (the shifted copies do not overlap, so no carries).
static __device__ __forceinline__ u32 sign_bytes(u32 bits4) {
    return byte_tops_to_masks(bits4 * 0x10204080u);
}

// The byte masks of an IQ2 group's eight signs (bit j negative: byte j 0xff) from its 7-bit
// sign index, without the table ksigns_iq2xs (index | parity(index) << 7: the eighth sign
// keeps the count of negatives even). Low four values: index * 0x10204080 puts copies of the
// 7-bit index at bits 7, 14, 21 and 28 (disjoint, so no carries; bits past 31 drop), which
// leaves bits 0-3 at the bytes' tops. High four: copies at bits 3, 10 and 17 leave bits 4-6
// there, and the popcount's lowest bit, shifted to bit 31, is the parity. A table lookup
// (two 64-bit address instructions and a load) and a shift become a popcount, a multiply-add
// and a shift; REDLITE_IQ2_SIGNS_COMPUTED=0 (a compile option, for A/B) reads the table
// `ksigns` (global or shared, as the caller reads its codebooks). The same masks for all 128
// indices (scripts/dev/decode-emu, group signs).
#ifndef REDLITE_IQ2_SIGNS_COMPUTED
#define REDLITE_IQ2_SIGNS_COMPUTED 1
#endif
static __device__ __forceinline__ void iq2_sign_masks(const u8* ksigns, u32 index, u32& m_lo,
                                                      u32& m_hi) {
#if REDLITE_IQ2_SIGNS_COMPUTED
    m_lo = byte_tops_to_masks(index * 0x10204080u);
    m_hi = byte_tops_to_masks(index * 0x00020408u + (u32(__popc(index)) << 31));
#else
    const u32 signs = ksigns[index];
    m_lo = sign_bytes(signs & 0x0f);
    m_hi = sign_bytes((signs >> 4) & 0x0f);
#endif
}

// Σ_j grid[j] · (±1)_j · x[j] over one IQ2 group of 8 values (sign_index: the group's 7-bit
// sign index, iq2_sign_masks' argument), as two sums: pos += Σ grid[j]·x[j], neg += Σ of
// those terms where value j is negative (the grid bytes there selected by an AND with the
// byte masks), so the group's sum is pos − 2·neg.
// Exact in integers (the grid bytes are below 128, so the AND leaves valid signed bytes):
// the same sums as flipping the grid bytes' signs, with a third fewer instructions (sm_80 and
// sm_90 have no byte-wise subtraction; twelfth session: the same bits and speed).
static __device__ __forceinline__ void iq2_group_dot(u64 grid, u32 sign_index, int x_lo,
                                                     int x_hi, int& pos, int& neg) {
    u32 m_lo, m_hi;
    iq2_sign_masks(Q8_KSIGNS, sign_index, m_lo, m_hi);
    pos = __dp4a(int(u32(grid)), x_lo, pos);
    pos = __dp4a(int(u32(grid >> 32)), x_hi, pos);
    neg = __dp4a(int(u32(grid) & m_lo), x_lo, neg);
    neg = __dp4a(int(u32(grid >> 32) & m_hi), x_hi, neg);
}

// The one-token q8 products (matmul_q8_kernel, the expert gate/up) load a lane's first
// items of all its rows (and matrices) before computing any, so their DRAM waits overlap;
// REDLITE_Q8_LOADS_AHEAD=0 (a compile option) keeps the plain loop. The sums run in the same
// order either way. Items ahead per row: 2 (every item of a 2,048-value row for most types),
// fewer where `rows` rows' Raws would pass the type's PRELOAD budget (registers): `Q8Ahead`.
#ifndef REDLITE_Q8_LOADS_AHEAD
#define REDLITE_Q8_LOADS_AHEAD 1
#endif

// Q8Dot<B>::dot(block, item, q, d8): item `item` of a B block (the same item split as
// B::decode) against the block's 256 codes `q` (16-byte aligned) with scale `d8`.
//
// Each dot is split in two: `load(block, item)` returns the item's weight bits as loaded
// (a `Raw`, no arithmetic on them, so a thread can issue the loads of many items before
// it waits on the first), and `dot(raw, item, q, d8)` does all the arithmetic. The
// one-call form is `dot(load(...), ...)`: the same operations in the same order, so a
// kernel that loads its items ahead gets the same bits as one that does not. PRELOAD is
// how many Raws a thread may hold at once (by their registers); the type without a
// Raw of its own (Q6K) keeps the block pointer and loads inside `dot`.
template <class B>
struct Q8Dot;

#define Q8_DOT_FROM_RAW                                                                      \
    static __device__ __forceinline__ float dot(const u8* b, int item, const i8* q,         \
                                                float d8) {                                 \
        return dot(load(b, item), item, q, d8);                                             \
    }

// Two halves of a 2-byte aligned u32, joined by `dot`.
struct U32Halves {
    u16 lo, hi;
    __device__ __forceinline__ u32 value() const { return u32(lo) | (u32(hi) << 16); }
};

static __device__ __forceinline__ U32Halves load_halves(const u8* p) {
    const u16* q = reinterpret_cast<const u16*>(p);
    return {q[0], q[1]};
}

template <>
struct Q8Dot<IQ2XXS> {
    static constexpr int PRELOAD = 12;
    struct Raw {
        u16 d;
        U32Halves a, s;
    };
    static __device__ __forceinline__ Raw load(const u8* b, int item) {
        return {load_u16(b), load_halves(b + 2 + 8 * item), load_halves(b + 6 + 8 * item)};
    }
    static __device__ __forceinline__ float dot(const Raw& r, int item, const i8* q, float d8) {
        const float d = f16_to_f32(r.d);
        const u32 a = r.a.value(), s = r.s.value();
        const int4 x0 = load_q8x16(q + 32 * item), x1 = load_q8x16(q + 32 * item + 16);
        const int xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        int sumi = 0;
        int neg = 0;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            iq2_group_dot(Q8_IQ2XXS_GRID[(a >> (8 * l)) & 0xff], (s >> (7 * l)) & 127,
                          xs[2 * l], xs[2 * l + 1], sumi, neg);
        }
        sumi -= 2 * neg;
        return 0.125f * d * d8 * float(sumi * (2 * int(s >> 28) + 1));
    }
    Q8_DOT_FROM_RAW
};

template <>
struct Q8Dot<IQ2XS> {
    static constexpr int PRELOAD = 12;
    struct Raw {
        u16 d;
        U32Halves w01, w23;
        u8 sc;
    };
    static __device__ __forceinline__ Raw load(const u8* b, int item) {
        return {load_u16(b), load_halves(b + 2 + 8 * item), load_halves(b + 6 + 8 * item),
                b[66 + item]};
    }
    static __device__ __forceinline__ float dot(const Raw& r, int item, const i8* q, float d8) {
        const float d = f16_to_f32(r.d);
        const u32 w01 = r.w01.value(), w23 = r.w23.value();
        const u32 sc = r.sc;
        const int4 x0 = load_q8x16(q + 32 * item), x1 = load_q8x16(q + 32 * item + 16);
        int low = 0, low_neg = 0, high = 0, high_neg = 0;
        iq2_group_dot(Q8_IQ2XS_GRID[w01 & 511], (w01 >> 9) & 127, x0.x, x0.y, low,
                      low_neg);
        iq2_group_dot(Q8_IQ2XS_GRID[(w01 >> 16) & 511], w01 >> 25, x0.z, x0.w, low,
                      low_neg);
        iq2_group_dot(Q8_IQ2XS_GRID[w23 & 511], (w23 >> 9) & 127, x1.x, x1.y, high,
                      high_neg);
        iq2_group_dot(Q8_IQ2XS_GRID[(w23 >> 16) & 511], w23 >> 25, x1.z, x1.w, high,
                      high_neg);
        low -= 2 * low_neg;
        high -= 2 * high_neg;
        const int sumi = low * int(2 * (sc & 0x0f) + 1) + high * int(2 * (sc >> 4) + 1);
        return 0.125f * d * d8 * float(sumi);
    }
    Q8_DOT_FROM_RAW
};

// A type without a Raw of its own: the block pointer stands for it.
struct BlockPointer {
    const u8* b;
};

// Items ahead per row for the loads-ahead products: 2, or 1 where `rows` rows' Raws of 2
// items would pass the type's PRELOAD budget; 0 for the types whose Raw is the block
// pointer: they load inside `dot`, so there is nothing to issue ahead.
template <class Raw>
struct Q8Ahead {
    static __host__ __device__ constexpr int of(int preload, int rows) {
        return preload / rows >= 2 ? 2 : 1;
    }
};
template <>
struct Q8Ahead<BlockPointer> {
    static __host__ __device__ constexpr int of(int, int) { return 0; }
};

// An item's bits: its four grid index bytes (qs, one u32 at 4 * item), its two high-nibble
// bytes (qh, one u16 at 32 + 2 * item) and the block's four scale words (8 bytes at 48,
// 8-aligned: 56-byte blocks on a 16-byte aligned base), whose top nibbles make the f16 scale.
// Three loads where reading the bytes one by one inside `dot` took eleven that no load ahead
// could issue.
template <>
struct Q8Dot<IQ1M> {
    static constexpr int PRELOAD = 12;
    struct Raw {
        u32 qs;
        u16 qh;
        uint2 scales;
    };
    static __device__ __forceinline__ Raw load(const u8* b, int item) {
        return {load_u32(b + 4 * item), load_u16(b + 32 + 2 * item),
                *reinterpret_cast<const uint2*>(b + 48)};
    }
    static __device__ __forceinline__ float dot(const Raw& r, int item, const i8* q, float d8) {
        const u32 w0 = r.scales.x & 0xffff, w1 = r.scales.x >> 16;
        const u32 w2 = r.scales.y & 0xffff, w3 = r.scales.y >> 16;
        const float d = f16_to_f32(u16((w0 >> 12) | ((w1 >> 8) & 0x00f0) |
                                       ((w2 >> 4) & 0x0f00) | (w3 & 0xf000)));
        const u32 word = item < 4 ? (item < 2 ? w0 : w1) : (item < 6 ? w2 : w3);
        const int4 x0 = load_q8x16(q + 32 * item), x1 = load_q8x16(q + 32 * item + 16);
        const int xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        int sumi = 0, sum_delta = 0;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 nibble = (u32(r.qh) >> (4 * l)) & 0x0f;
            const u64 grid = iq1s_grid[((r.qs >> (8 * l)) & 0xff) | ((nibble & 7) << 8)];
            const int ls = 2 * int((word >> (6 * (item % 2) + 3 * (l / 2))) & 7) + 1;
            int grid_sum = __dp4a(int(u32(grid)), xs[2 * l], 0);
            grid_sum = __dp4a(int(u32(grid >> 32)), xs[2 * l + 1], grid_sum);
            int code_sum = __dp4a(0x01010101, xs[2 * l], 0);
            code_sum = __dp4a(0x01010101, xs[2 * l + 1], code_sum);
            sumi += grid_sum * ls;
            sum_delta += (nibble & 8 ? -code_sum : code_sum) * ls;
        }
        return d * d8 * (float(sumi) + 0.125f * float(sum_delta));
    }
    Q8_DOT_FROM_RAW
};

// Item s = 8H + 2p + k: values 128H + 32p + 16k + t (t < 16) are bits 2p of
// qs[32H + 16k + t].
template <>
struct Q8Dot<Q2K> {
    static constexpr int PRELOAD = 8;
    struct Raw {
        u32 dd, qs[4];
        u8 sc;
    };
    static __device__ __forceinline__ Raw load(const u8* b, int item) {
        const u8* qs = b + 16 + 32 * (item >> 3) + 16 * (item & 1);
        return {load_u32(b + 80),
                {load_u32(qs), load_u32(qs + 4), load_u32(qs + 8), load_u32(qs + 12)},
                b[item]};
    }
    static __device__ __forceinline__ float dot(const Raw& r, int item, const i8* q, float d8) {
        const u32 dd = r.dd;
        const u32 sc = r.sc;
        const int half = item >> 3, p = (item >> 1) & 3, k = item & 1;
        const int4 x = load_q8x16(q + 128 * half + 32 * p + 16 * k);
        const int xs[4] = {x.x, x.y, x.z, x.w};
        int sum = 0;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            sum = __dp4a(int((r.qs[w] >> (2 * p)) & 0x03030303u), xs[w], sum);
        }
        const float dl = f16_to_f32(u16(dd & 0xffff)), ml = f16_to_f32(u16(dd >> 16));
        return d8 * (dl * float(int(sc & 0x0f) * sum) - ml * float(int(sc >> 4) * q8_sum16(x)));
    }
    Q8_DOT_FROM_RAW
};

// The 6-bit scale and min of sub-block j of Q4_K / Q5_K as integers.
static __device__ __forceinline__ void scale_min_k4_int(int j, const u8* packed, int& sc, int& m) {
    if (j < 4) {
        sc = packed[j] & 63;
        m = packed[j + 4] & 63;
    } else {
        sc = (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4);
        m = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
    }
}

// The same from the 12 packed bytes held as three little-endian words (a loaded Raw). The
// word of byte i is chosen by comparisons, not by indexing: with j known only at run time,
// `packed[i / 4]` is a run-time index into a register array, which puts the whole Raw in
// local memory (a store and reload after every item's loads: the items of a lane were
// loaded one after the other, each waiting on DRAM). The same bytes either way.
static __device__ __forceinline__ void scale_min_k4_words(int j, const u32 packed[3], int& sc,
                                                          int& m) {
    const auto byte = [&](int i) {
        const u32 word = i < 4 ? packed[0] : (i < 8 ? packed[1] : packed[2]);
        return int((word >> (8 * (i % 4))) & 0xff);
    };
    if (j < 4) {
        sc = byte(j) & 63;
        m = byte(j + 4) & 63;
    } else {
        sc = (byte(j + 4) & 0x0f) | ((byte(j - 4) >> 6) << 4);
        m = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
    }
}

// Item (c, h): low nibbles of qs[32c + 16h + t] are values 64c + 16h + t (sub-block 2c),
// high nibbles values 64c + 32 + 16h + t (sub-block 2c + 1); Q5_K's fifth bit of value
// 32s + l is bit s of qh[l].
template <bool FIVE_BITS>
struct Q8Dot<QKAffine<FIVE_BITS>> {
    static constexpr int PRELOAD = 4;
    struct Raw {
        u32 dd, packed[3];
        uint4 qs, qh;
    };
    static __device__ __forceinline__ Raw load(const u8* b, int item) {
        const int c = item >> 1, h = item & 1;
        Raw r;
        r.dd = load_u32(b);
        r.packed[0] = load_u32(b + 4), r.packed[1] = load_u32(b + 8);
        r.packed[2] = load_u32(b + 12);
        r.qs = load_u128(b + (FIVE_BITS ? 48 : 16) + 32 * c + 16 * h);
        r.qh = FIVE_BITS ? load_u128(b + 16 + 16 * h) : make_uint4(0, 0, 0, 0);
        return r;
    }
    static __device__ __forceinline__ float dot(const Raw& r, int item, const i8* q, float d8) {
        const u32 dd = r.dd;
        const int c = item >> 1, h = item & 1;
        int sc_lo, m_lo, sc_hi, m_hi;
        scale_min_k4_words(2 * c, r.packed, sc_lo, m_lo);
        scale_min_k4_words(2 * c + 1, r.packed, sc_hi, m_hi);
        const uint4 qs = r.qs, qh = r.qh;
        const int4 x_lo = load_q8x16(q + 64 * c + 16 * h);
        const int4 x_hi = load_q8x16(q + 64 * c + 32 + 16 * h);
        const u32 qs_w[4] = {qs.x, qs.y, qs.z, qs.w};
        const u32 qh_w[4] = {qh.x, qh.y, qh.z, qh.w};
        const int xl[4] = {x_lo.x, x_lo.y, x_lo.z, x_lo.w};
        const int xh[4] = {x_hi.x, x_hi.y, x_hi.z, x_hi.w};
        int sum_lo = 0, sum_hi = 0;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            u32 lo = qs_w[w] & 0x0f0f0f0fu, hi = (qs_w[w] >> 4) & 0x0f0f0f0fu;
            if (FIVE_BITS) {
                lo |= ((qh_w[w] >> (2 * c)) & 0x01010101u) << 4;
                hi |= ((qh_w[w] >> (2 * c + 1)) & 0x01010101u) << 4;
            }
            sum_lo = __dp4a(int(lo), xl[w], sum_lo);
            sum_hi = __dp4a(int(hi), xh[w], sum_hi);
        }
        const float d = f16_to_f32(u16(dd & 0xffff)), dmin = f16_to_f32(u16(dd >> 16));
        const int scaled = sc_lo * sum_lo + sc_hi * sum_hi;
        const int mins = m_lo * q8_sum16(x_lo) + m_hi * q8_sum16(x_hi);
        return d8 * (d * float(scaled) - dmin * float(mins));
    }
    Q8_DOT_FROM_RAW
};

// Item (H, k): l = 8k..8k+8 of half H, values 128H + 32g + l for g = 0..4 with scale
// 8H + 2g + k/2.
template <>
struct Q8Dot<Q6K> {
    static constexpr int PRELOAD = 12;
    typedef BlockPointer Raw;
    static __device__ __forceinline__ Raw load(const u8* b, int) { return {b}; }
    static __device__ __forceinline__ float dot(const Raw& r, int item, const i8* q, float d8) {
        const u8* b = r.b;
        const float d = f16_to_f32(load_u16(b + 208));
        const int half = item >> 2, l0 = 8 * (item & 3);
        const u8* ql = b + 64 * half + l0;
        const u8* qh = b + 128 + 32 * half + l0;
        const i8* scales = reinterpret_cast<const i8*>(b + 192 + 8 * half + l0 / 16);
        int sums[4] = {0, 0, 0, 0}, code_sums[4] = {0, 0, 0, 0};
#pragma unroll
        for (int w = 0; w < 2; ++w) {
            const u32 a = load_u32_a2(ql + 4 * w), c = load_u32_a2(ql + 32 + 4 * w);
            const u32 hb = load_u32_a2(qh + 4 * w);
            const u32 codes[4] = {
                (a & 0x0f0f0f0fu) | ((hb & 0x03030303u) << 4),
                (c & 0x0f0f0f0fu) | (((hb >> 2) & 0x03030303u) << 4),
                ((a >> 4) & 0x0f0f0f0fu) | (((hb >> 4) & 0x03030303u) << 4),
                ((c >> 4) & 0x0f0f0f0fu) | (((hb >> 6) & 0x03030303u) << 4),
            };
#pragma unroll
            for (int g = 0; g < 4; ++g) {
                const int x = *reinterpret_cast<const int*>(q + 128 * half + 32 * g + l0 + 4 * w);
                sums[g] = __dp4a(int(codes[g]), x, sums[g]);
                code_sums[g] = __dp4a(0x01010101, x, code_sums[g]);
            }
        }
        int sumi = 0;
#pragma unroll
        for (int g = 0; g < 4; ++g) sumi += int(scales[2 * g]) * (sums[g] - 32 * code_sums[g]);
        return d * d8 * float(sumi);
    }
    Q8_DOT_FROM_RAW
};

// This lane's share of W_row · x with x quantized (`q` codes, `d` scales per 256 values)
// when LANES lanes share the row; reduce over those lanes.
template <class B, int LANES = WARP_SIZE>
static __device__ __forceinline__ float row_dot_lane_q8(const u8* __restrict__ row,
                                                        const i8* q, const float* d, int cols,
                                                        int lane) {
    const int items = cols / B::VALUES * B::ITEMS;
    float acc = 0.0f;
    for (int i = lane; i < items; i += LANES) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        acc += Q8Dot<B>::dot(row + i64(block) * B::BYTES, item, q + block * B::VALUES, d[block]);
    }
    return acc;
}
