//! cuBLAS: loading the library, the handle and the one GEMM of the cuBLAS prompt products,
//! and the launches of their conversion kernels (`dequantize.cu`).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys, CudaBlas};
use cudarc::driver::{
    CudaFunction, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg,
};

use super::layers::{builder, launched};
use crate::error::CudaError;

/// A cuBLAS handle on `stream`, or `None` where libcublas cannot be loaded.
pub(crate) fn blas_handle(stream: &Arc<CudaStream>) -> Option<CudaBlas> {
    // SAFETY: only tries to dlopen the candidate library names; calls no cuBLAS function.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    CudaBlas::new(stream.clone()).ok()
}

/// `to_f16_kernel(x, out, n)`.
pub(crate) fn launch_to_f16(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    x: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, u16>,
) -> Result<(), CudaError> {
    let n = i64::try_from(x.len()).unwrap_or(i64::MAX);
    let mut launch = builder(stream, kernel);
    launch.arg(x).arg(out).arg(&n);
    // SAFETY: the caller sized `out` to x.len(); threads past n return.
    launched(stream, "cuLaunchKernel(to_f16)", unsafe {
        launch.launch(config)
    })
}

/// The element type of a cuBLAS product's weights and activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GemmInput {
    /// f16 (`u16` bits): the Q8_K precision's products.
    F16,
    /// f32: the exact precision's products (no TF32: `CUBLAS_COMPUTE_32F` on a handle in the
    /// default math mode).
    F32,
}

/// y[t][r] = Σ_c w[r][c] x[t][c] for row-major `w` (rows x cols) and `x` (tokens x cols) of
/// `input`'s type, f32 `y` (tokens x rows), f32 accumulation: in cuBLAS's column-major terms
/// y (rows x tokens) = wᵀ · x with w read as cols x rows.
pub(crate) fn gemm<T>(
    stream: &CudaStream,
    handle: &CudaBlas,
    input: GemmInput,
    w: &CudaView<'_, T>,
    x: &CudaView<'_, T>,
    y: &mut CudaViewMut<'_, f32>,
    (rows, cols, tokens): (i32, i32, i32),
) -> Result<(), CudaError> {
    let data_type = match input {
        GemmInput::F16 => sys::cudaDataType_t::CUDA_R_16F,
        GemmInput::F32 => sys::cudaDataType_t::CUDA_R_32F,
    };
    if std::mem::size_of::<T>() != if input == GemmInput::F16 { 2 } else { 4 } {
        return Err(CudaError::Blas {
            call: "cublasGemmEx",
            message: format!(
                "{input:?} inputs in a buffer of {}-byte elements",
                std::mem::size_of::<T>()
            ),
        });
    }
    let (w_ptr, _w_sync) = w.device_ptr(stream);
    let (x_ptr, _x_sync) = x.device_ptr(stream);
    let (y_ptr, _y_sync) = y.device_ptr_mut(stream);
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: the caller checked w = rows x cols, x = tokens x cols and y = tokens x rows
    // elements of `data_type` (element size checked above); the leading dimensions are the
    // row lengths of those row-major arrays; alpha and beta are f32 as CUBLAS_COMPUTE_32F
    // requires; the handle's stream orders the call after the conversions that wrote w and x.
    unsafe {
        blas::gemm_ex(
            *handle.handle(),
            sys::cublasOperation_t::CUBLAS_OP_T,
            sys::cublasOperation_t::CUBLAS_OP_N,
            rows,
            tokens,
            cols,
            (&alpha as *const f32).cast::<c_void>(),
            w_ptr as *const c_void,
            data_type,
            cols,
            x_ptr as *const c_void,
            data_type,
            cols,
            (&beta as *const f32).cast::<c_void>(),
            y_ptr as *mut c_void,
            sys::cudaDataType_t::CUDA_R_32F,
            rows,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| CudaError::Blas {
        call: "cublasGemmEx",
        message: format!("{e:?}"),
    })
}
