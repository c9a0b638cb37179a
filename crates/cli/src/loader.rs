//! Opening a model for the commands that run it: file, config, tokenizer, backend, session.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use redlite_engine::backend::cpu::CpuBackend;
use redlite_engine::model::load::config_from_gguf;
use redlite_engine::model::HybridConfig;
use redlite_engine::plan::{
    human, parse_bytes, plan_file, ExpertPolicy, PlanSettings, Residency, CUDA_CONTEXT_BYTES,
};
use redlite_engine::session::{Runner, Session, DEFAULT_CHUNK, MAX_DRAFT};
use redlite_engine::state::KvType;
use redlite_engine::tokenizer::Tokenizer;
use redlite_engine::EngineError;
use redlite_gguf::GgufModel;

use crate::default_model;

/// Flags shared by every command that runs a model.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// GGUF file (any part of a split set). Without it: the default model.
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Context length (positions of the KV cache).
    #[arg(short = 'c', long = "ctx", default_value_t = 4096)]
    pub ctx: usize,
    /// KV cache type: f32 or f16.
    #[arg(long, default_value = "f32")]
    pub kv: String,
    /// Prefill chunk size (tokens per forward call).
    #[arg(long, default_value_t = DEFAULT_CHUNK)]
    pub chunk: usize,
    /// Where to run: cpu, or cuda (a build with `--features cuda`; falls back to the CPU
    /// with a message when no GPU, driver or NVRTC is found).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// With --device cuda: the GPU memory the run may use (24GiB, 16000MiB, ...), enforced
    /// on every allocation. The plan (`redlite plan`) is checked before anything is loaded;
    /// one that does not fit is refused with what would make it fit.
    #[arg(long, value_name = "SIZE")]
    pub gpu_limit: Option<String>,
    /// With --device cuda: where the routed experts live: auto (what the plan says: all
    /// resident when they fit), resident, cache=SIZE (a GPU cache of SIZE over all layers,
    /// the experts in page-locked host memory) or cpu (every MoE block computed on the CPU
    /// from the file, the rest of the model on the GPU).
    #[arg(long, default_value = "auto", value_name = "WHERE")]
    pub experts: String,
    /// Speculative decoding with the model's own MTP block (the file must carry it:
    /// `qwen3next.nextn_predict_layers` = 1).
    #[arg(long)]
    pub mtp: bool,
    /// With --mtp: tokens the MTP block drafts per step (1 to 3).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub draft: usize,
}

impl ModelArgs {
    /// Drafts per step for a generation request (0: MTP off).
    pub fn draft(&self) -> usize {
        if self.mtp {
            self.draft
        } else {
            0
        }
    }
}

/// What a GPU run may use and where its routed experts live, settled by the plan before any
/// weight is read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuChoice {
    /// Bytes the run may allocate past the CUDA context (`--gpu-limit` less the context the
    /// plan counts).
    pub limit: Option<u64>,
    /// Experts per layer in the GPU cache; `None`: every expert resident, or on the CPU.
    pub cache_slots: Option<usize>,
    /// The MoE blocks run on the CPU (`--experts cpu`).
    pub experts_on_cpu: bool,
}

/// The plan's GPU memory when no `--gpu-limit` is given: more than any device has.
const NO_LIMIT: u64 = 1 << 50;

