//! Token sampling with llama.cpp's semantics and order: penalties, top-k, top-p, min-p,
//! temperature, then a seeded draw (greedy when the temperature is 0). Plus stop strings over
//! streamed text ([`StopMatcher`]); end-of-generation ids come from the tokenizer
//! (`Tokenizer::is_eog`).

mod rng;
mod sort;
mod stop;
mod top_k;

pub use rng::Rng;
pub use stop::{StopMatcher, StopOutput};

use std::collections::{HashMap, VecDeque};

/// Why sampling parameters or inputs were refused.
#[derive(Debug, thiserror::Error)]
pub enum SamplingError {
    #[error("sampling: {name} = {value} is invalid ({rule})")]
    BadParam {
        name: &'static str,
        value: f64,
        rule: &'static str,
    },
    #[error("sampling: empty logits")]
    EmptyLogits,
    #[error("sampling: no finite logit among {count}")]
    NoFiniteLogit { count: usize },
}

/// Sampling settings. Defaults are llama.cpp's, except no penalties and a fixed seed.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens below `min_p` times the top probability; 0 keeps all.
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of recent tokens; 1 is off.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every recent token; 0 is off.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of recent tokens; 0 is off.
    pub frequency_penalty: f32,
    /// How many of the last tokens the penalties look at.
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (argmax), no penalties.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Checks every setting; the error names the first one out of its range.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let checks: [(&'static str, f32, bool, &'static str); 6] = [
            (
                "temperature",
                self.temperature,
                self.temperature >= 0.0,
                "finite and >= 0",
            ),
            (
                "top_p",
                self.top_p,
                self.top_p > 0.0 && self.top_p <= 1.0,
                "in (0, 1]",
            ),
            (
                "min_p",
                self.min_p,
                (0.0..=1.0).contains(&self.min_p),
                "in [0, 1]",
            ),
            (
                "repeat_penalty",
                self.repeat_penalty,
                self.repeat_penalty > 0.0,
                "finite and > 0",
            ),
            ("presence_penalty", self.presence_penalty, true, "finite"),
            ("frequency_penalty", self.frequency_penalty, true, "finite"),
        ];
        for (name, value, ok, rule) in checks {
            if !ok || !value.is_finite() {
                return Err(SamplingError::BadParam {
                    name,
                    value: value.into(),
                    rule,
                });
            }
        }
        Ok(())
    }
}

