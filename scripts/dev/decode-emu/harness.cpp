// The decode kernels written without a GPU (fifteenth to twenty-second sessions) on the host
// (run.sh), each against the launches it replaces, bit for bit: both sides are the kernels'
// own code compiled alike, so any difference is a fault of layout, indexing or order, not of
// rounding. Cases (the switches measured slower on a GPU were removed with their cases):
//   1. router_topk_kernel (the router with the gate row stored after it) and
//      moe_route_gate_kernel (its gate dot's lanes all in one warp) against the split-K router then
//      moe_route_v2_kernel; route_token_tree against route_token_v2.
//   2. argmax_kernel and ids_of_keys_kernel (REDLITE_DEVICE_GREEDY=1) against the host's
//      greedy argmax: ties, -0, NaN, infinities, a row without a finite value.
//   3. The small-batch q8 products (2 to 4 tokens, MTP verifications; one and two rows a
//      warp, and split-K with every token in each CTA, q8 and the router's F32) against the
//      one-token product per token.
//   4. The one-token q8 products with two or four rows a warp (REDLITE_MATMUL_ROWS) against
//      one row a warp.
//   5. Attention decode split over the KV length with 8 warps a CTA (REDLITE_ATTN_SPLIT_WARPS=8,
//      other sums) and with 4, then merged, each against a double-precision reference;
//      attention_split_depth_kernel (REDLITE_ATTN_LONG_FROM) against the grouped split
//      kernels of 4 heads and 4 warps and of 8 and 8, token by token; the scores' warp sums
//      of several values at once (warp_reduce_sum_each) against a butterfly each; the merge of
//      the splits with its values loaded first against the merge over the list of live splits.
//   6. The q8 expert gate/up of 2 and 3 tokens with four rows a lane group
//      (REDLITE_MOE_GATE_UP_ROWS=4) against two, the shared expert and an invalid expert id
//      included; the expert down on CTAs of 8 warps (the default since 0821e26;
//      REDLITE_DOWN_WARPS=4 keeps 4) against 4; the expert down with its ids loaded as a
//      group, EARLY or not, against moe_down_q8_kernel's one id at a time (a skipped token,
//      an id out of range); the expert down folded (two lanes' work a thread, batches of 3
//      or 4 tokens) against unfolded.
//   7. Q8Dot<IQ1M>'s item dot from its loaded bits (three loads an item, so the products can
//      load ahead) against a scalar reference of the same integer sums, on every item of
//      random blocks; the products and the expert down on IQ1_M blocks with their loads ahead
//      against the forms that load as they go.
//   8. The norms' sum of squares from the 8 warps' sums read by every thread
//      (block_sum_of_8_warps, norm_row's on CTAs of 8 warps) against block_reduce_sum; the
//      MTP input's two norms in one launch (mtp_concat_norms_kernel) against two norm
//      launches and the copies of each half.
// Every case runs; the exit status is nonzero if any failed.
#include "emu.h"

typedef unsigned char u8;
typedef signed char i8;

namespace el {
#include "elementwise_host.cu"
float4 norm_stage[1 << 12];
}  // namespace el

namespace mo {
#include "moe_host.cu"
float as[1 << 14], p[1 << 14], xs[1 << 14];
float4 q8_shared[1 << 14];
}  // namespace mo

namespace mm {
#include "matmul_host.cu"
float x_shared[1 << 14];
float4 q8_shared[1 << 14], x_shared4[1 << 12];
}  // namespace mm

namespace at {
#include "attention_host.cu"
float buf[1 << 14], factor[1 << 12], prefill_shared[1 << 12];
}  // namespace at

#include "../emu-common/random_blocks.h"
#include <algorithm>
#include <random>

std::mt19937_64 rng(11);
int failures = 0;

std::vector<float> uniform(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

// `tokens` rows of x as a norm kernel leaves them for the q8 products (rms_norm_q8_kernel with
// unit weights): the normed rows into `x`, their Q8_K scales and codes into `gd` and `gq`.
void quantize_rows(std::vector<float>& x, int tokens, int cols, std::vector<float>& gd,
                   std::vector<i8>& gq) {
    std::vector<float> ones(cols, 1.0f), normed((size_t)tokens * cols);
    gd.assign((size_t)tokens * cols / 256, 0);
    gq.assign((size_t)tokens * cols, 0);
    launch({(unsigned)tokens, 1, 0}, 256, [&] {
        el::rms_norm_q8_kernel(x.data(), ones.data(), normed.data(), gd.data(), gq.data(), cols, 1e-6f);
    });
    x = normed;
}

template <class T>
bool same(const char* what, const std::vector<T>& a, const std::vector<T>& b) {
    if (a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0) return true;
    size_t at = 0;
    while (at < std::min(a.size(), b.size()) && memcmp(&a[at], &b[at], sizeof(T)) == 0) ++at;
    printf("  %s differs at %zu of %zu\n", what, at, a.size());
    return false;
}

void verdict(const char* name, bool ok) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", name);
    failures += !ok;
}

// Router rows: n_expert F32 rows of `cols` values, then the gate row as F32.
struct Router {
    int cols, n_expert, used;
    std::vector<float> rows;  // (n_expert + 1) x cols: the gate row last
};

Router random_router(int cols, int n_expert, int used) {
    return Router{cols, n_expert, used, uniform((size_t)(n_expert + 1) * cols, -0.05f, 0.05f)};
}

struct Routing {
    std::vector<float> logits, weights, shared_weight;
    std::vector<int> ids, ticket;
    // `fill`: what the outputs hold before the launch (each side of a comparison its own, so
    // that an output neither side writes is a difference).
    Routing(const Router& r, float fill)
        : logits(r.n_expert + 1, fill), weights(r.used, fill), shared_weight(1, fill),
          ids(r.used, std::isnan(fill) ? -7 : (int)fill), ticket(1, 0) {}
};

