//! The seam between the limiter and its runtime: the isolate's clock, a
//! pause that a deadline or a signal ends, and the signal one request
//! rings for others. workerd lends them in `edge::entry`; tokio, here, in
//! tests and on the command line; the simulator's timeline its own.

use std::{
    any::Any,
    cell::{Cell, RefCell},
    future::Future,
    pin::Pin,
    rc::Rc,
    task::{Poll, Waker},
};

/// What the runtime lends the requests of a line.
pub trait Pause {
    /// The isolate's clock, ms: the one its requests are decided at.
    fn now_ms(&self) -> u64;

    /// A [`Signal`] for other requests to follow, and the [`Bell`] that
    /// rings it, both of the request that calls this. In workerd one
    /// request makes and settles the promise, others follow it: a promise
    /// that one request made and another settled resumed its maker in the
    /// settler's context once the isolate had served enough of them (some
    /// 19 000 requests in `tests/bare_workerd.rs`, then 500s: "Cannot
    /// perform I/O on behalf of a different request").
    fn signal(&self) -> (Bell, Signal);

    /// A pause that ends at `until_ms` (`u64::MAX`: never), or sooner when
    /// `signal` rings. It resumes the request in its own context, and the
    /// deadline's timer is I/O of its own while it waits: without one,
    /// workerd would cancel the request as hung.
    fn until(&self, until_ms: u64, signal: Option<&Signal>) -> Paused;
}

/// A [`Pause`] under way.
pub type Paused = Pin<Box<dyn Future<Output = ()>>>;

/// Rings its [`Signal`]; dropping it unrung leaves the signal unrung.
pub struct Bell(Box<dyn FnOnce()>);

impl Bell {
    /// Rings the signal: every pause following it ends.
    pub fn ring(self) {
        (self.0)()
    }
}

/// What pauses follow until its [`Bell`] rings; clones follow the same.
#[derive(Clone)]
pub struct Signal(Rc<Followed>);

struct Followed {
    rung: Cell<bool>,
    /// Native followers (tests, the simulator) waiting on it.
    wakers: RefCell<Vec<Waker>>,
    /// The runtime's own handle on it (in workerd, the promise).
    runtime: Box<dyn Any>,
}

impl Signal {
    /// A signal carrying `runtime`'s handle on it, and the bell that marks
    /// it rung, wakes its native followers and then calls `ring`.
    pub fn new(runtime: impl Any, ring: impl FnOnce() + 'static) -> (Bell, Signal) {
        let signal = Signal(Rc::new(Followed {
            rung: Cell::new(false),
            wakers: RefCell::new(Vec::new()),
            runtime: Box::new(runtime),
        }));
        let rung = signal.clone();
        let bell = Bell(Box::new(move || {
            rung.0.rung.set(true);
            let wakers = std::mem::take(&mut *rung.0.wakers.borrow_mut());
            wakers.into_iter().for_each(Waker::wake);
            ring();
        }));
        (bell, signal)
    }

    /// A signal with no handle of the runtime's, for runtimes whose
    /// wake-ups resume a task where it runs (a native executor, the
    /// simulator's timeline).
    pub fn native() -> (Bell, Signal) {
        Signal::new((), || {})
    }

    /// Whether its bell has rung.
    pub fn rung(&self) -> bool {
        self.0.rung.get()
    }

    /// The runtime's handle on it, if it is a `T`.
    pub fn runtime<T: Any>(&self) -> Option<&T> {
        self.0.runtime.downcast_ref()
    }

    /// A pause for runtimes whose wake-ups resume a task where it runs:
    /// ends when `signal` (if any) rings or `deadline` ends, whichever
    /// comes first.
    pub fn native_pause(
        signal: Option<&Signal>,
        deadline: impl Future<Output = ()> + 'static,
    ) -> Paused {
        let signal = signal.cloned();
        Box::pin(async move {
            let mut deadline = std::pin::pin!(deadline);
            std::future::poll_fn(|cx| {
                if let Some(signal) = &signal {
                    if signal.rung() {
                        return Poll::Ready(());
                    }
                    let mut wakers = signal.0.wakers.borrow_mut();
                    if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                        wakers.push(cx.waker().clone());
                    }
                }
                deadline.as_mut().poll(cx)
            })
            .await
        })
    }
}

/// On a native executor (tests, the command line): tokio's timer, and a
/// clock the caller gives, the one it decides requests at.
#[cfg(not(target_arch = "wasm32"))]
pub struct TokioPause<F>(pub F);

#[cfg(not(target_arch = "wasm32"))]
impl<F: Fn() -> u64> Pause for TokioPause<F> {
    fn now_ms(&self) -> u64 {
        (self.0)()
    }

    fn signal(&self) -> (Bell, Signal) {
        Signal::native()
    }

    fn until(&self, until_ms: u64, signal: Option<&Signal>) -> Paused {
        let wait = std::time::Duration::from_millis(until_ms.saturating_sub(self.now_ms()));
        Signal::native_pause(signal, tokio::time::sleep(wait))
    }
}
