use clap::Args;
use redlite_engine::sampling::SamplingParams;

/// Sampling flags shared by generate and chat (llama.cpp's names and defaults).
#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop before this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }
}
