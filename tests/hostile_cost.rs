//! What a hostile request costs the worker's own path, natively: every
//! shape of `edge_limiter_local::hostile` goes through what the worker does
//! with a request (`RequestMeta::new`, `Config::needs_body` and `needs_cf`,
//! `Limiter::handle` up to and through its call to a real Redis behind the
//! REST endpoint), and a counting global allocator, in this test binary
//! alone, holds its allocations, bytes allocated and peak heap to the
//! ordinary request's plus a small multiple of what the request carries;
//! a panic on any of them fails it too. Nothing here reads a clock:
//! `scripts/bench --parts 8` reports CPU.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::{Cell, RefCell},
};

use edge_limiter::{
    decision::{
        limiter::{Limiter, Outcome},
        memory::block_cache::BlockCache,
        memory::in_flight::InFlight,
        memory::leases::Leases,
        memory::rule_wide::RuleWide,
        runtime::TokioPause,
        transport::redis_rest::RestClient,
    },
    operator::validate::check_wrangler_toml,
    rules::{
        body::MAX_BODY_BYTES,
        config::Config,
        request::{CfField, RequestMeta},
    },
};
use edge_limiter_local::hostile::{self, Shape};
use support::{report::Table, Backend};

/// At most one allocation per this many bytes the request carries, beyond
/// the ordinary request's.
const BYTES_PER_ALLOCATION: usize = 64;
/// At most this many bytes allocated (every block, and what a block grew
/// by) per byte the request carries, beyond the ordinary request's.
const ALLOCATED_PER_BYTE: usize = 32;
/// At most this many bytes of heap in use at once per byte the request
/// carries, beyond the ordinary request's.
const PEAK_PER_BYTE: usize = 24;
/// What a request may vary by from one run to the next, outside its
/// content (how the REST reply arrives): allocations, and bytes.
const SLACK_ALLOCATIONS: u64 = 64;
const SLACK_BYTES: u64 = 16 * 1024;

/// What this thread allocated while counting.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    allocations: u64,
    bytes: u64,
    live: i64,
    peak: i64,
}

thread_local! {
    static TALLY: Cell<Option<Tally>> = const { Cell::new(None) };
}

/// The system allocator, counting what the thread that armed it asks for:
/// the test harness runs other threads alongside.
struct Counting;

/// Notes a heap that grew by `grown` bytes, in a block obtained (`new`)
/// or resized.
fn note(grown: i64, new: bool) {
    let _ = TALLY.try_with(|cell| {
        if let Some(mut t) = cell.get() {
            if new || grown > 0 {
                t.allocations += 1;
                t.bytes += grown.max(0) as u64;
            }
            t.live += grown;
            t.peak = t.peak.max(t.live);
            cell.set(Some(t));
        }
    });
}

