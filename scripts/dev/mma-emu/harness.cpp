// The mma kernels on the host (run.sh) against the q8 kernels' integer dots: random blocks of
// each covered type with finite scales, x quantized by mma_quantize_kernel, then dense (ragged
// row and token tiles, one token), routed gate/up with SwiGLU and down + combine, as MmaTiles
// groups the pairs. Exits nonzero on the first value of a case beyond 1e-5 of the token's
// largest value.
#include "../emu-common/shim.h"
#include "mma_host.cu"
#include "../emu-common/random_blocks.h"
#include <random>
#include <algorithm>

std::mt19937_64 rng(7);
template <class B>
std::vector<u8> random_blocks(int rows, int cols) {
    return ::random_blocks<B>(rng, rows, cols);
}

void quantize(const std::vector<float>& x, std::vector<float>& d, std::vector<i8>& q) {
    int blocks = x.size() / 256;
    d.assign(blocks, 0);
    q.assign(x.size(), 0);
    launch({(unsigned)((blocks + 15) / 16), 1, 0}, 128, [&] {
        mma_quantize_kernel(x.data(), d.data(), q.data(), blocks);
    });
}

template <class B>
double ref_dot(const u8* row, const i8* xq, const float* xd, int cols) {
    double s = 0;
    for (int b = 0; b < cols / 256; ++b)
        for (int item = 0; item < B::ITEMS; ++item)
            s += Q8Dot<B>::dot(row + (size_t)b * B::BYTES, item, xq + b * 256, xd[b]);
    return s;
}

int failures = 0;
void check(const char* what, const std::vector<double>& ref, const std::vector<float>& y, int width) {
    for (size_t t = 0; t * width < ref.size(); ++t) {
        double scale = 0;
        for (int r = 0; r < width; ++r) scale = std::max(scale, std::fabs(ref[t * width + r]));
        for (int r = 0; r < width; ++r) {
            double e = ref[t * width + r], f = y[t * width + r];
            if (!(std::fabs(e - f) <= 1e-5 * std::max(scale, 1e-30))) {
                printf("FAIL %s token %zu row %d: ref %g mma %g (scale %g)\n", what, t, r, e, f, scale);
                ++failures;
                return;
            }
        }
    }
    printf("ok   %s\n", what);
}

template <class B>
void dense(const char* name, int rows, int cols, int tokens) {
    auto w = random_blocks<B>(rows, cols);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> x((size_t)tokens * cols);
    for (auto& v : x) v = u(rng);
    std::vector<float> xd; std::vector<i8> xq;
    quantize(x, xd, xq);
    std::vector<float> y((size_t)tokens * rows, NAN);
    constexpr int MT = 128, NT = 64;
    launch({(unsigned)((rows + MT - 1) / MT), (unsigned)((tokens + NT - 1) / NT), 0}, 256, [&] {
        mma_matmul_kernel<B, 4, 2, 2, 4, 1>(w.data(), nullptr, 0, nullptr, nullptr, 1, xq.data(),
                                            xd.data(), y.data(), rows, cols, tokens);
    });
    size_t rb = (size_t)cols / 256 * B::BYTES;
    std::vector<double> ref(y.size());
    for (int t = 0; t < tokens; ++t)
        for (int r = 0; r < rows; ++r)
            ref[(size_t)t * rows + r] = ref_dot<B>(&w[r * rb], &xq[(size_t)t * cols], &xd[t * (cols / 256)], cols);
    char what[128];
    snprintf(what, sizeof what, "%s dense %dx%d t%d", name, rows, cols, tokens);
    check(what, ref, y, rows);
}

// Groups ids on the "device" (mma_group_kernel); returns the grid's tile count.
// Tiles of `tile` pairs (16, or 64: the wide shapes).
int group_on_device(const std::vector<int>& ids, int n_expert, std::vector<int>& info,
                    std::vector<int>& pairs, int tile = 16) {
    const int n_pairs = ids.size(), bound = (n_pairs + tile - 1) / tile + n_expert;
    info.assign(3 * bound, -7);
    pairs.assign(n_pairs, -7);
    launch({1, 1, 0}, 1024, [&] {
        mma_group_kernel(ids.data(), n_pairs, n_expert, info.data(), bound, pairs.data(), tile);
    });
    return bound;
}

