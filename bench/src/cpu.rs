//! CPU time per process from `/proc`, to tell where a worker's overhead is
//! spent: in its own isolate, in the REST endpoint, or in Redis. Under load
//! on two cores, latency mixes everyone's queueing; CPU time per request
//! does not.

use std::collections::HashMap;

/// Linux reports CPU time in clock ticks of 1/100 s on every architecture
/// this runs on (USER_HZ).
const TICKS_PER_SECOND: f64 = 100.0;

/// What `/proc/<pid>/stat` says about one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub comm: String,
    pub ppid: u32,
    pub pgrp: u32,
    /// User plus system time, in ticks.
    pub ticks: u64,
}

/// Every process's CPU time at one instant.
#[derive(Debug, Default)]
pub struct Snapshot(HashMap<u32, Proc>);

pub fn snapshot() -> Snapshot {
    let mut procs = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Snapshot(procs);
    };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some(p) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| parse(&s))
        {
            procs.insert(pid, p);
        }
    }
    Snapshot(procs)
}

impl Snapshot {
    /// CPU seconds that the processes `pick` selects (by pid and stat) used
    /// between `before` and this snapshot (processes that started meanwhile
    /// count from zero).
    pub fn since(&self, before: &Snapshot, pick: impl Fn(u32, &Proc) -> bool) -> f64 {
        let ticks: u64 = self
            .0
            .iter()
            .filter(|(pid, p)| pick(**pid, p))
            .map(|(pid, p)| p.ticks - before.0.get(pid).map_or(0, |b| b.ticks.min(p.ticks)))
            .sum();
        ticks as f64 / TICKS_PER_SECOND
    }
}

impl Snapshot {
    /// The processes of group `pgrp` named `comm` with an argument that
    /// starts with `arg` (`--flag` finds `--flag=value` too).
    pub fn with_arg(&self, pgrp: u32, comm: &str, arg: &str) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .0
            .iter()
            .filter(|(_, p)| p.pgrp == pgrp && p.comm == comm)
            .map(|(pid, _)| *pid)
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| {
                    line.split(|&b| b == 0)
                        .any(|a| a.starts_with(arg.as_bytes()))
                })
            })
            .collect();
        pids.sort_unstable();
        pids
    }

    /// Share of one core each process name used between `before` and this
    /// snapshot, `seconds` apart, busiest first; only those above `min`.
    pub fn busiest(&self, before: &Snapshot, seconds: f64, min: f64) -> Vec<(String, f64)> {
        let mut ticks: HashMap<&str, u64> = HashMap::new();
        for (pid, p) in &self.0 {
            *ticks.entry(&p.comm).or_default() +=
                p.ticks - before.0.get(pid).map_or(0, |b| b.ticks.min(p.ticks));
        }
        let mut busy: Vec<(String, f64)> = ticks
            .into_iter()
            .map(|(name, t)| (name.to_owned(), t as f64 / TICKS_PER_SECOND / seconds))
            .filter(|(_, share)| *share >= min)
            .collect();
        busy.sort_by(|a, b| b.1.total_cmp(&a.1));
        busy
    }
}

/// Reads `pid (comm) state ppid pgrp ... utime stime ...`; the name may hold
/// spaces and parentheses, so fields are counted after its last `)`.
fn parse(stat: &str) -> Option<Proc> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    let field = |n: usize| rest.get(n - 3)?.parse::<u64>().ok();
    Some(Proc {
        comm,
        ppid: u32::try_from(field(4)?).ok()?,
        pgrp: u32::try_from(field(5)?).ok()?,
        ticks: field(14)? + field(15)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_stat_line_with_an_awkward_name() {
        let stat = "4242 (my (odd) name) S 1 4200 4200 0 -1 4194560 151 0 0 0 12 3 0 0 20 0 1 0 1234 1000 10 18446744073709551615";
        assert_eq!(
            parse(stat),
            Some(Proc {
                comm: "my (odd) name".into(),
                ppid: 1,
                pgrp: 4200,
                ticks: 15
            })
        );
        assert_eq!(parse("garbage"), None);
    }

    #[test]
    fn differences_cover_only_picked_processes() {
        let proc = |pgrp, ticks| Proc {
            comm: "x".into(),
            ppid: 1,
            pgrp,
            ticks,
        };
        let before = Snapshot(HashMap::from([(1, proc(7, 100)), (2, proc(8, 50))]));
        let after = Snapshot(HashMap::from([
            (1, proc(7, 250)),
            (2, proc(8, 90)),
            (3, proc(7, 10)),
        ]));
        assert_eq!(after.since(&before, |_, p| p.pgrp == 7), 1.6);
        assert_eq!(after.since(&before, |_, p| p.pgrp == 8), 0.4);
        assert_eq!(after.since(&before, |pid, _| pid == 3), 0.1);
    }

    #[test]
    fn busiest_groups_by_name() {
        let proc = |comm: &str, ticks| Proc {
            comm: comm.into(),
            ppid: 1,
            pgrp: 1,
            ticks,
        };
        let before = Snapshot(HashMap::from([
            (1, proc("rustc", 0)),
            (2, proc("rustc", 0)),
        ]));
        let after = Snapshot(HashMap::from([
            (1, proc("rustc", 60)),
            (2, proc("rustc", 30)),
            (3, proc("bash", 1)),
        ]));
        assert_eq!(
            after.busiest(&before, 1.0, 0.05),
            [("rustc".to_owned(), 0.9)]
        );
    }

    #[test]
    fn this_process_is_visible() {
        let me = std::process::id();
        assert!(snapshot().0.contains_key(&me));
    }
}
