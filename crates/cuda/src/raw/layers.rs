//! Launches of the layer kernels (`elementwise.cu`, `matmul.cu`, `attention.cu`; the DeltaNet
//! kernels' are in `deltanet.rs`, the MoE kernels' in `moe.rs`, the greedy argmax's in
//! `greedy.rs`).
//! Each function pushes the arguments in the kernel's order and type; the op entries in
//! `layer_ops` checked every buffer length the grid implies, and the launchers in
//! `layer_launch` sized the grid and the dynamic shared memory.

use super::launcher::Launch;
use crate::error::CudaError;
use crate::profile;
use crate::q8_input::Q8Views;
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{
    CudaFunction, CudaStream, CudaView, CudaViewMut, DeviceRepr, LaunchConfig, PushKernelArg,
};

pub(super) fn launched(
    stream: &CudaStream,
    call: &'static str,
    result: Result<
        Option<(cudarc::driver::CudaEvent, cudarc::driver::CudaEvent)>,
        cudarc::driver::DriverError,
    >,
) -> Result<(), CudaError> {
    profile::after(stream, call);
    result.map(|_| ()).map_err(CudaError::driver(call))
}

/// Lets `kernel` take the dynamic shared memory `config` asks for (above the default 48 KiB
/// a launch needs this first; the launchers checked the device's opt-in maximum).
pub(super) fn allow_shared(kernel: &CudaFunction, config: LaunchConfig) -> Result<(), CudaError> {
    kernel
        .set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            i32::try_from(config.shared_mem_bytes).unwrap_or(i32::MAX),
        )
        .map(|_| ())
        .map_err(CudaError::driver("cuFuncSetAttribute"))
}

pub(super) fn builder<'a>(stream: &'a CudaStream, kernel: &'a CudaFunction) -> Launch<'a> {
    profile::before(stream);
    Launch::new(stream, kernel)
}

/// The null device pointer kernels take for "no position in device memory".
pub(super) static NO_POS: u64 = 0;

/// Pushes the `const u32* pos_dev` argument: the device scalar, or null.
fn push_pos<'a>(launch: &mut Launch<'a>, pos: Option<&'a CudaView<'_, u32>>) {
    match pos {
        Some(view) => launch.arg(view),
        None => launch.arg(&NO_POS),
    };
}

/// The `gd, gq` arguments of the kernels that may read their input already quantized to
/// Q8_K (`q8_input` in `q8dot.cuh`): absent from the signature, null (the kernel quantizes
/// x itself), or the scales and codes of every row of x.
pub(crate) enum Q8Arg<'a, 'b> {
    Absent,
    Null,
    Given(&'a CudaView<'b, f32>, &'a CudaView<'b, i8>),
}

impl<'a, 'b> Q8Arg<'a, 'b> {
    /// The argument for a kernel that takes `gd, gq` (`takes`) or not, given the codes or
    /// not.
    pub(crate) fn new(takes: bool, q8: Option<Q8Views<'a, 'b>>) -> Self {
        match (takes, q8) {
            (false, _) => Q8Arg::Absent,
            (true, None) => Q8Arg::Null,
            (true, Some((d, q))) => Q8Arg::Given(d, q),
        }
    }

    /// The dynamic shared memory of a launch that stages `staged` bytes of quantized input
    /// unless it reads the codes where they are.
    pub(crate) fn shared_bytes(&self, staged: usize) -> usize {
        match self {
            Q8Arg::Given(..) => 0,
            _ => staged,
        }
    }
}

pub(super) fn push_q8<'a>(launch: &mut Launch<'a>, q8: Q8Arg<'a, '_>) {
    match q8 {
        Q8Arg::Absent => {}
        Q8Arg::Null => {
            launch.arg(&NO_POS).arg(&NO_POS);
        }
        Q8Arg::Given(d, q) => {
            launch.arg(d).arg(q);
        }
    }
}

