//! The serving scheduler on the GPU: requests batched over several slots, plain and with the
//! MTP block drafting 1 to 3 tokens, give exactly the greedy tokens each request gives alone
//! (one slot, one request at a time). A batch of decoding slots launches the one-token
//! kernels row for row, so any difference names a batch shape whose rows are not the bits
//! of a one-token step. Without a CUDA driver, NVRTC or GPU the test prints why and passes.
#![cfg(feature = "cuda")]

mod cuda_support;
mod serve_support;

use std::sync::Arc;

use cuda_support::device;
use redlite_cuda::Device;
use redlite_engine::backend::cpu::linear::Precision;
use redlite_engine::backend::cuda::CudaBackend;
use redlite_engine::model::load::config_from_gguf;
use redlite_engine::serve::{self, Handle};
use redlite_engine::synth::Recipe;
use serve_support::{job, prompt, serve_config, tiny_model, wait, Model};

const MAX_TOKENS: usize = 14;

/// A scheduler on the GPU (llama.cpp's precision, the default) with `slots` slots,
/// drafting `draft` tokens per step with the MTP block (0: off).
fn start(device: &Arc<Device>, m: &Model, slots: usize, draft: usize) -> Handle {
    let (gguf, device) = (m.gguf.clone(), device.clone());
    let config = config_from_gguf(&gguf).unwrap();
    serve::spawn(
        move || {
            let mut backend = CudaBackend::with_precision(device, &gguf, config, Precision::Ggml)?;
            if draft > 0 {
                backend.load_mtp(&gguf)?;
            }
            Ok(backend)
        },
        m.tokenizer.clone(),
        serve_config(slots, 16, 0, draft),
    )
    .unwrap()
}

#[test]
fn batched_serving_with_and_without_mtp_equals_each_request_alone() {
    let Some(device) = device("batched_serving_with_and_without_mtp_equals_each_request_alone")
    else {
        return;
    };
    let mut failures = Vec::new();
    for recipe in [Recipe::IQ2XXS, Recipe::Q4KM] {
        let m = tiny_model(recipe, true);
        let prompts: Vec<Vec<u32>> = (0..6).map(|s| prompt(s, 5 + 3 * s as usize)).collect();
        let alone = start(&device, &m, 1, 0);
        let reference: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| {
                let (j, rx, _) = job(p.clone(), MAX_TOKENS);
                alone.submit(j).unwrap();
                wait(&rx).0
            })
            .collect();
        alone.shutdown();
        for draft in 0..=3 {
            let handle = start(&device, &m, 3, draft);
            let receivers: Vec<_> = prompts
                .iter()
                .map(|p| {
                    let (j, rx, _) = job(p.clone(), MAX_TOKENS);
                    handle.submit(j).unwrap();
                    rx
                })
                .collect();
            for (i, rx) in receivers.iter().enumerate() {
                let ids = wait(rx).0;
                if ids != reference[i] {
                    let same = ids.iter().zip(&reference[i]).take_while(|(a, b)| a == b);
                    failures.push(format!(
                        "{} draft {draft}, request {i}: differs from token {} on",
                        recipe.name(),
                        same.count()
                    ));
                }
            }
            if draft > 0 {
                let metrics = handle.metrics();
                assert!(metrics.mtp_steps > 0, "{metrics:?}");
            }
            handle.shutdown();
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
