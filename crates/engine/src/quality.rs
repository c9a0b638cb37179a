//! Quality measures over a text, with llama.cpp's `llama-perplexity` procedure so the numbers
//! compare: the tokens are cut into chunks of `n_ctx`; each chunk is evaluated from an empty
//! state; only the second half of each chunk is scored (positions `n_ctx/2 .. n_ctx-1`
//! predicting the next token), so every scored token sees at least `n_ctx/2` of context.
//! Perplexity is `exp(mean NLL)`; the KL divergence compares a model's next-token
//! distribution with a base model's at the same scored positions.

use crate::error::{EngineError, Result};
use crate::session::Runner;

/// Scored positions of a chunk of `n_ctx` tokens: the second half, minus the last (it has
/// no next token inside the chunk).
fn scored(n_ctx: usize) -> std::ops::Range<usize> {
    n_ctx / 2..n_ctx - 1
}

/// Chunks of `n_ctx` tokens the text gives; refuses texts shorter than two chunks (as
/// llama.cpp does) and contexts too small to score anything.
fn chunks(tokens: &[u32], n_ctx: usize) -> Result<usize> {
    if n_ctx < 4 {
        return Err(EngineError::BadConfig(format!(
            "a perplexity context of {n_ctx} tokens is too small (at least 4)"
        )));
    }
    if tokens.len() < 2 * n_ctx {
        return Err(EngineError::BadConfig(format!(
            "the text has {} tokens; at least {} (2 x the context of {n_ctx}) are needed",
            tokens.len(),
            2 * n_ctx
        )));
    }
    Ok(tokens.len() / n_ctx)
}

/// `log Σ exp(l) - l[token]` with a float max and a double sum, as llama.cpp computes it.
fn nll(logits: &[f32], token: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    sum.ln() + f64::from(max) - f64::from(logits[token as usize])
}

/// Running sums of per-token NLL.
#[derive(Clone, Debug, Default)]
struct Nll {
    sum: f64,
    sum_sq: f64,
    count: usize,
}

impl Nll {
    fn add(&mut self, v: f64) {
        self.sum += v;
        self.sum_sq += v * v;
        self.count += 1;
    }

    fn ppl(&self) -> f64 {
        (self.sum / self.count.max(1) as f64).exp()
    }

    /// llama.cpp's uncertainty of the final estimate: `ppl · sqrt(var(nll) / (n - 1))`.
    fn ppl_error(&self) -> f64 {
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = self.sum_sq / n - mean * mean;
        if var > 0.0 && self.count > 1 {
            self.ppl() * (var / (n - 1.0)).sqrt()
        } else {
            0.0
        }
    }
}

#[derive(Clone, Debug)]
pub struct PerplexityReport {
    pub n_ctx: usize,
    /// The running estimate after each chunk (what llama.cpp prints as `[i]ppl,`).
    pub per_chunk: Vec<f64>,
    pub scored_tokens: usize,
    pub ppl: f64,
    pub ppl_error: f64,
}

/// The logits of every position of chunk `i`, from an empty state.
fn chunk_logits(
    runner: &mut dyn Runner,
    tokens: &[u32],
    i: usize,
    n_ctx: usize,
) -> Result<Vec<f32>> {
    runner.reset();
    let logits = runner
        .feed(&tokens[i * n_ctx..(i + 1) * n_ctx], true, false)?
        .logits;
    runner.reset();
    Ok(logits)
}

/// Perplexity of `tokens` under the model, chunk by chunk; `on_chunk` sees each running
/// estimate.
pub fn perplexity(
    runner: &mut dyn Runner,
    tokens: &[u32],
    n_ctx: usize,
    on_chunk: &mut dyn FnMut(usize, f64),
) -> Result<PerplexityReport> {
    let n_chunks = chunks(tokens, n_ctx)?;
    let vocab = runner.n_vocab();
    let mut acc = Nll::default();
    let mut per_chunk = Vec::with_capacity(n_chunks);
    for i in 0..n_chunks {
        let logits = chunk_logits(runner, tokens, i, n_ctx)?;
        for j in scored(n_ctx) {
            acc.add(nll(
                &logits[j * vocab..(j + 1) * vocab],
                tokens[i * n_ctx + j + 1],
            ));
        }
        per_chunk.push(acc.ppl());
        on_chunk(i, acc.ppl());
    }
    Ok(PerplexityReport {
        n_ctx,
        per_chunk,
        scored_tokens: acc.count,
        ppl: acc.ppl(),
        ppl_error: acc.ppl_error(),
    })
}

