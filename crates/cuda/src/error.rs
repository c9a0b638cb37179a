//! The crate's one error type: every variant names the operation and what was expected.

use cudarc::driver::DriverError;
use redlite_gguf::GgmlType;
use std::fmt;
use std::path::PathBuf;

/// The operation that failed, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaOp {
    Dequantize,
    Matvec,
    Embed,
    RmsNorm,
    Add,
    Matmul,
    MoeRoute,
    MoeGateUp,
    MoeDown,
    DeltaNet,
    DeltaRule,
    AttentionPrep,
    Attention,
    ExpertCache,
    Argmax,
    CopySpans,
}

impl fmt::Display for CudaOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CudaOp::Dequantize => "cuda dequantize",
            CudaOp::Argmax => "cuda argmax",
            CudaOp::CopySpans => "cuda span copies",
            CudaOp::Matvec => "cuda matvec",
            CudaOp::Embed => "cuda embed",
            CudaOp::RmsNorm => "cuda rms_norm",
            CudaOp::Add => "cuda add",
            CudaOp::Matmul => "cuda matmul",
            CudaOp::MoeRoute => "cuda moe_route",
            CudaOp::MoeGateUp => "cuda moe_gate_up",
            CudaOp::MoeDown => "cuda moe_down",
            CudaOp::DeltaNet => "cuda deltanet",
            CudaOp::DeltaRule => "cuda delta_rule",
            CudaOp::AttentionPrep => "cuda attention_prep",
            CudaOp::Attention => "cuda attention",
            CudaOp::ExpertCache => "cuda expert cache",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// libcuda could not be loaded: no NVIDIA driver on this machine. Fall back to the CPU.
    #[error("no CUDA driver: libcuda.so could not be loaded (no NVIDIA driver on this machine)")]
    NoDriver,
    /// libnvrtc could not be loaded, so kernels cannot be compiled. Fall back to the CPU.
    #[error(
        "no NVRTC: libnvrtc.so.13 (or libnvrtc.so) could not be loaded; \
         put its folder on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// The driver loaded but reports no device with this ordinal.
    #[error("no CUDA device {ordinal}: the driver reports {count}")]
    NoDevice { ordinal: usize, count: usize },
    #[error("CUDA driver call {call} failed: {source}")]
    Driver {
        call: &'static str,
        #[source]
        source: DriverError,
    },
    #[error("cuBLAS call {call} failed: {message}")]
    Blas { call: &'static str, message: String },
    #[error("NVRTC call {call} failed for module {module}: {status}")]
    Nvrtc {
        call: &'static str,
        module: String,
        status: String,
    },
    #[error("kernel module {module} does not compile for {arch}:\n{log}")]
    Compile {
        module: String,
        arch: String,
        log: String,
    },
    #[error("bad GPU architecture {arch:?}: expected sm_XY (e.g. sm_90)")]
    BadArch { arch: String },
    #[error("kernel {kernel} is not in the compiled modules")]
    MissingKernel { kernel: String },
    #[error("kernel cache entry {path}: {source}")]
    Cache {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{op}: weight type {ty} has no CUDA kernel")]
    UnsupportedType { op: CudaOp, ty: GgmlType },
    #[error("{op}: {what}: expected {expected}, found {found}")]
    Shape {
        op: CudaOp,
        what: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("{op}: {what} = {found} is not a multiple of {multiple} (values per {ty} block)")]
    PartialBlock {
        op: CudaOp,
        what: &'static str,
        ty: GgmlType,
        multiple: usize,
        found: usize,
    },
    #[error("{op}: {what} = {found} exceeds the kernel's limit {limit}")]
    TooLarge {
        op: CudaOp,
        what: &'static str,
        limit: usize,
        found: usize,
    },
    #[error("{op}: {what} = {found} has no kernel (built for {supported})")]
    NoSpecialization {
        op: CudaOp,
        what: &'static str,
        found: usize,
        supported: &'static str,
    },
    /// An allocation would take the device past the run's `--gpu-limit`.
    #[error(
        "GPU memory limit: allocating {requested} bytes would take the run to {would_use} bytes, \
         past its limit of {limit} bytes (--gpu-limit)"
    )]
    OverLimit {
        requested: u64,
        would_use: u64,
        limit: u64,
    },
    #[error("{op}: the int8 tensor-core kernels need sm_80 or newer; this GPU is {arch}")]
    NeedsArch { op: CudaOp, arch: String },
    #[error("{op}: {what} device address {address:#x} is not {alignment}-byte aligned")]
    Misaligned {
        op: CudaOp,
        what: &'static str,
        address: u64,
        alignment: u64,
    },
}

impl CudaError {
    pub(crate) fn driver(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
        move |source| CudaError::Driver { call, source }
    }
}
