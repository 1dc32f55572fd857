//! The rule-wide overrides' steps: which of a request's rules are due a
//! read of their rule-wide copy, that read after the response, and the
//! call of a request under the copies this isolate holds.

use std::time::Duration;

use super::state::Limiter;
use crate::decision::{
    outcomes::events::{Action, Event},
    transport::keys::rule_wide_key,
    transport::protocol::{read_rule_wide, Check, ScriptCall, ScriptRunner, WideRead},
};
use crate::rules::{overrides::Override, rule::DEFAULT_BUDGET_MS};

impl<'c, S: ScriptRunner> Limiter<'c, '_, S> {
    /// The rules of `checks` that take overrides whose rule-wide copy is
    /// due a read after this response.
    pub(super) fn reread_due(&self, checks: &[(Check<'c>, Vec<&str>)], now_ms: u64) -> Vec<String> {
        let mut wide = self.wide.borrow_mut();
        checks
            .iter()
            .filter(|(c, _)| c.rule.overrides && wide.start_read(&c.rule.name, now_ms))
            .map(|(c, _)| c.rule.name.clone())
            .collect()
    }

    /// Reads the rule-wide overrides of `rules` in one request, sent at
    /// `now_ms`, after the response has gone. A key that holds no override
    /// of its rule is none, logged; a fault is only logged: the isolate
    /// keeps that rule's copy and reads it again after a response a second
    /// later. A shared rule's, away from the home, are read from the home's Redis,
    /// which decides and grants under them.
    pub async fn reread(&self, rules: &[String], now_ms: u64) -> Vec<Event> {
        let keys: Vec<String> = rules.iter().map(|r| rule_wide_key(r)).collect();
        let budget = Duration::from_millis(DEFAULT_BUDGET_MS);
        let at_home = |name: &String| {
            let rule = self.config.rules.iter().find(|r| r.name == *name);
            self.home.is_some() && rule.is_some_and(|r| r.shared.is_some())
        };
        let mut read: Vec<Option<WideRead>> = vec![None; rules.len()];
        for home in [false, true] {
            let store = match home {
                true => self.home.unwrap_or(self.store),
                false => self.store,
            };
            let (picked, keys): (Vec<usize>, Vec<String>) = (rules.iter().zip(&keys))
                .enumerate()
                .filter(|(_, (r, _))| at_home(r) == home)
                .map(|(i, (_, k))| (i, k.clone()))
                .unzip();
            if keys.is_empty() {
                continue;
            }
            let got = match read_rule_wide(store, &keys, budget).await {
                Ok(got) => got,
                Err(e) => vec![WideRead::Failed(e); keys.len()],
            };
            for (i, got) in picked.into_iter().zip(got) {
                read[i] = Some(got);
            }
        }
        let read = read.into_iter().map(|r| r.unwrap_or(WideRead::NotText));
        let mut wide = self.wide.borrow_mut();
        let mut events = vec![];
        for ((rule, key), read) in rules.iter().zip(keys).zip(read) {
            let action = match read {
                WideRead::Text(text, pttl) if self.none_or_override(rule, &text) => {
                    wide.keep(rule, text, pttl, now_ms);
                    continue;
                }
                WideRead::Text(..) | WideRead::NotText => {
                    wide.keep(rule, String::new(), -1, now_ms);
                    Event::new(Action::OverrideIgnored, rule)
                }
                WideRead::Failed(error) => {
                    wide.failed(rule, now_ms);
                    Event {
                        error: Some(error.to_string()),
                        ..Event::new(Action::OverrideReadFailed, rule)
                    }
                }
            };
            events.push(Event {
                key: Some(key),
                ..action
            });
        }
        events
    }

    /// Whether `text`, read from rule `name`'s rule-wide key, is empty or
    /// an override of the rule's figures. Anything else counts as none and
    /// is never passed on: every decision would carry it, of any size.
    fn none_or_override(&self, name: &str, text: &str) -> bool {
        let rule = self.config.rules.iter().find(|r| r.name == name);
        text.is_empty() || rule.is_some_and(|r| Override::parse(text, &r.policy).is_some())
    }

    /// The call deciding `checks` at `now_ms`, under the rule-wide
    /// overrides this isolate holds.
    pub(super) fn call_for(&self, checks: &[(Check<'c>, Vec<&str>)], now_ms: u64) -> ScriptCall {
        let call = ScriptCall::decide(checks, self.clock(now_ms));
        self.under_rule_wide(call, checks, now_ms)
    }

    /// `call`, on `checks`' rules, under the rule-wide overrides this
    /// isolate holds at `now_ms`.
    pub(super) fn under_rule_wide(
        &self,
        call: ScriptCall,
        checks: &[(Check<'c>, Vec<&str>)],
        now_ms: u64,
    ) -> ScriptCall {
        let wide = self.wide.borrow();
        call.with_rule_wide(|i| wide.in_force(&checks.get(i)?.0.rule.name, now_ms))
    }
}
