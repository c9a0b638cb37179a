//! `REDLITE_STEP_TIMES=1`: host clocks of replayed chained MTP steps (`step_graph.rs`),
//! printed to stderr when the backend is dropped. A replayed step uploads its inputs and
//! launches its graph as it begins, the host then walks the step's ops (each checked against
//! the recording) while the GPU runs it, waits for the picks, and decides what to keep (the
//! tokens, the rollback, the next step's plan) before the next step begins: the GPU idles
//! from the step's last kernel to the next step's first one for the wait's wake-up, the host's
//! decision, the upload and the launch. Clocks at each of those say which of them the gap is.

use std::time::{Duration, Instant};

/// The marks of a replayed step, in order; each ends the phase of the same index. `Begun`
/// ends the gap's last part (from the next step's planning; from the accept or the picks
/// where that mark was not made).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mark {
    Begun,
    Uploaded,
    Launched,
    Ended,
    PicksBack,
    /// The session's accept began (its first position set after the picks).
    Accepting,
    /// The accept's rollback launched (steps that rejected a draft).
    RolledBack,
    /// The backend began to plan the next step (its bounds, identity and graph lookup).
    Planning,
}

const PHASES: [&str; 8] = [
    "the plan's lookup",
    "upload",
    "launch",
    "walk",
    "wait for the picks",
    "from the picks to the accept",
    "rollback",
    "from the accept to the plan",
];

pub struct StepClocks {
    on: bool,
    /// The last mark of the step in progress and when it was made.
    last: Option<(Mark, Instant)>,
    /// When the last step's picks came back (the gap's start).
    picks_at: Option<Instant>,
    /// Each phase's total and how many times it ended.
    sums: [(Duration, u32); 8],
    /// Each whole gap from a step's picks to the next step's start.
    gaps: Vec<Duration>,
}

impl Default for StepClocks {
    /// On where `REDLITE_STEP_TIMES=1`.
    fn default() -> StepClocks {
        StepClocks {
            on: std::env::var("REDLITE_STEP_TIMES").as_deref() == Ok("1"),
            last: None,
            picks_at: None,
            sums: [(Duration::ZERO, 0); 8],
            gaps: Vec::new(),
        }
    }
}

impl StepClocks {
    /// `to` made now: the phase it ends is counted where the mark before it was one of
    /// `from`; a mark out of order ends nothing and starts the step over from `to`.
    fn mark(&mut self, from: &[Mark], to: Mark) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        if let Some((mark, at)) = self.last {
            if from.contains(&mark) {
                let sum = &mut self.sums[to as usize];
                sum.0 += now - at;
                sum.1 += 1;
            }
        }
        self.last = Some((to, now));
    }

    /// A mark within the gap: made only right after one of `from` (a position set or a
    /// rollback elsewhere in a step changes nothing).
    fn mark_in_gap(&mut self, from: &[Mark], to: Mark) {
        if self.last.is_some_and(|(mark, _)| from.contains(&mark)) {
            self.mark(from, to);
        }
    }

    /// A chained step begins, `replayed` when its graph was found (its inputs about to be
    /// uploaded); a step that runs otherwise is not clocked, nor the gap before it.
    pub fn begin(&mut self, replayed: bool) {
        match replayed {
            true => {
                let gap_from = [
                    Mark::PicksBack,
                    Mark::Accepting,
                    Mark::RolledBack,
                    Mark::Planning,
                ];
                if let (true, Some(at)) = (
                    self.last.is_some_and(|(m, _)| gap_from.contains(&m)),
                    self.picks_at,
                ) {
                    self.gaps.push(at.elapsed());
                }
                self.mark(&gap_from, Mark::Begun);
            }
            false => self.last = None,
        }
        self.picks_at = None;
    }

    /// Its inputs are uploaded (the launch follows).
    pub fn uploaded(&mut self) {
        self.mark(&[Mark::Begun], Mark::Uploaded);
    }

    /// Its graph was launched.
    pub fn launched(&mut self) {
        self.mark(&[Mark::Uploaded], Mark::Launched);
    }

    /// The host walked the whole step.
    pub fn ended(&mut self) {
        self.mark(&[Mark::Launched], Mark::Ended);
    }

    /// The step's picks are on the host (after a step that was not clocked: nothing).
    pub fn picks_back(&mut self) {
        match self.last {
            Some((Mark::Ended, _)) => {
                self.mark(&[Mark::Ended], Mark::PicksBack);
                self.picks_at = self.last.map(|(_, at)| at);
            }
            _ => self.last = None,
        }
    }

    /// The session's accept sets its first position after the picks.
    pub fn accepting(&mut self) {
        self.mark_in_gap(&[Mark::PicksBack], Mark::Accepting);
    }

    /// The accept's rollback is launched.
    pub fn rolled_back(&mut self) {
        self.mark_in_gap(&[Mark::Accepting], Mark::RolledBack);
    }

    /// The backend begins to plan the next step.
    pub fn planning(&mut self) {
        self.mark_in_gap(
            &[Mark::PicksBack, Mark::Accepting, Mark::RolledBack],
            Mark::Planning,
        );
    }

    fn steps(&self) -> u32 {
        self.sums[Mark::PicksBack as usize].1
    }

    fn gaps(&self) -> u32 {
        self.gaps.len() as u32
    }

    /// Anything else ran (a forward outside a chained step): the gap in progress, if any, is
    /// not a step boundary's.
    pub fn interrupt(&mut self) {
        self.last = None;
        self.picks_at = None;
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
        let mut gaps = self.gaps.clone();
        gaps.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let mean = us(gaps.iter().sum()) / gaps.len().max(1) as f64;
        let median = gaps.get(gaps.len() / 2).map_or(0.0, |&d| us(d));
        eprintln!(
            "chained step times ({} replayed steps, {} gaps between them, {} rollbacks): \
             from the picks to the next step {mean:.1} us (median {median:.1}); {}",
            self.steps(),
            self.gaps(),
            self.sums[Mark::RolledBack as usize].1,
            phases.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> StepClocks {
        let mut c = StepClocks::default();
        c.on = true;
        c
    }

    fn replayed_step(c: &mut StepClocks) {
        c.begin(true);
        c.uploaded();
        c.launched();
        c.ended();
        c.picks_back();
    }

    #[test]
    fn the_accept_and_its_rollback_split_the_gap_and_marks_within_a_step_change_nothing() {
        let mut c = on();
        replayed_step(&mut c);
        c.accepting();
        c.rolled_back();
        c.planning();
        replayed_step(&mut c);
        c.accepting();
        // Position sets and rollbacks within a step are not the accept's.
        c.begin(true);
        c.accepting();
        c.uploaded();
        c.launched();
        c.ended();
        c.rolled_back();
        c.picks_back();
        let n = |m: Mark| c.sums[m as usize].1;
        assert_eq!((c.steps(), c.gaps()), (3, 2));
        assert_eq!(
            (n(Mark::Accepting), n(Mark::RolledBack), n(Mark::Begun)),
            (2, 1, 2)
        );
    }

    #[test]
    fn a_forward_between_steps_is_not_a_gap() {
        let mut c = on();
        replayed_step(&mut c);
        c.accepting();
        // A plain step or a prompt between them.
        c.interrupt();
        c.accepting();
        replayed_step(&mut c);
        assert_eq!((c.steps(), c.gaps()), (2, 0));
        assert_eq!(c.sums[Mark::Accepting as usize].1, 1);
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
