//! `REDLITE_STEP_TIMES=1`: the host's share of a replayed decode step, printed to stderr when
//! the backend is dropped. A replayed step launches its graph only after the host has walked
//! every op of the step (each checks that it is the recorded one), so the GPU has nothing but
//! the embedding and the first norm to run meanwhile; then the host waits for the logits. Two
//! host clocks a step: from the embedding to the graph's launch (the walk), and from the
//! launch to the logits being back on the host (the GPU's share, the LM head and the copy
//! included). Their sum against the step's wall time says how much of a token the GPU idles.

use std::time::{Duration, Instant};

#[derive(Default)]
pub struct StepTimes {
    on: bool,
    armed_at: Option<Instant>,
    launched_at: Option<Instant>,
    walk: Duration,
    wait: Duration,
    steps: u32,
}

impl StepTimes {
    pub fn from_env() -> StepTimes {
        StepTimes {
            on: std::env::var("REDLITE_STEP_TIMES").as_deref() == Ok("1"),
            ..StepTimes::default()
        }
    }

    /// A one-token step was embedded.
    pub fn armed(&mut self) {
        if self.on {
            self.armed_at = Some(Instant::now());
            self.launched_at = None;
        }
    }

    /// Its recorded graph was replayed.
    pub fn replayed(&mut self) {
        if let Some(armed) = self.armed_at.take() {
            let now = Instant::now();
            self.walk += now - armed;
            self.launched_at = Some(now);
        }
    }

    /// Its logits are on the host.
    pub fn logits_back(&mut self) {
        if let Some(launched) = self.launched_at.take() {
            self.wait += launched.elapsed();
            self.steps += 1;
        }
    }
}

impl Drop for StepTimes {
    fn drop(&mut self) {
        if self.on && self.steps > 0 {
            let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(self.steps);
            eprintln!(
                "step times ({} replayed steps): embedding to graph launch {:.1} us a step, \
                 launch to logits on the host {:.1} us",
                self.steps,
                per(self.walk),
                per(self.wait)
            );
        }
    }
}