bool same_routing(const Routing& a, const Routing& b) {
    return same("ids", a.ids, b.ids) & same("weights", a.weights, b.weights) &
           same("shared weight", a.shared_weight, b.shared_weight) &
           same("ticket", a.ticket, b.ticket) & same("logits", a.logits, b.logits);
}

constexpr int PER = 16, SPLIT_WARPS = 4;

// The fused router on the normed row `h` (router_topk_kernel).
Routing router_topk(const Router& r, const float* h, float fill) {
    Routing out(r, fill);
    const u8* w = reinterpret_cast<const u8*>(r.rows.data());
    launch({(unsigned)r.n_expert + 1, 1, 0}, SPLIT_WARPS * 32, [&] {
        mo::router_topk_kernel<PER, SPLIT_WARPS>(w, h, out.logits.data(), out.ticket.data(),
                                                 out.ids.data(), out.weights.data(),
                                                 out.shared_weight.data(), r.cols, r.n_expert,
                                                 r.used);
    });
    return out;
}

// Reference of the fused router: the split-K router (the n_expert + 1 rows), then the routing.
void router_fused(const char* name, const Router& r) {
    const int cols = r.cols;
    auto h = uniform(cols, -1, 1);
    const u8* rows = reinterpret_cast<const u8*>(r.rows.data());
    Routing ref(r, NAN);
    const int reduced = r.n_expert + 1;
    launch({(unsigned)reduced, 1, 0}, SPLIT_WARPS * 32, [&] {
        mm::matmul_splitk_kernel<mm::F32x4, SPLIT_WARPS>(rows, h.data(), ref.logits.data(), reduced,
                                                         cols);
    });
    launch({1, 1, 0}, 32, [&] {
        mo::moe_route_v2_kernel<PER>(ref.logits.data(), ref.logits.data() + r.n_expert,
                                     ref.ids.data(), ref.weights.data(), ref.shared_weight.data(),
                                     r.n_expert, r.used);
    });
    Routing got = router_topk(r, h.data(), -3.0f);
    verdict(name, same_routing(ref, got));
    // moe_route_gate_kernel (the routing with the gate row's dot in its launch, the dot's lanes
    // all in one warp) on the same router logits.
    Routing gated(r, -5.0f);
    gated.logits = ref.logits;
    const u8* gate_row = rows + (size_t)r.n_expert * cols * sizeof(float);
    launch({1, 1, 0}, (1 + SPLIT_WARPS) * 32, [&] {
        mo::moe_route_gate_kernel<PER, mo::F32x4, SPLIT_WARPS>(
            gated.logits.data(), gate_row, h.data(), gated.ids.data(), gated.weights.data(),
            gated.shared_weight.data(), cols, r.n_expert, r.used);
    });
    verdict("moe_route_gate_kernel = split-K gate row, then moe_route_v2_kernel",
            same_routing(ref, gated));
}

// The host's greedy argmax: the largest finite value, the lower index on ties, -0 = +0.
long host_argmax(const float* x, int n) {
    long best = -1;
    for (int i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) continue;
        if (best < 0 || x[i] > x[best]) best = i;
    }
    return best;
}

void argmax_and_ids() {
    const int n = 5000, rows = 5;
    auto x = uniform((size_t)n * rows, -10, 10);
    float* r = x.data();
    r[17] = 50, r[4000] = 50;                                   // row 0: a tie, the lower wins
    r[n + 3] = INFINITY, r[n + 9] = NAN, r[n + 4999] = 40;      // row 1: inf and NaN skipped
    for (int i = 0; i < n; ++i) r[2 * n + i] = NAN;             // row 2: nothing finite
    for (int i = 0; i < n; ++i) r[3 * n + i] = -1;              // row 3: -0 and +0 tie
    r[3 * n + 2500] = -0.0f, r[3 * n + 2600] = 0.0f;
    r[4 * n + 4999] = 1e30f;                                    // row 4: the last value
    std::vector<unsigned long long> keys(rows, 0);
    const int per_cta = 256 * 8;
    launch({(unsigned)((n + per_cta - 1) / per_cta), (unsigned)rows, 0}, 256,
           [&] { el::argmax_kernel(x.data(), n, keys.data()); });
    std::vector<unsigned> ids(rows, 12345);
    launch({1, 1, 0}, 32, [&] { el::ids_of_keys_kernel(keys.data(), rows, ids.data()); });
    bool ok = true;
    for (int row = 0; row < rows; ++row) {
        long want = host_argmax(x.data() + (size_t)row * n, n);
        long got = keys[row] == 0 ? -1 : (long)(0xffffffffu - (unsigned)(keys[row] & 0xffffffffu));
        unsigned want_id = want < 0 ? 0u : (unsigned)want;
        if (got != want || ids[row] != want_id) {
            printf("  row %d: host %ld, key names %ld, id %u\n", row, want, got, ids[row]);
            ok = false;
        }
    }
    verdict("argmax_kernel + ids_of_keys_kernel: ties, -0, NaN, inf, no finite value", ok);
}

constexpr int MATMUL_WARPS = 8;

// The one-token q8 product of every token (a CTA row per token) against the small-batch
// product of all of them (the tiles kernel with ROWS rows a warp and T tokens); x quantized in
// the kernels, or read quantized from gd / gq (`quantized`).
// A small batch's product inputs: `rows` random rows of BM blocks, T tokens' x, and those
// quantized when asked (`d`, `q`: null otherwise, the kernels then quantize); `one` and `small`
// for the two launches' outputs, each value not written keeping its mark.
template <class BM, int T>
struct SmallBatchInputs {
    decltype(random_blocks<BM>(rng, 1, 256)) w;
    std::vector<float> x, gd;
    std::vector<i8> gq;
    const float* d = nullptr;
    const i8* q = nullptr;
    std::vector<float> one, small;
    SmallBatchInputs(int rows, int cols, bool quantized)
        : w(random_blocks<BM>(rng, rows, cols)), x(uniform((size_t)T * cols, -1, 1)),
          one((size_t)T * rows, NAN), small((size_t)T * rows, -1.0f) {
        if (quantized) {
            quantize_rows(x, T, cols, gd, gq);
            d = gd.data();
            q = gq.data();
        }
    }
};