/// Settles a GPU run with the plan: refuses one that does not fit `--gpu-limit`, and says
/// where the experts go (`--experts`).
pub fn check_plan(
    args: &ModelArgs,
    gguf: &GgufModel,
    kv_type: KvType,
    slots: usize,
) -> Result<GpuChoice> {
    let policy = ExpertPolicy::parse(&args.experts)?;
    if args.device != "cuda" {
        if args.gpu_limit.is_some() || policy != ExpertPolicy::Auto {
            eprintln!(
                "note: --gpu-limit and --experts apply to --device cuda; this run is on the {}",
                args.device
            );
        }
        return Ok(GpuChoice::default());
    }
    let limit = args.gpu_limit.as_deref().map(parse_bytes).transpose()?;
    if limit.is_none() && matches!(policy, ExpertPolicy::Auto | ExpertPolicy::Resident) {
        return Ok(GpuChoice::default());
    }
    let settings = PlanSettings {
        gpu_limit: limit.unwrap_or(NO_LIMIT),
        ctx: args.ctx,
        chunk: args.chunk,
        kv: kv_type,
        slots,
        mtp: args.mtp,
        draft: args.draft,
        experts: policy,
    };
    let plan = plan_file(gguf, &settings).context("planning the run")?;
    let within = match &args.gpu_limit {
        Some(l) => format!("in {l}"),
        None => "on the GPU".to_string(),
    };
    if !plan.fits {
        bail!("the run does not fit {within}:\n{plan}");
    }
    let cache_slots = match plan.experts.residency {
        Residency::Resident => {
            eprintln!(
                "plan: fits {within} with every expert resident ({} used)",
                human(plan.used)
            );
            None
        }
        Residency::Cache { slots_per_layer } => {
            eprintln!(
                "plan: fits {within} with a cache of {slots_per_layer} experts per layer ({}; {} used), the experts in host memory",
                human(plan.experts.gpu_bytes),
                human(plan.used)
            );
            Some(usize::try_from(slots_per_layer)?)
        }
        Residency::Cpu => {
            eprintln!(
                "plan: fits {within} with the routed experts on the CPU ({} used on the GPU); every MoE block runs on the CPU",
                human(plan.used)
            );
            None
        }
    };
    Ok(GpuChoice {
        limit: limit.map(|l| l.saturating_sub(CUDA_CONTEXT_BYTES)),
        cache_slots,
        experts_on_cpu: plan.experts.residency == Residency::Cpu,
    })
}

/// The CUDA backend as `gpu` says (limit, expert cache), with the MTP block when asked.
#[cfg(feature = "cuda")]
pub fn cuda_backend(
    gguf: &Arc<GgufModel>,
    config: HybridConfig,
    gpu: GpuChoice,
    mtp: bool,
) -> Result<redlite_engine::backend::cuda::CudaBackend> {
    use redlite_engine::backend::cuda::{CudaBackend, ExpertResidency};
    let device = Arc::new(redlite_cuda::Device::open(0)?);
    device.set_limit(gpu.limit);
    let residency = match gpu.cache_slots {
        Some(slots) => {
            let policy = redlite_engine::backend::cuda::cache_policy_from_env()?;
            eprintln!("expert cache: {policy} replacement");
            ExpertResidency::Cache { slots, policy }
        }
        None => ExpertResidency::Resident,
    };
    let precision = CudaBackend::precision_from_env();
    let mut backend = if gpu.experts_on_cpu {
        CudaBackend::with_host_experts(device, gguf, config, precision)?
    } else {
        CudaBackend::with_options(device, gguf, config, precision, residency)?
    };
    if mtp {
        backend.load_mtp(gguf)?;
    }
    Ok(backend)
}

pub struct Loaded {
    pub gguf: Arc<GgufModel>,
    pub tokenizer: Arc<Tokenizer>,
    pub session: Box<dyn Runner>,
    /// The backend that runs: "cpu" or "cuda".
    pub device: &'static str,
}

fn cpu_session(
    gguf: &Arc<GgufModel>,
    config: HybridConfig,
    args: &ModelArgs,
    kv: KvType,
) -> Result<Box<dyn Runner>> {
    let mut backend = CpuBackend::new(gguf.clone(), config)?;
    if args.mtp {
        backend.load_mtp()?;
    }
    let mut session = Session::new(backend, args.ctx, kv, args.chunk)?;
    if args.mtp {
        session.enable_mtp()?;
    }
    Ok(Box::new(session))
}

#[cfg(feature = "cuda")]
fn cuda_session(
    gguf: &Arc<GgufModel>,
    config: HybridConfig,
    args: &ModelArgs,
    kv: KvType,
    gpu: GpuChoice,
) -> Result<Box<dyn Runner>> {
    let backend = cuda_backend(gguf, config, gpu, args.mtp)?;
    let mut session = Session::new(backend, args.ctx, kv, args.chunk)?;
    if args.mtp {
        session.enable_mtp()?;
    }
    Ok(Box::new(session))
}

