// The decode emulator's single-item dot checks, included by harness.cpp after its helpers
// (random_blocks, verdict, rng): the IQ1_M item dot against a scalar reference, and the
// computed IQ2 sign masks against the sign table.

// The IQ1_M item dot from the block's bytes, each read where it is used and every product
// taken one at a time: the integers that the loaded-words dot (and, to 2026-12-06, its
// byte-wise form with dp4a) sums, and the same final float expression, so Q8Dot<IQ1M> must
// give its bits.
float iq1m_reference_dot(const u8* b, int item, const i8* q, float d8) {
    const auto half = [&](int at) { return unsigned(b[at]) | (unsigned(b[at + 1]) << 8); };
    const unsigned scale_bits = (half(48) >> 12) | ((half(50) >> 8) & 0xf0) |
                                ((half(52) >> 4) & 0xf00) | (half(54) & 0xf000);
    const float d = mm::f16_to_f32((mm::u16)scale_bits);
    const unsigned word = half(48 + 2 * (item / 2));
    int sumi = 0, sum_delta = 0;
    for (int l = 0; l < 4; ++l) {
        const unsigned nibble = (b[32 + 2 * item + l / 2] >> (4 * (l % 2))) & 15;
        const uint64_t grid = mm::iq1s_grid[b[4 * item + l] | ((nibble & 7) << 8)];
        const int ls = 2 * int((word >> (6 * (item % 2) + 3 * (l / 2))) & 7) + 1;
        int grid_sum = 0, code_sum = 0;
        for (int j = 0; j < 8; ++j) {
            const int x = q[32 * item + 8 * l + j];
            grid_sum += int(int8_t(grid >> (8 * j))) * x;
            code_sum += x;
        }
        sumi += grid_sum * ls;
        sum_delta += (nibble & 8 ? -code_sum : code_sum) * ls;
    }
    return d * d8 * (float(sumi) + 0.125f * float(sum_delta));
}

void iq1m_item_dot() {
    const int blocks = 512;
    const auto w = random_blocks<mm::IQ1M>(rng, 1, blocks * 256);
    alignas(16) static i8 q[256];
    bool ok = true;
    for (int b = 0; b < blocks && ok; ++b) {
        for (auto& c : q) c = (i8)(int(rng() % 255) - 127);
        const float d8 = uniform(1, 1e-4f, 1e-1f)[0];
        const u8* block = w.data() + (size_t)b * mm::IQ1M::BYTES;
        for (int item = 0; item < mm::IQ1M::ITEMS; ++item) {
            const float old = iq1m_reference_dot(block, item, q, d8);
            const float now = mm::Q8Dot<mm::IQ1M>::dot(mm::Q8Dot<mm::IQ1M>::load(block, item), item,
                                                       q, d8);
            if (memcmp(&old, &now, sizeof old) != 0) {
                printf("  IQ1_M block %d item %d: %.9g against the reference %.9g\n", b, item, now,
                       old);
                ok = false;
            }
        }
    }
    verdict("IQ1_M: item dot from its loaded bits = the scalar reference (512 random blocks, "
            "every item)",
            ok);
}

// iq2_sign_masks (the IQ2 sign masks computed from the 7-bit sign index: multiplies, a
// popcount for the eighth sign's parity) against the sign table's byte spread over the eight
// values, for every index: the masks the q8 products AND their grid bytes with.
void iq2_signs() {
    bool ok = true;
    for (unsigned index = 0; index < 128; ++index) {
        uint32_t lo = 0, hi = 0;
        mm::iq2_sign_masks(mm::ksigns_iq2xs, index, lo, hi);
        const unsigned signs = mm::ksigns_iq2xs[index];
        uint32_t want_lo = 0, want_hi = 0;
        for (int j = 0; j < 4; ++j) {
            want_lo |= ((signs >> j) & 1u) * (0xffu << (8 * j));
            want_hi |= ((signs >> (4 + j)) & 1u) * (0xffu << (8 * j));
        }
        if (lo != want_lo || hi != want_hi) {
            printf("  sign index %u: masks %08x %08x, the table gives %08x %08x\n", index, lo, hi,
                   want_lo, want_hi);
            ok = false;
        }
    }
    verdict("iq2_sign_masks = the sign table's bits spread over bytes (all 128 indices)", ok);
}
