//! What a rule allows: the two algorithms' parameters, checked, and how they
//! travel to the script as `ARGV`.

/// A rate-limiting policy: which algorithm, with which numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// Generic cell rate algorithm (see `lua/gcra.lua`).
    Gcra(Gcra),
    /// One or more sliding windows checked together (see `lua/windowed.lua`).
    Windowed(Vec<Window>),
}

/// GCRA parameters: `rate` units per `period_ms`, of which `burst` may come at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    /// Units replenished per period.
    pub rate: u64,
    /// Length of the period, milliseconds.
    pub period_ms: u64,
    /// Units a fresh client may spend back to back.
    pub burst: u64,
}

impl Gcra {
    /// Time one unit occupies, microseconds, rounded to the nearest one so
    /// that the script's arithmetic stays exact (a rate of 3/s is treated as
    /// one unit per 333 333 us).
    pub fn interval_us(&self) -> u64 {
        (self.period_ms * 1000 + self.rate / 2) / self.rate
    }
}

/// One sliding window: at most `limit` units in any `duration_ms`, counted in
/// buckets of `precision_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Window length, milliseconds.
    pub duration_ms: u64,
    /// Units admitted per window.
    pub limit: u64,
    /// Bucket length, milliseconds; equal to `duration_ms` for a fixed window.
    pub precision_ms: u64,
}

/// A policy's parameters that cannot work, with the field to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    /// The offending field, as written in the configuration.
    pub field: String,
    /// What is wrong and what would be right.
    pub problem: String,
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> PolicyError {
    PolicyError {
        field: field.into(),
        problem: problem.into(),
    }
}

/// Upper bound for every duration: a day of milliseconds times 366 keeps every
/// product the script forms far below 2^53.
pub const MAX_DURATION_MS: u64 = 366 * 24 * 3600 * 1000;

impl Policy {
    /// Checks the numbers against what the script can decide exactly.
    pub fn validate(&self) -> Result<(), PolicyError> {
        match self {
            Policy::Gcra(g) => {
                if g.rate == 0 {
                    return Err(invalid("rate", "must be at least 1"));
                }
                if g.period_ms == 0 || g.period_ms > MAX_DURATION_MS {
                    return Err(invalid("period", "must be between 1ms and 366d"));
                }
                if g.rate > g.period_ms * 1000 {
                    return Err(invalid("rate", "must be at most one unit per microsecond"));
                }
                if g.burst == 0 || g.burst > 1_000_000_000 {
                    return Err(invalid("burst", "must be between 1 and 1000000000"));
                }
                Ok(())
            }
            Policy::Windowed(windows) => {
                if windows.is_empty() || windows.len() > 8 {
                    return Err(invalid("windows", "give between 1 and 8 windows"));
                }
                for (i, w) in windows.iter().enumerate() {
                    let field = |name: &str| format!("windows[{i}].{name}");
                    if w.duration_ms == 0 || w.duration_ms > MAX_DURATION_MS {
                        return Err(invalid(field("duration"), "must be between 1ms and 366d"));
                    }
                    if w.limit == 0 || w.limit > 1_000_000_000 {
                        return Err(invalid(field("limit"), "must be between 1 and 1000000000"));
                    }
                    if w.precision_ms == 0 || w.duration_ms % w.precision_ms != 0 {
                        return Err(invalid(
                            field("precision"),
                            "must divide the duration evenly (use the duration itself for a fixed window)",
                        ));
                    }
                    if w.duration_ms / w.precision_ms > 3600 {
                        return Err(invalid(
                            field("precision"),
                            "gives more than 3600 buckets per window; choose a coarser precision",
                        ));
                    }
                    let twin = windows[..i].iter().any(|o| {
                        o.duration_ms == w.duration_ms && o.precision_ms == w.precision_ms
                    });
                    if twin {
                        return Err(invalid(
                            field("duration"),
                            "repeats an earlier window's duration and precision; they would share counters",
                        ));
                    }
                }
                Ok(())
            }
        }
    }

