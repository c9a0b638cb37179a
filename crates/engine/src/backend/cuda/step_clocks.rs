//! `REDLITE_STEP_TIMES=1`: host clocks of replayed chained MTP steps (`step_graph.rs`),
//! printed to stderr when the backend is dropped. A replayed step uploads its inputs and
//! launches its graph as it begins, the host then walks the step's ops (each checked against
//! the recording) while the GPU runs it, waits for the picks, and decides what to keep (the
//! rollback, the tokens, the next step's plan) before the next step begins: the GPU idles
//! from the step's last kernel to the next step's first one for the wait's wake-up, the host's
//! decision, the upload and the launch. Five clocks a step say which of them the gap is.

use std::time::{Duration, Instant};

/// The marks of a replayed step, in order; each ends the phase of the same index (`Begun`
/// ends the gap from the previous step's picks).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mark {
    Begun,
    Uploaded,
    Launched,
    Ended,
    PicksBack,
}

const PHASES: [&str; 5] = [
    "from the picks to the next step",
    "upload",
    "launch",
    "walk",
    "wait for the picks",
];

pub struct StepClocks {
    on: bool,
    /// The last mark of the step in progress and when it was made.
    last: Option<(Mark, Instant)>,
    /// Each phase's total and how many times it ended.
    sums: [(Duration, u32); 5],
}

impl Default for StepClocks {
    /// On where `REDLITE_STEP_TIMES=1`.
    fn default() -> StepClocks {
        StepClocks {
            on: std::env::var("REDLITE_STEP_TIMES").as_deref() == Ok("1"),
            last: None,
            sums: [(Duration::ZERO, 0); 5],
        }
    }
}

impl StepClocks {
    /// `to` made now: the phase it ends is counted where the mark before it was `from`; a
    /// mark out of order ends nothing and starts the step over from `to`.
    fn mark(&mut self, from: Mark, to: Mark) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        if let Some((mark, at)) = self.last {
            if mark == from {
                let sum = &mut self.sums[to as usize];
                sum.0 += now - at;
                sum.1 += 1;
            }
        }
        self.last = Some((to, now));
    }

    /// A chained step begins, `replayed` when its graph was found (its inputs about to be
    /// uploaded); a step that runs otherwise is not clocked, nor the gap before it.
    pub fn begin(&mut self, replayed: bool) {
        match replayed {
            true => self.mark(Mark::PicksBack, Mark::Begun),
            false => self.last = None,
        }
    }

    /// Its inputs are uploaded (the launch follows).
    pub fn uploaded(&mut self) {
        self.mark(Mark::Begun, Mark::Uploaded);
    }

    /// Its graph was launched.
    pub fn launched(&mut self) {
        self.mark(Mark::Uploaded, Mark::Launched);
    }

    /// The host walked the whole step.
    pub fn ended(&mut self) {
        self.mark(Mark::Launched, Mark::Ended);
    }

    /// The step's picks are on the host (after a step that was not clocked: nothing).
    pub fn picks_back(&mut self) {
        match self.last {
            Some((Mark::Ended, _)) => self.mark(Mark::Ended, Mark::PicksBack),
            _ => self.last = None,
        }
    }

    fn steps(&self) -> u32 {
        self.sums[Mark::PicksBack as usize].1
    }

    fn gaps(&self) -> u32 {
        self.sums[Mark::Begun as usize].1
    }
}

impl Drop for StepClocks {
    fn drop(&mut self) {
        if !self.on || self.steps() == 0 {
            return;
        }
        let phases: Vec<String> = PHASES
            .iter()
            .zip(&self.sums)
            .map(|(name, (total, n))| {
                let us = total.as_secs_f64() * 1e6 / f64::from((*n).max(1));
                format!("{name} {us:.1} us")
            })
            .collect();
        eprintln!(
            "chained step times ({} replayed steps, {} gaps between them): {}",
            self.steps(),
            self.gaps(),
            phases.join(", ")
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
        assert_eq!((c.steps(), c.gaps()), (2, 1));
    }

    #[test]
    fn a_step_that_is_not_replayed_breaks_the_gap_and_is_not_counted() {
        let mut c = on();
        replayed_step(&mut c);
        // Recorded (or run eagerly): its picks come back without a replay's clocks.
        c.begin(false);
        c.picks_back();
        replayed_step(&mut c);
        assert_eq!((c.steps(), c.gaps()), (2, 0));
    }
}
