//! The leased units docs/leases.md allows each isolate to spend, kept apart
//! from the isolates' own tables: each grant's deadline counted from the
//! sending of the call that brought it (and, for a window, no later than
//! the end of the bucket that call ran in), beside the deadline an isolate
//! would keep if it counted from the reply. A request decided from leases
//! must find its units here; one that finds them only by the later
//! deadlines is where counting from the reply goes over.

use std::collections::HashMap;

/// One grant of a rule's units to an isolate.
#[derive(Debug, Clone, Copy)]
pub struct Granted {
    /// Units not yet spent.
    pub units: u64,
    /// Its deadline by docs/leases.md (exclusive), ms.
    pub until_ms: u64,
    /// Its deadline counted from the reply instead, ms.
    pub late_until_ms: u64,
}

/// Per isolate and rule, its grants, earliest deadline first.
#[derive(Debug, Default)]
pub struct Ledger {
    held: HashMap<(usize, usize), Vec<Granted>>,
}

impl Ledger {
    /// Keeps a grant of rule `j`'s units to isolate `i`.
    pub fn keep(&mut self, (i, j): (usize, usize), granted: Granted) {
        let held = self.held.entry((i, j)).or_default();
        let at = held.partition_point(|g| g.until_ms <= granted.until_ms);
        held.insert(at, granted);
    }

    /// Spends `cost` of rule `j`'s units at isolate `i` at `at_ms`,
    /// earliest deadline first; whether the ledger held them.
    pub fn spend(&mut self, (i, j): (usize, usize), cost: u64, at_ms: u64) -> bool {
        let Some(held) = self.held.get_mut(&(i, j)) else {
            return cost == 0;
        };
        let live = |g: &&mut Granted| g.until_ms > at_ms;
        if held.iter_mut().filter(live).map(|g| g.units).sum::<u64>() < cost {
            return false;
        }
        let mut due = cost;
        for g in held.iter_mut().filter(live) {
            let take = due.min(g.units);
            g.units -= take;
            due -= take;
        }
        true
    }

    /// Rule `j`'s units isolate `i` holds at `at_ms`: by docs/leases.md's
    /// deadlines, and by deadlines counted from the reply.
    pub fn held(&self, (i, j): (usize, usize), at_ms: u64) -> (u64, u64) {
        let held = self.held.get(&(i, j)).map_or(&[][..], Vec::as_slice);
        let sum = |by: fn(&Granted) -> u64| {
            let live = held.iter().filter(|g| by(g) > at_ms);
            live.map(|g| g.units).sum()
        };
        (sum(|g| g.until_ms), sum(|g| g.late_until_ms))
    }
}
