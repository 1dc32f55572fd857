//! The isolate's decision calls in flight, by the rules and keys they
//! decide, and the requests waiting on each. A request that finds a call in
//! flight for exactly its rules and keys waits in that call's line instead
//! of sending its own; when the call returns, the newest request waiting
//! takes the turn and sends one call deciding every request still waiting,
//! itself last (`limiter::grouped` does the deciding). Bookkeeping only, on
//! the isolate's one thread; the runtime lends the clock and the pause
//! ([`Pause`]).

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    future::Future,
    pin::Pin,
    rc::Rc,
    task::{Context, Poll, Waker},
};

use super::{protocol::ScriptError, verdict::Decision};

/// What the runtime lends a request that waits on another's call.
pub trait Pause {
    /// The isolate's clock, ms: the one its requests are decided at.
    fn now_ms(&self) -> u64;

    /// A pause that ends at `until_ms` (`u64::MAX`: never), or sooner when
    /// its [`Bell`] rings (from any request). It must resume the request
    /// in the request's own context: workerd cancels a request that waits
    /// with no I/O of its own, and runs a continuation where whoever woke
    /// it runs.
    fn until(&self, until_ms: u64) -> (Bell, Paused);
}

/// A [`Pause`] under way.
pub type Paused = Pin<Box<dyn Future<Output = ()>>>;

/// Ends a pause early; ringing a pause that has ended does nothing.
pub struct Bell(Box<dyn FnOnce()>);

impl Bell {
    /// A bell that calls `ring` when rung.
    pub fn new(ring: impl FnOnce() + 'static) -> Bell {
        Bell(Box::new(ring))
    }

    fn ring(self) {
        (self.0)()
    }

    /// A bell and the future it ends, for runtimes whose wake-ups resume a
    /// task where it runs (a native executor, the simulator's timeline).
    pub fn pair() -> (Bell, Rung) {
        let rung = Rung(Rc::new((Cell::new(false), RefCell::new(None))));
        let state = rung.0.clone();
        let bell = Bell::new(move || {
            state.0.set(true);
            if let Some(waker) = state.1.borrow_mut().take() {
                waker.wake();
            }
        });
        (bell, rung)
    }
}

/// Ready once its [`Bell`] (from [`Bell::pair`]) rang.
pub struct Rung(Rc<(Cell<bool>, RefCell<Option<Waker>>)>);

impl Rung {
    /// Ends when this rings or `deadline` ends, whichever comes first.
    pub async fn or(self, deadline: impl Future<Output = ()>) {
        let mut deadline = std::pin::pin!(deadline);
        let mut rung = std::pin::pin!(self);
        std::future::poll_fn(|cx| match rung.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(()),
            Poll::Pending => deadline.as_mut().poll(cx),
        })
        .await
    }
}

impl Future for Rung {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 .0.get() {
            return Poll::Ready(());
        }
        *self.0 .1.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// A call that decided several requests at once, as each of them saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shared {
    /// Which call: the isolate numbers its group calls from 1.
    pub call: u64,
    /// This request's place among those it decided, from 0 (the order in
    /// which the script decided them).
    pub place: usize,
    /// Whether this request sent it (the last in the group).
    pub sent: bool,
}

/// What became of a request in a line.
enum State {
    /// Waiting for the call in flight.
    Waiting,
    /// Its turn to send: the call it waited for returned.
    Turn,
    /// In a group another request is sending.
    Taken,
    /// Decided by that group's call, or failed with it.
    Done(Result<Decision, ScriptError>, Shared),
}

/// A request in a line.
struct Seat {
    /// What it costs each rule.
    costs: Vec<u64>,
    /// When its budget runs out, ms.
    deadline_ms: u64,
    state: RefCell<State>,
    /// Ends its pause; taken when rung.
    bell: RefCell<Option<Bell>>,
}

impl Seat {
    fn ring(&self) {
        let bell = self.bell.borrow_mut().take();
        if let Some(bell) = bell {
            bell.ring();
        }
    }
}

/// The requests behind one call in flight.
struct Line {
    /// Who holds the line: each hold is numbered, so that a holder that
    /// lapsed cannot release its successor's.
    holder: u64,
    /// Past this, the holder vanished (a request cancelled mid-call) and
    /// the next request leads: a call ends within its budget.
    until_ms: u64,
    /// Oldest first.
    waiting: Vec<Rc<Seat>>,
}

