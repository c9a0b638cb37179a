// What the DeltaNet kernels use beyond ../emu-common/shim.h: the dynamic shared memory of
// the chunked delta rule (one CTA runs at a time, so one buffer serves them all), and the
// shared-window address the step's volatile shared loads take (host_source.py turns the
// load itself into a plain one).
alignas(16) float4 delta_chunked_shared[(227 * 1024) / sizeof(float4)];
inline unsigned long long __cvta_generic_to_shared(const void* p) { return (unsigned long long)p; }