/// The session on the device asked for, or on the CPU when the GPU cannot be used.
fn session(opened: &Opened, args: &ModelArgs) -> Result<(Box<dyn Runner>, &'static str)> {
    let (gguf, config, kv) = (&opened.gguf, opened.config.clone(), opened.kv_type);
    match args.device.as_str() {
        "cpu" => Ok((cpu_session(gguf, config, args, kv)?, "cpu")),
        #[cfg(feature = "cuda")]
        "cuda" => match cuda_session(gguf, config.clone(), args, kv, opened.gpu) {
            Ok(s) => Ok((s, "cuda")),
            Err(e) => {
                eprintln!("CUDA unavailable ({e}); running on the CPU");
                Ok((cpu_session(gguf, config, args, kv)?, "cpu"))
            }
        },
        #[cfg(not(feature = "cuda"))]
        "cuda" => bail!("this redlite was built without CUDA: rebuild with `cargo build --release --features cuda`"),
        other => bail!("unknown device {other:?} (expected cpu or cuda)"),
    }
}

/// A model file opened, before any backend exists.
pub struct Opened {
    pub path: PathBuf,
    pub gguf: Arc<GgufModel>,
    pub config: HybridConfig,
    /// Shared: the server's scheduler thread and its handlers hold it too.
    pub tokenizer: Arc<Tokenizer>,
    pub kv_type: KvType,
    /// The GPU's limit and expert residency (defaults for a CPU run).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub gpu: GpuChoice,
}

/// Opens the file (or the default model), reads its config and tokenizer.
/// `slots`: sequences run at once (the server's), for the plan check.
pub fn open(args: &ModelArgs, slots: usize) -> Result<Opened> {
    let path = match &args.model {
        Some(p) => p.clone(),
        None => default_model::path_or_create()?,
    };
    let Some(kv_type) = KvType::parse(&args.kv) else {
        bail!("unknown KV type {:?} (expected f32 or f16)", args.kv)
    };
    let gguf_bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    if let Some(available) = available_memory() {
        if gguf_bytes > available {
            eprintln!(
                "note: the model ({:.1} GiB) is larger than the memory available ({:.1} GiB): it runs, but weights stream from disk on every token (slow)",
                gguf_bytes as f64 / (1u64 << 30) as f64,
                available as f64 / (1u64 << 30) as f64
            );
        }
    }
    let gguf =
        Arc::new(GgufModel::open(&path).with_context(|| format!("opening {}", path.display()))?);
    let gpu = check_plan(args, &gguf, kv_type, slots)?;
    let config = config_from_gguf(&gguf).with_context(|| format!("reading {}", path.display()))?;
    if args.mtp && config.n_mtp == 0 {
        bail!("{}: {}", path.display(), EngineError::NoMtpBlock);
    }
    if args.mtp && !(1..=MAX_DRAFT).contains(&args.draft) {
        bail!("--draft must be 1 to {MAX_DRAFT}, got {}", args.draft);
    }
    if !args.mtp && args.draft != 1 {
        eprintln!("note: --draft applies with --mtp; this run decodes without drafts");
    }
    let tokenizer =
        Arc::new(Tokenizer::from_metadata(gguf.metadata()).context("building the tokenizer")?);
    Ok(Opened {
        path,
        gguf,
        config,
        tokenizer,
        kv_type,
        gpu,
    })
}

/// Says what was loaded where, and how fast.
pub fn report_loaded(opened: &Opened, device: &str, start: Instant) {
    let name = opened
        .gguf
        .metadata()
        .str("general.name")
        .unwrap_or("model");
    eprintln!(
        "loaded {} ({}, {:.2} GiB) on {} in {:.2} s",
        opened.path.display(),
        name,
        opened.gguf.file_bytes() as f64 / (1u64 << 30) as f64,
        device,
        start.elapsed().as_secs_f64()
    );
}

pub fn load(args: &ModelArgs) -> Result<Loaded> {
    let start = Instant::now();
    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}")?);
    bar.enable_steady_tick(Duration::from_millis(100));
    let opened = open(args, 1)?;
    bar.set_message(format!("loading {}", opened.path.display()));
    let (session, device) = session(&opened, args)?;
    bar.finish_and_clear();
    report_loaded(&opened, device, start);
    Ok(Loaded {
        gguf: opened.gguf,
        tokenizer: opened.tokenizer,
        session,
        device,
    })
}

/// `MemAvailable` from /proc/meminfo, in bytes (Linux; `None` elsewhere).
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
