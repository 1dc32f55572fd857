//! What a rule allows: one module per algorithm, each owning its figures,
//! their checks, and every question the rest of the crate asks of them
//! ([`Algorithm`]), and reading them from a rule ([`Policy::read`]). Each
//! figure is checked when it is built, so a [`Gcra`], [`Windows`] or
//! [`Concurrency`] that exists is one the script and the headers can
//! represent exactly.

mod algorithm;
mod concurrency;
mod gcra;
mod windowed;

use serde_json::{Map, Value};

pub use algorithm::{Algorithm, Described, Written, MAX_DURATION_MS, MAX_UNITS};
pub use concurrency::{Concurrency, DEFAULT_HOLD_MS, MAX_HOLD_MS, MAX_IN_FLIGHT};
pub use gcra::{Gcra, MAX_DELAY_MS, MAX_GCRA_SPAN_US};
pub use windowed::{Window, Windows, MAX_BUCKETS, MAX_WINDOWS};

use super::fields::{invalid, named, FieldError};

/// An algorithm as the configuration reads it: how it is written, and
/// its figures read from a rule's table.
struct Listed {
    written: &'static Written,
    read: fn(&Map<String, Value>) -> Result<Policy, FieldError>,
}

/// Every algorithm, an entry each: the place a new one is added.
static ALGORITHMS: [Listed; 3] = [
    Listed {
        written: &gcra::WRITTEN,
        read: |rule| Gcra::read(rule).map(Policy::Gcra),
    },
    Listed {
        written: &windowed::WRITTEN,
        read: |rule| Windows::read(rule).map(Policy::Windowed),
    },
    Listed {
        written: &concurrency::WRITTEN,
        read: |rule| Concurrency::read(rule).map(Policy::Concurrency),
    },
];

/// The first name `table` holds (`null` counts as absent) that another
/// algorithm lists in `names` and `own` does not, with that algorithm.
fn foreign(
    table: &Map<String, Value>,
    own: &Written,
    names: fn(&Written) -> &'static [&'static str],
) -> Option<(&'static str, &'static Written)> {
    let held = |f: &str| table.get(f).is_some_and(|v| !v.is_null()) && !names(own).contains(&f);
    ALGORITHMS.iter().find_map(|a| {
        let field = names(a.written).iter().copied().find(|f| held(f))?;
        Some((field, a.written))
    })
}

/// A rate-limiting policy: which algorithm, with which numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// Generic cell rate algorithm (see `lua/gcra.lua`).
    Gcra(Gcra),
    /// One or more sliding windows checked together (see `lua/windowed.lua`).
    Windowed(Windows),
    /// Requests in flight at once (see `lua/concurrency.lua`).
    Concurrency(Concurrency),
}

impl Policy {
    /// The figures of the algorithm `name`s (a rule's `algorithm`), read
    /// from the rule's `table`; another algorithm's field there is refused,
    /// naming whose it is.
    pub(super) fn read(name: &Value, table: &Map<String, Value>) -> Result<Policy, FieldError> {
        let names: Vec<&str> = ALGORITHMS.iter().map(|a| a.written.name).collect();
        let this = &ALGORITHMS[named(name, &names).map_err(|e| invalid("algorithm", e))?];
        let own = this.written;
        if let Some((field, other)) = foreign(table, own, |w| w.fields) {
            let says = format!(
                "belongs to algorithm \"{}\"; {} takes {}",
                other.name, own.label, own.takes
            );
            return Err(invalid(field, says));
        }
        (this.read)(table)
    }

