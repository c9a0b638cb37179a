//! The two questions a plan answers besides "does it fit": how long a context fits, and
//! what is the cheapest change that makes a failing plan fit (or that keeps every expert
//! on the GPU when the plan settled for less).
//!
//! The rule for the cheapest change: the changes below are ordered by what they cost;
//! the first one that makes the plan fit on its own is the advice; when none does, they are
//! made together, in order, each as far as it goes, until the plan fits.
//!
//! 1. an f16 KV cache (halves the KV; llama.cpp's default KV type),
//! 2. a smaller prefill chunk (the largest multiple of 64 that fits, at least 64; costs
//!    prefill speed only),
//! 3. fewer slots (the most that fit; costs concurrent requests),
//! 4. for `--experts resident` or `cache=SIZE`: the largest expert cache that fits, else the
//!    experts on the CPU (costs decode speed),
//! 5. a shorter context (the longest that fits).
//!
//! When even all of them cannot make it fit (the dense weights, one slot's state and the
//! CUDA reserve alone exceed the limit), the advice is empty: a larger GPU is needed.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::plan::experts::Residency;
use crate::plan::settings::{ExpertPolicy, PlanSettings};
use crate::plan::shape::ModelShape;
use crate::plan::{evaluate, Evaluation};
use crate::state::KvType;

/// The smallest prefill chunk the advice goes down to.
pub const MIN_CHUNK: usize = 64;

/// One change to the settings, printed as the flag that makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    KvF16,
    Chunk(usize),
    Slots(usize),
    Experts(ExpertPolicy),
    Ctx(usize),
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::KvF16 => f.write_str("--kv f16"),
            Change::Chunk(n) => write!(f, "--chunk {n}"),
            Change::Slots(n) => write!(f, "--slots {n}"),
            Change::Experts(p) => write!(f, "--experts {p}"),
            Change::Ctx(n) => write!(f, "--ctx {n}"),
        }
    }
}

impl Serialize for Change {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// What the advice aims at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Goal {
    /// Make a plan that does not fit, fit (with the residency its policy asks for).
    Fit,
    /// Keep every expert on the GPU (the plan fits, with a cache or the CPU).
    AllResident,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Advice {
    pub goal: Goal,
    /// The changes, in the order tried; empty when nothing short of a larger GPU works.
    pub changes: Vec<Change>,
    /// The residency the changed plan settles on.
    pub residency: Option<Residency>,
}

/// The longest contexts (positions per slot) that fit with the other settings unchanged,
/// each at most the trained context.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LargestContext {
    /// With every expert resident.
    pub all_resident: Option<usize>,
    /// With at least the minimum expert cache (or every expert resident).
    pub with_cache: Option<usize>,
    /// With the experts on the CPU if need be.
    pub at_all: Option<usize>,
    /// With the expert policy as set (equals `at_all` for `auto`).
    pub as_set: Option<usize>,
    /// The model's trained context length, the cap of the above.
    pub trained: usize,
}

/// The largest `ctx` in `1..=hi` for which `ok` holds (`ok` only turns false as ctx grows).
fn largest_ctx(s: &PlanSettings, hi: usize, ok: &dyn Fn(&PlanSettings) -> bool) -> Option<usize> {
    let at = |ctx: usize| ok(&PlanSettings { ctx, ..s.clone() });
    if hi == 0 || !at(1) {
        return None;
    }
    let (mut lo, mut hi) = (1usize, hi);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if at(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo)
}

/// Whether the settings fit with at least `level` under the `auto` policy.
fn reaches(shape: &ModelShape, s: &PlanSettings, level: Residency) -> bool {
    let e = evaluate(
        shape,
        &PlanSettings {
            experts: ExpertPolicy::Auto,
            ..s.clone()
        },
    );
    e.fits() && e.experts.residency >= level
}

pub fn largest_context(shape: &ModelShape, s: &PlanSettings) -> LargestContext {
    let trained = shape.config.context_length.max(1);
    let min_cache = Residency::Cache { slots_per_layer: 0 };
    LargestContext {
        all_resident: largest_ctx(s, trained, &|t| reaches(shape, t, Residency::Resident)),
        with_cache: largest_ctx(s, trained, &|t| reaches(shape, t, min_cache)),
        at_all: largest_ctx(s, trained, &|t| reaches(shape, t, Residency::Cpu)),
        as_set: largest_ctx(s, trained, &|t| evaluate(shape, t).fits()),
        trained,
    }
}

/// The policy that names a residency exactly.
fn policy_for(e: &Evaluation) -> ExpertPolicy {
    match e.experts.residency {
        Residency::Resident => ExpertPolicy::Resident,
        Residency::Cache { .. } => ExpertPolicy::Cache(e.experts.gpu_bytes),
        Residency::Cpu => ExpertPolicy::Cpu,
    }
}

