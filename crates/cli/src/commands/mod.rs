pub mod bench;
pub mod chat;
pub mod generate;
pub mod inspect;
pub mod logits;
pub mod sampling_args;
pub mod synth;
pub mod tokenize;
