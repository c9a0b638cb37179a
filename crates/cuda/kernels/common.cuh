// Shared by every kernel module: fixed-width types, f16 decoding and aligned loads.
// NVRTC compiles without the toolkit's headers, so nothing here includes any.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#define WARP_SIZE 32

static __device__ __forceinline__ float f16_to_f32(u16 bits) {
    float value;
    asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
    return value;
}

static __device__ __forceinline__ u16 f32_to_f16(float value) {
    u16 bits;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
    return bits;
}

// Little-endian loads at the alignment the block layouts guarantee. Every block size of
// the supported types is even, so 2-byte loads are always legal; wider ones are used
// only where the layout (and the 16-byte aligned base the op entry checks) allows.
static __device__ __forceinline__ u16 load_u16(const u8* p) {
    return *reinterpret_cast<const u16*>(p);
}

static __device__ __forceinline__ u32 load_u32_a2(const u8* p) {
    const u16* q = reinterpret_cast<const u16*>(p);
    return u32(q[0]) | (u32(q[1]) << 16);
}

static __device__ __forceinline__ u32 load_u32(const u8* p) {
    return *reinterpret_cast<const u32*>(p);
}

static __device__ __forceinline__ uint4 load_u128(const u8* p) {
    return *reinterpret_cast<const uint4*>(p);
}

// Programmatic dependent launch (sm_90 and later; off with `REDLITE_PDL=0`; raw/launcher.rs):
// a kernel may be scheduled while the previous kernel on the stream still runs. Everything
// before this call may read only what no kernel of the step writes (weights, a layer's own
// recurrent state) or what the kernel two launches back wrote: the previous kernel called
// this before letting this one start, so every earlier kernel had finished. This waits until
// the previous kernel has finished and its writes are visible, then lets the next kernel be
// scheduled. Every kernel calls it before it reads another kernel's output, before it writes
// global memory and before it returns (so that a grid's completion implies its
// predecessors'). Without the launch attribute both instructions return at once; with
// `REDLITE_PDL=0` (a compile option, compile.rs) they are not emitted.
#ifndef REDLITE_PDL
#define REDLITE_PDL 0
#endif
#ifndef REDLITE_TIMELINE
#define REDLITE_TIMELINE 0
#endif
static __device__ __forceinline__ void pdl_wait() {
#if REDLITE_PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// pdl_begin_as(name): pdl_begin called inside a lambda, whose __func__ names its call
// operator, not the kernel; the timeline records `name` instead.
#if !REDLITE_TIMELINE
static __device__ __forceinline__ void pdl_begin() { pdl_wait(); }
#define pdl_begin_as(name) pdl_begin()
#else
// Measurement option REDLITE_TIMELINE=1 (timeline.rs; off by default, and then the code above
// is all there is): a timeline of the launches. In every launch, thread 0 of CTA (0, 0, 0)
// reads the global nanosecond clock when it reaches the wait (its CTA resident and its loads
// ahead issued) and again when the wait returns (the kernels it waits for complete), and
// writes both, the grid's and the CTA's sizes and the name of the function that called
// pdl_begin (or the one given to pdl_begin_as) into this module's ring of records; its slot's
// atomic is issued before the wait, so the round trip is hidden by it. The host reads each
// module's ring when the device is dropped. Other threads only wait, as without the option.
#define TIMELINE_RECORDS 32768
#define TIMELINE_NAME 24
struct TimelineRecord {
    unsigned long long start, release;
    unsigned int ctas, threads;
    char name[TIMELINE_NAME];
};
__device__ TimelineRecord redlite_timeline[TIMELINE_RECORDS];
__device__ unsigned int redlite_timeline_count;

static __device__ __forceinline__ unsigned long long timeline_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ void pdl_begin_named(const char* name) {
    // The start clock waits in shared memory (the wait's memory clobber makes the compiler
    // read it back), so that only the slot holds a register across the wait: with the clock
    // in registers too, the fused DeltaNet step spilled.
    __shared__ unsigned long long timeline_start;
    const bool first = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 &&
                       blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
    unsigned int slot = 0;
    if (first) {
        timeline_start = timeline_ns();
        slot = atomicAdd(&redlite_timeline_count, 1u) % TIMELINE_RECORDS;
    }
    pdl_wait();
    if (first) {
        TimelineRecord& r = redlite_timeline[slot];
        r.start = timeline_start;
        r.release = timeline_ns();
        r.ctas = gridDim.x * gridDim.y * gridDim.z;
        r.threads = blockDim.x * blockDim.y * blockDim.z;
        int i = 0;
        for (; i < TIMELINE_NAME - 1 && name[i] != 0; ++i) r.name[i] = name[i];
        for (; i < TIMELINE_NAME; ++i) r.name[i] = 0;
    }
}
#define pdl_begin() pdl_begin_named(__func__)
#define pdl_begin_as(name) pdl_begin_named(name)
#endif

// Measurement probe (`REDLITE_PROBE_EXIT`, source.rs; wrong results on purpose): the kernels
// of the families set in this mask return at once, their launches kept, so a decode step
// without their work is timed. Defined only in the sources of the probed families.
#ifndef REDLITE_PROBE_EXIT
#define REDLITE_PROBE_EXIT 0
#endif
#define PROBE_MATMUL 1
#define PROBE_GATE_UP 2
#define PROBE_DOWN 4
#define PROBE_STEP 8
#define PROBE_NORM 16
#define PROBE_SPLITK 32
#define PROBE_ROUTE 64
#define PROBE_ATTENTION 128
// Not emptied kernels but parts of them: the expert down matvec without its input's
// quantization (zero scales, its codes whatever shared memory holds), and the expert kernels
// taking expert k for slot k instead of reading the routing's ids (no id load before the
// weights').
#define PROBE_DOWN_INPUT 256
#define PROBE_FIXED_EXPERTS 512
#define PROBE_RETURN(family)                                                                 \
    if ((REDLITE_PROBE_EXIT & (family)) != 0) {                                              \
        pdl_begin();                                                                         \
        return;                                                                              \
    }

// A float's bits as an unsigned key in the floats' order (-0 just below +0): the routing's
// and the greedy argmax's comparisons as integer ones.
static __device__ __forceinline__ u32 float_order_key(float v) {
    const u32 bits = __float_as_uint(v);
    return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

static __device__ __forceinline__ float float_of_order_key(u32 key) {
    return __uint_as_float((key & 0x80000000u) != 0 ? key & 0x7fffffffu : ~key);
}