    /// Every algorithm's fields, each once, in the order they are listed.
    pub(super) fn fields() -> Vec<&'static str> {
        let mut all: Vec<&'static str> = vec![];
        for field in ALGORITHMS.iter().flat_map(|a| a.written.fields) {
            if !all.contains(field) {
                all.push(field);
            }
        }
        all
    }

    /// These figures with the ones `given` changed (an override's, by the
    /// names of [`Written::options`]), checked as a rule's are; another
    /// algorithm's option is refused, naming whose it is.
    pub fn changed(&self, given: &Map<String, Value>) -> Result<Policy, FieldError> {
        let own = self.algorithm().written();
        if let Some((option, other)) = foreign(given, own, |w| w.options) {
            let says = format!(
                "is for {} rules; a {} rule takes {}",
                other.label, own.label, own.takes_options
            );
            return Err(invalid(option, says));
        }
        match self {
            Policy::Gcra(g) => g.changed(given).map(Policy::Gcra),
            Policy::Windowed(ws) => ws.changed(given).map(Policy::Windowed),
            Policy::Concurrency(c) => c.changed(given).map(Policy::Concurrency),
        }
    }

    /// The algorithm and its figures. This file is the one that lists the
    /// algorithms: in [`ALGORITHMS`], here, and where figures of one become
    /// a `Policy` again.
    pub fn algorithm(&self) -> &dyn Algorithm {
        match self {
            Policy::Gcra(g) => g,
            Policy::Windowed(ws) => ws,
            Policy::Concurrency(c) => c,
        }
    }

    /// What the operator's commands say of its figures.
    pub fn described(&self) -> &dyn Described {
        match self {
            Policy::Gcra(g) => g,
            Policy::Windowed(ws) => ws,
            Policy::Concurrency(c) => c,
        }
    }

    /// The largest cost one request can ever be admitted with.
    pub fn capacity(&self) -> u64 {
        self.algorithm().capacity()
    }

    /// The longest window, milliseconds: the span over which edge offsets spread.
    pub fn longest_ms(&self) -> u64 {
        self.algorithm().longest_ms()
    }

    /// The figures an override's text of `kind` and `words` puts in place
    /// of these; `None` when it is no override this release wrote for a
    /// rule of these figures (another algorithm's among them).
    pub fn override_figures(&self, kind: &str, words: &[&str]) -> Option<Policy> {
        match self {
            Policy::Gcra(g) => g.overridden_by(kind, words).map(Policy::Gcra),
            Policy::Windowed(ws) => ws.overridden_by(kind, words).map(Policy::Windowed),
            Policy::Concurrency(c) => c.overridden_by(kind, words).map(Policy::Concurrency),
        }
    }

    /// Each limit the figures hold as figures of its own, over the same
    /// state: `inspect` peeks them one by one, where a decision reports
    /// only the one that binds.
    pub fn parts(&self) -> Vec<Policy> {
        match self {
            Policy::Gcra(g) => vec![Policy::Gcra(*g)],
            Policy::Windowed(ws) => ws.parts().into_iter().map(Policy::Windowed).collect(),
            Policy::Concurrency(c) => vec![Policy::Concurrency(*c)],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gcra(rate: u64, period_ms: u64, burst: u64) -> Policy {
        Policy::Gcra(Gcra::new(rate, period_ms, burst).unwrap())
    }

    fn window(duration_ms: u64, limit: u64, precision_ms: u64) -> Window {
        Window::new(duration_ms, limit, precision_ms).unwrap()
    }

    #[test]
    fn interval_rounds_to_the_nearest_microsecond() {
        assert_eq!(Gcra::new(3, 1000, 1).unwrap().interval_us(), 333_333);
        assert_eq!(Gcra::new(3, 2, 1).unwrap().interval_us(), 667);
    }

    #[test]
    fn capacity_and_longest_window() {
        let p = Policy::Windowed(
            Windows::new(vec![window(1000, 10, 100), window(60_000, 100, 60_000)]).unwrap(),
        );
        assert_eq!(p.capacity(), 10);
        assert_eq!(p.longest_ms(), 60_000);
        assert_eq!(gcra(10, 1000, 5).capacity(), 5);
    }

    #[test]
    fn invalid_figures_cannot_be_built_and_name_their_field() {
        for ((rate, period, burst), field) in [
            ((0, 1000, 1), "rate"),
            ((1, 0, 1), "period"),
            ((1, MAX_DURATION_MS + 1, 1), "period"),
            ((1, 1000, 0), "burst"),
            ((1, 1000, MAX_UNITS + 1), "burst"),
            ((2000, 1, 1), "rate"),
            // The example: a year per unit, a billion at once.
            ((1, MAX_DURATION_MS, MAX_UNITS), "burst"),
        ] {
            assert_eq!(
                Gcra::new(rate, period, burst).unwrap_err().field,
                field,
                "{rate}/{period} burst {burst}"
            );
        }
        for ((d, l, p), field) in [
            ((0, 1, 1), "duration"),
            ((MAX_DURATION_MS + 1000, 1, 1000), "duration"),
            ((1000, 0, 100), "limit"),
            ((1000, MAX_UNITS + 1, 100), "limit"),
            ((1000, 1, 300), "precision"),
            ((1000, 1, 0), "precision"),
            ((3601, 1, 1), "precision"),
        ] {
            assert_eq!(
                Window::new(d, l, p).unwrap_err().field,
                field,
                "{d} {l} {p}"
            );
        }
        assert_eq!(Windows::new(vec![]).unwrap_err().field, "windows");
        assert_eq!(
            Windows::new(vec![window(1000, 1, 100), window(1000, 2, 100)])
                .unwrap_err()
                .field,
            "windows[1].duration"
        );
        assert_eq!(
            Windows::new(vec![window(1000, 1, 1000); 9])
                .unwrap_err()
                .field,
            "windows"
        );
    }

    #[test]
    fn the_largest_accepted_figures_stay_within_exact_arithmetic() {
        // The longest span that passes: exactly 2^51 us.
        let g = Gcra::new(1, 1, 1).unwrap();
        assert_eq!(g.interval_us(), 1000);
        let widest = Gcra::new(1, MAX_GCRA_SPAN_US / 1000 / MAX_UNITS, MAX_UNITS);
        let widest = widest.unwrap();
        assert!(widest.span_us() <= MAX_GCRA_SPAN_US);
        assert!(Gcra::new(1, MAX_GCRA_SPAN_US / 1000 / MAX_UNITS + 1, MAX_UNITS).is_err());
        let longest = Gcra::new(
            1,
            MAX_DURATION_MS,
            MAX_GCRA_SPAN_US / (MAX_DURATION_MS * 1000),
        );
        assert!(longest.unwrap().span_us() <= MAX_GCRA_SPAN_US);
    }
}
