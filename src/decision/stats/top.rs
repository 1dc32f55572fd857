//! The clients a rule denied most in one minute, in bounded memory: a
//! flood of distinct denied clients cannot grow an isolate's memory, nor
//! the stats kept in Redis.

/// Clients an isolate follows per rule and minute. Exact while no more
/// than this many are denied in the minute; past it, each newcomer takes
/// the place of the least denied so far, so the heaviest stay.
pub const TRACKED: usize = 64;

/// Clients kept per rule and minute in Redis, and shown.
pub const KEPT: usize = 10;

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
        let mut all: Vec<(&str, u64)> =
            self.clients.iter().map(|(c, n)| (c.as_str(), *n)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        all.truncate(k);
        all
    }

    /// Keeps only the `k` most denied.
    pub fn trim(&mut self, k: usize) {
        if self.clients.len() > k {
            let kept: Vec<(String, u64)> = self
                .top(k)
                .into_iter()
                .map(|(c, n)| (c.to_owned(), n))
                .collect();
            self.clients = kept;
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