template <class BM, int T, int ROWS = 1>
bool small_batch_case(int rows, int cols, bool quantized) {
    SmallBatchInputs<BM, T> in(rows, cols, quantized);
    auto& [w, x, gd, gq, d, q, one, small] = in;
    const unsigned ctas = (rows + MATMUL_WARPS - 1) / MATMUL_WARPS;
    launch({ctas, (unsigned)T, 0}, MATMUL_WARPS * 32, [&] {
        mm::matmul_q8_kernel<BM, MATMUL_WARPS, 1>(w.data(), x.data(), d, q, one.data(), rows, cols);
    });
    const unsigned tile_ctas = (rows + ROWS * MATMUL_WARPS - 1) / (ROWS * MATMUL_WARPS);
    launch({tile_ctas, 1, 0}, MATMUL_WARPS * 32, [&] {
        mm::matmul_q8_tiles_kernel<BM, MATMUL_WARPS, ROWS, T>(w.data(), x.data(), d, q,
                                                              small.data(), rows, cols, T);
    });
    return same("small batch", one, small);
}

// The split-K q8 product of every token (a CTA row per token) against the small batch's
// (all T tokens in each CTA, each item decoded once): the few-row products of a verification.
template <class BM, int T>
bool small_splitk_case(int rows, int cols, bool quantized) {
    constexpr int WARPS = 4;
    SmallBatchInputs<BM, T> in(rows, cols, quantized);
    auto& [w, x, gd, gq, d, q, one, small] = in;
    launch({(unsigned)rows, (unsigned)T, 0}, WARPS * 32, [&] {
        mm::matmul_splitk_q8_kernel<BM, WARPS>(w.data(), x.data(), d, q, one.data(), rows, cols);
    });
    launch({(unsigned)rows, 1, 0}, WARPS * 32, [&] {
        mm::matmul_splitk_q8_small_kernel<BM, WARPS, T>(w.data(), x.data(), d, q, small.data(),
                                                        rows, cols, T);
    });
    return same("small split-K", one, small);
}

// The split-K float product (the router's wide F32 rows) of every token against the small
// batch's (all T tokens in each CTA, each row value loaded once).
template <int T>
bool small_splitk_float_case(int rows, int cols) {
    constexpr int WARPS = 4;
    const auto w = uniform((size_t)rows * cols, -1, 1);
    const auto x = uniform((size_t)T * cols, -1, 1);
    const u8* wb = reinterpret_cast<const u8*>(w.data());
    std::vector<float> one((size_t)T * rows, NAN), small((size_t)T * rows, -1.0f);
    launch({(unsigned)rows, (unsigned)T, 0}, WARPS * 32, [&] {
        mm::matmul_splitk_kernel<mm::F32x4, WARPS>(wb, x.data(), one.data(), rows, cols);
    });
    launch({(unsigned)rows, 1, 0}, WARPS * 32, [&] {
        mm::matmul_splitk_small_kernel<mm::F32x4, WARPS, T>(wb, x.data(), small.data(), rows, cols,
                                                            T);
    });
    return same("small split-K float", one, small);
}

void small_splitk_float() {
    const bool ok = small_splitk_float_case<2>(9, 2048) & small_splitk_float_case<3>(9, 2048) &
                    small_splitk_float_case<4>(9, 2048);
    verdict("F32x4: 2-4 token split-K products (the router's) = one-token products", ok);
}

template <class BM>
void small_batches(const char* type) {
    // 61 rows: the last CTA's warps partly past the rows.
    const int rows = 61, cols = 2048;
    bool ok = true;
    for (bool quantized : {false, true}) {
        ok &= small_batch_case<BM, 2>(rows, cols, quantized);
        ok &= small_batch_case<BM, 3>(rows, cols, quantized);
        ok &= small_batch_case<BM, 4>(rows, cols, quantized);
        ok &= small_batch_case<BM, 2, 2>(rows, cols, quantized);
        ok &= small_batch_case<BM, 3, 2>(rows, cols, quantized);
        ok &= small_batch_case<BM, 4, 2>(rows, cols, quantized);
        ok &= small_splitk_case<BM, 2>(9, cols, quantized);
        ok &= small_splitk_case<BM, 3>(9, cols, quantized);
        ok &= small_splitk_case<BM, 4>(9, cols, quantized);
    }
    char name[160];
    snprintf(name, sizeof name,
             "%s: 2-4 token products, one and two rows a warp, and split-K (x quantized in the "
             "kernel or read quantized) = one-token products",
             type);
    verdict(name, ok);
}

// One-token q8 products with two and four rows a warp (REDLITE_MATMUL_ROWS) against one: the
// same bits.
template <class B>
void rows_a_warp(const char* type) {
    const int rows = 61, cols = 2048;
    auto w = random_blocks<B>(rng, rows, cols);
    auto x = uniform(cols, -1, 1);
    std::vector<float> one(rows, NAN), two(rows, -1.0f), four(rows, -2.0f);
    launch({(rows + MATMUL_WARPS - 1) / MATMUL_WARPS, 1, 0}, MATMUL_WARPS * 32, [&] {
        mm::matmul_q8_kernel<B, MATMUL_WARPS, 1>(w.data(), x.data(), nullptr, nullptr, one.data(),
                                                 rows, cols);
    });
    launch({(rows + 2 * MATMUL_WARPS - 1) / (2 * MATMUL_WARPS), 1, 0}, MATMUL_WARPS * 32, [&] {
        mm::matmul_q8_kernel<B, MATMUL_WARPS, 2>(w.data(), x.data(), nullptr, nullptr, two.data(),
                                                 rows, cols);
    });
    launch({(rows + 4 * MATMUL_WARPS - 1) / (4 * MATMUL_WARPS), 1, 0}, MATMUL_WARPS * 32, [&] {
        mm::matmul_q8_kernel<B, MATMUL_WARPS, 4>(w.data(), x.data(), nullptr, nullptr, four.data(),
                                                 rows, cols);
    });
    char name[120];
    snprintf(name, sizeof name, "%s: one-token products, two and four rows a warp = one row a warp",
             type);
    verdict(name, same("products", one, two) & same("products", one, four));
}

