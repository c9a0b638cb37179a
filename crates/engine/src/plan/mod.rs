//! The memory planner: from a model's tensor table and the user's settings, how the GPU's
//! memory is spent (dense weights, KV cache, DeltaNet state, activations, CUDA's own), where
//! the routed experts live (all resident, a GPU cache of whole expert slots, or the CPU),
//! whether that fits, the longest context that fits, and the cheapest change that makes a
//! failing plan fit. Pure arithmetic over shapes and block sizes: no tensor data is read,
//! so a plan for an 80 GB file takes a millisecond. `docs/PLAN.md` explains every line.

mod activations;
mod advice;
mod budget;
mod error;
mod experts;
mod report;
mod settings;
mod shape;
mod units;

use redlite_gguf::GgufModel;
use serde::Serialize;

pub use activations::{Activations, ATTENTION_MAX_SPLITS};
pub use advice::{Advice, Change, Goal, LargestContext, MIN_CHUNK};
pub use budget::{Budget, CUDA_CONTEXT_BYTES, CUDA_WORKSPACE_BYTES};
pub use error::{PlanError, Result};
pub use experts::{ExpertPlan, ExpertPool, Residency};
pub use settings::{ExpertPolicy, PlanSettings, DEFAULT_CHUNK, DEFAULT_CTX};
pub use shape::{stored_bytes, DenseWeights, ExpertLayer, ModelShape, MtpBlock};
pub use units::{human, parse_bytes, GIB, MIB};

/// One set of settings, sized: the budget before the experts and the experts' residency.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evaluation {
    pub budget: Budget,
    pub experts: ExpertPlan,
}

impl Evaluation {
    pub fn fits(&self) -> bool {
        self.experts.fits
    }

    /// GPU bytes the plan uses.
    pub fn used(&self) -> u64 {
        self.budget
            .before_experts()
            .saturating_add(self.experts.gpu_bytes)
    }

    /// The limit minus what the plan uses (negative when it does not fit).
    pub fn remaining(&self) -> i128 {
        i128::from(self.budget.gpu_limit) - i128::from(self.used())
    }
}

/// Sizes one set of settings (already validated, the MTP block present if asked for).
pub fn evaluate(shape: &ModelShape, s: &PlanSettings) -> Evaluation {
    let budget = budget::budget(shape, s);
    let pool = ExpertPool::new(shape, s.mtp);
    let experts = experts::decide(&pool, s.experts, budget.available_for_experts());
    Evaluation { budget, experts }
}

/// The model facts a plan reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModelFacts {
    pub layers: usize,
    pub attention_layers: usize,
    pub deltanet_layers: usize,
    pub experts: usize,
    pub experts_used: usize,
    pub has_mtp_block: bool,
    /// Every tensor of the table as stored, loaded or not.
    pub tensor_bytes: u64,
}

/// A complete plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub model: ModelFacts,
    pub settings: PlanSettings,
    pub budget: Budget,
    pub experts: ExpertPlan,
    /// GPU bytes the plan uses, and what the limit leaves (negative: short by that much).
    pub used: u64,
    pub remaining: i64,
    pub fits: bool,
    pub largest_context: LargestContext,
    pub advice: Option<Advice>,
}

/// Plans `settings` for a model.
pub fn plan(shape: &ModelShape, settings: &PlanSettings) -> Result<Plan> {
    settings.validate()?;
    if settings.mtp && shape.mtp.is_none() {
        return Err(PlanError::NoMtpBlock);
    }
    let e = evaluate(shape, settings);
    let c = &shape.config;
    let remaining = e.remaining();
    Ok(Plan {
        model: ModelFacts {
            layers: c.n_layer,
            attention_layers: c.attention_layers(),
            deltanet_layers: c.deltanet_layers(),
            experts: c.n_expert,
            experts_used: c.n_expert_used,
            has_mtp_block: shape.mtp.is_some(),
            tensor_bytes: shape.tensor_bytes,
        },
        settings: settings.clone(),
        used: e.used(),
        remaining: i64::try_from(remaining).unwrap_or(if remaining < 0 {
            i64::MIN
        } else {
            i64::MAX
        }),
        fits: e.fits(),
        largest_context: advice::largest_context(shape, settings),
        advice: advice::advise(shape, settings, &e),
        budget: e.budget,
        experts: e.experts,
    })
}

/// Plans `settings` for a GGUF file from its metadata and tensor table (nothing else is
/// read, so a full-size file is planned in a moment).
pub fn plan_file(model: &GgufModel, settings: &PlanSettings) -> Result<Plan> {
    plan(&ModelShape::from_gguf(model)?, settings)
}
