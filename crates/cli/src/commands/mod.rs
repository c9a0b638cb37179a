pub mod inspect;
pub mod synth;