// Worst relative L2 error over (token, head) of an attention output `o` of `tokens` tokens
// after `pos0` cached positions (Qwen3-Next's heads: 16 query heads on 2 KV heads of 256
// values; caches `k`, `v` as the kernels read them) against the attention in doubles.
double attention_reference_error(const std::vector<float>& q, const std::vector<float>& qg,
                                 const std::vector<float>& k, const std::vector<float>& v,
                                 const std::vector<float>& o, int tokens, int pos0) {
    constexpr int HD = 256, HEADS = 16, KV_HEADS = 2;
    const double scale = 1.0f / 16.0f;
    double worst = 0;
    for (int t = 0; t < tokens; ++t) {
        for (int h = 0; h < HEADS; ++h) {
            const int kvh = h / (HEADS / KV_HEADS), n = pos0 + t + 1;
            const float* qr = &q[((size_t)t * HEADS + h) * HD];
            std::vector<double> p(n);
            double m = -1e300, l = 0;
            for (int j = 0; j < n; ++j) {
                double d = 0;
                for (int e = 0; e < HD; ++e) d += (double)qr[e] * k[((size_t)j * KV_HEADS + kvh) * HD + e];
                p[j] = d * scale;
                m = std::max(m, p[j]);
            }
            for (int j = 0; j < n; ++j) l += p[j] = std::exp(p[j] - m);
            double err = 0, norm = 0;
            for (int e = 0; e < HD; ++e) {
                double acc = 0;
                for (int j = 0; j < n; ++j) acc += p[j] * v[((size_t)j * KV_HEADS + kvh) * HD + e];
                const double gate = qg[((size_t)t * HEADS + h) * 2 * HD + HD + e];
                const double want = acc / l / (1 + std::exp(-gate));
                const double got = o[((size_t)t * HEADS + h) * HD + e];
                err += (got - want) * (got - want);
                norm += want * want;
            }
            const double rel = std::sqrt(err / std::max(norm, 1e-300));
            worst = std::isfinite(rel) ? std::max(worst, rel) : 1e300;
        }
    }
    return worst;
}

// Attention decode of `tokens` tokens after `pos0` cached positions: the split kernel with
// four query heads a CTA and WARPS warps, every split launched as the decode graph does (each
// token's chunk from its own length), then the merge with the sigmoid gate; against doubles.
template <int WARPS>
double attention_error(int tokens, int pos0) {
    constexpr int HD = 256, VPL = HD / 32, HPC = 4, HEADS = 16, KV_HEADS = 2, SPLITS = 64,
                  MIN_CHUNK = 32;
    const float scale = 1.0f / 16.0f;
    const int len = pos0 + tokens;
    auto q = uniform((size_t)tokens * HEADS * HD, -1, 1);
    auto qg = uniform((size_t)tokens * HEADS * 2 * HD, -2, 2);
    auto k = uniform((size_t)len * KV_HEADS * HD, -1, 1), v = uniform((size_t)len * KV_HEADS * HD, -1, 1);
    std::vector<float> partials((size_t)tokens * HEADS * SPLITS * (HD + 2), NAN), o((size_t)tokens * HEADS * HD, NAN);
    launch({(unsigned)tokens, HEADS / HPC, SPLITS}, WARPS * 32, [&] {
        at::attention_split_heads_kernel<float, VPL, WARPS, HPC>(q.data(), k.data(), v.data(),
                                                                 partials.data(), nullptr, pos0, HEADS,
                                                                 KV_HEADS, 0, MIN_CHUNK, scale);
    });
    launch({(unsigned)tokens, HEADS, 1}, 256, [&] {
        at::attention_combine_kernel(partials.data(), qg.data(), o.data(), HEADS, HD, SPLITS);
    });
    return attention_reference_error(q, qg, k, v, o, tokens, pos0);
}

// n uniform values in [-1, 1) as a KV cache holds them: floats, or f16 bits (KV of 2 bytes).
template <class KV>
std::vector<KV> random_cache(size_t n) {
    const auto f = uniform(n, -1, 1);
    std::vector<KV> out(n);
    for (size_t i = 0; i < n; ++i) {
        if constexpr (sizeof(KV) == 2) {
            out[i] = emu_to_half(f[i]);
        } else {
            out[i] = f[i];
        }
    }
    return out;
}

