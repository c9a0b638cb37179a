//! Every weight resident on the GPU, uploaded once: matrices in their GGUF block format
//! (decoded inside the kernels), small vectors (norms, gates, conv taps) decoded to f32.

use redlite_cuda::{CudaSlice, Device, Dots, WeightMatrix};
use redlite_gguf::{GgmlType, GgufModel, TensorInfo, TensorRef};
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
    /// Rows stored after `rows` in the same buffer: a router holds the shared expert's gate
    /// row there (see [`ROUTER`]), so that decode computes both in one launch.
    extra_rows: usize,
}

/// The router's tensor name suffix, and the shared-expert gate row stored after it.
const ROUTER: &str = "ffn_gate_inp.weight";
const SHARED_GATE: &str = "ffn_gate_inp_shexp.weight";

/// A tensor's place and description, or the error naming it.
fn tensor<'g>(gguf: &'g GgufModel, name: &str) -> Result<(TensorRef, &'g TensorInfo)> {
    let loc = gguf
        .locate(name)
        .ok_or_else(|| EngineError::MissingTensor { name: name.into() })?;
    Ok((loc, gguf.info(loc)))
}

impl DeviceMatrix {
    fn load(device: &Device, gguf: &GgufModel, name: &str, dots: Dots) -> Result<DeviceMatrix> {
        let (loc, info) = tensor(gguf, name)?;
        Ok(DeviceMatrix {
            ty: info.ty,
            rows: info.rows() as usize,
            cols: info.row_len() as usize,
            bytes: device.upload(gguf.data(loc))?,
            dots,
            extra_rows: 0,
        })
    }

    /// A router with the block's shared-expert gate row appended (decode computes both,
    /// and routes, in one launch) when both have the same type and row length; otherwise
    /// the router alone. Real files and `redlite synth` store the router in F32 and the gate
    /// in F16 or BF16 (spec: never quantized, the source precision), so they take the
    /// split-K router and the routing with the gate row. (The gate row widened to F32 and
    /// stored here moved the logits, the shared gate's logit summed in the router's order,
    /// and was slower: 338.8 vs 351.4 t/s on the H200, fifteenth session; removed.)
    fn router(device: &Device, gguf: &GgufModel, name: &str, dots: Dots) -> Result<DeviceMatrix> {
        let shared_name = name.replace(ROUTER, SHARED_GATE);
        let (Some(router), Some(shared)) = (gguf.locate(name), gguf.locate(&shared_name)) else {
            return DeviceMatrix::load(device, gguf, name, dots);
        };
        let (r, g) = (gguf.info(router), gguf.info(shared));
        if r.ty != g.ty || r.row_len() != g.row_len() || g.rows() != 1 {
            return DeviceMatrix::load(device, gguf, name, dots);
        }
        let bytes = [gguf.data(router), gguf.data(shared)].concat();
        Ok(DeviceMatrix {
            ty: r.ty,
            rows: r.rows() as usize,
            cols: r.row_len() as usize,
            bytes: device.upload(&bytes)?,
            dots,
            extra_rows: 1,
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
        let (loc, info) = tensor(gguf, name)?;
        let n = n_expert.max(1);
        host.keep(device, name, gguf.data(loc))?;
        Ok(DeviceMatrix {
            ty: info.ty,
            rows: info.rows() as usize / n * slots,
            cols: info.row_len() as usize,
            bytes: device.alloc_zeros(info.bytes as usize / n * slots)?,
            dots,
            extra_rows: 0,
        })
    }

    /// An expert stack left in host memory (`--experts cpu`): the shape without rows, so a
    /// product on it is refused rather than reading anything.
    fn on_host(device: &Device, gguf: &GgufModel, name: &str, dots: Dots) -> Result<DeviceMatrix> {
        let (_, info) = tensor(gguf, name)?;
        Ok(DeviceMatrix {
            ty: info.ty,
            rows: 0,
            cols: info.row_len() as usize,
            bytes: device.alloc_zeros(16)?,
            dots,
            extra_rows: 0,
        })
    }

    /// The device bytes (the fill target of a slot stack).
    pub fn bytes(&self) -> &CudaSlice<u8> {
        &self.bytes
    }

    pub fn view(&self) -> WeightMatrix<'_> {
        self.slice_rows(0..self.rows)
    }

    /// Rows `range` of the matrix (consecutive rows are consecutive bytes), or `None` past
    /// its rows.
    pub fn rows_view(&self, range: std::ops::Range<usize>) -> Option<WeightMatrix<'_>> {
        (range.start < range.end && range.end <= self.rows).then(|| self.slice_rows(range))
    }

    fn slice_rows(&self, range: std::ops::Range<usize>) -> WeightMatrix<'_> {
        let row_bytes = self.row_bytes();
        WeightMatrix {
            ty: self.ty,
            rows: range.len(),
            cols: self.cols,
            bytes: self
                .bytes
                .slice(range.start * row_bytes..range.end * row_bytes),
            dots: self.dots,
        }
    }

    /// The matrix with the rows stored after it (a router with the shared-expert gate row),
    /// or `None` when there are none.
    pub fn view_with_extra_rows(&self) -> Option<WeightMatrix<'_>> {
        (self.extra_rows > 0).then(|| WeightMatrix {
            ty: self.ty,
            rows: self.rows + self.extra_rows,
            cols: self.cols,
            bytes: self.bytes.as_view(),
            dots: self.dots,
        })
    }

    fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_values() * self.ty.block_bytes()
    }
}

/// A small tensor decoded to f32 on the host, then uploaded.
fn vector(device: &Device, gguf: &GgufModel, name: &str) -> Result<CudaSlice<f32>> {
    let (loc, info) = tensor(gguf, name)?;
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
        ExpertResidency::Cache { slots, .. } if is_expert_stack(name) => {
            DeviceMatrix::slot_stack(device, g, name, dots, (slots, config.n_expert), host)
        }
        ExpertResidency::Cpu if is_expert_stack(name) => {
            DeviceMatrix::on_host(device, g, name, dots)
        }
        _ if name.ends_with(ROUTER) => DeviceMatrix::router(device, g, name, dots),
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
        ExpertResidency::Resident | ExpertResidency::Cpu => Ok(Vec::new()),
        ExpertResidency::Cache { slots, policy } => layers
            .map(|l| {
                let cache = LayerCache::new(device, config.n_expert, l, (slots, policy), host)?;
                Ok((l, cache))
            })
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