/// Picks tokens from logits. Holds the recent-token window for the penalties, the RNG, and a
/// candidate buffer reused across calls.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// The last `penalty_last_n` accepted tokens, oldest first.
    recent: VecDeque<u32>,
    /// Occurrences of each token in `recent`.
    counts: HashMap<u32, u32>,
    /// (token, logit) candidates of the current call.
    candidates: Vec<(u32, f32)>,
    /// The radix sort's second buffer for a whole row (`sort.rs`), kept across calls.
    spare: Vec<(u32, f32)>,
    /// The one-pass top-k's penalized ids (`top_k.rs`), kept across calls.
    penalized_ids: Vec<u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler, SamplingError> {
        params.validate()?;
        Ok(Sampler {
            rng: Rng::new(params.seed),
            recent: VecDeque::with_capacity(params.penalty_last_n),
            counts: HashMap::new(),
            candidates: Vec::new(),
            spare: Vec::new(),
            penalized_ids: Vec::new(),
            params,
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records a token of the prompt or of the output for the penalties (llama.cpp `accept`).
    pub fn accept(&mut self, token: u32) {
        if self.params.penalty_last_n == 0 {
            return;
        }
        if self.recent.len() == self.params.penalty_last_n {
            if let Some(old) = self.recent.pop_front() {
                if let Some(count) = self.counts.get_mut(&old) {
                    *count -= 1;
                    if *count == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.recent.push_back(token);
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// Chooses the next token from `logits` (one per vocabulary id). Does not `accept` it.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        if let Some(token) = self.plain_argmax(logits)? {
            return Ok(token);
        }
        self.prepare(logits)?;
        if self.params.temperature <= 0.0 {
            return Ok(argmax(&self.candidates));
        }
        let u = self.rng.next_f64();
        Ok(draw(&self.candidates, self.params.temperature, u))
    }

    /// The distribution `sample` draws from, as (token, probability) pairs with nonzero
    /// probability (one pair at probability 1 when greedy). Draws nothing.
    pub fn distribution(&mut self, logits: &[f32]) -> Result<Vec<(u32, f64)>, SamplingError> {
        if let Some(token) = self.plain_argmax(logits)? {
            return Ok(vec![(token, 1.0)]);
        }
        self.prepare(logits)?;
        let t = self.params.temperature;
        if t <= 0.0 {
            return Ok(vec![(argmax(&self.candidates), 1.0)]);
        }
        let max = self.candidates.first().map_or(0.0, |c| c.1);
        let weights: Vec<f64> = self
            .candidates
            .iter()
            .map(|c| (f64::from(c.1 - max) / f64::from(t)).exp())
            .collect();
        let sum: f64 = weights.iter().sum();
        Ok(self
            .candidates
            .iter()
            .zip(weights)
            .map(|(c, w)| (c.0, w / sum))
            .collect())
    }

    /// A token drawn from a distribution (`distribution`'s pairs; they need not sum to 1).
    pub fn draw_from(&mut self, dist: &[(u32, f64)]) -> u32 {
        let total: f64 = dist.iter().map(|d| d.1).sum();
        let target = self.rng.next_f64() * total;
        let mut cumulative = 0.0;
        for &(token, p) in dist {
            cumulative += p;
            if target < cumulative {
                return token;
            }
        }
        dist.last().map_or(0, |d| d.0)
    }

    /// A uniform draw in [0, 1) from the sampler's generator.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// Greedy without penalties in effect: the argmax straight from the logits (the highest
    /// finite one, ties to the lowest id: what `prepare` then `argmax` give), without
    /// copying the vocabulary into candidates. `None` when sampling needs the full path.
    fn plain_argmax(&self, logits: &[f32]) -> Result<Option<u32>, SamplingError> {
        if !self.plain_greedy() {
            return Ok(None);
        }
        greedy_argmax(logits).map(Some)
    }

    /// Whether [`Sampler::sample`] now picks the largest logit and nothing else (temperature
    /// 0, no penalty in effect): the greedy token a backend may pick itself
    /// (`Session::step_greedy`) is then the one `sample` would pick.
    pub fn plain_greedy(&self) -> bool {
        self.params.temperature <= 0.0 && (self.penalties_off() || self.counts.is_empty())
    }

    /// Whether [`Sampler::sample`] picks the largest logit for every token from here on
    /// (temperature 0 and no penalty at all, so tokens it accepts change nothing): a
    /// speculative step may then judge its drafts by ids alone.
    pub fn always_greedy(&self) -> bool {
        self.params.temperature <= 0.0 && self.penalties_off()
    }

    /// Whether no penalty is configured (repeat 1, presence and frequency 0).
    fn penalties_off(&self) -> bool {
        let p = &self.params;
        p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0
    }

    /// Penalties and the truncations (top-k, top-p, min-p) into `candidates`.
    fn prepare(&mut self, logits: &[f32]) -> Result<(), SamplingError> {
        if logits.is_empty() {
            return Err(SamplingError::EmptyLogits);
        }
        let p = &self.params;
        if p.temperature > 0.0 && p.top_k > 0 && !top_k::whole_row_selection() {
            // The same candidates as below in one pass over the row (`top_k.rs`).
            let penalized = !self.penalties_off() && !self.counts.is_empty();
            top_k::top_k_of_row(
                logits,
                (p.top_k, p),
                (&self.counts, penalized),
                &mut self.penalized_ids,
                &mut self.candidates,
            );
            if self.candidates.is_empty() {
                return Err(SamplingError::NoFiniteLogit {
                    count: logits.len(),
                });
            }
            top_p(&mut self.candidates, p.top_p);
            min_p(&mut self.candidates, p.min_p);
            return Ok(());
        }
        self.candidates.clear();
        self.candidates.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan())
                .map(|(id, &l)| (id as u32, l)),
        );
        apply_penalties(&mut self.candidates, &self.counts, p);
        self.candidates.retain(|(_, l)| l.is_finite());
        if self.candidates.is_empty() {
            return Err(SamplingError::NoFiniteLogit {
                count: logits.len(),
            });
        }
        if p.temperature <= 0.0 {
            return Ok(());
        }
        top_k(&mut self.candidates, p.top_k, &mut self.spare);
        top_p(&mut self.candidates, p.top_p);
        min_p(&mut self.candidates, p.min_p);
        Ok(())
    }
}

/// llama.cpp `penalties` over the recent-token counts: the repeat penalty moves a logit towards
/// less likely (divides a positive one, multiplies a negative one), then the frequency penalty
/// (per occurrence) and the presence penalty (once) are subtracted.
fn apply_penalties(candidates: &mut [(u32, f32)], counts: &HashMap<u32, u32>, p: &SamplingParams) {
    let off = p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0;
    if off || counts.is_empty() {
        return;
    }
    for (id, logit) in candidates.iter_mut() {
        if let Some(&count) = counts.get(id) {
            *logit = apply_penalty(*logit, count, p);
        }
    }
}

/// One recent token's logit (`count` occurrences) under the penalties.
fn apply_penalty(logit: f32, count: u32, p: &SamplingParams) -> f32 {
    let repeated = match logit <= 0.0 {
        true => logit * p.repeat_penalty,
        false => logit / p.repeat_penalty,
    };
    repeated - (count as f32 * p.frequency_penalty + p.presence_penalty)
}

/// Logits a chunk of the row scans (`greedy_argmax`, `top_k.rs`), skipped whole where none
/// can change the result.
const SCAN_CHUNK: usize = 64;

/// The greedy token of `logits`: the largest finite logit, the lower id on ties (NaN and
/// infinities never chosen); an error where none is finite.
pub fn greedy_argmax(logits: &[f32]) -> Result<u32, SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    // Chunks with no logit above the best so far are skipped after one vectorized test (only
    // a larger logit replaces it); the others are walked as one loop would.
    let mut best: Option<(u32, f32)> = None;
    for (c, chunk) in logits.chunks(SCAN_CHUNK).enumerate() {
        if let Some((_, b)) = best {
            if !chunk.iter().fold(false, |any, &l| any | (l > b)) {
                continue;
            }
        }
        for (i, &l) in chunk.iter().enumerate() {
            if l.is_finite() && best.is_none_or(|b| l > b.1) {
                best = Some(((c * SCAN_CHUNK + i) as u32, l));
            }
        }
    }
    match best {
        Some((token, _)) => Ok(token),
        None => Err(SamplingError::NoFiniteLogit {
            count: logits.len(),
        }),
    }
}

/// The highest logit; ties go to the lowest id.
fn argmax(candidates: &[(u32, f32)]) -> u32 {
    candidates
        .iter()
        .copied()
        .reduce(|best, c| if c.1 > best.1 { c } else { best })
        .map_or(0, |c| c.0)
}

fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Keeps the `k` highest logits, sorted descending (all, sorted, when `k` is 0 or too big;
/// `candidates` in ascending id order; `spare`: the whole row's sort buffer).
fn top_k(candidates: &mut Vec<(u32, f32)>, k: usize, spare: &mut Vec<(u32, f32)>) {
    if k > 0 && k < candidates.len() {
        candidates.select_nth_unstable_by(k - 1, by_logit_desc);
        candidates.truncate(k);
        candidates.sort_unstable_by(by_logit_desc);
    } else {
        sort::sort_by_logit_desc(candidates, spare);
    }
}

/// Softmax of sorted logits at temperature 1.
fn probabilities(candidates: &[(u32, f32)]) -> Vec<f64> {
    let max = candidates.first().map_or(0.0, |c| f64::from(c.1));
    let exps: Vec<f64> = candidates
        .iter()
        .map(|c| (f64::from(c.1) - max).exp())
        .collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Keeps the shortest prefix (of sorted candidates) whose probability reaches `p`.
fn top_p(candidates: &mut Vec<(u32, f32)>, p: f32) {
    if p >= 1.0 {
        return;
    }
    let probs = probabilities(candidates);
    let mut cumulative = 0.0;
    let mut keep = candidates.len();
    for (i, prob) in probs.iter().enumerate() {
        cumulative += prob;
        if cumulative >= f64::from(p) {
            keep = i + 1;
            break;
        }
    }
    candidates.truncate(keep.max(1));
}

/// Drops tokens whose probability is below `p` times the top one (sorted candidates).
fn min_p(candidates: &mut Vec<(u32, f32)>, p: f32) {
    if p <= 0.0 {
        return;
    }
    let Some(&(_, max)) = candidates.first() else {
        return;
    };
    let threshold = max + p.ln();
    let keep = candidates.iter().take_while(|c| c.1 >= threshold).count();
    candidates.truncate(keep.max(1));
}

/// Softmax at `temperature`, then the token where the cumulative probability passes `u`.
fn draw(candidates: &[(u32, f32)], temperature: f32, u: f64) -> u32 {
    let max = candidates.first().map_or(0.0, |c| c.1);
    let weights: Vec<f64> = candidates
        .iter()
        .map(|c| (f64::from(c.1 - max) / f64::from(temperature)).exp())
        .collect();
    let target = u * weights.iter().sum::<f64>();
    let mut cumulative = 0.0;
    for (c, w) in candidates.iter().zip(&weights) {
        cumulative += w;
        if target < cumulative {
            return c.0;
        }
    }
    candidates.last().map_or(0, |c| c.0)
}

#[cfg(test)]
mod tests;