// attention_split_depth_kernel (REDLITE_ATTN_LONG_FROM) against the grouped split kernel of
// four heads and four warps for tokens shorter than long_len, of eight and eight for the
// others: every token's partials the same bits (f32 and f16 caches, tokens on both sides).
template <class KV>
bool attention_depth_case(int pos0, int tokens, int long_len) {
    // 16 splits (the graph launches 64; a token uses at most grid.z): a quarter of the CTAs.
    constexpr int HD = 256, VPL = HD / 32, HEADS = 16, KV_HEADS = 2, SPLITS = 16, MIN_CHUNK = 32;
    const float scale = 1.0f / 16.0f;
    const int len = pos0 + tokens;
    auto q = uniform((size_t)tokens * HEADS * HD, -1, 1);
    auto k = random_cache<KV>((size_t)len * KV_HEADS * HD), v = random_cache<KV>((size_t)len * KV_HEADS * HD);
    const size_t n = (size_t)tokens * HEADS * SPLITS * (HD + 2);
    std::vector<float> p4(n, NAN), p8(n, -1.0f), pd(n, -2.0f);
    launch({(unsigned)tokens, HEADS / 4, SPLITS}, 4 * 32, [&] {
        at::attention_split_heads_kernel<KV, VPL, 4, 4>(q.data(), k.data(), v.data(), p4.data(), nullptr,
                                                        pos0, HEADS, KV_HEADS, 0, MIN_CHUNK, scale);
    });
    launch({(unsigned)tokens, HEADS / 8, SPLITS}, 8 * 32, [&] {
        at::attention_split_heads_kernel<KV, VPL, 8, 8>(q.data(), k.data(), v.data(), p8.data(), nullptr,
                                                        pos0, HEADS, KV_HEADS, 0, MIN_CHUNK, scale);
    });
    launch({(unsigned)tokens, HEADS / 4, SPLITS}, 8 * 32, [&] {
        at::attention_split_depth_kernel<KV, VPL>(q.data(), k.data(), v.data(), pd.data(), nullptr, pos0,
                                                  HEADS, KV_HEADS, 0, MIN_CHUNK, scale, long_len);
    });
    bool ok = true;
    const size_t per_token = n / tokens;
    for (int t = 0; t < tokens; ++t) {
        const auto& want = pos0 + t + 1 >= long_len ? p8 : p4;
        std::vector<float> a(want.begin() + t * per_token, want.begin() + (t + 1) * per_token);
        std::vector<float> b(pd.begin() + t * per_token, pd.begin() + (t + 1) * per_token);
        ok &= same("partials", a, b);
    }
    return ok;
}

void attention_depth() {
    // Token 0 short, the others long (f32, f16); one token at depth 0 as long (one live split).
    const bool ok = attention_depth_case<float>(700, 3, 702) & attention_depth_case<unsigned short>(300, 2, 302) &
                    attention_depth_case<float>(0, 1, 1);
    verdict("attention split by depth = four heads and four warps below long_len, eight and eight "
            "from it (f32 and f16, 1-3 tokens)",
            ok);
}

// attention_combine_ahead_kernel (the default) against attention_combine_kernel
// (REDLITE_COMBINE_AHEAD=0) on the partials of the grouped split kernel: every output the same
// bits, launched as the engine launches them (64 threads, four CTAs a head of 256). `splits`
// above 64 walks the ahead kernel's splits past the ones it loads first.
template <class KV>
bool combine_ahead_case(int pos0, int tokens, int splits) {
    constexpr int HD = 256, VPL = HD / 32, HEADS = 16, KV_HEADS = 2, MIN_CHUNK = 32;
    const float scale = 1.0f / 16.0f;
    const int len = pos0 + tokens;
    auto q = uniform((size_t)tokens * HEADS * HD, -1, 1);
    auto qg = uniform((size_t)tokens * HEADS * 2 * HD, -2, 2);
    auto k = random_cache<KV>((size_t)len * KV_HEADS * HD), v = random_cache<KV>((size_t)len * KV_HEADS * HD);
    std::vector<float> partials((size_t)tokens * HEADS * splits * (HD + 2), NAN);
    launch({(unsigned)tokens, HEADS / 4, (unsigned)splits}, 4 * 32, [&] {
        at::attention_split_heads_kernel<KV, VPL, 4, 4>(q.data(), k.data(), v.data(), partials.data(),
                                                        nullptr, pos0, HEADS, KV_HEADS, 0, MIN_CHUNK, scale);
    });
    std::vector<float> listed((size_t)tokens * HEADS * HD, NAN), ahead(listed.size(), -1.0f);
    launch({(unsigned)tokens, HEADS, HD / 64}, 64, [&] {
        at::attention_combine_kernel(partials.data(), qg.data(), listed.data(), HEADS, HD, splits);
    });
    launch({(unsigned)tokens, HEADS, HD / 64}, 64, [&] {
        at::attention_combine_ahead_kernel(partials.data(), qg.data(), ahead.data(), HEADS, HD, splits);
    });
    return same("merged attention", listed, ahead);
}

void combine_ahead() {
    // One live split of 64; a few; every one of 64 (2,100 positions: 66 splits of 32 capped
    // at 64); 66 live of 80 (the splits past the first 64); f32 and f16 caches.
    const bool ok = combine_ahead_case<float>(0, 1, 64) & combine_ahead_case<float>(45, 3, 64) &
                    combine_ahead_case<float>(2100, 2, 64) & combine_ahead_case<unsigned short>(2100, 1, 64) &
                    combine_ahead_case<float>(2100, 2, 80);
    verdict("attention merge with the values loaded first = the merge over the list of live splits "
            "(1-3 tokens, 1 to 66 live splits, 64 and 80 launched)",
            ok);
}

// warp_reduce_sum_each (the attention split kernels' scores, several heads' at once) against
// warp_reduce_sum value by value, bit for bit, on values of mixed signs and magnitudes (so
// that the order of the additions shows), every lane's copy of every total.
template <int R, int C>
bool scattered_sums_case() {
    constexpr int N = R * C;
    // A generator of its own: the other cases' data stays what it was before this case.
    std::mt19937_64 own(N);
    std::uniform_real_distribution<float> mantissa(-1, 1);
    std::uniform_int_distribution<int> exponent(-20, 20);
    std::vector<float> x((size_t)32 * N);
    for (auto& value : x) value = std::ldexp(mantissa(own), exponent(own));
    std::vector<float> want(x.size(), NAN), got(x.size(), -1.0f);
    launch({1, 1, 0}, 32, [&] {
        const int lane = threadIdx.x % 32;
        float v[R][C];
        for (int i = 0; i < N; ++i) {
            v[i / C][i % C] = x[lane * N + i];
            want[lane * N + i] = at::warp_reduce_sum(v[i / C][i % C]);
        }
        at::warp_reduce_sum_each(v);
        for (int i = 0; i < N; ++i) got[lane * N + i] = v[i / C][i % C];
    });
    return same("sums", want, got);
}

