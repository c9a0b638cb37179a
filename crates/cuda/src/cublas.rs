//! Dense prompt products through cuBLAS, the alternative to the int8 tensor-core kernels of
//! `mma.rs` that issue 7 asks to choose by measurement: the weight matrix is dequantized to f16
//! into stream-ordered scratch (the whole matrix, per call), the activations converted to f16,
//! then one cublasGemmEx with f32 accumulation writes f32 outputs. cuBLAS's f16 GEMM is 4-5x
//! faster than our dense tensor-core products at every shape of this model (H200); with the
//! per-call dequantization it wins from 512 tokens: prompts of at least [`cublas_min_tokens`]
//! take it (`REDLITE_PREFILL_CUBLAS=0`: never; `=1`: from 16).
//! Not the q8 kernels' numbers: f16 weights and activations instead of Q8_K activation codes,
//! closer to exact f32 (on the tiny Q4_K_M model its logits sit 0.13 from the CPU's Q8_K ones,
//! as the CPU's own exact logits do). Under the exact precision (`Dots::F32`) the weights are
//! dequantized to f32 and the GEMM runs on f32 inputs (no TF32): the exact math in another
//! summation order, which the parity tests hold to the CPU's exact logits (1e-4). Only for the
//! low-bit block types, and only where libcublas loads.

use std::sync::OnceLock;

use cudarc::driver::{CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32};
use crate::layer_ops::product_tokens;
use crate::ops::{check_matrix, Dots, WeightMatrix};
use crate::raw::{self, GemmInput};
use crate::source::{self, TO_F16_KERNEL};

/// Fewest tokens for the cuBLAS products: `REDLITE_PREFILL_CUBLAS_MIN_TOKENS`, else 16 with
/// `REDLITE_PREFILL_CUBLAS=1`, never with `=0`, else 512 (H200: with the staged f16
/// dequantization, pp512 5,849 t/s against 5,377 with the tensor cores; shorter prompts stay
/// on the tensor cores, where the parity tests (up to 200 tokens) hold them to the CPU's Q8_K).
pub fn cublas_min_tokens() -> usize {
    static MIN: OnceLock<usize> = OnceLock::new();
    *MIN.get_or_init(|| {
        let forced = std::env::var("REDLITE_PREFILL_CUBLAS_MIN_TOKENS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok());
        match (std::env::var("REDLITE_PREFILL_CUBLAS").as_deref(), forced) {
            (Ok("0"), _) => usize::MAX,
            (_, Some(n)) => n.max(16),
            (Ok("1"), None) => 16,
            _ => 512,
        }
    })
}

/// Threads per CTA of the conversion kernels.
const CONVERT_THREADS: u32 = 256;

/// Whether the product of `matrix` with `tokens` tokens goes through cuBLAS: at least
/// [`cublas_min_tokens`] tokens, a type of [`crate::Q8_DOT_TYPES`] (the low-bit blocks; f16 and
/// f32 under `Dots::Q8K`, f32 under the exact `Dots::F32`), libcublas found.
pub fn cublas_takes(device: &Device, matrix: &WeightMatrix<'_>, tokens: usize) -> bool {
    tokens >= cublas_min_tokens()
        && crate::source::Q8_DOT_TYPES.contains(&matrix.ty)
        && device.blas().is_some()
}

/// `y[t] = W x[t]` through cuBLAS (see the module comment); `x` is tokens x cols, `y` tokens x
/// rows.
pub fn matmul_cublas(
    device: &Device,
    matrix: &WeightMatrix<'_>,
    x: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::Matmul;
    let (kind, items) = check_matrix(device, op, matrix)?;
    let (rows, cols) = (matrix.rows, matrix.cols);
    let tokens = product_tokens(op, (rows, cols), x.len(), y.len())?;
    if rows == 0 {
        return Ok(());
    }
    let blas = device.blas().ok_or(CudaError::Blas {
        call: "cublasCreate",
        message: "libcublas could not be loaded".into(),
    })?;
    let stream = device.stream();
    let shape = (to_i32(rows), to_i32(cols), to_i32(tokens));
    let label = |input: &str| {
        format!(
            "matmul cublas {input} {} {rows}x{cols} t{tokens}",
            kind.cuda_name
        )
    };
    if matrix.dots == Dots::F32 {
        // The exact precision: f32 weights and activations, only the summation order moves.
        let mut w32 = raw::scratch::<f32>(stream, rows * cols)?;
        crate::ops::dequantize(device, matrix, &mut w32.as_view_mut())?;
        crate::profile::label(|| label("f32"));
        crate::profile::before(stream);
        raw::gemm(stream, blas, GemmInput::F32, &w32.as_view(), x, y, shape)?;
        crate::profile::after(stream, "cublasGemmEx");
        return Ok(());
    }
    let mut w16 = raw::scratch::<u16>(stream, rows * cols)?;
    let kernel = device.kernel(&source::dequantize_f16_kernel(kind))?;
    // Each CTA decodes CONVERT_THREADS items (DEQUANT_F16_THREADS in dequantize.cu).
    let grid = usize::try_from(items.div_ceil(u64::from(CONVERT_THREADS))).unwrap_or(usize::MAX);
    let total_items = i64::try_from(items).unwrap_or(i64::MAX);
    let cfg = config((grid, 1, 1), CONVERT_THREADS, 0);
    raw::launch_dequantize(
        stream,
        kernel,
        cfg,
        &matrix.bytes,
        &mut w16.as_view_mut(),
        total_items,
    )?;
    let mut x16 = raw::scratch::<u16>(stream, x.len())?;
    let kernel = device.kernel(TO_F16_KERNEL)?;
    let cfg = config(
        (x.len().div_ceil(CONVERT_THREADS as usize), 1, 1),
        CONVERT_THREADS,
        0,
    );
    raw::launch_to_f16(stream, kernel, cfg, x, &mut x16.as_view_mut())?;
    crate::profile::label(|| label("f16"));
    crate::profile::before(stream);
    raw::gemm(
        stream,
        blas,
        GemmInput::F16,
        &w16.as_view(),
        &x16.as_view(),
        y,
        shape,
    )?;
    crate::profile::after(stream, "cublasGemmEx");
    Ok(())
}
