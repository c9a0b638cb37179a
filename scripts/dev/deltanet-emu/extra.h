// Built-ins the DeltaNet kernels use beyond ../mma-emu/shim.h: __syncwarp as a barrier of the
// warp's host threads, and the dynamic shared memory of the chunked delta rule (one CTA runs
// at a time, so one buffer serves them all).
inline void __syncwarp(unsigned = 0xffffffffu) { warp_barriers[threadIdx.x / 32]->arrive_and_wait(); }
alignas(16) float4 delta_chunked_shared[(227 * 1024) / sizeof(float4)];