// SAFETY: every call goes to `System` unchanged; the counting touches only
// a thread-local `Cell` of plain integers, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as i64, true);
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as i64, true);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as i64), false);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size as i64 - layout.size() as i64, false);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f`, counting what this thread allocates meanwhile.
fn counted<T>(f: impl FnOnce() -> T) -> (T, Tally) {
    TALLY.with(|cell| cell.set(Some(Tally::default())));
    let out = f();
    let tally = TALLY.with(|cell| cell.take()).unwrap_or_default();
    (out, tally)
}

/// The host every request is for.
const HOST: &str = "example.com";

/// The rules every request is decided under (`hostile::RULES`).
fn config() -> Config {
    let toml = format!("name = \"hostile\"\n{}", hostile::RULES);
    let mut environments = check_wrangler_toml(&toml).expect("the rules are TOML");
    environments.remove(0).1.expect("the rules are valid")
}

/// What the worker does with `shape` before it answers (`edge/entry.rs`):
/// the request read, its body read if a rule asks for it (at most
/// `MAX_BODY_BYTES`, or none and `body_cut`), `request.cf` if a rule asks,
/// then decided. Whether Redis was reached, so that the whole path ran.
async fn worker_path(config: &Config, limiter: &Limiter<'_, '_, RestClient>, shape: Shape) -> bool {
    let Shape {
        method,
        path,
        query,
        headers,
        body,
        ..
    } = shape;
    let mut meta = RequestMeta::new(method, HOST, &path, query.as_deref(), headers);
    if config.needs_body(&meta) {
        meta.body = (body.len() <= MAX_BODY_BYTES).then_some(body);
        meta.body_cut = meta.body.is_none();
    }
    if config.needs_cf(&meta) {
        meta.cf = vec![(CfField::Country, "NL".to_owned())];
    }
    let handled = limiter.handle(&meta, 0).await;
    !matches!(handled.outcome, Outcome::Unavailable)
}

#[test]
fn a_hostile_request_costs_a_small_multiple_of_what_it_carries() {
    let backend = Backend::start();
    let config = config();
    let (cache, leases, wide) = (
        RefCell::new(BlockCache::new(config.cache_hold_ms)),
        RefCell::new(Leases::new()),
        RefCell::new(RuleWide::new()),
    );
    let limiter = Limiter {
        config: &config,
        store: &backend.client,
        cache: &cache,
        leases: &leases,
        wide: &wide,
        in_flight: &InFlight::new(TokioPause(|| 0)),
        pinned: false,
        home: None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let send = |shape: &Shape| {
        let shape = shape.clone();
        let (decided, tally) = counted(|| runtime.block_on(worker_path(&config, &limiter, shape)));
        assert!(decided, "Redis did not decide: the path stopped short");
        tally
    };
    // The first requests load the script and open the connection.
    let ordinary = hostile::ordinary();
    for _ in 0..3 {
        send(&ordinary);
    }
    let base = (0..3)
        .map(|_| send(&ordinary))
        .reduce(|a, b| Tally {
            allocations: a.allocations.max(b.allocations),
            bytes: a.bytes.max(b.bytes),
            live: 0,
            peak: a.peak.max(b.peak),
        })
        .unwrap();

    let mut table = Table::new(
        "What a request costs the worker's path, natively, beyond an ordinary request",
        &[
            "shape",
            "carries, bytes",
            "allocations",
            "per byte",
            "bytes allocated",
            "per byte",
            "peak heap",
            "per byte",
        ],
    );
    table.row(vec![
        format!("{} (the base)", ordinary.name),
        ordinary.size().to_string(),
        base.allocations.to_string(),
        "-".into(),
        base.bytes.to_string(),
        "-".into(),
        base.peak.to_string(),
        "-".into(),
    ]);
    let mut over = Vec::new();
    for shape in hostile::shapes() {
        let n = shape.size();
        let t = send(&shape);
        let allocations = t.allocations.saturating_sub(base.allocations);
        let bytes = t.bytes.saturating_sub(base.bytes);
        let peak = (t.peak - base.peak).max(0) as u64;
        let per = |x: u64| format!("{:.3}", x as f64 / n as f64);
        table.row(vec![
            shape.name.to_owned(),
            n.to_string(),
            allocations.to_string(),
            per(allocations),
            bytes.to_string(),
            per(bytes),
            peak.to_string(),
            per(peak),
        ]);
        let n = n as u64;
        if allocations > SLACK_ALLOCATIONS + n / BYTES_PER_ALLOCATION as u64 {
            over.push(format!("{}: {allocations} allocations", shape.name));
        }
        if bytes > SLACK_BYTES + n * ALLOCATED_PER_BYTE as u64 {
            over.push(format!("{}: {bytes} bytes allocated", shape.name));
        }
        if peak > SLACK_BYTES + n * PEAK_PER_BYTE as u64 {
            over.push(format!("{}: {peak} bytes of heap at once", shape.name));
        }
    }
    table.print("hostile_cost");
    assert!(
        over.is_empty(),
        "beyond one allocation per {BYTES_PER_ALLOCATION} bytes carried, {ALLOCATED_PER_BYTE} \
         bytes allocated or {PEAK_PER_BYTE} of heap at once per byte (over an ordinary \
         request's):\n{}",
        over.join("\n")
    );
}