    /// The largest cost one request can ever be admitted with.
    pub fn capacity(&self) -> u64 {
        match self {
            Policy::Gcra(g) => g.burst,
            Policy::Windowed(ws) => ws.iter().map(|w| w.limit).min().unwrap_or(0),
        }
    }

    /// Appends this rule's script arguments (see `lua/limiter.lua`).
    /// `offset_ms` shifts window edges per key; GCRA has no edges to shift.
    pub fn push_args(&self, cost: u64, offset_ms: u64, args: &mut Vec<String>) {
        let (tag, numbers) = match self {
            Policy::Gcra(g) => ("gcra", vec![cost, g.interval_us(), g.burst]),
            Policy::Windowed(ws) => {
                let mut n = vec![cost, offset_ms, ws.len() as u64];
                for w in ws {
                    n.extend([w.duration_ms, w.limit, w.precision_ms]);
                }
                ("window", n)
            }
        };
        args.push(tag.to_owned());
        args.extend(numbers.iter().map(u64::to_string));
    }

    /// The longest window, milliseconds: the span over which edge offsets spread.
    pub fn longest_ms(&self) -> u64 {
        match self {
            Policy::Gcra(g) => g.period_ms,
            Policy::Windowed(ws) => ws.iter().map(|w| w.duration_ms).max().unwrap_or(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gcra(rate: u64, period_ms: u64, burst: u64) -> Policy {
        Policy::Gcra(Gcra {
            rate,
            period_ms,
            burst,
        })
    }

    #[test]
    fn interval_rounds_to_the_nearest_microsecond() {
        let g = Gcra {
            rate: 3,
            period_ms: 1000,
            burst: 1,
        };
        assert_eq!(g.interval_us(), 333_333);
        let g = Gcra {
            rate: 3,
            period_ms: 2,
            burst: 1,
        };
        assert_eq!(g.interval_us(), 667);
    }

    #[test]
    fn gcra_arguments_follow_the_script_layout() {
        let mut args = vec![];
        gcra(10, 1000, 5).push_args(2, 0, &mut args);
        assert_eq!(args, ["gcra", "2", "100000", "5"]);
    }

    #[test]
    fn windowed_arguments_follow_the_script_layout() {
        let mut args = vec![];
        let p = Policy::Windowed(vec![
            Window {
                duration_ms: 1000,
                limit: 10,
                precision_ms: 100,
            },
            Window {
                duration_ms: 60_000,
                limit: 100,
                precision_ms: 60_000,
            },
        ]);
        p.push_args(1, 42, &mut args);
        assert_eq!(
            args,
            ["window", "1", "42", "2", "1000", "10", "100", "60000", "100", "60000"]
        );
        assert_eq!(p.capacity(), 10);
        assert_eq!(p.longest_ms(), 60_000);
    }

    #[test]
    fn validation_names_the_field() {
        let cases = [
            (gcra(0, 1000, 1), "rate"),
            (gcra(1, 0, 1), "period"),
            (gcra(1, 1000, 0), "burst"),
            (gcra(2000, 1, 1), "rate"),
            (Policy::Windowed(vec![]), "windows"),
            (
                Policy::Windowed(vec![Window {
                    duration_ms: 1000,
                    limit: 1,
                    precision_ms: 300,
                }]),
                "windows[0].precision",
            ),
            (
                Policy::Windowed(vec![
                    Window {
                        duration_ms: 1000,
                        limit: 1,
                        precision_ms: 100,
                    },
                    Window {
                        duration_ms: 1000,
                        limit: 2,
                        precision_ms: 100,
                    },
                ]),
                "windows[1].duration",
            ),
        ];
        for (policy, field) in cases {
            assert_eq!(policy.validate().unwrap_err().field, field, "{policy:?}");
        }
        assert!(gcra(3, 1000, 3).validate().is_ok());
    }
}
