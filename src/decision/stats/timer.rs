//! When an isolate's own timer writes its stats, so that the counts of an
//! isolate gone quiet reach Redis without waiting for a request that may
//! never come. A timer lives in a request's `waitUntil`, which Cloudflare
//! lets run 30 s after the response: each wakes within that, at the write's
//! due time when it falls there, and a busy isolate sets one every few
//! seconds at most.

/// How long after its request a timer may wake: within the 30 s the
/// platform gives `waitUntil`, with room left for the write.
pub const WAKE_WITHIN_MS: u64 = 25_000;

/// How much later than the last timer set a request's must wake to be set:
/// however busy the isolate, at most one timer per this.
pub const WAKE_GAP_MS: u64 = 5_000;

/// The timers an isolate has set for its writes.
#[derive(Debug, Default)]
pub struct WriteTimer {
    /// When the last one set wakes.
    latest: Option<u64>,
}

impl WriteTimer {
    /// After a request at `now_ms`, the next write due at `due_ms` (`None`:
    /// nothing waits to be written): when a timer of this request should
    /// wake, or `None` when one already set wakes close enough to it.
    pub fn plan(&mut self, now_ms: u64, due_ms: Option<u64>) -> Option<u64> {
        let wake = due_ms?.clamp(now_ms, now_ms.saturating_add(WAKE_WITHIN_MS));
        if let Some(latest) = self.latest.filter(|l| *l > now_ms) {
            if wake < latest.saturating_add(WAKE_GAP_MS) {
                return None;
            }
        }
        self.latest = Some(wake);
        Some(wake)
    }

    /// The timer set to wake at `wake_ms` woke: whether it is the last one
    /// set, so that no later timer will write what is left and it should,
    /// due or not.
    pub fn woke(&self, wake_ms: u64) -> bool {
        self.latest == Some(wake_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_due_soon_is_woken_for_once() {
        let mut t = WriteTimer::default();
        assert_eq!(t.plan(0, None), None, "nothing to write");
        assert_eq!(t.plan(100, Some(1_000)), Some(1_000));
        assert_eq!(t.plan(500, Some(1_000)), None, "the timer set wakes then");
        assert!(t.woke(1_000));
        // Written at 1 000, the next due at 2 000: a new timer.
        assert_eq!(t.plan(1_200, Some(2_000)), Some(2_000));
        assert!(!t.woke(1_000), "a later one was set");
    }

    #[test]
    fn a_write_due_late_is_woken_for_within_the_platforms_limit() {
        let mut t = WriteTimer::default();
        assert_eq!(t.plan(0, Some(3_600_000)), Some(WAKE_WITHIN_MS));
        // A busy isolate sets a timer every WAKE_GAP_MS, no more.
        for now in (1_000..WAKE_GAP_MS).step_by(1_000) {
            assert_eq!(t.plan(now, Some(3_600_000)), None, "at {now}");
        }
        let next = WAKE_GAP_MS + WAKE_WITHIN_MS;
        assert_eq!(t.plan(WAKE_GAP_MS, Some(3_600_000)), Some(next));
        assert!(!t.woke(WAKE_WITHIN_MS), "not the last: it leaves the write");
        assert!(t.woke(next), "the last: it writes, due or not");
        // Past due, a request's timer wakes at once.
        assert_eq!(t.plan(next + 10, Some(next)), Some(next + 10));
    }
}
