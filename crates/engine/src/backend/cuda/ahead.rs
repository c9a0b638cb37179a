//! The next block's weights asked of L2 while this block's MoE runs (`REDLITE_L2_AHEAD=1`,
//! off until measured on a GPU; `redlite_cuda::l2_prefetch` says why). Only in a recorded
//! decode step, as a branch of its graph that nothing waits on: the results are the same
//! bits with it on or off.

use redlite_cuda::{
    CudaSlice, Device, L2Ranges, L2RangesBuilder, Switch, ONE_TOKEN_KERNELS_MAX_TOKENS,
};

use crate::backend::cuda::weights::{CudaWeights, DeviceMatrix};
use crate::error::Result;
use crate::model::weights::{LayerWeights, Mixer};

/// `REDLITE_L2_AHEAD=1`: the prefetch on; off by default until measured.
pub static L2_AHEAD: Switch = Switch::new("REDLITE_L2_AHEAD", false);

/// Bytes of the LM head asked for after the last block: its first rows, which its launch's
/// first CTAs read.
const HEAD_AHEAD_BYTES: u64 = 24 << 20;

/// For block l of the main stack, what block l + 1 reads besides its routed experts (its
/// norms, mixer, router and shared expert); after the last block, the final norm and the LM
/// head's first rows.
pub fn ranges(device: &Device, w: &CudaWeights) -> Result<Vec<Option<L2Ranges>>> {
    (0..w.layers.len())
        .map(|l| {
            let mut b = L2RangesBuilder::default();
            match w.layers.get(l + 1) {
                Some(next) => add_layer(device, &mut b, next),
                None => {
                    b.add(device, &w.output_norm, None);
                    b.add(device, w.output.bytes(), Some(HEAD_AHEAD_BYTES));
                }
            }
            Ok(b.build(device)?)
        })
        .collect()
}

fn add_layer(
    device: &Device,
    b: &mut L2RangesBuilder,
    layer: &LayerWeights<DeviceMatrix, CudaSlice<f32>>,
) {
    let (matrices, vectors): (Vec<&DeviceMatrix>, Vec<&CudaSlice<f32>>) = match &layer.mixer {
        Mixer::DeltaNet(d) => (
            [&d.in_proj, &d.ba, &d.out]
                .into_iter()
                .chain(d.gate_proj.as_ref())
                .collect(),
            vec![&d.conv, &d.dt_bias, &d.a, &d.norm],
        ),
        Mixer::Attention(a) => (vec![&a.q, &a.k, &a.v, &a.out], vec![&a.q_norm, &a.k_norm]),
    };
    let moe = &layer.moe;
    let shared = [
        &moe.router,
        &moe.shared_gate_inp,
        &moe.shared_gate,
        &moe.shared_up,
        &moe.shared_down,
    ];
    for v in [&layer.attn_norm, &layer.post_norm]
        .into_iter()
        .chain(vectors)
    {
        b.add(device, v, None);
    }
    for m in matrices.into_iter().chain(shared) {
        b.add(device, m.bytes(), None);
    }
}

/// Queues block `layer`'s prefetch of the next block's weights where it applies: the switch
/// on, a batch of decode size, a graph being recorded (`Device::on_ahead`).
pub fn queue(
    device: &Device,
    ranges: &[Option<L2Ranges>],
    layer: usize,
    tokens: usize,
) -> Result<()> {
    if !L2_AHEAD.on() || tokens > ONE_TOKEN_KERNELS_MAX_TOKENS {
        return Ok(());
    }
    if let Some(Some(r)) = ranges.get(layer) {
        device.on_ahead(|| redlite_cuda::l2_prefetch(device, r))?;
    }
    Ok(())
}