/// `embed_kernel<B>(table, tokens, x, rows, cols)`.
pub(crate) fn launch_embed(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    table: &CudaView<'_, u8>,
    tokens: &CudaView<'_, u32>,
    x: &mut CudaViewMut<'_, f32>,
    (rows, cols): (i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(table).arg(tokens).arg(x).arg(&rows).arg(&cols);
    // SAFETY: arguments match the signature; the op entry checked table = rows x cols whole
    // blocks and x = tokens x cols; ids past `rows` are zero-filled by the kernel.
    launched(stream, "cuLaunchKernel(embed)", unsafe {
        launch.launch(config)
    })
}

/// `rms_norm_kernel(x, w, out, cols, eps)`, one CTA per row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_rms_norm(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    x: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    cols: i32,
    eps: f32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(x).arg(w).arg(out).arg(&cols).arg(&eps);
    // SAFETY: arguments match the signature; x and out hold grid.x rows of `cols`, w `cols`.
    launched(stream, "cuLaunchKernel(rms_norm)", unsafe {
        launch.launch(config)
    })
}

/// `mtp_concat_norms_kernel(embedded, hidden, enorm, hnorm, concat, rows, cols, eps)`, two
/// CTAs a row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_mtp_concat_norms(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    (embedded, hidden): (&CudaView<'_, f32>, &CudaView<'_, f32>),
    (enorm, hnorm): (&CudaView<'_, f32>, &CudaView<'_, f32>),
    concat: &mut CudaViewMut<'_, f32>,
    (rows, cols): (i32, i32),
    eps: f32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch
        .arg(embedded)
        .arg(hidden)
        .arg(enorm)
        .arg(hnorm)
        .arg(concat)
        .arg(&rows)
        .arg(&cols)
        .arg(&eps);
    // SAFETY: arguments match the signature; the op entry checked embedded and hidden =
    // rows x cols, both norms' weights cols and concat rows x 2 cols; grid.x = 2 rows.
    launched(stream, "cuLaunchKernel(mtp_concat_norms)", unsafe {
        launch.launch(config)
    })
}

/// `add_rms_norm_kernel(x, y, w, out, cols, eps)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_add_rms_norm(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    x: &mut CudaViewMut<'_, f32>,
    y: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    cols: i32,
    eps: f32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(x).arg(y).arg(w).arg(out).arg(&cols).arg(&eps);
    // SAFETY: arguments match the signature; x, y and out hold grid.x rows of `cols`, w
    // `cols`; out is a separate buffer (a mutable borrow distinct from x's).
    launched(stream, "cuLaunchKernel(add_rms_norm)", unsafe {
        launch.launch(config)
    })
}

/// The rows a quantizing norm reads: `x` alone (`rms_norm_q8_kernel`), or the residual `x`,
/// updated in place, and the `y` added to it first (`add_rms_norm_q8_kernel`).
pub(crate) enum NormRows<'a, 'b> {
    Plain(&'a CudaView<'a, f32>),
    Add(&'a mut CudaViewMut<'b, f32>, &'a CudaView<'a, f32>),
}

/// `rms_norm_q8_kernel(x, w, out, d, q, cols, eps)` or `add_rms_norm_q8_kernel(x, y, w, out,
/// d, q, cols, eps)`, as `rows` says: the norms with each row also quantized into `d`, `q`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_norm_q8(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    rows: NormRows<'_, '_>,
    w: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    (d, q): (&mut CudaViewMut<'_, f32>, &mut CudaViewMut<'_, i8>),
    cols: i32,
    eps: f32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    match rows {
        NormRows::Plain(x) => launch.arg(x),
        NormRows::Add(x, y) => launch.arg(x).arg(y),
    };
    launch.arg(w).arg(out).arg(d).arg(q).arg(&cols).arg(&eps);
    // SAFETY: arguments match the signature of the kernel the caller chose by `rows`; x, y
    // and out hold grid.x rows of `cols` (a multiple of 256), w `cols`, d grid.x x cols / 256
    // and q grid.x x cols values; the dynamic shared memory holds a row (launcher).
    launched(stream, "cuLaunchKernel(norm_q8)", unsafe {
        launch.launch(config)
    })
}

