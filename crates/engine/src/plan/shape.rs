//! What the planner needs to know about a model: the bytes the GPU backend uploads as
//! resident dense weights, and the routed experts' bytes layer by layer. Read from a file's
//! tensor table (metadata only, no tensor data) or from shapes and types alone (a synthetic
//! recipe), through one function, so the 80B plans are tested without a 20 GB file.

use std::collections::HashMap;

use redlite_gguf::{GgmlType, GgufModel};
use serde::Serialize;

use crate::model::config::HybridConfig;
use crate::model::load::config_from_gguf;
use crate::model::tensors::{expected_tensors, Role};
use crate::plan::error::{PlanError, Result};
use crate::synth::{plan_tensors, Recipe};

/// The routed experts of one MoE layer: the three stacks `ffn_{gate,up,down}_exps`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExpertLayer {
    /// Block index (`n_layer` for the MTP block).
    pub layer: usize,
    /// Bytes of the three stacks together.
    pub bytes: u64,
    /// Bytes of one expert (its slab of each stack): what one cache slot of this layer holds.
    pub per_expert: u64,
}

/// Weights the GPU backend uploads once and keeps (everything but the routed experts).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DenseWeights {
    /// `token_embd.weight` in its block format (the embedding kernel reads it on the GPU).
    pub token_embd: u64,
    /// `output.weight`, or a second upload of `token_embd` when the file ties them (the
    /// loader loads the tensor by name twice).
    pub output: u64,
    /// Mixers, norms, routers and shared experts of the main stack, and `output_norm`.
    pub layers: u64,
}

impl DenseWeights {
    pub fn total(&self) -> u64 {
        self.token_embd + self.output + self.layers
    }
}

/// The MTP block (spec §4): one attention layer with its MoE, and the `nextn` projection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MtpBlock {
    /// Everything but its routed experts.
    pub dense: u64,
    pub experts: ExpertLayer,
}

/// A model as the planner sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelShape {
    pub config: HybridConfig,
    pub dense: DenseWeights,
    /// Main-stack MoE layers, in order.
    pub experts: Vec<ExpertLayer>,
    /// Present when the file (or the shape) holds an MTP block.
    pub mtp: Option<MtpBlock>,
    /// Bytes of every tensor of the table as stored (what the file's data section holds,
    /// before alignment padding), including tensors the engine does not load.
    pub tensor_bytes: u64,
}

/// A tensor's type and shape (outermost first), found by name.
type Lookup<'a> = dyn Fn(&str) -> Option<(GgmlType, Vec<u64>)> + 'a;

/// Bytes of a tensor as stored.
pub fn stored_bytes(name: &str, ty: GgmlType, shape: &[u64]) -> Result<u64> {
    let row = shape.last().copied().unwrap_or(1);
    let outer = &shape[..shape.len().saturating_sub(1)];
    ty.row_bytes(row)
        .and_then(|row_bytes| {
            outer
                .iter()
                .try_fold(row_bytes, |acc, &d| acc.checked_mul(d))
        })
        .ok_or_else(|| PlanError::TensorSize {
            name: name.to_string(),
            ty,
            shape: shape.to_vec(),
        })
}

/// Small tensors the backend decodes to f32 before uploading (the `vector` loads of
/// `model::weights::load_weights`); every other tensor goes up in its block format.
fn decoded_to_f32(role: Role) -> bool {
    matches!(
        role,
        Role::Norm | Role::SsmNorm | Role::SsmA | Role::SsmDtBias | Role::SsmConv
    )
}

impl ModelShape {
    /// From a file's metadata and tensor table; no tensor data is read.
    pub fn from_gguf(model: &GgufModel) -> Result<ModelShape> {
        let config = config_from_gguf(model)?;
        let tensor_bytes = model.tensors().map(|t| t.bytes).sum();
        let lookup = |name: &str| model.tensor(name).map(|t| (t.ty, t.shape.clone()));
        ModelShape::from_lookup(config, tensor_bytes, &lookup)
    }

    /// From shapes and a quantization recipe's types, as `redlite synth` would write them.
    pub fn from_recipe(config: &HybridConfig, recipe: Recipe) -> Result<ModelShape> {
        let tensors = plan_tensors(config, recipe);
        let mut tensor_bytes = 0u64;
        let mut by_name = HashMap::with_capacity(tensors.len());
        for (plan, ty) in tensors {
            tensor_bytes += stored_bytes(&plan.name, ty, &plan.shape)?;
            by_name.insert(plan.name, (ty, plan.shape));
        }
        let lookup = |name: &str| by_name.get(name).cloned();
        ModelShape::from_lookup(config.clone(), tensor_bytes, &lookup)
    }

    /// Walks the tensors the config implies (the list the loader checks and loads) and
    /// sorts their upload sizes into dense weights, experts per layer and the MTP block.
    fn from_lookup(config: HybridConfig, tensor_bytes: u64, lookup: &Lookup) -> Result<ModelShape> {
        let mut dense = DenseWeights::default();
        let mut layer_experts: Vec<u64> = vec![0; config.n_layer + config.n_mtp];
        let mut mtp_dense = 0u64;
        for plan in expected_tensors(&config) {
            let Some((ty, shape)) = lookup(&plan.name) else {
                if plan.role == Role::Output {
                    // Tied head: the loader uploads `token_embd` a second time.
                    dense.output = dense.token_embd;
                    continue;
                }
                return Err(crate::error::EngineError::MissingTensor { name: plan.name }.into());
            };
            let bytes = if decoded_to_f32(plan.role) {
                let elements = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
                elements
                    .and_then(|n| n.checked_mul(4))
                    .ok_or_else(|| PlanError::TensorSize {
                        name: plan.name.clone(),
                        ty,
                        shape: shape.clone(),
                    })?
            } else {
                stored_bytes(&plan.name, ty, &shape)?
            };
            let in_mtp = plan.layer.is_some_and(|l| l >= config.n_layer);
            match (plan.role, plan.layer) {
                (role, Some(layer)) if role.is_expert() => {
                    if let Some(total) = layer_experts.get_mut(layer) {
                        *total += bytes;
                    }
                }
                _ if in_mtp => mtp_dense += bytes,
                (Role::TokenEmbd, _) => dense.token_embd = bytes,
                (Role::Output, _) => dense.output = bytes,
                _ => dense.layers += bytes,
            }
        }
        let n_expert = config.n_expert.max(1) as u64;
        let mut experts: Vec<ExpertLayer> = layer_experts
            .into_iter()
            .enumerate()
            .map(|(layer, bytes)| ExpertLayer {
                layer,
                bytes,
                per_expert: bytes / n_expert,
            })
            .collect();
        let mtp = if experts.len() > config.n_layer {
            experts.pop().map(|experts| MtpBlock {
                dense: mtp_dense,
                experts,
            })
        } else {
            None
        };
        Ok(ModelShape {
            config,
            dense,
            experts,
            mtp,
            tensor_bytes,
        })
    }

    /// Bytes of every routed expert of the main stack.
    pub fn expert_bytes(&self) -> u64 {
        self.experts.iter().map(|e| e.bytes).sum()
    }
}
