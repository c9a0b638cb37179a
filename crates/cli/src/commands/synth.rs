use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use redlite_engine::model::{DeltaNetLayout, HybridConfig};
use redlite_engine::synth::{write_synth, Preset, Recipe, SynthOptions, VocabChoice};

#[derive(Args)]
pub struct SynthArgs {
    /// Output file.
    #[arg(value_name = "OUT")]
    out: PathBuf,
    /// Shape preset: `full` (Qwen3-Next-80B-A3B) or `tiny`.
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Tensor types: F32, F16, Q4_K_M, IQ2_XXS, IQ2_XS, IQ1_M (llama-quantize's default recipes).
    #[arg(long, default_value = "F32")]
    recipe: String,
    /// DeltaNet input layout: `split` (attn_qkv + attn_gate) or `legacy` (ssm_in).
    #[arg(long, default_value = "split")]
    layout: String,
    /// Add the MTP block (block N = layers, `nextn.*`).
    #[arg(long)]
    mtp: bool,
    /// Vocabulary: `qwen` (the real 151,936) or `tiny`. Default: qwen for full, tiny otherwise.
    #[arg(long)]
    vocab: Option<String>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Override: main-stack layers.
    #[arg(long)]
    layers: Option<usize>,
    /// Override: hidden size.
    #[arg(long)]
    hidden: Option<usize>,
    /// Override: vocabulary size.
    #[arg(long)]
    n_vocab: Option<usize>,
    /// Override: routed experts.
    #[arg(long)]
    experts: Option<usize>,
    /// Override: experts per token.
    #[arg(long)]
    experts_used: Option<usize>,
    /// Override: routed and shared expert width.
    #[arg(long)]
    expert_ff: Option<usize>,
    /// Override: attention heads / KV heads / head dim.
    #[arg(long)]
    heads: Option<usize>,
    #[arg(long)]
    kv_heads: Option<usize>,
    #[arg(long)]
    head_dim: Option<usize>,
    /// Override: DeltaNet q/k heads, v heads and head dim.
    #[arg(long)]
    ssm_k_heads: Option<usize>,
    #[arg(long)]
    ssm_v_heads: Option<usize>,
    #[arg(long)]
    ssm_head_dim: Option<usize>,
    /// Override: rope base.
    #[arg(long)]
    rope_base: Option<f32>,
}

fn config(args: &SynthArgs, preset: Preset) -> HybridConfig {
    let mut c = preset.config();
    let set = |slot: &mut usize, v: Option<usize>| {
        if let Some(v) = v {
            *slot = v;
        }
    };
    set(&mut c.n_layer, args.layers);
    set(&mut c.n_embd, args.hidden);
    set(&mut c.n_vocab, args.n_vocab);
    set(&mut c.n_expert, args.experts);
    set(&mut c.n_expert_used, args.experts_used);
    set(&mut c.expert_ff, args.expert_ff);
    set(&mut c.shared_ff, args.expert_ff);
    set(&mut c.n_head, args.heads);
    set(&mut c.n_head_kv, args.kv_heads);
    set(&mut c.head_dim, args.head_dim);
    set(&mut c.ssm_k_heads, args.ssm_k_heads);
    set(&mut c.ssm_v_heads, args.ssm_v_heads);
    set(&mut c.ssm_head_dim, args.ssm_head_dim);
    if let Some(b) = args.rope_base {
        c.rope_base = b;
    }
    if let Some(d) = args.head_dim {
        c.rope_dim = d / 4;
    }
    c.layers = HybridConfig::default_layers(c.n_layer, c.full_attention_interval);
    c.n_mtp = usize::from(args.mtp);
    c
}

pub fn run(args: SynthArgs) -> Result<()> {
    let Some(preset) = Preset::parse(&args.preset) else {
        bail!("unknown preset {:?} (expected full or tiny)", args.preset)
    };
    let Some(recipe) = Recipe::parse(&args.recipe) else {
        bail!(
            "unknown recipe {:?} (expected F32, F16, Q4_K_M, IQ2_XXS, IQ2_XS or IQ1_M)",
            args.recipe
        )
    };
    let vocab = match args.vocab.as_deref() {
        None if preset == Preset::Full => VocabChoice::Qwen,
        None | Some("tiny") => VocabChoice::Tiny,
        Some("qwen") => VocabChoice::Qwen,
        Some(other) => bail!("unknown vocabulary {other:?} (expected qwen or tiny)"),
    };
    let mut config = config(&args, preset);
    config.layout = match args.layout.as_str() {
        "split" => DeltaNetLayout::Split,
        "legacy" => DeltaNetLayout::Legacy,
        other => bail!("unknown layout {other:?} (expected split or legacy)"),
    };
    if vocab == VocabChoice::Qwen && args.n_vocab.is_none() {
        config.n_vocab = 151_936;
    }
    let opts = SynthOptions {
        config,
        recipe,
        vocab,
        seed: args.seed,
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )?
        .progress_chars("=> "),
    );
    bar.set_message(format!("writing {}", args.out.display()));
    let start = Instant::now();
    let summary = write_synth(&args.out, &opts, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    println!(
        "wrote {} ({} tensors, {:.2} GiB, recipe {}, seed {}) in {:.1} s — random weights, for tests and benchmarks",
        summary.path.display(),
        summary.tensors,
        summary.bytes as f64 / (1u64 << 30) as f64,
        recipe.name(),
        opts.seed,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
