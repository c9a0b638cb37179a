//! Every weight resident on the GPU, uploaded once: matrices in their GGUF block format
//! (decoded inside the kernels), small vectors (norms, gates, conv taps) decoded to f32.

use redlite_cuda::{CudaSlice, Device, Dots, WeightMatrix};
use redlite_gguf::{GgmlType, GgufModel};
use redlite_quant::dequantize_row;

use crate::backend::cuda::experts::{is_expert_stack, ExpertResidency, HostStacks, LayerCache};
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

    /// The slot stack of an expert stack kept in a cache of `slots` experts: room for
    /// `slots` of the file's `n_expert` experts on the device, the whole stack copied into
    /// `host` (page-locked) for the cache to copy from.
    fn slot_stack(
        device: &Device,
        gguf: &GgufModel,
        name: &str,
        dots: Dots,
        (slots, n_expert): (usize, usize),
        host: &HostStacks,
    ) -> Result<DeviceMatrix> {
        let loc = gguf
            .locate(name)
            .ok_or_else(|| EngineError::MissingTensor { name: name.into() })?;
        let info = gguf.info(loc);
        let n = n_expert.max(1);
        host.keep(device, name, gguf.data(loc))?;
        Ok(DeviceMatrix {
            ty: info.ty,
            rows: info.rows() as usize / n * slots,
            cols: info.row_len() as usize,
            bytes: device.alloc_zeros(info.bytes as usize / n * slots)?,
            dots,
        })
    }

    /// The device bytes (the fill target of a slot stack).
    pub fn bytes(&self) -> &CudaSlice<u8> {
        &self.bytes
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

/// Loads one matrix: uploaded whole, or as a slot stack when it is an expert stack and the
/// experts are cached.
fn matrix(
    device: &Device,
    g: &GgufModel,
    config: &HybridConfig,
    (dots, residency): (Dots, ExpertResidency),
    host: &HostStacks,
    name: &str,
) -> Result<DeviceMatrix> {
    match residency {
        ExpertResidency::Cache { slots } if is_expert_stack(name) => {
            DeviceMatrix::slot_stack(device, g, name, dots, (slots, config.n_expert), host)
        }
        _ => DeviceMatrix::load(device, g, name, dots),
    }
}

/// The caches of blocks `layers` (empty when the experts are resident).
fn caches(
    device: &Device,
    config: &HybridConfig,
    residency: ExpertResidency,
    layers: std::ops::Range<usize>,
    host: &HostStacks,
) -> Result<Vec<(usize, LayerCache)>> {
    match residency {
        ExpertResidency::Resident => Ok(Vec::new()),
        ExpertResidency::Cache { slots } => layers
            .map(|l| Ok((l, LayerCache::new(device, config.n_expert, l, slots, host)?)))
            .collect(),
    }
}

/// Uploads every weight once (the routed experts as `residency` says); every matrix's
/// products use `dots`. Returns the caches by block index too.
pub fn upload(
    device: &Device,
    g: &GgufModel,
    config: &HybridConfig,
    dots: Dots,
    residency: ExpertResidency,
) -> Result<(CudaWeights, Vec<(usize, LayerCache)>)> {
    let host = HostStacks::default();
    let weights = weights::load_weights(
        config,
        &|name| matrix(device, g, config, (dots, residency), &host, name),
        &|name| vector(device, g, name),
        &|name| g.locate(name).is_some(),
    )?;
    let caches = caches(device, config, residency, 0..config.n_layer, &host)?;
    Ok((weights, caches))
}

/// Uploads the MTP block (refused when the file has none), its experts as `residency`
/// says; returns its cache too.
pub fn upload_mtp(
    device: &Device,
    g: &GgufModel,
    config: &HybridConfig,
    dots: Dots,
    residency: ExpertResidency,
) -> Result<(MtpWeights, Vec<(usize, LayerCache)>)> {
    let host = HostStacks::default();
    let weights = weights::load_mtp(
        config,
        &|name| matrix(device, g, config, (dots, residency), &host, name),
        &|name| vector(device, g, name),
        &|name| g.locate(name).is_some(),
    )?;
    let l = config.n_layer;
    let caches = caches(device, config, residency, l..l + 1, &host)?;
    Ok((weights, caches))
}
