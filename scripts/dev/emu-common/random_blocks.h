// Random weight blocks for the host emulators (scripts/dev/*-emu): random bytes with every
// f16 scale of the block type set to a finite value of moderate size (0x1800..0x23ff:
// about 0.002 to 0.016), so that the products stay finite. B is a 256-value block type of
// the kernels (its size names the type: IQ2_XXS 66, IQ2_XS 74, Q2_K 84, Q4_K 144, Q5_K 176,
// Q6_K 210, IQ1_M 56).
#pragma once
#include <vector>

template <class B, class Rng>
std::vector<unsigned char> random_blocks(Rng& rng, int rows, int cols) {
    std::vector<unsigned char> w((size_t)rows * cols / 256 * B::BYTES);
    for (auto& b : w) b = (unsigned char)rng();
    auto f16 = [&]() { return (unsigned short)(0x1800 + rng() % 0xc00); };
    for (size_t at = 0; at < w.size(); at += B::BYTES) {
        unsigned char* b = &w[at];
        auto put = [&](int off, unsigned short h) { b[off] = h & 255; b[off + 1] = h >> 8; };
        if (B::BYTES == 66 || B::BYTES == 74) put(0, f16());
        if (B::BYTES == 84) put(80, f16()), put(82, f16());
        if (B::BYTES == 144 || B::BYTES == 176) put(0, f16()), put(2, f16());
        if (B::BYTES == 210) put(208, f16());
        if (B::BYTES == 56) {
            // IQ1_M: the f16 scale is spread over the top nibbles of the four scale words.
            unsigned short h = f16();
            for (int i = 0; i < 4; ++i) {
                unsigned short wv = b[48 + 2 * i] | (b[49 + 2 * i] << 8);
                wv = (wv & 0x0fff) | (((h >> (4 * i)) & 15) << 12);
                put(48 + 2 * i, wv);
            }
        }
    }
    return w;
}