/// Every line of one isolate.
pub struct InFlight {
    lines: RefCell<HashMap<String, Line>>,
    /// Holds given, and group calls sent, so far.
    holds: Cell<u64>,
    groups: Cell<u64>,
    pause: Box<dyn Pause>,
    /// Whether a request leaves its line when its budget runs out.
    budgets: bool,
}

/// How long past its budget a held line counts as held: a holder that
/// does not release it by then vanished.
const LAPSE_MS: u64 = 1_000;

impl InFlight {
    /// No call in flight; requests wait with `pause`.
    pub fn new(pause: impl Pause + 'static) -> InFlight {
        InFlight {
            lines: RefCell::new(HashMap::new()),
            holds: Cell::new(0),
            groups: Cell::new(0),
            pause: Box::new(pause),
            budgets: true,
        }
    }

    /// For a replay whose calls never time out (`simulate`): a request
    /// waits in line for as long as it takes.
    pub fn ignoring_budgets(self) -> InFlight {
        InFlight {
            budgets: false,
            ..self
        }
    }

    /// The isolate's clock, ms.
    pub fn now_ms(&self) -> u64 {
        self.pause.now_ms()
    }

    /// Whether a call for `line` is in flight at `now_ms`.
    pub fn busy(&self, line: &str, now_ms: u64) -> bool {
        self.lines
            .borrow()
            .get(line)
            .is_some_and(|l| !self.budgets || now_ms < l.until_ms)
    }

    /// Holds `line` for a call this request sends within `budget_ms` of
    /// `now_ms`; released (the turn passed on) when the hold is dropped.
    pub fn hold(&self, line: &str, now_ms: u64, budget_ms: u64) -> Hold<'_> {
        let holder = self.next_holder();
        let until_ms = now_ms + budget_ms + LAPSE_MS;
        let mut lines = self.lines.borrow_mut();
        match lines.get_mut(line) {
            // Taken over from a holder that vanished: its line waits on.
            Some(l) => (l.holder, l.until_ms) = (holder, until_ms),
            None => {
                let waiting = Vec::new();
                let l = Line {
                    holder,
                    until_ms,
                    waiting,
                };
                lines.insert(line.to_owned(), l);
            }
        }
        Hold {
            in_flight: self,
            line: line.to_owned(),
            holder,
        }
    }

    /// Joins the requests waiting on `line`'s call (which must be busy):
    /// this one costs `costs` and may wait until `deadline_ms`.
    pub fn join(&self, line: &str, costs: Vec<u64>, deadline_ms: u64) -> Waiter<'_> {
        let seat = Rc::new(Seat {
            costs,
            deadline_ms,
            state: RefCell::new(State::Waiting),
            bell: RefCell::new(None),
        });
        if let Some(l) = self.lines.borrow_mut().get_mut(line) {
            l.waiting.push(seat.clone());
        }
        Waiter {
            in_flight: self,
            line: line.to_owned(),
            seat,
        }
    }

    fn next_holder(&self) -> u64 {
        self.holds.set(self.holds.get() + 1);
        self.holds.get()
    }

    /// The call of `holder` on `line` is over: the newest request still
    /// waiting takes the turn, having the most time left to send in; with
    /// none, the line is gone.
    fn release(&self, line: &str, holder: u64) {
        let turn = {
            let mut lines = self.lines.borrow_mut();
            let Some(l) = lines.get_mut(line).filter(|l| l.holder == holder) else {
                return;
            };
            match l.waiting.pop() {
                Some(seat) => {
                    l.holder = self.next_holder();
                    l.until_ms = seat.deadline_ms + LAPSE_MS;
                    *seat.state.borrow_mut() = State::Turn;
                    seat
                }
                None => {
                    lines.remove(line);
                    return;
                }
            }
        };
        turn.ring();
    }
}

/// A line held by the request whose call is in flight.
pub struct Hold<'a> {
    in_flight: &'a InFlight,
    line: String,
    holder: u64,
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.in_flight.release(&self.line, self.holder);
    }
}

/// How a request's wait in line ended.
pub enum Woken {
    /// Its turn to send: the call it waited for returned.
    Turn,
    /// A group's call decided it (or failed).
    Done(Result<Decision, ScriptError>, Shared),
    /// Its budget ran out first.
    Expired,
}

/// A request waiting in a line.
pub struct Waiter<'a> {
    in_flight: &'a InFlight,
    line: String,
    seat: Rc<Seat>,
}