/// The changes the advice may make, cheapest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Kv,
    Chunk,
    Slots,
    Experts,
    Ctx,
}

const STEPS: [Step; 5] = [Step::Kv, Step::Chunk, Step::Slots, Step::Experts, Step::Ctx];

/// A step taken: the settings after it, and whether they pass.
struct Taken {
    change: Change,
    settings: PlanSettings,
    passes: bool,
}

/// Takes `step` on `s`: its gentlest value that passes `ok`, else its furthest value (to
/// carry on from). `None` when the step cannot change anything.
fn take(
    shape: &ModelShape,
    s: &PlanSettings,
    step: Step,
    goal: Goal,
    ok: &dyn Fn(&PlanSettings) -> bool,
) -> Option<Taken> {
    let with = |change: Change, settings: PlanSettings| {
        let passes = ok(&settings);
        Some(Taken {
            change,
            settings,
            passes,
        })
    };
    match step {
        Step::Kv if s.kv == KvType::F32 => with(
            Change::KvF16,
            PlanSettings {
                kv: KvType::F16,
                ..s.clone()
            },
        ),
        Step::Chunk if s.chunk > MIN_CHUNK => {
            let below = (s.chunk - 1) / MIN_CHUNK * MIN_CHUNK;
            let chunk = (1..=below / MIN_CHUNK)
                .rev()
                .map(|k| k * MIN_CHUNK)
                .find(|&chunk| ok(&PlanSettings { chunk, ..s.clone() }))
                .unwrap_or(MIN_CHUNK);
            with(Change::Chunk(chunk), PlanSettings { chunk, ..s.clone() })
        }
        Step::Slots if s.slots > 1 => {
            let slots = (1..s.slots)
                .rev()
                .find(|&slots| ok(&PlanSettings { slots, ..s.clone() }))
                .unwrap_or(1);
            with(Change::Slots(slots), PlanSettings { slots, ..s.clone() })
        }
        Step::Experts
            if goal == Goal::Fit
                && matches!(s.experts, ExpertPolicy::Resident | ExpertPolicy::Cache(_)) =>
        {
            let auto = evaluate(
                shape,
                &PlanSettings {
                    experts: ExpertPolicy::Auto,
                    ..s.clone()
                },
            );
            let experts = if auto.fits() {
                policy_for(&auto)
            } else {
                ExpertPolicy::Cpu
            };
            with(
                Change::Experts(experts),
                PlanSettings {
                    experts,
                    ..s.clone()
                },
            )
        }
        Step::Ctx if s.ctx > 1 => {
            let ctx = largest_ctx(s, s.ctx - 1, ok)?;
            with(Change::Ctx(ctx), PlanSettings { ctx, ..s.clone() })
        }
        _ => None,
    }
}

/// Applies the rule of the module comment until `ok` holds: first one change alone, in
/// order; then the changes together, in order.
fn search(
    shape: &ModelShape,
    start: &PlanSettings,
    goal: Goal,
    ok: &dyn Fn(&PlanSettings) -> bool,
) -> Advice {
    let done = |s: &PlanSettings, changes: Vec<Change>| Advice {
        goal,
        changes,
        residency: Some(evaluate(shape, s).experts.residency),
    };
    for step in STEPS {
        if let Some(t) = take(shape, start, step, goal, ok).filter(|t| t.passes) {
            return done(&t.settings, vec![t.change]);
        }
    }
    let mut s = start.clone();
    let mut changes = Vec::new();
    for step in STEPS {
        if let Some(t) = take(shape, &s, step, goal, ok) {
            s = t.settings;
            changes.push(t.change);
            if t.passes {
                return done(&s, changes);
            }
        }
    }
    Advice {
        goal,
        changes: Vec::new(),
        residency: None,
    }
}

/// Advice for a plan: how to make it fit, or, when it fits with fewer than all experts on
/// the GPU under `auto`, how to keep them all there. `None` when there is nothing to advise.
pub fn advise(shape: &ModelShape, s: &PlanSettings, current: &Evaluation) -> Option<Advice> {
    if !current.fits() {
        let ok = |t: &PlanSettings| evaluate(shape, t).fits();
        return Some(search(shape, s, Goal::Fit, &ok));
    }
    if s.experts == ExpertPolicy::Auto && current.experts.residency != Residency::Resident {
        let ok = |t: &PlanSettings| reaches(shape, t, Residency::Resident);
        let advice = search(shape, s, Goal::AllResident, &ok);
        return (!advice.changes.is_empty()).then_some(advice);
    }
    None
}