/// `add_kernel(x, y, n)`.
pub(crate) fn launch_add(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    x: &mut CudaViewMut<'_, f32>,
    y: &CudaView<'_, f32>,
    n: i32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(x).arg(y).arg(&n);
    // SAFETY: arguments match the signature; x and y hold n values; threads past n return.
    launched(stream, "cuLaunchKernel(add)", unsafe {
        launch.launch(config)
    })
}

/// `matmul_kernel<B, WARPS, X_SHARED>(weights, x, y, rows, cols)`, grid.y = tokens, and the
/// versions of that signature; the q8 ones take `gd, gq` after x (`Q8Arg`, whose rows
/// match x's: op entry).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_matmul(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    weights: &CudaView<'_, u8>,
    x: &CudaView<'_, f32>,
    q8: Q8Arg<'_, '_>,
    y: &mut CudaViewMut<'_, f32>,
    (rows, cols): (i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(weights).arg(x);
    push_q8(&mut launch, q8);
    launch.arg(y).arg(&rows).arg(&cols);
    // SAFETY: arguments match the signature; weights hold rows x cols whole blocks, x holds
    // grid.y x cols and y grid.y x rows values; X_SHARED kernels get cols * 4 shared bytes.
    launched(stream, "cuLaunchKernel(matmul)", unsafe {
        launch.launch(config)
    })
}

/// `matmul_q8_tiles_kernel<B, WARPS, ROWS, NT>(weights, x, gd, gq, y, rows, cols, tokens)`
/// and the float GEMM (`Q8Arg::Absent`: no `gd, gq`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_matmul_tiles(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    weights: &CudaView<'_, u8>,
    x: &CudaView<'_, f32>,
    q8: Q8Arg<'_, '_>,
    y: &mut CudaViewMut<'_, f32>,
    (rows, cols, tokens): (i32, i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(weights).arg(x);
    push_q8(&mut launch, q8);
    launch.arg(y).arg(&rows).arg(&cols).arg(&tokens);
    // SAFETY: arguments match the signature; weights hold rows x cols whole blocks, x holds
    // tokens x cols and y tokens x rows values (op entry); grid.y = ceil(tokens / NT) and
    // the last tile reads and writes only its tokens; the shared bytes hold NT x cols codes
    // and their scales (launcher).
    launched(stream, "cuLaunchKernel(matmul_tiles)", unsafe {
        launch.launch(config)
    })
}

/// The f32 arguments of `attn_prep_kernel` after its integer ones.
pub(crate) struct RopeArgs {
    pub rope_base: f32,
    pub eps: f32,
}

/// `attn_prep_kernel<KV>(qg, k, v, q_norm, k_norm, q, k_cache, v_cache, pos_dev, pos0,
/// heads, kv_heads, hd, rope_dim, rope_base, eps)`; `pos` (a u32 in device memory, read by
/// the kernel in place of pos0) is for one-token batches whose position the caller checked.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_attn_prep<T: DeviceRepr>(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    inputs: [&CudaView<'_, f32>; 5],
    q: &mut CudaViewMut<'_, f32>,
    k_cache: &mut CudaViewMut<'_, T>,
    v_cache: &mut CudaViewMut<'_, T>,
    pos: Option<&CudaView<'_, u32>>,
    dims: [i32; 5],
    rope: RopeArgs,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    for input in inputs {
        launch.arg(input);
    }
    launch.arg(q).arg(k_cache).arg(v_cache);
    push_pos(&mut launch, pos);
    for d in &dims {
        launch.arg(d);
    }
    launch.arg(&rope.rope_base).arg(&rope.eps);
    // SAFETY: arguments match the signature (inputs qg, k, v, q_norm, k_norm; dims pos0,
    // heads, kv_heads, hd, rope_dim); the op entry checked every input for grid.x tokens and
    // that the caches hold positions pos0 + tokens; T is the kernel's KV type; the CTA has
    // hd * 4 bytes of dynamic shared memory.
    launched(stream, "cuLaunchKernel(attn_prep)", unsafe {
        launch.launch(config)
    })
}