impl<'a> Waiter<'a> {
    /// Waits for the turn, a decision, or the end of the budget.
    pub async fn wait(&self) -> Woken {
        loop {
            let now_ms = self.in_flight.now_ms();
            let woken = match &*self.seat.state.borrow() {
                State::Done(result, shared) => Some(Woken::Done(result.clone(), *shared)),
                // A turn that came too late to send in is passed on.
                _ if self.in_flight.budgets && now_ms >= self.seat.deadline_ms => {
                    Some(Woken::Expired)
                }
                State::Turn => Some(Woken::Turn),
                _ => None,
            };
            if let Some(woken) = woken {
                return woken;
            }
            let until_ms = match self.in_flight.budgets {
                true => self.seat.deadline_ms,
                false => u64::MAX,
            };
            let (bell, paused) = self.in_flight.pause.until(until_ms);
            *self.seat.bell.borrow_mut() = Some(bell);
            paused.await;
        }
    }

    /// With the turn: every request still waiting, oldest first, and this
    /// one last, make a group this request sends within `budget_ms` of
    /// `now_ms`; they wait for [`Sending::deliver`].
    pub fn take(self, now_ms: u64, budget_ms: u64) -> Sending<'a> {
        let hold = self.in_flight.hold(&self.line, now_ms, budget_ms);
        let seats = {
            let mut lines = self.in_flight.lines.borrow_mut();
            let waiting = lines.get_mut(&self.line).map(|l| &mut l.waiting);
            waiting.map(std::mem::take).unwrap_or_default()
        };
        for seat in &seats {
            *seat.state.borrow_mut() = State::Taken;
        }
        *self.seat.state.borrow_mut() = State::Taken;
        let mut call = self.in_flight.groups.get();
        if !seats.is_empty() {
            call += 1;
            self.in_flight.groups.set(call);
        }
        Sending {
            hold,
            seats,
            call,
            costs: self.seat.costs.clone(),
        }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let state = std::mem::replace(&mut *self.seat.state.borrow_mut(), State::Taken);
        match state {
            // Left before its turn (its budget ran out): out of the line.
            State::Waiting => {
                if let Some(l) = self.in_flight.lines.borrow_mut().get_mut(&self.line) {
                    l.waiting.retain(|s| !Rc::ptr_eq(s, &self.seat));
                }
            }
            // Answered without a call (the block cache, leased units): the
            // turn goes on.
            State::Turn => {
                let holder = self
                    .in_flight
                    .lines
                    .borrow()
                    .get(&self.line)
                    .map(|l| l.holder);
                if let Some(holder) = holder {
                    self.in_flight.release(&self.line, holder);
                }
            }
            State::Taken | State::Done(..) => {}
        }
    }
}

/// A group this request sends: the others, oldest first, and itself.
pub struct Sending<'a> {
    hold: Hold<'a>,
    seats: Vec<Rc<Seat>>,
    call: u64,
    costs: Vec<u64>,
}

impl Sending<'_> {
    /// Each request's costs per rule, in the order the script decides
    /// them: the others', then this one's.
    pub fn costs(&self) -> Vec<Vec<u64>> {
        let others = self.seats.iter().map(|s| s.costs.clone());
        others.chain([self.costs.clone()]).collect()
    }

    /// Whether no other request is in the group.
    pub fn alone(&self) -> bool {
        self.seats.is_empty()
    }

    /// How this request saw the group's call.
    pub fn shared(&self) -> Shared {
        Shared {
            call: self.call,
            place: self.seats.len(),
            sent: true,
        }
    }

    /// Gives each other request its result, in the group's order, and
    /// ends the hold: the next request waiting takes the turn.
    pub fn deliver(self, results: impl IntoIterator<Item = Result<Decision, ScriptError>>) {
        for (place, (seat, result)) in self.seats.iter().zip(results).enumerate() {
            let shared = Shared {
                call: self.call,
                place,
                sent: false,
            };
            *seat.state.borrow_mut() = State::Done(result, shared);
            seat.ring();
        }
        drop(self.hold);
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

    fn until(&self, until_ms: u64) -> (Bell, Paused) {
        let (bell, rung) = Bell::pair();
        let wait = std::time::Duration::from_millis(until_ms.saturating_sub(self.now_ms()));
        (bell, Box::pin(rung.or(tokio::time::sleep(wait))))
    }
}
