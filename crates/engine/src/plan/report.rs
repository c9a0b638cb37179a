//! The plan as a table: one line per use of GPU memory, the verdict, the longest context
//! and the advice.

use std::fmt;

use crate::plan::experts::Residency;
use crate::plan::settings::kv_str;
use crate::plan::units::{human, human_signed};
use crate::plan::Plan;

fn residency_text(plan: &Plan) -> String {
    let pool = &plan.experts.pool;
    match plan.experts.residency {
        Residency::Resident => format!(
            "all resident ({} layers x {} experts)",
            pool.moe_layers, pool.experts_per_layer
        ),
        Residency::Cache { slots_per_layer } => format!(
            "a cache of {}: {slots_per_layer} of {} experts per layer ({:.1} %)",
            human(plan.experts.gpu_bytes),
            pool.experts_per_layer,
            100.0 * slots_per_layer as f64 / pool.experts_per_layer.max(1) as f64
        ),
        Residency::Cpu => "on the CPU".to_string(),
    }
}

/// One expert's bytes, or their range over the layers.
fn per_expert_text(plan: &Plan) -> String {
    let pool = &plan.experts.pool;
    if pool.per_expert_min == pool.per_expert_max {
        human(pool.per_expert_min)
    } else {
        format!(
            "{}-{}",
            human(pool.per_expert_min),
            human(pool.per_expert_max)
        )
    }
}

fn context_text(ctx: Option<usize>) -> String {
    ctx.map_or("none".to_string(), |n| n.to_string())
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        let b = &self.budget;
        let a = &b.activations;
        let pool = &self.experts.pool;
        let m = &self.model;
        writeln!(
            f,
            "model     {} layers ({} DeltaNet, {} attention){}, {} experts, top-{}",
            m.layers,
            m.deltanet_layers,
            m.attention_layers,
            match (m.has_mtp_block, s.mtp) {
                (true, true) => " + MTP block",
                (true, false) => " + MTP block (not counted without --mtp)",
                (false, _) => "",
            },
            m.experts,
            m.experts_used
        )?;
        writeln!(
            f,
            "settings  GPU limit {}, ctx {}, chunk {}, KV {}, {} slot{}, MTP {}, experts {}\n",
            human(s.gpu_limit),
            s.ctx,
            s.chunk,
            kv_str(s.kv),
            s.slots,
            if s.slots == 1 { "" } else { "s" },
            if s.mtp { "on" } else { "off" },
            s.experts
        )?;
        let line = |f: &mut fmt::Formatter<'_>, name: &str, bytes: u64, note: String| {
            writeln!(f, "  {name:<28} {:>11}   {note}", human(bytes))
        };
        let mtp_note = if b.mtp_weights > 0 {
            format!(", MTP block {}", human(b.mtp_weights))
        } else {
            String::new()
        };
        line(
            f,
            "dense weights (resident)",
            b.dense_weights,
            format!("everything but the routed experts{mtp_note}"),
        )?;
        line(
            f,
            "KV cache",
            b.kv_cache,
            format!(
                "{} per position ({} layer{}, {}) x {} x {} slot{}",
                human(b.kv_bytes_per_position),
                b.kv_layers,
                if b.kv_layers == 1 { "" } else { "s" },
                kv_str(s.kv),
                s.ctx,
                s.slots,
                if s.slots == 1 { "" } else { "s" }
            ),
        )?;
        line(
            f,
            "DeltaNet state",
            b.deltanet_state,
            format!(
                "{} per slot, worth {} KV positions{}",
                human(b.deltanet_state_per_slot),
                b.deltanet_state_positions,
                if b.deltanet_copies > 1 {
                    format!(
                        ", x{}: the row states an MTP verification records",
                        b.deltanet_copies
                    )
                } else {
                    String::new()
                }
            ),
        )?;
        line(
            f,
            "activations and scratch",
            a.total(),
            format!(
                "{} rows x {} + logits {} row{} {}{}",
                a.rows,
                human(a.bytes_per_row),
                a.logit_rows,
                if a.logit_rows == 1 { "" } else { "s" },
                human(a.logits),
                if a.mtp > 0 {
                    format!(" + MTP inputs {}", human(a.mtp))
                } else {
                    String::new()
                }
            ),
        )?;
        line(
            f,
            "CUDA context",
            b.cuda_context,
            "driver state and compiled kernels (fixed reserve)".into(),
        )?;
        line(
            f,
            "CUDA graphs and workspace",
            b.cuda_workspace,
            "decode graphs, allocator rounding, headroom (fixed reserve)".into(),
        )?;
        let expert_note = match self.experts.residency {
            Residency::Resident => format!(
                "all resident: {} layers x {} experts of {}",
                pool.moe_layers,
                pool.experts_per_layer,
                per_expert_text(self)
            ),
            Residency::Cache { slots_per_layer } => format!(
                "a cache of {slots_per_layer} slots per layer ({}) out of {}",
                per_expert_text(self),
                human(pool.total)
            ),
            Residency::Cpu => format!("none: all {} stay in host memory", human(pool.total)),
        };
        line(
            f,
            "routed experts on the GPU",
            self.experts.gpu_bytes,
            expert_note,
        )?;
        writeln!(f, "  {:-<28} {:->11}", "", "")?;
        line(f, "total", self.used, String::new())?;
        writeln!(
            f,
            "  {:<28} {:>11}",
            "remaining",
            human_signed(i128::from(self.remaining))
        )?;
        if self.experts.host_bytes > 0 {
            writeln!(
                f,
                "  {:<28} {:>11}   pinned copy the GPU reads from, or the CPU computes on",
                "host memory for experts",
                human(self.experts.host_bytes)
            )?;
        }
        writeln!(f)?;
        if self.fits {
            writeln!(f, "verdict   fits: experts {}", residency_text(self))?;
        } else {
            writeln!(
                f,
                "verdict   does NOT fit: {}",
                self.experts.problem.as_deref().unwrap_or("over the limit")
            )?;
        }
        let l = &self.largest_context;
        writeln!(
            f,
            "largest context  all experts resident {}, with an expert cache {}, experts on the CPU {} (trained {})",
            context_text(l.all_resident),
            context_text(l.with_cache),
            context_text(l.at_all),
            l.trained
        )?;
        if self.settings.experts != crate::plan::ExpertPolicy::Auto {
            writeln!(
                f,
                "                 with --experts {}: {}",
                self.settings.experts,
                context_text(l.as_set)
            )?;
        }
        if let Some(advice) = &self.advice {
            let flags: Vec<String> = advice.changes.iter().map(|c| c.to_string()).collect();
            let what = match advice.goal {
                crate::plan::Goal::Fit => "to fit",
                crate::plan::Goal::AllResident => "to keep every expert on the GPU",
            };
            if flags.is_empty() {
                writeln!(
                    f,
                    "advice    no change of settings suffices: a larger GPU is needed"
                )?;
            } else {
                writeln!(f, "advice    {what}: {}", flags.join(" "))?;
            }
        }
        Ok(())
    }
}
