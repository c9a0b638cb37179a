//! Every weight resident on the GPU, uploaded once: matrices in their GGUF block format
//! (decoded inside the kernels), small vectors (norms, gates, conv taps) decoded to f32.

use redlite_cuda::{CudaSlice, Device, Dots, WeightMatrix};
use redlite_gguf::{GgmlType, GgufModel};
use redlite_quant::dequantize_row;

use crate::error::{EngineError, Result};
use crate::model::config::HybridConfig;
use crate::model::weights;

/// A weight matrix `[rows (out), cols (in)]` (or a stack of experts) in device memory.
pub struct DeviceMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    bytes: CudaSlice<u8>,
    dots: Dots,
}

impl DeviceMatrix {
    fn load(device: &Device, gguf: &GgufModel, name: &str, dots: Dots) -> Result<DeviceMatrix> {
        let loc = gguf
            .locate(name)
            .ok_or_else(|| EngineError::MissingTensor { name: name.into() })?;
        let info = gguf.info(loc);
        Ok(DeviceMatrix {
            ty: info.ty,
            rows: info.rows() as usize,
            cols: info.row_len() as usize,
            bytes: device.upload(gguf.data(loc))?,
            dots,
        })
    }

    pub fn view(&self) -> WeightMatrix<'_> {
        WeightMatrix {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            bytes: self.bytes.as_view(),
            dots: self.dots,
        }
    }
}

/// A small tensor decoded to f32 on the host, then uploaded.
fn vector(device: &Device, gguf: &GgufModel, name: &str) -> Result<CudaSlice<f32>> {
    let loc = gguf
        .locate(name)
        .ok_or_else(|| EngineError::MissingTensor { name: name.into() })?;
    let info = gguf.info(loc);
    let mut values = vec![0f32; info.elements() as usize];
    dequantize_row(info.ty, gguf.data(loc), &mut values)?;
    Ok(device.upload(&values)?)
}

pub type DeltaNetWeights = weights::DeltaNetWeights<DeviceMatrix, CudaSlice<f32>>;
pub type AttentionWeights = weights::AttentionWeights<DeviceMatrix, CudaSlice<f32>>;
pub type MoeWeights = weights::MoeWeights<DeviceMatrix>;
pub type Mixer = weights::Mixer<DeviceMatrix, CudaSlice<f32>>;
pub type CudaWeights = weights::ModelWeights<DeviceMatrix, CudaSlice<f32>>;
pub type MtpWeights = weights::MtpWeights<DeviceMatrix, CudaSlice<f32>>;

/// Uploads every weight once; every matrix's products use `dots`.
pub fn upload(
    device: &Device,
    g: &GgufModel,
    config: &HybridConfig,
    dots: Dots,
) -> Result<CudaWeights> {
    weights::load_weights(
        config,
        &|name| DeviceMatrix::load(device, g, name, dots),
        &|name| vector(device, g, name),
        &|name| g.locate(name).is_some(),
    )
}

/// Uploads the MTP block (refused when the file has none).
pub fn upload_mtp(
    device: &Device,
    g: &GgufModel,
    config: &HybridConfig,
    dots: Dots,
) -> Result<MtpWeights> {
    weights::load_mtp(
        config,
        &|name| DeviceMatrix::load(device, g, name, dots),
        &|name| vector(device, g, name),
        &|name| g.locate(name).is_some(),
    )
}
