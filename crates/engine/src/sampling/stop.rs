//! Stop strings over streamed text: text that could be the start of a stop string is held
//! back until it is known not to be one, so a client never sees part of a stop string.

/// Result of feeding text to a [`StopMatcher`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopOutput {
    /// Text safe to emit now.
    pub text: String,
    /// Set when a stop string was found; `text` ends right before it and the rest is dropped.
    pub stopped_by: Option<String>,
}

/// Finds the first occurrence of any stop string in a stream of text pieces.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text not yet emitted: a suffix that is a prefix of some stop string.
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            stops: stops
                .into_iter()
                .map(Into::into)
                .filter(|s: &String| !s.is_empty())
                .collect(),
            held: String::new(),
            stopped: false,
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Adds `piece`; returns what can be emitted. After a stop, everything is dropped.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.stopped {
            return StopOutput::default();
        }
        self.held.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()).map(|at| (at, stop)))
            .min_by_key(|(at, stop)| (*at, std::cmp::Reverse(stop.len())));
        if let Some((at, stop)) = first {
            let stop = stop.clone();
            let mut text = std::mem::take(&mut self.held);
            text.truncate(at);
            self.stopped = true;
            return StopOutput {
                text,
                stopped_by: Some(stop),
            };
        }
        let keep = self.partial_match_len();
        let split = self.held.len() - keep;
        let rest = self.held.split_off(split);
        let text = std::mem::replace(&mut self.held, rest);
        StopOutput {
            text,
            stopped_by: None,
        }
    }

    /// Ends the stream: held-back text was not a stop string after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a stop string.
    fn partial_match_len(&self) -> usize {
        let held = self.held.as_bytes();
        self.stops
            .iter()
            .map(|stop| {
                let stop = stop.as_bytes();
                let longest = held.len().min(stop.len().saturating_sub(1));
                (1..=longest)
                    .rev()
                    .find(|&n| held.ends_with(&stop[..n]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, Option<String>, String) {
        let mut m = StopMatcher::new(stops.iter().copied());
        let mut out = Vec::new();
        let mut stopped = None;
        for p in pieces {
            let o = m.push(p);
            out.push(o.text);
            if o.stopped_by.is_some() {
                stopped = o.stopped_by;
            }
        }
        let tail = m.finish();
        (out, stopped, tail)
    }

    #[test]
    fn holds_back_partial_matches() {
        let (out, stopped, tail) = run(&["</answer>"], &["The ", "end</", "ans", "wer> more"]);
        assert_eq!(out, vec!["The ", "end", "", ""]);
        assert_eq!(stopped.as_deref(), Some("</answer>"));
        assert_eq!(tail, "");
    }

    #[test]
    fn releases_false_alarms_and_flushes() {
        let (out, stopped, tail) = run(&["STOP"], &["ST", "OR", "Y S", "T"]);
        assert_eq!(out, vec!["", "STOR", "Y ", ""]);
        assert_eq!(stopped, None);
        assert_eq!(tail, "ST");
    }

    #[test]
    fn earliest_stop_wins_and_multibyte_is_safe() {
        let (out, stopped, _) = run(&["世界", "b"], &["a你好世", "界b"]);
        assert_eq!(out.concat(), "a你好");
        assert_eq!(stopped.as_deref(), Some("世界"));
        let mut m = StopMatcher::new(["\n\n"]);
        assert_eq!(m.push("x\n").text, "x");
        assert_eq!(m.push("\n").stopped_by.as_deref(), Some("\n\n"));
        assert_eq!(m.push("after").text, "");
        assert!(m.is_stopped());
    }

    #[test]
    fn no_stops_passes_everything() {
        let (out, stopped, tail) = run(&[""], &["a", "b"]);
        assert_eq!(out, vec!["a", "b"]);
        assert_eq!((stopped, tail), (None, String::new()));
    }
}
