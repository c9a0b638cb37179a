// The flash prefill attention kernel on the host (run.sh) against a double-precision
// reference of spec §3.3's causal attention with the sigmoid output gate: random q, gate and
// caches (f32, or f16 bits the reference decodes the same way), a first chunk of a prompt
// (pos0 = 0) and a later one (pos0 > 0), one split or several (merged by
// attention_combine_kernel). Fails a case on a (token, head) row whose relative L2 error
// passes 1e-5; prints each case's largest.
#include "emu.h"
#include "attention_host.cu"
#include <random>
#include <algorithm>

std::mt19937_64 rng(7);
int failures = 0;

float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }

template <class KV> KV to_kv(float v);
template <> float to_kv<float>(float v) { return v; }
template <> u16 to_kv<u16>(float v) { return emu_f16_bits(v); }
double from_kv(float v) { return v; }
double from_kv(u16 v) { return emu_half(v); }

constexpr int BK = 64, ROWS = 64;

template <class KV, int HD>
void run_case(const char* kv_name, int tokens, int pos0, int heads, int kv_heads, int splits) {
    const int capacity = pos0 + tokens + 3, group = heads / kv_heads, len = pos0 + tokens;
    std::vector<float> q((size_t)tokens * heads * HD), qg((size_t)tokens * heads * 2 * HD);
    for (auto& v : q) v = uniform(-2, 2);
    for (auto& v : qg) v = uniform(-3, 3);
    std::vector<KV> k_cache((size_t)capacity * kv_heads * HD), v_cache(k_cache.size());
    for (size_t i = 0; i < k_cache.size(); ++i) {
        k_cache[i] = to_kv<KV>(uniform(-1, 1));
        v_cache[i] = to_kv<KV>(uniform(-1, 1));
    }
    // As the launcher plans it: chunks of whole K/V tiles, no empty split.
    int chunk = (len + splits - 1) / splits;
    chunk = (chunk + BK - 1) / BK * BK;
    splits = (len + chunk - 1) / chunk;
    const int tiles = (tokens + ROWS / group - 1) / (ROWS / group);
    std::vector<float> o((size_t)tokens * heads * HD, NAN);
    std::vector<float> partials((size_t)tokens * heads * splits * (HD + 2), NAN);
    const float scale = 1.0f / std::sqrt((float)HD);
    launch({(unsigned)tiles, (unsigned)kv_heads, (unsigned)splits}, 256, [&] {
        attention_prefill_kernel<KV, HD>(q.data(), qg.data(), k_cache.data(), v_cache.data(),
                                         o.data(), partials.data(), tokens, pos0, heads, kv_heads,
                                         chunk, scale);
    });
    if (splits > 1) {
        launch({(unsigned)tokens, (unsigned)heads, 1}, 128, [&] {
            attention_combine_kernel(partials.data(), qg.data(), o.data(), heads, HD, splits);
        });
    }
    double worst = 0;
    int worst_t = -1, worst_h = -1;
    for (int t = 0; t < tokens; ++t)
        for (int h = 0; h < heads; ++h) {
            const int kvh = h / group, last = pos0 + t;
            const float* qr = &q[((size_t)t * heads + h) * HD];
            std::vector<double> score(last + 1), ref(HD, 0.0);
            double m = -INFINITY, sum = 0;
            for (int p = 0; p <= last; ++p) {
                double d = 0;
                for (int i = 0; i < HD; ++i) d += (double)qr[i] * from_kv(k_cache[((size_t)p * kv_heads + kvh) * HD + i]);
                score[p] = d * scale;
                m = std::max(m, score[p]);
            }
            for (int p = 0; p <= last; ++p) {
                const double w = std::exp(score[p] - m);
                sum += w;
                for (int i = 0; i < HD; ++i) ref[i] += w * from_kv(v_cache[((size_t)p * kv_heads + kvh) * HD + i]);
            }
            const float* gate = &qg[((size_t)t * heads + h) * 2 * HD + HD];
            const float* got = &o[((size_t)t * heads + h) * HD];
            double err = 0, norm = 0;
            for (int i = 0; i < HD; ++i) {
                const double r = ref[i] / sum / (1.0 + std::exp(-(double)gate[i]));
                err += (got[i] - r) * (got[i] - r);
                norm += r * r;
            }
            const double rel = std::sqrt(err / norm);
            if (!(rel <= worst)) {  // NaN counts as worst
                worst = std::isnan(rel) ? INFINITY : rel;
                worst_t = t;
                worst_h = h;
            }
        }
    const bool ok = worst <= 1e-5;
    failures += !ok;
    printf("%s hd %3d %-5s T %3d pos0 %3d heads %2d/%d splits %d: max rel L2 %.3g%s\n",
           ok ? "ok  " : "FAIL", HD, kv_name, tokens, pos0, heads, kv_heads, splits, worst,
           ok ? "" : " (row of that token and head below)");
    if (!ok) printf("     token %d head %d\n", worst_t, worst_h);
}

template <class KV>
void sweep(const char* kv_name) {
    for (int tokens : {16, 33, 100})
        for (int pos0 : {0, 77}) {
            run_case<KV, 64>(kv_name, tokens, pos0, 4, 2, 1);
            run_case<KV, 256>(kv_name, tokens, pos0, 4, 2, 1);
        }
    // Eight query heads per KV head (Qwen3-Next), three (an odd group: one idle row per CTA),
    // and KV splits merged by the combine kernel.
    run_case<KV, 256>(kv_name, 33, 0, 16, 2, 1);
    run_case<KV, 64>(kv_name, 40, 100, 6, 2, 1);
    run_case<KV, 64>(kv_name, 16, 300, 16, 2, 4);
    run_case<KV, 256>(kv_name, 33, 150, 4, 2, 3);
}

int main() {
    sweep<float>("f32");
    sweep<u16>("f16");
    printf("%d failures\n", failures);
    return failures != 0;
}
