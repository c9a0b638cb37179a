//! Per-tensor types of llama-quantize's default recipes for qwen3next (spec §6.1), and the
//! all-F32 / all-F16 files of the converter.

use redlite_gguf::GgmlType;

use crate::model::tensors::{Role, TensorPlan};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipe {
    F32,
    F16,
    Q4KM,
    IQ2XXS,
    IQ2XS,
    IQ1M,
}

impl Recipe {
    pub fn parse(name: &str) -> Option<Recipe> {
        Some(match name.to_ascii_uppercase().as_str() {
            "F32" => Recipe::F32,
            "F16" => Recipe::F16,
            "Q4_K_M" => Recipe::Q4KM,
            "IQ2_XXS" => Recipe::IQ2XXS,
            "IQ2_XS" => Recipe::IQ2XS,
            "IQ1_M" => Recipe::IQ1M,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Recipe::F32 => "F32",
            Recipe::F16 => "F16",
            Recipe::Q4KM => "Q4_K_M",
            Recipe::IQ2XXS => "IQ2_XXS",
            Recipe::IQ2XS => "IQ2_XS",
            Recipe::IQ1M => "IQ1_M",
        }
    }

    /// llama.cpp's `general.file_type` (`llama_ftype`) for this recipe.
    pub fn file_type(self) -> u32 {
        match self {
            Recipe::F32 => 0,
            Recipe::F16 => 1,
            Recipe::Q4KM => 15,
            Recipe::IQ2XXS => 19,
            Recipe::IQ2XS => 20,
            Recipe::IQ1M => 31,
        }
    }

    /// The type most tensors get.
    fn base(self) -> GgmlType {
        match self {
            Recipe::F32 => GgmlType::F32,
            Recipe::F16 => GgmlType::F16,
            Recipe::Q4KM => GgmlType::Q4K,
            Recipe::IQ2XXS => GgmlType::IQ2XXS,
            Recipe::IQ2XS => GgmlType::IQ2XS,
            Recipe::IQ1M => GgmlType::IQ1M,
        }
    }
}

/// llama-quantize's `use_more_bits`: the first and last eighth, and every third in between.
fn use_more_bits(i: usize, n: usize) -> bool {
    let first = n / 8;
    i < first || i >= 7 * n / 8 || (i - first) % 3 == 2
}

/// Assigns types to a whole tensor list (some rules count tensors in processing order).
pub fn assign_types(
    recipe: Recipe,
    plans: &[TensorPlan],
    n_layer: usize,
    n_attention: usize,
) -> Vec<GgmlType> {
    let mut ffn_down_seen = 0usize;
    let mut attn_v_seen = 0usize;
    plans
        .iter()
        .map(|p| {
            let ty = choose(
                recipe,
                p,
                n_layer,
                n_attention,
                &mut ffn_down_seen,
                &mut attn_v_seen,
            );
            fit_row(ty, p)
        })
        .collect()
}

fn choose(
    recipe: Recipe,
    p: &TensorPlan,
    n_layer: usize,
    n_attention: usize,
    ffn_down_seen: &mut usize,
    attn_v_seen: &mut usize,
) -> GgmlType {
    use GgmlType as T;
    if p.role.is_always_f32() || recipe == Recipe::F32 {
        return T::F32;
    }
    if p.role == Role::SharedExpertGate || recipe == Recipe::F16 {
        // Effectively 1-D: never quantized, stays in the source precision.
        return T::F16;
    }
    let base = recipe.base();
    let low_bit = matches!(recipe, Recipe::IQ2XXS | Recipe::IQ2XS | Recipe::IQ1M);
    match p.role {
        Role::TokenEmbd if low_bit => T::Q2K,
        Role::Output if low_bit => T::Q5K,
        Role::Output => T::Q6K,
        Role::AttnV | Role::SsmQkv if low_bit => {
            *attn_v_seen += usize::from(p.role == Role::AttnV);
            T::Q4K
        }
        Role::AttnV => {
            let i = *attn_v_seen;
            *attn_v_seen += 1;
            if use_more_bits(i, n_attention) {
                T::Q6K
            } else {
                base
            }
        }
        Role::AttnOutput if recipe == Recipe::IQ1M => T::IQ2XXS,
        Role::ExpertDown | Role::SharedDown if low_bit => {
            let i = *ffn_down_seen;
            *ffn_down_seen += 1;
            if i < n_layer / 8 {
                T::Q2K
            } else {
                base
            }
        }
        Role::ExpertDown | Role::SharedDown => match p.layer {
            Some(l) if l < n_layer && use_more_bits(l, n_layer) => T::Q6K,
            _ => base,
        },
        _ => base,
    }
}

/// llama-quantize falls back when a row is not a whole number of blocks.
fn fit_row(ty: GgmlType, p: &TensorPlan) -> GgmlType {
    let row = p.shape.last().copied().unwrap_or(1);
    if ty.row_bytes(row).is_some() {
        ty
    } else if GgmlType::Q8_0.row_bytes(row).is_some() {
        GgmlType::Q8_0
    } else {
        GgmlType::F16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_more_bits_picks_a_quarter_plus() {
        assert_eq!((0..48).filter(|&i| use_more_bits(i, 48)).count(), 24);
        assert_eq!((0..12).filter(|&i| use_more_bits(i, 12)).count(), 6);
    }
}
