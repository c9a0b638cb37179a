// The DeltaNet prompt kernels on the host (run.sh): the token-parallel conv against the
// token-loop conv (every bit of the outputs and the new state), and the chunked delta rule
// against the token-loop kernel on random normalized q / k, β in (0, 1) and g < 0, from a
// random state (L2 of the difference over L2 of the values, at most 1e-4, outputs and final
// state). The fused step's MTP rollback replayed from its snapshot against the states it
// keeps a row (bit for bit). Exits nonzero when a case fails.
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

// An MTP verification of `tokens` rows through the fused step, keeping the state after each
// row (state_rec) and, again from the same start, keeping the snapshot and the rows' inputs;
// then the replay kernel over both copies of the layer (two table entries) for each number
// of rows kept: its state and conv window must be the kept row's, bit for bit, and the two
// runs' outputs and final states the same.
template <int DK>
void replay_case(int k_heads, int v_heads, int tokens) {
    const int r = v_heads / k_heads, threads = r * DK, key_dim = k_heads * DK;
    const int inner = v_heads * DK, channels = 2 * key_dim + inner, conv_len = 3 * channels;
    const size_t state_len = (size_t)v_heads * DK * DK;
    std::vector<float> qkv((size_t)tokens * channels), z((size_t)tokens * inner),
        ba(tokens * 2 * v_heads), conv_w(4 * channels), a(v_heads), dt_bias(v_heads), norm_w(DK),
        conv0(conv_len), state0(state_len);
    for (auto* v : {&qkv, &z, &ba, &conv_w, &a, &dt_bias, &norm_w, &conv0})
        for (auto& x : *v) x = uniform(-1, 1);
    for (auto& x : state0) x = uniform(-0.1f, 0.1f);
    const int rows = tokens - 1;
    const size_t row_floats = (size_t)(k_heads + v_heads) * DK + 2 * v_heads;
    struct Run {
        std::vector<float> conv, state, out, conv_rec, state_rec, snapshot, inputs;
    };
    // The step's row group: 1 (row by row), or all the rows in one group (3 and 4 rows).
    auto step = [&](bool replay, int group) {
        Run run{conv0, state0, std::vector<float>((size_t)tokens * inner),
                std::vector<float>((size_t)rows * conv_len), std::vector<float>(rows * state_len),
                std::vector<float>(state_len), std::vector<float>(rows * row_floats)};
        const auto body = [&]<int G>() {
            deltanet_step_kernel<DK, 4, G>(
                qkv.data(), z.data(), ba.data(), conv_w.data(), run.conv.data(), a.data(),
                dt_bias.data(), norm_w.data(), run.state.data(), run.out.data(),
                run.conv_rec.data(), replay ? nullptr : run.state_rec.data(),
                replay ? run.snapshot.data() : nullptr, replay ? run.inputs.data() : nullptr,
                nullptr, nullptr, tokens, k_heads, v_heads, 1e-6f, 1.0f / std::sqrt(float(DK)));
        };
        launch({(unsigned)k_heads, 1, 0}, threads, [&] {
            if (group == 4) {
                body.template operator()<4>();
            } else if (group == 3) {
                body.template operator()<3>();
            } else {
                body.template operator()<1>();
            }
        });
        return run;
    };
    const Run rows_run = step(false, 1), replay_run = step(true, 1);
    bool same = rows_run.out == replay_run.out && rows_run.state == replay_run.state &&
                rows_run.conv == replay_run.conv && replay_run.snapshot == state0;
    if (tokens >= 3) {
        // One group of all the rows: every output, state, record and kept input the same.
        for (bool replay : {false, true}) {
            const Run& one = replay ? replay_run : rows_run;
            const Run grouped = step(replay, tokens);
            const bool group_same = grouped.out == one.out && grouped.state == one.state &&
                                    grouped.conv == one.conv && grouped.conv_rec == one.conv_rec &&
                                    grouped.state_rec == one.state_rec &&
                                    grouped.snapshot == one.snapshot &&
                                    grouped.inputs == one.inputs;
            printf("%s group of %d rows, DK %d, %s: %s\n", group_same ? "ok  " : "FAIL", tokens,
                   DK, replay ? "replay inputs" : "states after each row",
                   group_same ? "the row-by-row bits" : "differs");
            failures += !group_same;
        }
    }
    for (int kept = 1; kept < tokens; ++kept) {
        std::vector<float> state[2], conv[2];
        std::vector<unsigned long long> table;
        for (int l = 0; l < 2; ++l) {
            state[l].assign(state_len, NAN);
            conv[l].assign(conv_len, NAN);
            for (const void* p : {(const void*)replay_run.snapshot.data(),
                                  (const void*)replay_run.inputs.data(), (const void*)state[l].data(),
                                  (const void*)replay_run.conv_rec.data(), (const void*)conv[l].data()})
                table.push_back((unsigned long long)p);
        }
        launch({(unsigned)v_heads, 2, 0}, DK, [&] {
            deltanet_replay_kernel<DK>(table.data(), kept, k_heads, v_heads, conv_len);
        });
        const float* kept_state = rows_run.state_rec.data() + (kept - 1) * state_len;
        const float* kept_conv = rows_run.conv_rec.data() + (size_t)(kept - 1) * conv_len;
        for (int l = 0; l < 2; ++l)
            same &= memcmp(state[l].data(), kept_state, state_len * 4) == 0 &&
                    memcmp(conv[l].data(), kept_conv, conv_len * 4) == 0;
    }
    printf("%s replay DK %d, %d/%d heads, %d rows: %s\n", same ? "ok  " : "FAIL", DK, k_heads,
           v_heads, tokens,
           same ? "each kept row's state and conv window, bit for bit" : "differs");
    failures += !same;
}

int main() {
    for (int tokens : {2, 3, 4}) {
        replay_case<32>(2, 4, tokens);
        replay_case<128>(1, 2, tokens);
    }
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
