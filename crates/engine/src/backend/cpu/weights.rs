//! CPU views of the weights: matrices stay in the memory map and are decoded row by row;
//! small vectors (norms, gates, conv taps) are decoded to f32 once at load.

use std::sync::Arc;

use redlite_gguf::{GgmlType, GgufModel, TensorRef};
use redlite_quant::dequantize_row;

use crate::error::{EngineError, Result};
use crate::model::config::HybridConfig;
use crate::model::weights;

/// A weight matrix `[rows (out), cols (in)]`, or a stack of them (`experts` slabs).
#[derive(Clone, Debug)]
pub struct Matrix {
    pub loc: TensorRef,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
}

impl Matrix {
    fn load(gguf: &GgufModel, name: &str) -> Result<Matrix> {
        let loc = gguf
            .locate(name)
            .ok_or_else(|| EngineError::MissingTensor { name: name.into() })?;
        let info = gguf.info(loc);
        let cols = info.row_len() as usize;
        let rows = info.rows() as usize;
        Ok(Matrix {
            loc,
            ty: info.ty,
            rows,
            cols,
            row_bytes: (info.bytes as usize) / rows.max(1),
        })
    }
}

/// Decodes a small tensor to f32.
fn vector(gguf: &GgufModel, name: &str) -> Result<Vec<f32>> {
    let loc = gguf
        .locate(name)
        .ok_or_else(|| EngineError::MissingTensor { name: name.into() })?;
    let info = gguf.info(loc);
    let mut out = vec![0f32; info.elements() as usize];
    dequantize_row(info.ty, gguf.data(loc), &mut out)?;
    Ok(out)
}

pub type DeltaNetWeights = weights::DeltaNetWeights<Matrix, Vec<f32>>;
pub type AttentionWeights = weights::AttentionWeights<Matrix, Vec<f32>>;
pub type MoeWeights = weights::MoeWeights<Matrix>;
pub type Mixer = weights::Mixer<Matrix, Vec<f32>>;

/// The weights in host memory: matrices are views into the memory map.
pub struct CpuWeights {
    pub gguf: Arc<GgufModel>,
    pub model: weights::ModelWeights<Matrix, Vec<f32>>,
}

impl CpuWeights {
    pub fn load(gguf: Arc<GgufModel>, config: &HybridConfig) -> Result<CpuWeights> {
        let g = &*gguf;
        let model = weights::load_weights(
            config,
            &|name| Matrix::load(g, name),
            &|name| vector(g, name),
            &|name| g.locate(name).is_some(),
        )?;
        Ok(CpuWeights { gguf, model })
    }

    /// Adds the MTP block (no-op when already loaded).
    pub fn load_mtp(&mut self, config: &HybridConfig) -> Result<()> {
        if self.model.mtp.is_some() {
            return Ok(());
        }
        let g = &*self.gguf;
        let mtp = weights::load_mtp(
            config,
            &|name| Matrix::load(g, name),
            &|name| vector(g, name),
            &|name| g.locate(name).is_some(),
        )?;
        self.model.mtp = Some(mtp);
        Ok(())
    }
}
