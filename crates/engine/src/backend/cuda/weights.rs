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

/// `REDLITE_ROUTER_WIDEN_GATE=1`: an F16/BF16 shared-expert gate row joins an F32 router
/// (`DeviceMatrix::router`).
fn widen_gate() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_ROUTER_WIDEN_GATE").as_deref() == Ok("1"))
}

/// The shared-expert gate row's bytes in the router's type `router`: as stored when the
/// types agree; an F16/BF16 row widened to F32 (exact values) when `widen`; else `None`.
fn gate_row_as(
    router: GgmlType,
    gate: GgmlType,
    row: &[u8],
    widen: bool,
) -> Result<Option<Vec<u8>>> {
    if router == gate {
        return Ok(Some(row.to_vec()));
    }
    if !(widen && router == GgmlType::F32 && matches!(gate, GgmlType::F16 | GgmlType::BF16)) {
        return Ok(None);
    }
    let mut values = vec![0.0f32; row.len() / 2];
    dequantize_row(gate, row, &mut values)?;
    Ok(Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()))
}

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
    /// three launches unless `REDLITE_ROUTER_WIDEN_GATE=1` widens the gate row to F32: its
    /// values exactly, but summed in the router's order (another rounding of the shared
    /// gate's logit, not yet measured on a GPU; hence off by default).
    fn router(device: &Device, gguf: &GgufModel, name: &str, dots: Dots) -> Result<DeviceMatrix> {
        let shared_name = name.replace(ROUTER, SHARED_GATE);
        let (Some(router), Some(shared)) = (gguf.locate(name), gguf.locate(&shared_name)) else {
            return DeviceMatrix::load(device, gguf, name, dots);
        };
        let (r, g) = (gguf.info(router), gguf.info(shared));
        if r.row_len() != g.row_len() || g.rows() != 1 {
            return DeviceMatrix::load(device, gguf, name, dots);
        }
        let Some(gate_row) = gate_row_as(r.ty, g.ty, gguf.data(shared), widen_gate())? else {
            return DeviceMatrix::load(device, gguf, name, dots);
        };
        let bytes = [gguf.data(router), gate_row.as_slice()].concat();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_half_precision_gate_row_widens_to_the_exact_f32_values() {
        let values = [1.0f32, -0.5, 65504.0, 2.0f32.powi(-24), 0.0, -3.140625];
        let f16: Vec<u8> = values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        let bf16: Vec<u8> = values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        for (ty, row) in [(GgmlType::F16, &f16), (GgmlType::BF16, &bf16)] {
            let widened = gate_row_as(GgmlType::F32, ty, row, true).unwrap().unwrap();
            let got: Vec<f32> = widened
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let want: Vec<f32> = match ty {
                GgmlType::F16 => values
                    .iter()
                    .map(|&v| half::f16::from_f32(v).to_f32())
                    .collect(),
                _ => values
                    .iter()
                    .map(|&v| half::bf16::from_f32(v).to_f32())
                    .collect(),
            };
            assert_eq!(got, want, "{ty:?}");
        }
        // Off, or a type it cannot widen: the router stays alone.
        assert!(gate_row_as(GgmlType::F32, GgmlType::F16, &f16, false)
            .unwrap()
            .is_none());
        assert!(gate_row_as(GgmlType::F32, GgmlType::Q8_0, &f16, true)
            .unwrap()
            .is_none());
        // The same type: the row as stored.
        let same = gate_row_as(GgmlType::F16, GgmlType::F16, &f16, false).unwrap();
        assert_eq!(same.as_deref(), Some(f16.as_slice()));
    }
}
