//! An MTP rollback of every DeltaNet layer in one launch (`deltanet_replay_kernel`,
//! `deltanet_replay.cu`): a verification that kept its layers' states as
//! `StepStates::Replay` (the state before the step and the rows' delta-rule inputs) gets the
//! state after any of its rows back by running those rows' delta rule again from the
//! snapshot, with the step's operations in the step's order, so the bits of the state the
//! step had after that row; the conv window comes from its record. It replaces a copy of a
//! recorded state per row, which the verification had to write between its rows.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32, to_u32};
use crate::layer_ops::{at_least, replay_row_floats, DeltaNetShape, MAX_GRID_YZ};
use crate::ops::{fits, shape};
use crate::raw;
use crate::source::{deltanet_replay_kernel, DELTA_DK};

/// Addresses a layer takes in the launch's table.
const TABLE_PER_LAYER: usize = 5;

/// One DeltaNet layer's rollback: what its verification kept (`snapshot`, `inputs`,
/// `conv_record`, as `deltanet_step` wrote them) and the state it puts back (`state`,
/// `conv`).
pub struct ReplayLayer<'a> {
    /// The recurrent state before the verification, `[v_heads][dk][dv]`.
    pub snapshot: CudaView<'a, f32>,
    /// At least `kept` rows of `replay_row_floats`.
    pub inputs: CudaView<'a, f32>,
    /// At least `kept` conv windows, each as long as `conv`.
    pub conv_record: CudaView<'a, f32>,
    pub state: CudaViewMut<'a, f32>,
    pub conv: CudaViewMut<'a, f32>,
}

/// The launch's table of addresses, kept between rollbacks: a sequence's rollbacks name the
/// same buffers each time (only the rows kept change, a kernel argument), so the table is
/// copied to the device only when its addresses change.
#[derive(Default)]
pub struct ReplayTable {
    on_device: Option<CudaSlice<u64>>,
    /// What `on_device` holds.
    written: Vec<u64>,
}

/// Puts every layer of `layers` back to its state after row `kept - 1` of the verification
/// (`kept` ≥ 1 rows kept), queued, in one launch. `s.tokens` is not read.
pub fn deltanet_replay(
    device: &Device,
    s: &DeltaNetShape,
    kept: usize,
    layers: &mut [ReplayLayer<'_>],
    table: &mut ReplayTable,
) -> Result<(), CudaError> {
    let op = CudaOp::DeltaNet;
    if layers.is_empty() {
        return Ok(());
    }
    // `kept` stands where a step's tokens would: at least one, within the grid's limits.
    let d = DeltaNetShape { tokens: kept, ..*s }.check(op)?;
    fits(op, "layers", layers.len() as u64, MAX_GRID_YZ)?;
    if !DELTA_DK.contains(&d.head_dim) {
        return Err(CudaError::NoSpecialization {
            op,
            what: "head dim",
            found: d.head_dim,
            supported: "32, 64, 128",
        });
    }
    let state_len = d.v_heads * d.head_dim * d.head_dim;
    let inputs_len = kept * replay_row_floats(s);
    let n = layers.len();
    let conv_len = layers[0].conv.len();
    fits(op, "conv state length", conv_len as u64, i32::MAX as u64)?;
    let mut addresses = Vec::with_capacity(TABLE_PER_LAYER * n);
    for layer in layers.iter() {
        shape(op, "state snapshot length", state_len, layer.snapshot.len())?;
        shape(op, "state length", state_len, layer.state.len())?;
        shape(op, "conv state length", conv_len, layer.conv.len())?;
        let what = "replay inputs length (at least)";
        at_least(op, what, inputs_len, layer.inputs.len())?;
        let what = "conv record length (at least)";
        at_least(op, what, kept * conv_len, layer.conv_record.len())?;
        addresses.extend([
            device.address(&layer.snapshot),
            device.address(&layer.inputs),
            device.address(&layer.state),
            device.address(&layer.conv_record),
            device.address(&layer.conv),
        ]);
    }
    let on_device = match &mut table.on_device {
        Some(t) if t.len() >= addresses.len() => t,
        slot => {
            table.written.clear();
            slot.insert(device.alloc_zeros(addresses.len())?)
        }
    };
    if table.written != addresses {
        // Cleared first: a failed copy must not leave the old addresses looking current.
        table.written.clear();
        device.copy_to_device(&addresses, &mut on_device.slice_mut(..addresses.len()))?;
        table.written = addresses;
    }
    let kernel = device.kernel(&deltanet_replay_kernel(d.head_dim))?;
    let cfg = config((d.v_heads, n, 1), to_u32(d.head_dim), 0);
    let dims = [kept, d.k_heads, d.v_heads, conv_len].map(to_i32);
    raw::launch_deltanet_replay(
        device.stream(),
        kernel,
        cfg,
        &on_device.slice(..TABLE_PER_LAYER * n),
        dims,
    )
}
