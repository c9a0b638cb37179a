//! `REDLITE_STEP_TIMES=1`: host clocks of replayed chained MTP steps (`step_graph.rs`),
//! printed to stderr when the backend is dropped. A replayed step uploads its inputs and
//! launches its graph as it begins, the host then walks the step's ops (each checked against
//! the recording) while the GPU runs it, waits for the picks, and decides what to keep (the
//! rollback, the tokens, the next step's plan) before the next step begins: the GPU idles
//! from the step's last kernel to the next step's first one for the wait's wake-up, the host's
//! decision, the upload and the launch. Five clocks a step say which of them the gap is.

use std::time::{Duration, Instant};

pub struct StepClocks {
    on: bool,
    begun: Option<Instant>,
    launched: Option<Instant>,
    ended: Option<Instant>,
    back: Option<Instant>,
    upload: Duration,
    launch: Duration,
    walk: Duration,
    wait: Duration,
    between: Duration,
    steps: u32,
    gaps: u32,
}

impl Default for StepClocks {
    /// On where `REDLITE_STEP_TIMES=1`.
    fn default() -> StepClocks {
        StepClocks {
            on: std::env::var("REDLITE_STEP_TIMES").as_deref() == Ok("1"),
            begun: None,
            launched: None,
            ended: None,
            back: None,
            upload: Duration::ZERO,
            launch: Duration::ZERO,
            walk: Duration::ZERO,
            wait: Duration::ZERO,
            between: Duration::ZERO,
            steps: 0,
            gaps: 0,
        }
    }
}

impl StepClocks {
    /// A chained step begins, `replayed` when its graph was found (its inputs about to be
    /// uploaded); a step that runs otherwise is not clocked, nor the gap before it.
    pub fn begin(&mut self, replayed: bool) {
        if !self.on {
            return;
        }
        if !replayed {
            self.back = None;
            self.begun = None;
            return;
        }
        let now = Instant::now();
        if let Some(back) = self.back.take() {
            self.between += now - back;
            self.gaps += 1;
        }
        self.begun = Some(now);
        self.launched = None;
        self.ended = None;
    }

    /// Its inputs are uploaded (the launch follows).
    pub fn uploaded(&mut self) {
        if let Some(begun) = self.begun {
            let now = Instant::now();
            self.upload += now - begun;
            self.begun = Some(now);
        }
    }

    /// Its graph was launched.
    pub fn launched(&mut self) {
        if let Some(uploaded) = self.begun.take() {
            let now = Instant::now();
            self.launch += now - uploaded;
            self.launched = Some(now);
        }
    }

    /// The host walked the whole step.
    pub fn ended(&mut self) {
        if let Some(launched) = self.launched.take() {
            let now = Instant::now();
            self.walk += now - launched;
            self.ended = Some(now);
        }
    }

    /// The step's picks are on the host.
    pub fn picks_back(&mut self) {
        if let Some(ended) = self.ended.take() {
            let now = Instant::now();
            self.wait += now - ended;
            self.steps += 1;
            self.back = Some(now);
        }
    }
}

impl Drop for StepClocks {
    fn drop(&mut self) {
        if !self.on || self.steps == 0 {
            return;
        }
        let per = |d: Duration, n: u32| d.as_secs_f64() * 1e6 / f64::from(n.max(1));
        eprintln!(
            "chained step times ({} replayed steps): upload {:.1} us, launch {:.1} us, walk {:.1} \
             us, wait for the picks {:.1} us; from the picks to the next step {:.1} us ({} gaps)",
            self.steps,
            per(self.upload, self.steps),
            per(self.launch, self.steps),
            per(self.walk, self.steps),
            per(self.wait, self.steps),
            per(self.between, self.gaps),
            self.gaps
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> StepClocks {
        StepClocks {
            on: true,
            ..StepClocks::default()
        }
    }

    fn replayed_step(c: &mut StepClocks) {
        c.begin(true);
        c.uploaded();
        c.launched();
        c.ended();
        c.picks_back();
    }

    #[test]
    fn a_replayed_step_is_counted_and_the_gap_after_it_too() {
        let mut c = on();
        replayed_step(&mut c);
        replayed_step(&mut c);
        assert_eq!((c.steps, c.gaps), (2, 1));
    }

    #[test]
    fn a_step_that_is_not_replayed_breaks_the_gap_and_is_not_counted() {
        let mut c = on();
        replayed_step(&mut c);
        // Recorded (or run eagerly): its picks come back without a replay's clocks.
        c.begin(false);
        c.picks_back();
        replayed_step(&mut c);
        assert_eq!((c.steps, c.gaps), (2, 0));
    }
}