// Host tiles as MmaTiles builds them, `tile` pairs at most.
void group_on_host(const std::vector<int>& ids, int n_expert, int tile, std::vector<int>& info,
                   std::vector<int>& pairs) {
    for (int e = 0; e < n_expert; ++e) {
        std::vector<int> list;
        for (int p = 0; p < (int)ids.size(); ++p) if (ids[p] == e) list.push_back(p);
        for (size_t c = 0; c < list.size(); c += tile) {
            int count = std::min<size_t>(tile, list.size() - c);
            info.insert(info.end(), {e, (int)pairs.size(), count});
            pairs.insert(pairs.end(), list.begin() + c, list.begin() + c + count);
        }
    }
}

// The grouping kernel alone, over several warp steps of experts: every valid pair in exactly
// one tile of its expert, tiles of at most 16 in expert order, the tail of the grid empty.
void grouping(int n_pairs, int n_expert, int tile = 16) {
    std::vector<int> ids(n_pairs), info, pairs;
    for (auto& e : ids) e = rng() % 4 == 0 ? (int)(rng() % 3) : (int)(rng() % (n_expert + 1));
    const int bound = group_on_device(ids, n_expert, info, pairs, tile);
    std::vector<int> seen(n_pairs, 0);
    int next_first = 0, last_expert = -1, bad = 0, t = 0;
    for (; t < bound && info[3 * t + 2] > 0; ++t) {
        const int e = info[3 * t], first = info[3 * t + 1], count = info[3 * t + 2];
        bad += first != next_first || count > tile || e < last_expert;
        for (int j = 0; j < count; ++j) {
            const int p = pairs[first + j];
            bad += ids[p] != e;
            ++seen[p];
        }
        next_first += count;
        last_expert = e;
    }
    for (; t < bound; ++t) bad += info[3 * t + 2] != 0;
    for (int p = 0; p < n_pairs; ++p) bad += seen[p] != (ids[p] < n_expert ? 1 : 0);
    printf("%s grouping %d pairs over %d experts, tiles of %d\n", bad ? "FAIL" : "ok  ", n_pairs,
           n_expert, tile);
    failures += bad != 0;
}

template <class B>
void experts(const char* name, int tokens, bool on_device, bool wide = false) {
    const int tile = wide ? 64 : 16;
    const int n_expert = 5, used = 3, ff = 96, cols = 512;
    auto gate = random_blocks<B>(n_expert * ff, cols), up = random_blocks<B>(n_expert * ff, cols);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> x((size_t)tokens * cols);
    for (auto& v : x) v = u(rng);
    std::vector<int> ids(tokens * used);
    for (int t = 0; t < tokens; ++t)
        for (int k = 0; k < used; ++k) ids[t * used + k] = (t + 2 * k) % n_expert;
    if (on_device) ids[tokens / 2] = n_expert;  // out of range: joins no tile
    // Tiles as MmaTiles builds them, or as the device grouping does.
    std::vector<int> info, pairs;
    int n_tiles = 0;
    if (on_device) n_tiles = group_on_device(ids, n_expert, info, pairs, tile);
    if (!on_device) group_on_host(ids, n_expert, tile, info, pairs);
    std::vector<float> xd; std::vector<i8> xq;
    quantize(x, xd, xq);
    if (!on_device) n_tiles = info.size() / 3;
    std::vector<float> act((size_t)tokens * used * ff, NAN);
    size_t rb = (size_t)cols / 256 * B::BYTES;
    long long expert_bytes = (long long)ff * rb;
    launch({(unsigned)((ff + 63) / 64), (unsigned)n_tiles, 0}, wide ? 256 : 128, [&] {
        auto kernel = wide ? mma_matmul_kernel<B, 4, 2, 1, 4, 2> : mma_matmul_kernel<B, 4, 1, 1, 2, 2>;
        kernel(gate.data(), up.data(), expert_bytes, info.data(), pairs.data(), used, xq.data(),
               xd.data(), act.data(), ff, cols, tokens);
    });
    std::vector<double> ref(act.size());
    for (int p = 0; p < tokens * used; ++p) {
        int t = p / used, e = ids[p];
        if (e >= n_expert) {  // no tile wrote it (still NaN): nothing to compare
            for (int r = 0; r < ff; ++r) {
                if (!std::isnan(act[(size_t)p * ff + r])) ++failures;
                ref[(size_t)p * ff + r] = act[(size_t)p * ff + r] = 0.0f;
            }
            continue;
        }
        for (int r = 0; r < ff; ++r) {
            double g = ref_dot<B>(&gate[(e * ff + r) * rb], &xq[(size_t)t * cols], &xd[t * 2], cols);
            double v = ref_dot<B>(&up[(e * ff + r) * rb], &xq[(size_t)t * cols], &xd[t * 2], cols);
            ref[(size_t)p * ff + r] = g / (1 + std::exp(-g)) * v;
        }
    }
    char what[128];
    snprintf(what, sizeof what, "%s gate/up t%d%s%s", name, tokens, on_device ? " device groups" : "",
             wide ? " wide" : "");
    check(what, ref, act, ff);
}

