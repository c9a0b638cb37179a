//! `redlite plan`: how a model would use a GPU of a given size, from the file's metadata and
//! tensor table alone (no weights are read), and whether it fits. Exits non-zero when the
//! plan does not fit, so scripts can ask before they load.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use redlite_engine::plan::{
    human, parse_bytes, plan_file, ExpertPolicy, PlanSettings, DEFAULT_CHUNK, DEFAULT_CTX,
};
use redlite_engine::state::KvType;
use redlite_gguf::GgufModel;

use crate::default_model;

#[derive(Args)]
pub struct PlanArgs {
    /// GGUF file (any part of a split set). Without it: the default model.
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// GPU memory the engine may use, CUDA's own included: 24GiB, 24G, 16000MiB, 24GB
    /// (G, GiB: 2^30 bytes; GB: 10^9).
    #[arg(long, value_name = "SIZE")]
    gpu_limit: String,
    /// Context length (KV positions per slot).
    #[arg(short = 'c', long, default_value_t = DEFAULT_CTX)]
    ctx: usize,
    /// Prefill chunk size (tokens per forward call).
    #[arg(long, default_value_t = DEFAULT_CHUNK)]
    chunk: usize,
    /// KV cache type: f32 or f16.
    #[arg(long, default_value = "f32")]
    kv: String,
    /// Sequences served at once, each with its own KV cache and state.
    #[arg(long, default_value_t = 1)]
    slots: usize,
    /// Count the MTP block (weights, KV layer, draft rows, recorded row states); the file
    /// must have one.
    #[arg(long)]
    mtp: bool,
    /// With --mtp: tokens drafted per step (1 to 3).
    #[arg(long, default_value_t = 1)]
    draft: usize,
    /// Where the routed experts live: auto, resident, cache=SIZE or cpu.
    #[arg(long, default_value = "auto")]
    experts: String,
    /// Print JSON for scripts.
    #[arg(long)]
    json: bool,
}

fn settings(args: &PlanArgs) -> Result<PlanSettings> {
    let Some(kv) = KvType::parse(&args.kv) else {
        bail!("unknown KV type {:?} (expected f32 or f16)", args.kv)
    };
    Ok(PlanSettings {
        gpu_limit: parse_bytes(&args.gpu_limit)?,
        ctx: args.ctx,
        chunk: args.chunk,
        kv,
        slots: args.slots,
        mtp: args.mtp,
        draft: args.draft,
        experts: ExpertPolicy::parse(&args.experts)?,
    })
}

pub fn run(args: PlanArgs) -> Result<()> {
    let settings = settings(&args)?;
    let path = match &args.model {
        Some(p) => p.clone(),
        None => default_model::path_or_create()?,
    };
    let model = GgufModel::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let plan =
        plan_file(&model, &settings).with_context(|| format!("planning {}", path.display()))?;
    let text = if args.json {
        format!("{}\n", serde_json::to_string_pretty(&plan)?)
    } else {
        format!("file      {}\n{plan}", path.display())
    };
    // A reader that stops early (`| head`) is not an error.
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other?,
    }
    if !plan.fits {
        // The reason first (it is not always the total: a cache below the router's top-k).
        let reason = plan
            .experts
            .problem
            .as_deref()
            .unwrap_or("it exceeds the limit");
        bail!(
            "the plan does not fit: {reason}; it needs {} and the limit is {}",
            human(plan.used),
            human(settings.gpu_limit)
        );
    }
    Ok(())
}
