// The DeltaNet prompt kernels on the host (run.sh): the token-parallel conv against the
// token-loop conv (every bit of the outputs and the new state), and the chunked delta rule
// against the token-loop kernel on random normalized q / k, β in (0, 1) and g < 0, from a
// random state (L2 of the difference over L2 of the values, at most 1e-4, outputs and final
// state). Exits nonzero when a case fails.
#include "../emu-common/shim.h"
#include "extra.h"
#include "deltanet_host.cu"
#include <random>

std::mt19937_64 rng(11);
float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
int failures = 0;

void conv_case(int channels, int tokens) {
    std::vector<float> qkv((size_t)tokens * channels), state(3 * channels), w(4 * channels);
    for (auto* v : {&qkv, &state, &w})
        for (auto& x : *v) x = uniform(-1, 1);
    auto q_loop = qkv, q_split = qkv, s_loop = state, s_split = state;
    launch({(unsigned)(channels + 255) / 256, 1, 0}, 256, [&] {
        conv_silu_kernel<4>(q_loop.data(), s_loop.data(), w.data(), channels, tokens);
    });
    launch({(unsigned)(channels + 31) / 32, 1, 0}, 1024, [&] {
        conv_silu_tokens_kernel<4>(q_split.data(), s_split.data(), w.data(), channels, tokens);
    });
    bool same = memcmp(q_loop.data(), q_split.data(), q_loop.size() * 4) == 0 &&
                memcmp(s_loop.data(), s_split.data(), s_loop.size() * 4) == 0;
    printf("%s conv %d channels x %d tokens: %s\n", same ? "ok  " : "FAIL", channels, tokens,
           same ? "bit-identical outputs and state" : "differs");
    failures += !same;
}

double rel(const std::vector<float>& ref, const std::vector<float>& got) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        num += (double(ref[i]) - got[i]) * (double(ref[i]) - got[i]);
        den += double(ref[i]) * ref[i];
    }
    return std::sqrt(num / std::max(den, 1e-300));
}

double worst_out = 0, worst_state = 0;

template <int DK>
void delta_case(int k_heads, int v_heads, int tokens, float g_min) {
    const int dv = DK, key_dim = k_heads * DK, channels = 2 * key_dim + v_heads * dv;
    std::vector<float> qkv((size_t)tokens * channels), beta(tokens * v_heads), g(tokens * v_heads);
    std::vector<float> state((size_t)v_heads * DK * dv);
    for (auto& x : qkv) x = uniform(-1, 1);
    for (int t = 0; t < tokens; ++t)
        for (int head = 0; head < 2 * k_heads; ++head) {
            float* x = &qkv[(size_t)t * channels + head * DK];
            double ss = 0;
            for (int i = 0; i < DK; ++i) ss += double(x[i]) * x[i];
            const float scale = (head < k_heads ? 1.0f / std::sqrt(float(DK)) : 1.0f) / std::sqrt(ss);
            for (int i = 0; i < DK; ++i) x[i] *= scale;
        }
    for (auto& x : beta) x = uniform(0.01f, 0.99f);
    for (auto& x : g) x = uniform(g_min, -1e-4f);
    for (auto& x : state) x = uniform(-0.5f, 0.5f);
    auto s_loop = state, s_chunk = state;
    std::vector<float> o_loop((size_t)tokens * v_heads * dv, NAN), o_chunk = o_loop;
    launch({(unsigned)v_heads, (unsigned)(dv / 32), 0}, 32, [&] {
        delta_rule_kernel<DK, 32>(qkv.data(), beta.data(), g.data(), s_loop.data(), o_loop.data(),
                                  tokens, k_heads, v_heads, dv);
    });
    launch({(unsigned)v_heads, (unsigned)(dv / 32), 0}, 256, [&] {
        delta_chunked_kernel<DK, 64>(qkv.data(), beta.data(), g.data(), s_chunk.data(),
                                     o_chunk.data(), tokens, k_heads, v_heads, dv);
    });
    const double eo = rel(o_loop, o_chunk), es = rel(s_loop, s_chunk);
    const bool ok = eo <= 1e-4 && es <= 1e-4;
    worst_out = std::max(worst_out, eo);
    worst_state = std::max(worst_state, es);
    printf("%s delta DK %d, %d/%d heads, %d tokens, g in [%g, 0): outputs %.2e, state %.2e\n",
           ok ? "ok  " : "FAIL", DK, k_heads, v_heads, tokens, g_min, eo, es);
    failures += !ok;
}

int main() {
    for (int tokens : {1, 2, 3, 5, 31, 33, 64, 65, 200}) conv_case(80, tokens);
    for (int tokens : {1, 5, 64, 65, 200}) {
        delta_case<128>(1, 2, tokens, -2.0f);
        delta_case<128>(1, 2, tokens, -0.05f);
        delta_case<32>(2, 4, tokens, -2.0f);
        delta_case<32>(2, 4, tokens, -0.05f);
    }
    delta_case<64>(1, 2, 130, -0.05f);
    printf("largest relative error: outputs %.2e, state %.2e\n", worst_out, worst_state);
    if (failures) printf("%d case(s) failed\n", failures);
    return failures ? 1 : 0;
}
