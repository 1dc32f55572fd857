//! Virtual time for the lease replay: tasks that wait on a clock the
//! replay moves itself, so that a call can be in flight for its round
//! trip while other requests come and go, with no real wait. One thread;
//! a task runs until it waits, and the clock moves only when every task
//! waits (a call to the private redis-server blocks, so it takes no
//! virtual time).

use std::{
    cell::{Cell, RefCell},
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll, Wake, Waker},
};

/// The replay's clock, epoch milliseconds, and who waits on it.
#[derive(Default)]
pub struct Clock {
    now: Cell<u64>,
    /// Waiters by (instant, arrival order).
    waiting: RefCell<BTreeMap<(u64, u64), Waker>>,
    waits: Cell<u64>,
}

impl Clock {
    /// A clock at `now_ms`.
    pub fn at(now_ms: u64) -> Clock {
        let clock = Clock::default();
        clock.now.set(now_ms);
        clock
    }

    /// The time now, ms.
    pub fn now_ms(&self) -> u64 {
        self.now.get()
    }

    /// Waits `ms` on this clock.
    pub fn sleep(&self, ms: u64) -> Sleep<'_> {
        Sleep {
            clock: self,
            until_ms: self.now_ms().saturating_add(ms),
        }
    }

    /// Wakes the earliest waiters at or before `until_ms`, moving the
    /// clock to their instant; whether there were any.
    fn wake_next(&self, until_ms: u64) -> bool {
        let mut waiting = self.waiting.borrow_mut();
        let Some((&(at, _), _)) = waiting.first_key_value().filter(|(k, _)| k.0 <= until_ms) else {
            return false;
        };
        self.now.set(self.now.get().max(at));
        while let Some(entry) = waiting.first_entry().filter(|e| e.key().0 <= at) {
            entry.remove().wake();
        }
        true
    }
}

/// A wait until an instant of a [`Clock`].
pub struct Sleep<'c> {
    clock: &'c Clock,
    until_ms: u64,
}

impl Future for Sleep<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.clock.now_ms() >= self.until_ms {
            return Poll::Ready(());
        }
        let order = self.clock.waits.get();
        self.clock.waits.set(order + 1);
        let key = (self.until_ms, order);
        self.clock
            .waiting
            .borrow_mut()
            .insert(key, cx.waker().clone());
        Poll::Pending
    }
}

/// Tasks woken and due a poll, by index.
#[derive(Default)]
struct Ready(Mutex<Vec<usize>>);

/// Wakes task `index` of a [`Timeline`].
struct TaskWaker {
    index: usize,
    ready: Arc<Ready>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Ok(mut ready) = self.ready.0.lock() {
            ready.push(self.index);
        }
    }
}

type Task<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// The tasks of a replay, run on a [`Clock`].
pub struct Timeline<'a> {
    tasks: Vec<Option<Task<'a>>>,
    /// Free places in `tasks`, reused so that it stays as long as the
    /// most tasks at once.
    free: Vec<usize>,
    ready: Arc<Ready>,
}

impl<'a> Timeline<'a> {
    /// No tasks.
    pub fn new() -> Timeline<'a> {
        Timeline {
            tasks: vec![],
            free: vec![],
            ready: Arc::new(Ready::default()),
        }
    }

    /// Adds `task`, first run by the next [`Timeline::run_until`].
    pub fn spawn(&mut self, task: impl Future<Output = ()> + 'a) {
        let index = match self.free.pop() {
            Some(i) => {
                self.tasks[i] = Some(Box::pin(task));
                i
            }
            None => {
                self.tasks.push(Some(Box::pin(task)));
                self.tasks.len() - 1
            }
        };
        self.wake(index);
    }

    fn wake(&self, index: usize) {
        if let Ok(mut ready) = self.ready.0.lock() {
            ready.push(index);
        }
    }

    /// Runs every task until `clock` reaches `until_ms` (`u64::MAX`: until
    /// they are all done), moving the clock from one waiter's instant to
    /// the next.
    pub fn run_until(&mut self, clock: &Clock, until_ms: u64) {
        loop {
            loop {
                let due = self.ready.0.lock().map(|mut r| std::mem::take(&mut *r));
                let due = due.unwrap_or_default();
                if due.is_empty() {
                    break;
                }
                for index in due {
                    self.poll(index);
                }
            }
            if !clock.wake_next(until_ms) {
                break;
            }
        }
        if until_ms != u64::MAX {
            clock.now.set(clock.now.get().max(until_ms));
        }
    }

    fn poll(&mut self, index: usize) {
        let Some(task) = self.tasks.get_mut(index).and_then(Option::as_mut) else {
            return;
        };
        let waker = Waker::from(Arc::new(TaskWaker {
            index,
            ready: self.ready.clone(),
        }));
        if task
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
        {
            self.tasks[index] = None;
            self.free.push(index);
        }
    }
}

impl Default for Timeline<'_> {
    fn default() -> Self {
        Timeline::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tasks interleave on the clock, each waking at its own instants; the
    /// clock stops where asked, and runs to the last waiter when asked to
    /// finish.
    #[test]
    fn tasks_wait_on_the_clock_in_turn() {
        let clock = Clock::at(1000);
        let seen = RefCell::new(vec![]);
        let mut timeline = Timeline::new();
        for (name, step) in [("a", 30), ("b", 20)] {
            let (clock, seen) = (&clock, &seen);
            timeline.spawn(async move {
                for _ in 0..3 {
                    clock.sleep(step).await;
                    seen.borrow_mut().push((name, clock.now_ms()));
                }
            });
        }
        timeline.run_until(&clock, 1050);
        assert_eq!(clock.now_ms(), 1050);
        assert_eq!(*seen.borrow(), [("b", 1020), ("a", 1030), ("b", 1040)]);
        timeline.run_until(&clock, u64::MAX);
        assert_eq!(clock.now_ms(), 1090);
        // At 1060 both wake, the one waiting longer first.
        assert_eq!(seen.borrow()[3..], [("a", 1060), ("b", 1060), ("a", 1090)]);
    }
}
