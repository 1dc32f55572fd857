//! The isolate's decision calls in flight, by the rules and keys they
//! decide, and the requests waiting on each. A request that finds a call in
//! flight for exactly its rules and keys waits in that call's line instead
//! of sending its own; when the call returns, the newest request waiting
//! takes the turn and sends one call deciding every request still waiting,
//! itself last (`limiter::grouped` does the deciding). Bookkeeping only, on
//! the isolate's one thread; the runtime lends the clock, the pause and
//! the signal that ends it ([`Pause`]).

use std::{
    cell::{Cell, RefCell},
    rc::Rc,
};

use super::seeded::SeededMap;
use crate::decision::{
    outcomes::verdict::Decision,
    runtime::{Bell, Pause, Signal},
    transport::protocol::ScriptError,
};

/// A call that decided several requests at once, as each of them saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedCall {
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
    Done(Result<Decision, ScriptError>, SharedCall),
}

/// A request in a line.
struct Seat {
    /// What it costs each rule.
    costs: Vec<u64>,
    /// When its budget runs out, ms.
    deadline_ms: u64,
    state: RefCell<State>,
}

/// The requests behind one call in flight.
struct Line {
    /// Who holds the line: each hold is numbered, so that a holder that
    /// lapsed cannot release its successor's.
    holder: u64,
    /// Past this, the holder vanished (a request cancelled mid-call) and
    /// the next request leads: a call ends within its budget.
    until_ms: u64,
    /// What its holder rings when its call returns, which the requests
    /// waiting follow.
    signal: Signal,
    /// Oldest first.
    waiting: Vec<Rc<Seat>>,
}

/// Every line of one isolate.
pub struct InFlight {
    lines: RefCell<SeededMap<String, Line>>,
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

/// How soon a request that finds its line's signal rung, the turn passing
/// to a request that has not yet made its own, looks again.
const RECHECK_MS: u64 = 1;

impl InFlight {
    /// No call in flight; requests wait with `pause`.
    pub fn new(pause: impl Pause + 'static) -> InFlight {
        InFlight {
            lines: RefCell::new(SeededMap::default()),
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
        let (bell, signal) = self.pause.signal();
        let mut lines = self.lines.borrow_mut();
        match lines.get_mut(line) {
            // Taken over from a holder that vanished: its line waits on.
            Some(l) => (l.holder, l.until_ms, l.signal) = (holder, until_ms, signal),
            None => {
                let waiting = Vec::new();
                let l = Line {
                    holder,
                    until_ms,
                    signal,
                    waiting,
                };
                lines.insert(line.to_owned(), l);
            }
        }
        Hold {
            in_flight: self,
            line: line.to_owned(),
            holder,
            bell: Some(bell),
        }
    }

    /// Joins the requests waiting on `line`'s call (which must be busy):
    /// this one costs `costs` and may wait until `deadline_ms`.
    pub fn join(&self, line: &str, costs: Vec<u64>, deadline_ms: u64) -> Waiter<'_> {
        let seat = Rc::new(Seat {
            costs,
            deadline_ms,
            state: RefCell::new(State::Waiting),
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
    /// none, the line is gone. The holder's bell, rung after, wakes them.
    fn release(&self, line: &str, holder: u64) {
        let mut lines = self.lines.borrow_mut();
        let Some(l) = lines.get_mut(line).filter(|l| l.holder == holder) else {
            return;
        };
        match l.waiting.pop() {
            Some(seat) => {
                l.holder = self.next_holder();
                l.until_ms = seat.deadline_ms + LAPSE_MS;
                *seat.state.borrow_mut() = State::Turn;
            }
            None => {
                lines.remove(line);
            }
        }
    }
}

/// A line held by the request whose call is in flight.
pub struct Hold<'a> {
    in_flight: &'a InFlight,
    line: String,
    holder: u64,
    /// Rings the line's signal: rung by the holder, in its own context.
    bell: Option<Bell>,
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.in_flight.release(&self.line, self.holder);
        if let Some(bell) = self.bell.take() {
            bell.ring();
        }
    }
}

/// How a request's wait in line ended.
pub enum Woken {
    /// Its turn to send: the call it waited for returned.
    Turn,
    /// A group's call decided it (or failed).
    Done(Result<Decision, ScriptError>, SharedCall),
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
            let signal = self
                .in_flight
                .lines
                .borrow()
                .get(&self.line)
                .map(|l| l.signal.clone());
            let paused = match signal.filter(|s| !s.rung()) {
                Some(signal) => self.in_flight.pause.until(until_ms, Some(&signal)),
                // The turn is passing to a request that has not made its
                // signal yet: look again soon, on a timer of this request's.
                None => {
                    let soon = now_ms.saturating_add(RECHECK_MS);
                    self.in_flight.pause.until(until_ms.min(soon), None)
                }
            };
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
    pub fn shared(&self) -> SharedCall {
        SharedCall {
            call: self.call,
            place: self.seats.len(),
            sent: true,
        }
    }

    /// Gives each other request its result, in the group's order, and
    /// ends the hold: the next request waiting takes the turn.
    pub fn deliver(self, results: impl IntoIterator<Item = Result<Decision, ScriptError>>) {
        for (place, (seat, result)) in self.seats.iter().zip(results).enumerate() {
            let shared = SharedCall {
                call: self.call,
                place,
                sent: false,
            };
            *seat.state.borrow_mut() = State::Done(result, shared);
        }
        drop(self.hold);
    }
}
