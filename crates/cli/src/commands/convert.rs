//! `redlite convert HF_DIR OUT.gguf`: a Hugging Face Qwen3-Next checkpoint to a GGUF.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use redlite_engine::convert::{convert, ConvertOptions};
use redlite_engine::model::DeltaNetLayout;
use redlite_gguf::GgmlType;

#[derive(Args)]
pub struct ConvertArgs {
    /// The checkpoint folder: config.json, *.safetensors, tokenizer.json.
    #[arg(value_name = "HF_DIR")]
    dir: PathBuf,
    /// Output file.
    #[arg(value_name = "OUT")]
    out: PathBuf,
    /// Type of the matrices: f16, bf16 or f32 (vectors and the router stay f32).
    #[arg(long = "type", default_value = "f16")]
    ty: String,
    /// DeltaNet input layout: `split` (attn_qkv + attn_gate, current llama.cpp) or `legacy`
    /// (ssm_in).
    #[arg(long, default_value = "split")]
    layout: String,
}

pub fn run(args: ConvertArgs) -> Result<()> {
    let ty = match args.ty.to_ascii_lowercase().as_str() {
        "f16" => GgmlType::F16,
        "bf16" => GgmlType::BF16,
        "f32" => GgmlType::F32,
        other => bail!("--type {other:?}: f16, bf16 or f32"),
    };
    let layout = match args.layout.as_str() {
        "split" => DeltaNetLayout::Split,
        "legacy" => DeltaNetLayout::Legacy,
        other => bail!("--layout {other:?}: split or legacy"),
    };
    let start = Instant::now();
    let summary = convert(
        &args.dir,
        &args.out,
        &ConvertOptions { ty, layout },
        &mut |done, total| {
            if done == total || done % 64 == 0 {
                eprint!("\r{done}/{total} tensors");
            }
        },
    )?;
    eprintln!();
    println!(
        "wrote {} ({} tensors, {:.2} GiB) in {:.1} s",
        summary.path.display(),
        summary.tensors,
        summary.bytes as f64 / (1u64 << 30) as f64,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
