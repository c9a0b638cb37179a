//! Random but valid tensor data: seeded normals for float tensors, random blocks with
//! calibrated scales for quantized ones.
//!
//! A quantized block is filled with random bytes (every grid index, sign and sub-scale is
//! valid), then its super-block scale `d` is set so that a typical weight has the standard
//! deviation the tensor's role asks for (about 0.02 for the 80B's projections). Types with
//! a `dmin` subtract `dmin * m` from every value; `dmin` is set to balance `d` times the mean
//! quant, so weights are zero-mean like real ones and the logits keep depending on the input.

use half::{bf16, f16};
use redlite_gguf::GgmlType;
use redlite_quant::{dequantize_row, scale_fields, set_iq1m_scale, ScaleKind};

use crate::error::{EngineError, Result};
use crate::model::tensors::Role;
use crate::synth::rng::Rng;

/// Standard deviation of a tensor's values for its role and row length.
pub fn role_std(role: Role, row_len: u64) -> f64 {
    let fan_in = (row_len.max(1) as f64).sqrt();
    match role {
        Role::TokenEmbd => 1.0,
        Role::Output => 4.0 / fan_in,
        Role::Router | Role::SharedExpertGate => 4.8 / fan_in,
        Role::SsmOut | Role::AttnOutput | Role::ExpertDown | Role::SharedDown => 0.32 / fan_in,
        _ => 1.28 / fan_in,
    }
}

/// One float value for a tensor of `role`.
fn float_value(role: Role, std: f64, rng: &mut Rng) -> f32 {
    let v = match role {
        // Stored norms are multiplicative weights near 1 (the converter folded the +1 in).
        Role::Norm | Role::SsmNorm => 1.0 + 0.1 * rng.normal(),
        // ssm_a = -exp(A_log) < 0: decays in a useful range.
        Role::SsmA => -(0.01 + 0.99 * rng.uniform()),
        Role::SsmDtBias => 0.5 * rng.normal(),
        Role::SsmConv => rng.normal(),
        _ => std * rng.normal(),
    };
    v as f32
}

/// How to scale random blocks of one type: `d` for unit RMS and the `dmin / d` balance.
#[derive(Clone, Copy, Debug)]
pub struct Calibration {
    unit_rms: f64,
    dmin_ratio: f64,
}

fn set_scales(ty: GgmlType, block: &mut [u8], d: f32, dmin: f32) -> Result<()> {
    if ty == GgmlType::IQ1M {
        set_iq1m_scale(block, f16::from_f32(d))?;
        return Ok(());
    }
    let fields = scale_fields(ty);
    if fields.is_empty() {
        return Err(EngineError::Synth(format!(
            "cannot fill random {ty} blocks: the type has no scale field to set"
        )));
    }
    for field in fields {
        let v = match field.kind {
            ScaleKind::D | ScaleKind::DF32 => d,
            ScaleKind::Dmin => dmin,
            // Q8_1's cached d·Σq is not used to dequantize; activations recompute it.
            ScaleKind::Sum => 0.0,
        };
        field.write(block, v);
    }
    Ok(())
}

fn mean_and_rms(ty: GgmlType, blocks: &[u8], n_values: usize) -> Result<(f64, f64)> {
    let mut values = vec![0f32; n_values];
    dequantize_row(ty, blocks, &mut values)?;
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let rms = (values.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n).sqrt();
    Ok((mean, rms))
}

/// Measures random blocks of `ty` once (fixed seed, so the result is the same everywhere).
pub fn calibrate(ty: GgmlType) -> Result<Calibration> {
    const BLOCKS: usize = 256;
    let (bb, bv) = (ty.block_bytes(), ty.block_values());
    let mut raw = vec![0u8; BLOCKS * bb];
    Rng::new(0x5eed, u64::from(ty.id()), 0).fill_bytes(&mut raw);
    let has_dmin = scale_fields(ty).iter().any(|f| f.kind == ScaleKind::Dmin);
    let with = |d: f32, dmin: f32| -> Result<Vec<u8>> {
        let mut b = raw.clone();
        for block in b.chunks_exact_mut(bb) {
            set_scales(ty, block, d, dmin)?;
        }
        Ok(b)
    };
    let mut dmin_ratio = 0.0;
    if has_dmin {
        let (mean_d, _) = mean_and_rms(ty, &with(1.0, 0.0)?, BLOCKS * bv)?;
        let (mean_m, _) = mean_and_rms(ty, &with(0.0, 1.0)?, BLOCKS * bv)?;
        if mean_m != 0.0 {
            dmin_ratio = -mean_d / mean_m;
        }
    }
    let (_, unit_rms) = mean_and_rms(ty, &with(1.0, dmin_ratio as f32)?, BLOCKS * bv)?;
    if !(unit_rms.is_finite() && unit_rms > 0.0) {
        return Err(EngineError::Synth(format!(
            "random {ty} blocks have RMS {unit_rms}"
        )));
    }
    Ok(Calibration {
        unit_rms,
        dmin_ratio,
    })
}

/// Fills `out` (whole rows of a tensor of `ty`) with random data of standard deviation `std`.
pub fn fill(
    ty: GgmlType,
    role: Role,
    std: f64,
    calibration: Option<Calibration>,
    rng: &mut Rng,
    out: &mut [u8],
) -> Result<()> {
    match ty {
        GgmlType::F32 => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&float_value(role, std, rng).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&f16::from_f32(float_value(role, std, rng)).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&bf16::from_f32(float_value(role, std, rng)).to_le_bytes());
            }
        }
        _ => {
            let cal = calibration
                .ok_or_else(|| EngineError::Synth(format!("{ty} needs a calibration")))?;
            rng.fill_bytes(out);
            let d = std / cal.unit_rms;
            for block in out.chunks_exact_mut(ty.block_bytes()) {
                // Scales vary from block to block as in real files.
                let jitter = 0.75 + 0.5 * rng.uniform();
                let db = d * jitter;
                set_scales(ty, block, db as f32, (db * cal.dmin_ratio) as f32)?;
            }
        }
    }
    Ok(())
}
