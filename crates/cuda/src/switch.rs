//! On/off switches read from the environment on first use (`REDLITE_...=1` or `=0`), which
//! a test may also set for the whole process: GPU tests compare a path written behind a
//! switch with the default one in one process, instead of relying on how a variable was
//! set when the process started.

use std::sync::atomic::{AtomicU8, Ordering};

/// A switch: `var` set to `1` turns it on, `0` off, anything else leaves `default`.
pub struct Switch {
    var: &'static str,
    default: bool,
    /// 0: not read yet; 1: off; 2: on.
    state: AtomicU8,
}

impl Switch {
    pub const fn new(var: &'static str, default: bool) -> Switch {
        Switch {
            var,
            default,
            state: AtomicU8::new(0),
        }
    }

    pub fn on(&self) -> bool {
        match self.state.load(Ordering::Relaxed) {
            0 => {
                let on = match std::env::var(self.var).as_deref() {
                    Ok("1") => true,
                    Ok("0") => false,
                    _ => self.default,
                };
                // A `set` racing with the first read wins.
                let _ = self.state.compare_exchange(
                    0,
                    Switch::code(on),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                self.state.load(Ordering::Relaxed) == 2
            }
            state => state == 2,
        }
    }

    /// On or off from here on, whatever the environment says.
    pub fn set(&self, on: bool) {
        self.state.store(Switch::code(on), Ordering::Relaxed);
    }

    /// The environment variable it reads.
    pub fn var(&self) -> &'static str {
        self.var
    }

    fn code(on: bool) -> u8 {
        if on {
            2
        } else {
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Switch;

    #[test]
    fn a_set_switch_ignores_the_environment() {
        static S: Switch = Switch::new("REDLITE_SWITCH_TEST_UNSET", false);
        assert!(!S.on());
        S.set(true);
        assert!(S.on());
        S.set(false);
        assert!(!S.on());
        static D: Switch = Switch::new("REDLITE_SWITCH_TEST_UNSET", true);
        assert!(D.on());
        assert_eq!(D.var(), "REDLITE_SWITCH_TEST_UNSET");
    }
}
