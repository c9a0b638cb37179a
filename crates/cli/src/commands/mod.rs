pub mod inspect;
pub mod logits;
pub mod synth;