#[derive(Clone, Debug)]
pub struct KldReport {
    pub scored_tokens: usize,
    /// Mean of KL(base ‖ model) over the scored positions, in nats.
    pub mean_kld: f64,
    /// Its standard error.
    pub kld_error: f64,
    pub max_kld: f64,
    /// Fraction of positions where both models rank the same token first.
    pub same_top1: f64,
    pub ppl: f64,
    pub base_ppl: f64,
}

/// `log_softmax` of one row, in f64.
fn log_probs(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_z = logits
        .iter()
        .map(|&l| f64::from(l - max).exp())
        .sum::<f64>()
        .ln()
        + f64::from(max);
    logits.iter().map(|&l| f64::from(l) - log_z).collect()
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &x)| if x > b.1 { (i, x) } else { b },
        )
        .0
}

/// How far `model`'s next-token distributions are from `base`'s on the same text (the same
/// chunks and scored positions as [`perplexity`]).
pub fn kl_divergence(
    base: &mut dyn Runner,
    model: &mut dyn Runner,
    tokens: &[u32],
    n_ctx: usize,
    on_chunk: &mut dyn FnMut(usize, f64),
) -> Result<KldReport> {
    let n_chunks = chunks(tokens, n_ctx)?;
    let vocab = model.n_vocab();
    if base.n_vocab() != vocab {
        return Err(EngineError::BadConfig(format!(
            "the base model has {} tokens, the model {vocab}: they do not share a vocabulary",
            base.n_vocab()
        )));
    }
    let (mut ppl, mut base_ppl, mut kld) = (Nll::default(), Nll::default(), Nll::default());
    let (mut same, mut max_kld) = (0usize, 0f64);
    for i in 0..n_chunks {
        let want = chunk_logits(base, tokens, i, n_ctx)?;
        let got = chunk_logits(model, tokens, i, n_ctx)?;
        for j in scored(n_ctx) {
            let (w, g) = (
                &want[j * vocab..(j + 1) * vocab],
                &got[j * vocab..(j + 1) * vocab],
            );
            let next = tokens[i * n_ctx + j + 1];
            ppl.add(nll(g, next));
            base_ppl.add(nll(w, next));
            let (lw, lg) = (log_probs(w), log_probs(g));
            let d: f64 = lw
                .iter()
                .zip(&lg)
                .map(|(a, b)| {
                    if a.is_finite() {
                        a.exp() * (a - b)
                    } else {
                        0.0
                    }
                })
                .sum();
            kld.add(d);
            max_kld = max_kld.max(d);
            same += usize::from(argmax(w) == argmax(g));
        }
        on_chunk(i, kld.sum / kld.count as f64);
    }
    let n = kld.count as f64;
    let mean = kld.sum / n;
    let var = (kld.sum_sq / n - mean * mean).max(0.0);
    Ok(KldReport {
        scored_tokens: kld.count,
        mean_kld: mean,
        kld_error: if kld.count > 1 {
            (var / (n - 1.0)).sqrt()
        } else {
            0.0
        },
        max_kld,
        same_top1: same as f64 / n,
        ppl: ppl.ppl(),
        base_ppl: base_ppl.ppl(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_is_minus_log_softmax() {
        let logits = [1.0f32, 2.0, 0.5];
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        assert!((nll(&logits, 1) - (z.ln() - 2.0)).abs() < 1e-6);
    }

    #[test]
    fn llama_cpp_uncertainty() {
        let mut n = Nll::default();
        for v in [1.0, 2.0, 3.0] {
            n.add(v);
        }
        // mean 2, population variance 2/3, error = e^2 · sqrt((2/3) / 2).
        assert!((n.ppl() - 2f64.exp()).abs() < 1e-12);
        assert!((n.ppl_error() - 2f64.exp() * (1.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert!(chunks(&[0; 10], 8).is_err());
        assert_eq!(chunks(&[0; 17], 8).ok(), Some(2));
        assert_eq!(scored(8), 4..7);
    }
}
