//! Every `unsafe` block of the crate: loading the CUDA libraries, NVRTC program calls and
//! kernel launches. Callers above this module validate shapes and size grids; each
//! function here states what it relies on.

use crate::error::CudaError;
use cudarc::driver::{
    CudaFunction, CudaStream, CudaView, CudaViewMut, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::sys as nvrtc;
use std::ffi::{c_char, c_int, CStr, CString};

/// Whether libcuda (the driver) can be loaded. cudarc panics on first use of a library it
/// cannot find, so nothing may touch the driver before this returns true.
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the candidate library names; calls no CUDA function.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether libnvrtc can be loaded (same contract as [`driver_present`]).
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the candidate library names; calls no NVRTC function.
    unsafe { nvrtc::is_culib_present() }
}

/// A new stream of `context`, with cudarc's per-buffer event tracking off: every op of the
/// crate is ordered on this one stream, and events recorded outside a graph capture must not
/// be waited on inside one.
pub(crate) fn single_stream(
    context: &std::sync::Arc<cudarc::driver::CudaContext>,
) -> Result<std::sync::Arc<CudaStream>, CudaError> {
    // SAFETY: called before any buffer of the freshly created context exists, so no buffer
    // carries events. The other streams (`Device::on_side`, `Device::on_branch`) are ordered
    // against this one by explicit events, and their callers keep the buffers they touch apart.
    unsafe { context.disable_event_tracking() };
    context
        .new_stream()
        .map_err(CudaError::driver("cuStreamCreate"))
}

/// An instantiated CUDA graph that may move between threads.
pub(crate) struct SendGraph(pub cudarc::driver::CudaGraph);

// SAFETY: CUDA graph objects may be used from any thread as long as calls on one graph are
// serialized; `Graph` owns this value and takes `&mut self` for nothing but its launch,
// and the owner keeps it behind a lock (the backend's mutex) when it shares it.
unsafe impl Send for SendGraph {}

fn status_text(status: nvrtc::nvrtcResult) -> String {
    format!("{status:?}")
}

/// The loaded NVRTC's (major, minor) version. Call only after [`nvrtc_present`].
pub(crate) fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: the library is present (caller's contract); both pointers are valid for writes.
    let status = unsafe { nvrtc::nvrtcVersion(&mut major, &mut minor) };
    match status {
        nvrtc::nvrtcResult::NVRTC_SUCCESS => Ok((major, minor)),
        other => Err(CudaError::Nvrtc {
            call: "nvrtcVersion",
            module: String::new(),
            status: status_text(other),
        }),
    }
}

/// A compiled module: its CUBIN and the mangled name of every exported kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Compiled {
    pub image: Vec<u8>,
    /// (name expression, lowered name), in the order they were asked for.
    pub lowered: Vec<(String, String)>,
    /// The compiler's log of a fresh compile (with `--ptxas-options=-v`: registers, stack
    /// frames and spills per kernel); empty when taken from the disk cache.
    pub log: String,
}