void scattered_sums() {
    verdict("warp_reduce_sum_each = warp_reduce_sum of each value (1x4, 2x4, 4x4, 8x4, 16x4)",
            scattered_sums_case<1, 4>() & scattered_sums_case<2, 4>() &
                scattered_sums_case<4, 4>() & scattered_sums_case<8, 4>() &
                scattered_sums_case<16, 4>());
}

void attention_split_warps() {
    // One split and 63 empty ones; a few positions a split; 22 splits, several groups a warp.
    const int cases[3][2] = {{0, 1}, {45, 3}, {700, 3}};
    for (const auto& [pos0, tokens] : cases) {
        const double four = attention_error<4>(tokens, pos0), eight = attention_error<8>(tokens, pos0);
        char name[160];
        snprintf(name, sizeof name,
                 "attention decode at depth %d, %d token(s): 4 warps %.1e, 8 warps %.1e relative L2 "
                 "(at most 1e-5)",
                 pos0, tokens, four, eight);
        verdict(name, four <= 1e-5 && eight <= 1e-5);
    }
}

// The q8 expert gate/up (with the shared expert) at ROWS rows a lane group into act and
// act_shared; `fill` what they hold before.
template <class B, int LANES, int ROWS>
void gate_up(const std::vector<u8>& gate, const std::vector<u8>& up, const std::vector<u8>& shared_gate,
             const std::vector<u8>& shared_up, const std::vector<int>& ids, const std::vector<float>& x,
             const float* gd, const i8* gq, int tokens, int used, int n_expert, std::vector<float>& act,
             std::vector<float>& act_shared) {
    const int cols = 2048, ff = 256, rows_per_cta = 4 * 32 / LANES * ROWS;
    launch({(unsigned)(ff / rows_per_cta), (unsigned)used + 1, (unsigned)tokens}, 128, [&] {
        mo::moe_gate_up_q8_kernel<B, 4, LANES, ROWS>(gate.data(), up.data(), ids.data(), x.data(), gd, gq,
                                                     act.data(), ff, cols, used, n_expert,
                                                     shared_gate.data(), shared_up.data(),
                                                     act_shared.data(), ff);
    });
}

template <class B, int LANES>
bool batch_rows_case(int tokens, bool quantized) {
    // The model's rows of 2,048 values; experts of 256 rows (the model's have 512: half the
    // CTAs, for time).
    const int cols = 2048, ff = 256, n_expert = 16, used = 4;
    auto gate = random_blocks<B>(rng, n_expert * ff, cols), up = random_blocks<B>(rng, n_expert * ff, cols);
    auto shared_gate = random_blocks<B>(rng, ff, cols), shared_up = random_blocks<B>(rng, ff, cols);
    std::vector<int> ids((size_t)tokens * used);
    for (auto& id : ids) id = (int)(rng() % n_expert);
    ids[1] = n_expert;  // an id out of range: zeros
    auto x = uniform((size_t)tokens * cols, -1, 1);
    std::vector<float> gd;
    std::vector<i8> gq;
    if (quantized) quantize_rows(x, tokens, cols, gd, gq);
    const float* d = quantized ? gd.data() : nullptr;
    const i8* q = quantized ? gq.data() : nullptr;
    std::vector<float> act2((size_t)tokens * used * ff, NAN), shared2((size_t)tokens * ff, NAN);
    std::vector<float> act4((size_t)tokens * used * ff, -1.0f), shared4((size_t)tokens * ff, -1.0f);
    gate_up<B, LANES, 2>(gate, up, shared_gate, shared_up, ids, x, d, q, tokens, used, n_expert, act2, shared2);
    gate_up<B, LANES, 4>(gate, up, shared_gate, shared_up, ids, x, d, q, tokens, used, n_expert, act4, shared4);
    return same("routed act", act2, act4) & same("shared act", shared2, shared4);
}

template <class B>
void batch_rows(const char* type) {
    // The model's 32 lanes a row (2,048 values) and the 16 of shorter rows' kernels.
    const bool ok = batch_rows_case<B, 32>(2, false) & batch_rows_case<B, 16>(3, true);
    char name[160];
    snprintf(name, sizeof name,
             "%s: expert gate/up, four rows a lane group = two (2 tokens, 32 lanes; 3 tokens, 16 "
             "lanes, x read quantized)",
             type);
    verdict(name, ok);
}

// route_token_tree (what the routing kernels run) against route_token_v2 on one token's
// logits: ids and weights bit for bit, each side starting from its own fill.
bool route_tree_case(const std::vector<float>& l, int n_expert, int used) {
    std::vector<int> ids_a(used, -7), ids_b(used, -9);
    std::vector<float> w_a(used, NAN), w_b(used, -5.0f);
    launch({1, 1, 0}, 32, [&] {
        mo::route_token_v2<PER>(l.data(), ids_a.data(), w_a.data(), n_expert, used, threadIdx.x);
    });
    launch({1, 1, 0}, 32, [&] {
        mo::route_token_tree<PER>(l.data(), ids_b.data(), w_b.data(), n_expert, used, threadIdx.x);
    });
    return same("ids", ids_a, ids_b) & same("weights", w_a, w_b);
}