template <class B>
void down(const char* name, int tokens, bool wide = false) {
    const int tile = wide ? 64 : 16;
    const int n_expert = 5, used = 3, rows = 200, ff = 512;
    auto w = random_blocks<B>(n_expert * rows, ff);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> act((size_t)tokens * used * ff), weights(tokens * used), out((size_t)tokens * rows);
    for (auto& v : act) v = u(rng);
    for (auto& v : weights) v = std::fabs(u(rng));
    for (auto& v : out) v = u(rng);
    std::vector<int> ids(tokens * used);
    for (int t = 0; t < tokens; ++t)
        for (int k = 0; k < used; ++k) ids[t * used + k] = (t + 2 * k) % n_expert;
    std::vector<int> info, pairs;
    group_on_host(ids, n_expert, tile, info, pairs);
    std::vector<float> ad; std::vector<i8> aq;
    quantize(act, ad, aq);
    std::vector<float> per_pair((size_t)tokens * used * rows, NAN);
    size_t rb = (size_t)ff / 256 * B::BYTES;
    launch({(unsigned)((rows + 127) / 128), (unsigned)(info.size() / 3), 0}, wide ? 256 : 128, [&] {
        auto kernel = wide ? mma_matmul_kernel<B, 4, 2, 2, 4, 1> : mma_matmul_kernel<B, 4, 1, 2, 2, 1>;
        kernel(w.data(), nullptr, (long long)rows * rb, info.data(), pairs.data(), 1, aq.data(),
               ad.data(), per_pair.data(), rows, ff, tokens * used);
    });
    std::vector<float> start = out;
    launch({(unsigned)((rows + 255) / 256), (unsigned)tokens, 0}, 256, [&] {
        mma_combine_kernel(per_pair.data(), weights.data(), ids.data(), out.data(), rows, used, n_expert, 1);
    });
    std::vector<double> ref(out.size());
    for (int t = 0; t < tokens; ++t)
        for (int r = 0; r < rows; ++r) {
            double s = 0;
            for (int k = 0; k < used; ++k) {
                int p = t * used + k, e = ids[p];
                s += weights[p] * ref_dot<B>(&w[(e * rows + r) * rb], &aq[(size_t)p * ff], &ad[p * 2], ff);
            }
            ref[(size_t)t * rows + r] = start[(size_t)t * rows + r] + s;
        }
    char what[128];
    snprintf(what, sizeof what, "%s down+combine t%d%s", name, tokens, wide ? " wide" : "");
    check(what, ref, out, rows);
}

template <class B>
void all(const char* name) {
    down<B>(name, 17);
    dense<B>(name, 128, 256, 7);
    dense<B>(name, 200, 512, 70);
    dense<B>(name, 37, 256, 1);
    experts<B>(name, 17, false);
    experts<B>(name, 40, true);
    // Wide tiles (long prompts): 5 experts x ~40 pairs, one partial 64-pair tile each.
    experts<B>(name, 70, true, true);
    down<B>(name, 70, true);
}

int main() {
    grouping(300, 70);
    grouping(1000, 33);
    grouping(3000, 33, 64);
    all<IQ2XXS>("IQ2_XXS");
    all<Q2K>("Q2_K");
    all<Q4K>("Q4_K");
    all<Q5K>("Q5_K");
    all<Q6K>("Q6_K");
    all<IQ2XS>("IQ2_XS");
    all<IQ1M>("IQ1_M");
    printf("%d failures\n", failures);
    return failures != 0;
}