/// Owns an nvrtcProgram and destroys it on every exit path.
struct Program(nvrtc::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: self.0 came from a successful nvrtcCreateProgram and is destroyed once.
        unsafe {
            nvrtc::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn c_string(module: &str, text: &str) -> Result<CString, CudaError> {
    CString::new(text).map_err(|_| CudaError::Nvrtc {
        call: "nvrtcCreateProgram",
        module: module.to_string(),
        status: "text contains a NUL byte".to_string(),
    })
}

fn check(call: &'static str, module: &str, status: nvrtc::nvrtcResult) -> Result<(), CudaError> {
    match status {
        nvrtc::nvrtcResult::NVRTC_SUCCESS => Ok(()),
        other => Err(CudaError::Nvrtc {
            call,
            module: module.to_string(),
            status: status_text(other),
        }),
    }
}

/// Compiles `source` to a CUBIN with `options` (which name the architecture) and exports
/// `kernels` (name expressions such as `matvec_kernel<Q4K, 4, true>`). Call only after
/// [`nvrtc_present`]. A compile error returns the program log.
pub(crate) fn nvrtc_compile(
    module: &str,
    arch: &str,
    source: &str,
    options: &[String],
    kernels: &[String],
) -> Result<Compiled, CudaError> {
    let source_c = c_string(module, source)?;
    let name_c = c_string(module, &format!("{module}.cu"))?;
    let kernels_c = kernels
        .iter()
        .map(|k| c_string(module, k))
        .collect::<Result<Vec<_>, _>>()?;
    let options_c = options
        .iter()
        .map(|o| c_string(module, o))
        .collect::<Result<Vec<_>, _>>()?;
    let option_ptrs: Vec<*const c_char> = options_c.iter().map(|o| o.as_ptr()).collect();

    let mut raw_program: nvrtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: the strings are NUL-terminated and outlive the program (dropped after it at
    // the end of this function); no headers are passed (count 0, null arrays).
    let status = unsafe {
        nvrtc::nvrtcCreateProgram(
            &mut raw_program,
            source_c.as_ptr(),
            name_c.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    check("nvrtcCreateProgram", module, status)?;
    let program = Program(raw_program);

    for kernel in &kernels_c {
        // SAFETY: program is live; the expression string outlives it.
        let status = unsafe { nvrtc::nvrtcAddNameExpression(program.0, kernel.as_ptr()) };
        check("nvrtcAddNameExpression", module, status)?;
    }
    let count = c_int::try_from(option_ptrs.len()).unwrap_or(c_int::MAX);
    // SAFETY: program is live; option_ptrs holds `count` valid C strings.
    let status = unsafe { nvrtc::nvrtcCompileProgram(program.0, count, option_ptrs.as_ptr()) };
    if status != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Compile {
            module: module.to_string(),
            arch: arch.to_string(),
            log: program_log(&program).unwrap_or_else(|_| status_text(status)),
        });
    }

    let mut size = 0usize;
    // SAFETY: program compiled successfully; size is valid for writes.
    check("nvrtcGetCUBINSize", module, unsafe {
        nvrtc::nvrtcGetCUBINSize(program.0, &mut size)
    })?;
    let mut image = vec![0u8; size];
    // SAFETY: image has exactly the size NVRTC reported.
    check("nvrtcGetCUBIN", module, unsafe {
        nvrtc::nvrtcGetCUBIN(program.0, image.as_mut_ptr().cast())
    })?;

    let mut lowered = Vec::with_capacity(kernels.len());
    for (kernel, kernel_c) in kernels.iter().zip(&kernels_c) {
        let mut name_ptr: *const c_char = std::ptr::null();
        // SAFETY: the expression was added before compiling; name_ptr is valid for writes.
        check("nvrtcGetLoweredName", module, unsafe {
            nvrtc::nvrtcGetLoweredName(program.0, kernel_c.as_ptr(), &mut name_ptr)
        })?;
        if name_ptr.is_null() {
            return Err(CudaError::MissingKernel {
                kernel: kernel.clone(),
            });
        }
        // SAFETY: NVRTC returned a NUL-terminated string owned by the live program; it is
        // copied before the program is destroyed.
        let name = unsafe { CStr::from_ptr(name_ptr) }
            .to_string_lossy()
            .into_owned();
        lowered.push((kernel.clone(), name));
    }
    let log = program_log(&program).unwrap_or_default();
    Ok(Compiled {
        image,
        lowered,
        log,
    })
}

fn program_log(program: &Program) -> Result<String, CudaError> {
    let mut size = 0usize;
    // SAFETY: program is live; size is valid for writes.
    check("nvrtcGetProgramLogSize", "", unsafe {
        nvrtc::nvrtcGetProgramLogSize(program.0, &mut size)
    })?;
    let mut log = vec![0u8; size.max(1)];
    // SAFETY: log holds at least the size NVRTC reported.
    check("nvrtcGetProgramLog", "", unsafe {
        nvrtc::nvrtcGetProgramLog(program.0, log.as_mut_ptr().cast())
    })?;
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    Ok(String::from_utf8_lossy(&log[..end]).into_owned())
}

/// Launches `dequantize_kernel<B>` or `dequantize_f16_kernel<B>` (weights, out, total_items).
pub(crate) fn launch_dequantize<T: cudarc::driver::DeviceRepr>(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    weights: &CudaView<'_, u8>,
    out: &mut CudaViewMut<'_, T>,
    total_items: i64,
) -> Result<(), CudaError> {
    let mut launch = layers::builder(stream, kernel);
    launch.arg(weights).arg(out).arg(&total_items);
    // SAFETY: the arguments match dequantize.cu's signatures in type and order (f32 out for
    // dequantize_kernel, u16 for dequantize_f16_kernel: the caller names the kernel); the
    // caller checked that `weights` holds total_items / ITEMS whole blocks and `out` their
    // values, and threads at or past total_items return before touching memory.
    layers::launched(stream, "cuLaunchKernel(dequantize)", unsafe {
        launch.launch(config)
    })
}

/// Launches `matvec_kernel<B, WARPS, X_SHARED>(weights, x, y, rows, cols)`; the shape is
/// (rows, cols).
pub(crate) fn launch_matvec(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    weights: &CudaView<'_, u8>,
    x: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
    (rows, cols): (i32, i32),
) -> Result<(), CudaError> {
    let mut launch = Launch::new(stream, kernel);
    launch.arg(weights).arg(x).arg(y).arg(&rows).arg(&cols);
    // SAFETY: the arguments match matvec.cu's signature in type and order; the op entry
    // checked rows x cols against the byte length of `weights`, cols against `x` and rows
    // against `y`, and the launcher gives X_SHARED kernels cols * 4 bytes of shared memory.
    unsafe { launch.launch(config) }
        .map(|_| ())
        .map_err(CudaError::driver("cuLaunchKernel(matvec)"))
}

mod attention_prefill;
mod copies;
mod cublas;
mod deltanet;
mod deltanet_replay;
mod expert_cache;
mod greedy;
mod host_stage;
mod launcher;
mod layers;
mod mma;
mod moe;
pub(crate) use attention_prefill::*;
pub(crate) use copies::*;
pub(crate) use cublas::*;
pub(crate) use deltanet::*;
pub(crate) use deltanet_replay::*;
pub(crate) use expert_cache::*;
pub(crate) use greedy::*;
pub(crate) use host_stage::*;
pub(crate) use launcher::*;
pub(crate) use layers::*;
pub(crate) use mma::*;
pub(crate) use moe::*;
