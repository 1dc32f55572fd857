//! The names a rule denied most in one minute (clients, countries,
//! networks), in bounded memory: a flood of distinct names cannot grow an
//! isolate's memory, nor the stats kept in Redis. Past its bound it is the
//! space-saving summary (Metwally, Agrawal and El Abbadi, 2005), merged as
//! Agarwal et al.'s mergeable summaries merge it, so that every count it
//! gives comes with the most it can be off by.

/// Names an isolate follows per rule and minute. Exact while no more than
/// this many are denied in the minute.
pub const TRACKED: usize = 64;

/// Names kept per rule and minute in Redis, and shown.
pub const KEPT: usize = 10;

/// One name's count: at most `over` above its true number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    /// The client (as the stats show it), country or network.
    pub name: String,
    /// Its denials, or more: never fewer.
    pub count: u64,
    /// How far `count` may be above the true number: 0 when exact.
    pub over: u64,
}

/// Whether `a` ranks before `b`: a higher count, or as high and a name
/// that sorts first, so that every run and every isolate reads the same.
fn before(a: &Counted, b: &Counted) -> bool {
    a.count > b.count || (a.count == b.count && a.name < b.name)
}

/// Denials per name, most first once [`TopDenied::top`] sorts them. Every
/// listed name's true number lies in `count - over ..= count`, and a name
/// not listed was denied at most [`TopDenied::floor`] times.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopDenied {
    // A few dozen entries: a list costs the wasm less than a map.
    entries: Vec<Counted>,
    floor: u64,
}

impl TopDenied {
    /// A summary read back as stored.
    pub fn from_parts(entries: Vec<Counted>, floor: u64) -> TopDenied {
        TopDenied { entries, floor }
    }

    /// `n` more denials of `name`. A name not yet followed may have had up
    /// to [`TopDenied::floor`] before; when [`TRACKED`] are followed, it
    /// takes the place of the least counted, which raises the floor.
    pub fn add(&mut self, name: &str, n: u64) {
        if let Some(entry) = self.entries.iter_mut().find(|e| e.name == name) {
            entry.count = entry.count.saturating_add(n);
            return;
        }
        if self.entries.len() >= TRACKED {
            self.drop_last();
        }
        self.entries.push(Counted {
            name: name.to_owned(),
            count: self.floor.saturating_add(n),
            over: self.floor,
        });
    }

    /// Adds `other`: a name missing from one side had at most that side's
    /// floor there, counted as its count and its error both.
    pub fn merge(&mut self, other: &TopDenied) {
        let theirs = other.floor;
        for mine in &mut self.entries {
            match other.entries.iter().find(|e| e.name == mine.name) {
                Some(e) => {
                    mine.count = mine.count.saturating_add(e.count);
                    mine.over = mine.over.saturating_add(e.over);
                }
                None => {
                    mine.count = mine.count.saturating_add(theirs);
                    mine.over = mine.over.saturating_add(theirs);
                }
            }
        }
        for e in &other.entries {
            if !self.entries.iter().any(|mine| mine.name == e.name) {
                self.entries.push(Counted {
                    name: e.name.clone(),
                    count: e.count.saturating_add(self.floor),
                    over: e.over.saturating_add(self.floor),
                });
            }
        }
        self.floor = self.floor.saturating_add(theirs);
        self.trim(TRACKED);
    }

    /// Removes the least counted, raising the floor to its count.
    fn drop_last(&mut self) {
        let mut last = 0;
        for (i, e) in self.entries.iter().enumerate() {
            if before(&self.entries[last], e) {
                last = i;
            }
        }
        let dropped = self.entries.swap_remove(last);
        self.floor = self.floor.max(dropped.count);
    }

    /// Keeps only the `k` most counted.
    pub fn trim(&mut self, k: usize) {
        while self.entries.len() > k {
            self.drop_last();
        }
    }

    /// What [`TopDenied::trim`] to `k` would keep, without a copy: the `k`
    /// most counted, most first, and the floor, raised to the count of the
    /// most counted one left out.
    pub fn kept(&self, k: usize) -> (Vec<&Counted>, u64) {
        let mut listed = self.top(k.saturating_add(1));
        let floor = match listed.len() > k {
            true => self.floor.max(listed.remove(k).count),
            false => self.floor,
        };
        (listed, floor)
    }

    /// The `k` most counted, most first.
    pub fn top(&self, k: usize) -> Vec<&Counted> {
        // Insertion into a short list: a library sort would cost the wasm
        // several KB, for lists of a few dozen.
        let mut out: Vec<&Counted> = Vec::with_capacity(k.min(self.entries.len()) + 1);
        for e in &self.entries {
            let at = out.iter().position(|o| before(e, o)).unwrap_or(out.len());
            if at < k {
                out.insert(at, e);
                out.truncate(k);
            }
        }
        out
    }