// Logits from a normal law, from five values (ties everywhere), with -inf and +inf entries,
// a NaN, equal logits only, fewer experts than the lanes' slots; 1, 10, 32 and 33 picks (33:
// the tree falls back to the chain).
void route_tree() {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    bool ok = true;
    int cases = 0;
    for (int n_expert : {512, 500, 40}) {
        for (int used : {1, 10, 32, 33}) {
            if (used > n_expert) continue;
            for (int kind = 0; kind < 6; ++kind) {
                for (int rep = 0; rep < 4; ++rep) {
                    std::vector<float> l(n_expert);
                    for (auto& x : l) {
                        const float five[5] = {-1.5f, 0.0f, 0.25f, 3.0f, 3.0f};
                        x = kind == 1 ? five[rng() % 5] : kind == 4 ? 0.5f : normal(rng);
                    }
                    if (kind == 2) l[rng() % n_expert] = -INFINITY, l[rng() % n_expert] = -INFINITY;
                    if (kind == 3) l[rng() % n_expert] = INFINITY;
                    if (kind == 5) l[rng() % n_expert] = NAN;
                    const bool one = route_tree_case(l, n_expert, used);
                    if (!one) printf("  (%d experts, %d picks, kind %d)\n", n_expert, used, kind);
                    ok &= one;
                    ++cases;
                }
            }
        }
    }
    char name[160];
    snprintf(name, sizeof name,
             "route_token_tree = route_token_v2 (%d tokens: normal, five values, +-inf, NaN, all "
             "equal; 512, 500, 40 experts; 1, 10, 32, 33 picks)",
             cases);
    verdict(name, ok);
}

// An expert down launch's inputs at the 80B model's term shapes (10 + 1 terms of 512 values,
// 256 rows here): the shared expert folded in, token 0's fourth id out of range (no term).
template <class B>
struct DownCase {
    static constexpr int LANES = 16, ROWS = 256, FF = 512;
    static constexpr int IPL = (FF / 256 * B::ITEMS + LANES - 1) / LANES;
    const int n_expert = 12, used = 10, tokens;
    decltype(random_blocks<B>(rng, 1, FF)) down, shared_down;
    std::vector<int> ids;
    std::vector<float> weights, shared_weight, act, act_shared;
    explicit DownCase(int tokens)
        : tokens(tokens), down(random_blocks<B>(rng, n_expert * ROWS, FF)),
          shared_down(random_blocks<B>(rng, ROWS, FF)), ids((size_t)tokens * used),
          weights(uniform((size_t)tokens * used, 0, 0.2f)), shared_weight(uniform(tokens, 0, 1)),
          act(uniform((size_t)tokens * used * FF, -3, 3)), act_shared(uniform((size_t)tokens * FF, -1, 1)) {
        for (auto& id : ids) id = (int)(rng() % n_expert);
        ids[3] = n_expert;
    }
    // `kernel` (an instance of a q8 down kernel with `warps` warps a CTA, each lane group's
    // work folded into LANES / fold threads) run over every token; rows it does not write stay
    // -1.
    template <class K>
    std::vector<float> run(int warps, K kernel, int fold = 1) const {
        std::vector<float> out((size_t)tokens * ROWS, -1.0f);
        launch({(unsigned)(ROWS / (warps * 32 / (LANES / fold))), (unsigned)tokens, 0}, warps * 32, [&] {
            kernel(down.data(), ids.data(), weights.data(), act.data(), out.data(), ROWS, FF, used,
                   n_expert, 0, shared_down.data(), shared_weight.data(), act_shared.data(), FF);
        });
        return out;
    }
};

// The expert down with its weights loaded ahead on CTAs of 8 warps (the default) against 4:
// each row's lane group and sums alike, the input's blocks spread over 8 warps instead of 4
// (each quantized alike); out bit for bit.
template <class B>
void down_warps(const char* type) {
    using C = DownCase<B>;
    const C c(2);
    const auto four = c.run(4, mo::moe_down_q8_preload_kernel<B, 4, C::LANES, C::IPL, false>);
    const auto eight = c.run(8, mo::moe_down_q8_preload_kernel<B, 8, C::LANES, C::IPL, false>);
    char name[120];
    snprintf(name, sizeof name, "%s: expert down on CTAs of 8 warps = 4 (2 tokens, 10 + 1 terms)", type);
    verdict(name, same("down", four, eight));
}

// The expert down with its ids loaded as a group before any is used (both EARLY forms: the
// valid terms by a bit mask, or by id[k] again) against moe_down_q8_kernel, which reads one
// term's id at a time (REDLITE_MOE_DOWN_PRELOAD=0; the same terms in the same order): out
// bit for bit, with a skipped token (SKIP_PAIR: nothing written).
template <class B, bool EARLY>
void down_id_group(const char* type) {
    using C = DownCase<B>;
    C c(3);
    c.ids[2 * c.used] = SKIP_PAIR;
    const auto group = c.run(4, mo::moe_down_q8_preload_kernel<B, 4, C::LANES, C::IPL, EARLY>);
    const auto one = c.run(4, mo::moe_down_q8_kernel<B, 4, C::LANES, 1>);
    char name[140];
    snprintf(name, sizeof name, "%s: expert down, ids as a group (%s) = one id at a time (3 tokens, one skipped)",
             type, EARLY ? "EARLY" : "after the wait");
    verdict(name, same("down", group, one));
}

// The expert down folded (each thread two lanes' work, half the CTAs: a verification of 3 or 4
// rows in one wave) against the unfolded kernel: each lane's terms and sums alike, the first
// shuffle's sum done in the thread; out bit for bit, with a skipped token and an id out of range.
template <class B, bool EARLY>
void down_fold(const char* type) {
    using C = DownCase<B>;
    C c(4);
    c.ids[2 * c.used] = SKIP_PAIR;
    const auto one = c.run(8, mo::moe_down_q8_preload_kernel<B, 8, C::LANES, C::IPL, EARLY, 1>);
    const auto two = c.run(8, mo::moe_down_q8_preload_kernel<B, 8, C::LANES, C::IPL, EARLY, 2>, 2);
    char name[140];
    snprintf(name, sizeof name, "%s: expert down folded = unfolded (%s; 4 tokens, one skipped)", type,
             EARLY ? "EARLY" : "after the wait");
    verdict(name, same("down", one, two));
}

#include "item_dots.h"

