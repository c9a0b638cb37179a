//! `--experts cpu`: the MoE blocks on the CPU while the GPU runs the rest of the model (the
//! role of llama.cpp's `--n-cpu-moe` for every layer). Each block's input comes back to the
//! host, the CPU backend computes the router, the routed experts (read in place from the
//! file's mapping) and the shared expert, and the result goes back to the device. The host
//! waits on the GPU twice a layer, so the decode step is not captured in a graph.

use std::sync::{Arc, Mutex};

use redlite_cuda::{CudaView, CudaViewMut, Device};
use redlite_gguf::GgufModel;

use crate::backend::cpu::linear::{MatmulCtx, Precision};
use crate::backend::cpu::moe;
use crate::backend::cpu::weights::CpuWeights;
use crate::error::{EngineError, Result};
use crate::model::config::HybridConfig;

pub struct HostMoe {
    weights: CpuWeights,
    precision: Precision,
    /// The block's input and output on the host, grown to the largest batch.
    buffers: Mutex<(Vec<f32>, Vec<f32>)>,
}

impl HostMoe {
    /// The CPU views of the file's weights (no copy: matrices stay in the mapping).
    pub fn new(gguf: Arc<GgufModel>, config: &HybridConfig, precision: Precision) -> Result<Self> {
        Ok(HostMoe {
            weights: CpuWeights::load(gguf, config)?,
            precision,
            buffers: Mutex::new((Vec::new(), Vec::new())),
        })
    }

    /// Adds the MTP block's MoE (its decoder layer is block `n_layer`).
    pub fn load_mtp(&mut self, config: &HybridConfig) -> Result<()> {
        self.weights.load_mtp(config)
    }

    /// `out = MoE(h)` of block `layer` for `tokens` rows: copies down (waiting for the work
    /// queued before), computes on the CPU, queues the copy up.
    pub fn forward(
        &self,
        device: &Device,
        config: &HybridConfig,
        layer: usize,
        tokens: usize,
        h: &CudaView<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let n = tokens * config.n_embd;
        let mut buffers = self
            .buffers
            .lock()
            .map_err(|_| EngineError::Cuda("host MoE buffers poisoned by a panic".into()))?;
        let (input, output) = &mut *buffers;
        input.resize(n, 0.0);
        output.resize(n, 0.0);
        device.copy_to_host(h, input)?;
        let mm = MatmulCtx {
            gguf: &self.weights.gguf,
            precision: self.precision,
        };
        let w = &self.weights.model.layer(layer)?.moe;
        moe::forward(config, &mm, w, input, tokens, output)?;
        device.copy_to_device(output, out)?;
        Ok(())
    }
}