    /// The most denials a name not listed can have had.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Whether no name is in it.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What one rule denied in one minute: whom, and from where, each a
/// bounded summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Denials {
    /// The clients, as the stats show them.
    pub clients: TopDenied,
    /// The countries, as `request.cf.country` gives them (`T1` for Tor);
    /// [`UNPLACED`] where the platform gave none.
    pub countries: TopDenied,
    /// The networks (`request.cf.asn`); [`UNPLACED`] where the platform
    /// gave none.
    pub networks: TopDenied,
}

/// What the reports call a denial's places, in [`Denials::places`]' order.
pub const PLACES: [&str; 2] = ["country", "network"];

/// The country or network of a denial the platform placed nowhere: no
/// `request.cf` (a local run on bare workerd), or no such field in it.
pub const UNPLACED: &str = "-";

impl Denials {
    /// The summaries with the letter of the field each is stored under.
    pub fn each(&self) -> [(char, &TopDenied); 3] {
        [
            ('c', &self.clients),
            ('g', &self.countries),
            ('a', &self.networks),
        ]
    }

    /// The places, each with the word the reports name it by ([`PLACES`]).
    pub fn places(&self) -> [(&'static str, &TopDenied); 2] {
        [(PLACES[0], &self.countries), (PLACES[1], &self.networks)]
    }

    /// The summary stored under `letter`, if any is.
    pub fn of(&mut self, letter: char) -> Option<&mut TopDenied> {
        match letter {
            'c' => Some(&mut self.clients),
            'g' => Some(&mut self.countries),
            'a' => Some(&mut self.networks),
            _ => None,
        }
    }

    /// Adds `other`'s, summary by summary.
    pub fn merge(&mut self, other: &Denials) {
        self.clients.merge(&other.clients);
        self.countries.merge(&other.countries);
        self.networks.merge(&other.networks);
    }

    /// Keeps the `k` most counted of each.
    pub fn trim(&mut self, k: usize) {
        self.clients.trim(k);
        self.countries.trim(k);
        self.networks.trim(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(t: &TopDenied, k: usize) -> Vec<(&str, u64, u64)> {
        let top = t.top(k).into_iter();
        top.map(|e| (e.name.as_str(), e.count, e.over)).collect()
    }

    #[test]
    fn counts_are_exact_within_the_bound_and_ordered() {
        let mut t = TopDenied::default();
        for (c, n) in [("b", 2), ("a", 2), ("c", 5), ("b", 1)] {
            t.add(c, n);
        }
        assert_eq!(shown(&t, KEPT), [("c", 5, 0), ("b", 3, 0), ("a", 2, 0)]);
        assert_eq!(shown(&t, 1), [("c", 5, 0)]);
        assert_eq!(t.floor(), 0);
    }

    /// A heavy client arriving after a flood of others is still found,
    /// and every count's range holds its true number.
    #[test]
    fn a_late_heavy_client_is_found_with_its_error_stated() {
        let mut t = TopDenied::default();
        for i in 0..10_000 {
            t.add(&format!("c{i}"), 1);
        }
        for _ in 0..300 {
            t.add("heavy", 1);
        }
        assert_eq!(t.entries.len(), TRACKED);
        let heavy = t.top(1)[0].clone();
        assert_eq!(heavy.name, "heavy");
        assert!(heavy.count - heavy.over <= 300 && 300 <= heavy.count);
        // 10 300 denials over 64 places: no error can exceed a 64th of them.
        assert!(t.floor() <= 10_300 / TRACKED as u64);
        for e in t.top(TRACKED).iter().filter(|e| e.name != "heavy") {
            assert!(e.count - e.over <= 1 && 1 <= e.count, "{e:?}");
        }
    }

    #[test]
    fn kept_is_what_trim_keeps() {
        let mut t = TopDenied::default();
        for (i, n) in [5u64, 1, 9, 3, 9, 2, 7].into_iter().enumerate() {
            t.add(&format!("c{i}"), n);
        }
        for k in [0, 1, 3, 7, 10] {
            let (listed, floor) = t.kept(k);
            let listed: Vec<Counted> = listed.into_iter().cloned().collect();
            let mut trimmed = t.clone();
            trimmed.trim(k);
            let want: Vec<Counted> = trimmed.top(k).into_iter().cloned().collect();
            assert_eq!((listed, floor), (want, trimmed.floor()), "k = {k}");
        }
    }

    #[test]
    fn merging_bounds_what_either_side_left_out() {
        let mut a = TopDenied::default();
        a.add("x", 5);
        a.add("y", 1);
        a.trim(1);
        assert_eq!((shown(&a, 9), a.floor()), (vec![("x", 5, 0)], 1));
        let mut b = TopDenied::default();
        b.add("y", 4);
        a.merge(&b);
        // y: 1 on a's side (at most its floor) and 4 on b's.
        assert_eq!(shown(&a, 9), [("x", 5, 0), ("y", 5, 1)]);
        assert_eq!(a.floor(), 1);
    }
}
