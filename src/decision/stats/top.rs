//! The clients a rule denied most in one minute, in bounded memory: a
//! flood of distinct denied clients cannot grow an isolate's memory, nor
//! the stats kept in Redis.

/// Clients an isolate follows per rule and minute. Exact while no more
/// than this many are denied in the minute; past it, each newcomer takes
/// the place of the least denied so far, so the heaviest stay.
pub const TRACKED: usize = 64;

/// Clients kept per rule and minute in Redis, and shown.
pub const KEPT: usize = 10;

/// Whether `a` ranks before `b`: more denials, or as many and a name
/// that sorts first.
fn before(a: (&str, u64), b: (&str, u64)) -> bool {
    a.1 > b.1 || (a.1 == b.1 && a.0 < b.0)
}

/// Denials per client, most first once [`TopDenied::top`] sorts them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopDenied {
    // A few dozen entries: a list costs the wasm less than a map.
    clients: Vec<(String, u64)>,
}

impl TopDenied {
    /// `n` more denials of `client`.
    pub fn add(&mut self, client: &str, n: u64) {
        if let Some(entry) = self.clients.iter_mut().find(|(c, _)| c == client) {
            entry.1 = entry.1.saturating_add(n);
            return;
        }
        if self.clients.len() < TRACKED {
            self.clients.push((client.to_owned(), n));
            return;
        }
        let least = self
            .clients
            .iter_mut()
            .min_by_key(|(_, count)| *count)
            .filter(|(_, count)| *count <= n);
        if let Some(entry) = least {
            *entry = (client.to_owned(), n);
        }
    }

    /// Adds every client of `other`.
    pub fn merge(&mut self, other: &TopDenied) {
        for (client, n) in &other.clients {
            self.add(client, *n);
        }
    }

    /// The `k` most denied, most first; ties by name, so that every run
    /// reads the same.
    pub fn top(&self, k: usize) -> Vec<(&str, u64)> {
        // Insertion into a short list: a library sort would cost the wasm
        // several KB, for lists of a few dozen.
        let mut out: Vec<(&str, u64)> = Vec::with_capacity(k.min(self.clients.len()) + 1);
        for (client, n) in &self.clients {
            let entry = (client.as_str(), *n);
            let at = out
                .iter()
                .position(|e| before(entry, *e))
                .unwrap_or(out.len());
            if at < k {
                out.insert(at, entry);
                out.truncate(k);
            }
        }
        out
    }

    /// Keeps only the `k` most denied.
    pub fn trim(&mut self, k: usize) {
        while self.clients.len() > k {
            let mut last = 0;
            for (i, (client, n)) in self.clients.iter().enumerate() {
                let (c, m) = &self.clients[last];
                if before((c, *m), (client, *n)) {
                    last = i;
                }
            }
            self.clients.swap_remove(last);
        }
    }

    /// Whether no client is in it.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_exact_within_the_bound_and_ordered() {
        let mut t = TopDenied::default();
        for (c, n) in [("b", 2), ("a", 2), ("c", 5), ("b", 1)] {
            t.add(c, n);
        }
        assert_eq!(t.top(KEPT), [("c", 5), ("b", 3), ("a", 2)]);
        assert_eq!(t.top(1), [("c", 5)]);
    }

    #[test]
    fn a_flood_of_clients_stays_bounded_and_keeps_the_heaviest() {
        let mut t = TopDenied::default();
        t.add("heavy", 50);
        for i in 0..10_000 {
            t.add(&format!("c{i}"), 1);
        }
        t.add("heavy", 1);
        assert_eq!(t.clients.len(), TRACKED);
        assert_eq!(t.top(1), [("heavy", 51)]);
        let mut other = TopDenied::default();
        other.add("heavy", 9);
        t.merge(&other);
        assert_eq!(t.top(1), [("heavy", 60)]);
    }
}
