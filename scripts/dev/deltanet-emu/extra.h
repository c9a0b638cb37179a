// What the DeltaNet kernels use beyond ../emu-common/shim.h: the dynamic shared memory of
// the chunked delta rule (one CTA runs at a time, so one buffer serves them all).
alignas(16) float4 delta_chunked_shared[(227 * 1024) / sizeof(float4)];