/// `attention_kernel<KV, VPL, WARPS>(q, qg, k_cache, v_cache, o, pos_dev, pos0, heads,
/// kv_heads, scale)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_attention<T: DeviceRepr>(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    q: &CudaView<'_, f32>,
    qg: &CudaView<'_, f32>,
    k_cache: &CudaView<'_, T>,
    v_cache: &CudaView<'_, T>,
    o: &mut CudaViewMut<'_, f32>,
    pos: Option<&CudaView<'_, u32>>,
    dims: [i32; 3],
    scale: f32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(q).arg(qg).arg(k_cache).arg(v_cache).arg(o);
    push_pos(&mut launch, pos);
    for d in &dims {
        launch.arg(d);
    }
    launch.arg(&scale);
    // SAFETY: arguments match the signature (dims pos0, heads, kv_heads); q and o hold tokens
    // x heads x hd, qg twice that; the caches hold pos0 + tokens positions of kv_heads x hd
    // (hd = 32 VPL, the kernel's specialization); T is the kernel's KV type.
    launched(stream, "cuLaunchKernel(attention)", unsafe {
        launch.launch(config)
    })
}

/// `attention_split_kernel<KV, VPL, WARPS>(q, k_cache, v_cache, partials, pos_dev, pos0,
/// heads, kv_heads, chunk, min_chunk, scale)`, its grouped variants of the same signature,
/// and `attention_split_depth_kernel<KV, VPL>` with `long_len` after `scale` (`long_len`
/// `Some`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_attention_split<T: DeviceRepr>(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    (q, k_cache, v_cache): (&CudaView<'_, f32>, &CudaView<'_, T>, &CudaView<'_, T>),
    partials: &mut CudaViewMut<'_, f32>,
    pos: Option<&CudaView<'_, u32>>,
    dims: [i32; 5],
    scale: f32,
    long_len: Option<i32>,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(q).arg(k_cache).arg(v_cache).arg(partials);
    push_pos(&mut launch, pos);
    for d in &dims {
        launch.arg(d);
    }
    launch.arg(&scale);
    if let Some(long_len) = &long_len {
        launch.arg(long_len);
    }
    // SAFETY: arguments match the signature (dims pos0, heads, kv_heads, chunk, min_chunk;
    // long_len for the depth kernel, which the caller passes exactly for it);
    // q holds tokens x heads x hd, the caches pos0 + tokens positions of kv_heads x hd
    // (hd = 32 VPL, the kernel's specialization; the op entry checked them, and for a
    // device position the caller checked it against the capacity); the launcher sized
    // grid.z (splits) so that partials holds tokens x heads x splits x (hd + 2) floats and
    // splits x chunk covers pos0 + tokens positions (chunk 0: the kernel derives it so that
    // it does); T is the kernel's KV type.
    launched(stream, "cuLaunchKernel(attention_split)", unsafe {
        launch.launch(config)
    })
}

/// `attention_combine_kernel(partials, qg, o, heads, hd, splits)`.
pub(crate) fn launch_attention_combine(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    partials: &CudaView<'_, f32>,
    qg: &CudaView<'_, f32>,
    o: &mut CudaViewMut<'_, f32>,
    dims: [i32; 3],
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(partials).arg(qg).arg(o);
    for d in &dims {
        launch.arg(d);
    }
    // SAFETY: arguments match the signature (dims heads, hd, splits); partials holds grid.x
    // tokens x heads x splits x (hd + 2) floats written by the split kernel before it on the
    // stream; qg holds tokens x heads x 2 hd and o tokens x heads x hd (op entry).
    launched(stream, "cuLaunchKernel(attention_combine)", unsafe {
        launch.launch(config)
    })
}