// block_sum_of_8_warps (the norms' sum of squares on CTAs of 8 warps) against
// block_reduce_sum on the same 256 values a CTA, every thread's result bit for bit: values
// from a normal law squared (as the norm sums them), zeros, subnormals, huge ones, a NaN.
float sum_scratch_a[32], sum_scratch_b[32];
void norm_sums() {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    bool ok = true;
    for (int rep = 0; rep < 200; ++rep) {
        std::vector<float> v(256);
        for (auto& x : v) {
            const float n = normal(rng);
            x = n * n;
        }
        if (rep % 5 == 1) for (int i = 0; i < 256; i += 3) v[i] = 0.0f;
        if (rep % 5 == 2) for (int i = 0; i < 256; i += 7) v[i] = 1e-41f;
        if (rep % 5 == 3) v[rng() % 256] = 3e38f;
        if (rep == 4) v[rng() % 256] = NAN;
        std::vector<float> a(256), b(256);
        launch({1, 1, 0}, 256, [&] {
            a[threadIdx.x] = el::block_reduce_sum(v[threadIdx.x], sum_scratch_a);
            b[threadIdx.x] = el::block_sum_of_8_warps(v[threadIdx.x], sum_scratch_b);
        });
        ok &= same("CTA sum", a, b);
    }
    verdict("block_sum_of_8_warps = block_reduce_sum (200 CTAs of 256 non-negative values: zeros, "
            "subnormals, 3e38, a NaN)",
            ok);
}

// mtp_concat_norms_kernel (the MTP input's two norms side by side, one launch) against
// rms_norm_kernel on the embeddings and on the hidden rows, then each half copied into its
// place: every value of the concatenation bit for bit, 1 to 4 rows of the model's 2048.
void mtp_concat_norms() {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    bool ok = true;
    const int cols = 2048;
    for (int rows = 1; rows <= 4; ++rows) {
        std::vector<float> e((size_t)rows * cols), h((size_t)rows * cols), we(cols), wh(cols);
        for (auto* v : {&e, &h, &we, &wh})
            for (auto& x : *v) x = normal(rng);
        std::vector<float> ne(e.size()), nh(h.size()), expected(2 * e.size()),
            found(2 * e.size(), NAN);
        launch({(unsigned)rows, 1, 0}, 256,
               [&] { el::rms_norm_kernel(e.data(), we.data(), ne.data(), cols, 1e-6f); });
        launch({(unsigned)rows, 1, 0}, 256,
               [&] { el::rms_norm_kernel(h.data(), wh.data(), nh.data(), cols, 1e-6f); });
        for (int r = 0; r < rows; ++r) {
            std::copy_n(ne.begin() + (size_t)r * cols, cols, expected.begin() + (size_t)r * 2 * cols);
            std::copy_n(nh.begin() + (size_t)r * cols, cols,
                        expected.begin() + (size_t)r * 2 * cols + cols);
        }
        launch({(unsigned)(2 * rows), 1, 0}, 256, [&] {
            el::mtp_concat_norms_kernel(e.data(), h.data(), we.data(), wh.data(), found.data(),
                                        rows, cols, 1e-6f);
        });
        ok &= same("MTP concat norms", expected, found);
    }
    verdict("mtp_concat_norms_kernel = two rms_norm_kernel launches and the halves' copies "
            "(1-4 rows of 2048)",
            ok);
}

int main(int argc, char** argv) {
    // An argument runs only the cases of that group: router, argmax, small, rows, attention,
    // moe, iq1m, signs or norm.
    const auto group = [&](const char* name) { return argc < 2 || strcmp(argv[1], name) == 0; };
    // The model's shapes: 2048 values a row, 512 experts, 10 chosen.
    const Router r = random_router(2048, 512, 10);
    if (group("router")) {
        router_fused("router_topk_kernel = split-K router, then moe_route_v2_kernel", r);
        route_tree();
    }
    if (group("argmax")) argmax_and_ids();
    if (group("small")) {
        small_batches<mm::IQ2XXS>("IQ2_XXS");
        small_batches<mm::IQ2XS>("IQ2_XS");
        small_batches<mm::Q2K>("Q2_K");
        small_batches<mm::Q4K>("Q4_K");
        small_batches<mm::Q5K>("Q5_K");
        small_batches<mm::Q6K>("Q6_K");
        small_batches<mm::IQ1M>("IQ1_M");
        small_splitk_float();
    }
    if (group("iq1m")) {
        iq1m_item_dot();
        rows_a_warp<mm::IQ1M>("IQ1_M");
        down_warps<mo::IQ1M>("IQ1_M");
        down_id_group<mo::IQ1M, true>("IQ1_M");
        down_id_group<mo::IQ1M, false>("IQ1_M");
        down_fold<mo::IQ1M, true>("IQ1_M");
    }
    if (group("rows")) {
        rows_a_warp<mm::IQ2XXS>("IQ2_XXS");
        rows_a_warp<mm::Q4K>("Q4_K");
        rows_a_warp<mm::Q5K>("Q5_K");
        rows_a_warp<mm::Q6K>("Q6_K");
    }
    if (group("attention")) {
        scattered_sums();
        attention_split_warps();
        attention_depth();
        combine_ahead();
    }
    if (group("moe")) {
        down_warps<mo::IQ2XXS>("IQ2_XXS");
        down_warps<mo::Q2K>("Q2_K");
        down_id_group<mo::IQ2XXS, true>("IQ2_XXS");
        down_id_group<mo::IQ2XXS, false>("IQ2_XXS");
        down_id_group<mo::Q2K, true>("Q2_K");
        down_fold<mo::IQ2XXS, true>("IQ2_XXS");
        down_fold<mo::IQ2XXS, false>("IQ2_XXS");
        down_fold<mo::Q2K, true>("Q2_K");
        down_fold<mo::Q4K, false>("Q4_K");
        batch_rows<mo::IQ2XXS>("IQ2_XXS");
        batch_rows<mo::Q4K>("Q4_K");
    }
    if (group("signs")) iq2_signs();
    if (group("norm")) {
        norm_sums();
        mtp_concat_norms();
    }
    printf("%s\n", failures == 0 ? "all cases passed" : "some cases failed");
    return failures == 0 ? 0 : 1;
}
