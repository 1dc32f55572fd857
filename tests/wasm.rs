//! The code that touches JS values, run as wasm32 in node.
#![cfg(target_arch = "wasm32")]

use std::{cell::RefCell, rc::Rc, task::Poll, time::Duration};

use edge_limiter::{
    decision::{
        transport::protocol::LIMITER,
        transport::redis_rest::{without_stacks, RestClient, RestError},
    },
    edge::{
        entry::{request_meta, with_headers},
        microtasks,
    },
};
use wasm_bindgen::prelude::wasm_bindgen;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::wasm_bindgen_test;
use worker::{worker_sys::web_sys, Headers, Method, Request, RequestInit, Response};

#[wasm_bindgen_test]
fn request_meta_reads_method_path_query_and_the_headers_named() {
    let headers = Headers::new();
    headers.set("CF-Connecting-IP", "203.0.113.5").unwrap();
    headers.set("X-Api-Key", "k1").unwrap();
    headers.append("X-Api-Key", "k2").unwrap();
    headers.set("X-Other", "o").unwrap();
    let mut init = RequestInit::new();
    init.with_method(Method::Post).with_headers(headers);
    let req =
        Request::new_with_init("https://API.Example.com:8443/%61pi//v1/?x=1&y=%7B", &init).unwrap();
    let url = req.url().unwrap();
    let named = ["cf-connecting-ip", "x-api-key", "cookie"].map(String::from);
    let meta = request_meta(req.inner(), &url, &named);
    assert_eq!(meta.method, "POST");
    assert_eq!(meta.host, "api.example.com");
    assert_eq!(meta.path, "/api/v1", "normalized as the rules see it");
    assert_eq!(meta.query.as_deref(), Some("x=1&y=%7B"));
    assert_eq!(meta.header("cf-connecting-ip"), Some("203.0.113.5"));
    assert_eq!(
        meta.header("x-api-key"),
        Some("k1, k2"),
        "one value, as the runtime joins a header sent twice"
    );
    assert_eq!(meta.headers.len(), 2, "{:?}", meta.headers);
    assert_eq!(meta.header("x-other"), None, "a header no rule reads");
}

#[wasm_bindgen_test]
fn outcome_headers_are_added_and_the_origins_kept() {
    let origin_headers = Headers::new();
    origin_headers.set("Content-Type", "text/html").unwrap();
    origin_headers.append("Set-Cookie", "a=1").unwrap();
    origin_headers.append("Set-Cookie", "b=2").unwrap();
    let response: web_sys::Response = Response::ok("page")
        .unwrap()
        .with_headers(origin_headers)
        .into();
    let headers = [
        ("RateLimit".into(), "\"r\";r=1;t=2".into()),
        ("RateLimit-Policy".into(), "\"r\";q=3;w=4".into()),
    ];
    let out = with_headers(response, &headers).unwrap();
    assert_eq!(out.status(), 200);
    let h = Headers(out.headers());
    assert_eq!(h.get("content-type").unwrap().as_deref(), Some("text/html"));
    let cookies: Vec<String> = h
        .entries()
        .filter(|(n, _)| n == "set-cookie")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        cookies,
        ["a=1", "b=2"],
        "each Set-Cookie kept as its own line"
    );
    assert_eq!(
        h.get("ratelimit").unwrap().as_deref(),
        Some("\"r\";r=1;t=2")
    );
    assert_eq!(
        h.get("ratelimit-policy").unwrap().as_deref(),
        Some("\"r\";q=3;w=4")
    );
}

#[wasm_bindgen_test]
async fn an_unreachable_endpoint_is_a_typed_error_within_budget() {
    // Port 1 on loopback: nothing listens there.
    let client = RestClient::new("http://127.0.0.1:1", "secret-token").unwrap();
    let err = client
        .run_script(
            &LIMITER,
            &["k".into()],
            &["decide".into(), "".into()],
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, RestError::Transport(_) | RestError::Timeout { .. }),
        "{err:?}"
    );
    assert!(!err.to_string().contains("secret-token"));
}

#[wasm_bindgen_test]
async fn a_body_is_read_with_no_stack_captured_and_the_limit_put_back() {
    let limit = || js_sys::Error::stack_trace_limit().as_f64();
    let before = js_sys::Error::stack_trace_limit();
    js_sys::Error::set_stack_trace_limit(&7.into());
    // Pending once, as a body is until its promise settles: both polls
    // run at 0, and outside them the limit stays as it was.
    let seen = Rc::new(RefCell::new(vec![]));
    let polls = seen.clone();
    let body = std::future::poll_fn(move |cx| {
        polls.borrow_mut().push(limit());
        if polls.borrow().len() < 2 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(())
    });
    let read = without_stacks(body);
    assert_eq!(limit(), Some(7.0));
    read.await;
    assert_eq!(*seen.borrow(), [Some(0.0), Some(0.0)]);
    assert_eq!(limit(), Some(7.0));
    js_sys::Error::set_stack_trace_limit(&before);
}

#[wasm_bindgen(inline_js = "
export function countQueueMicrotask() {
  const real = globalThis.queueMicrotask;
  let calls = 0;
  globalThis.queueMicrotask = (task) => { calls += 1; real(task); };
  return () => { globalThis.queueMicrotask = real; return calls; };
}
")]
extern "C" {
    /// Counts calls to the global `queueMicrotask` from now on; the
    /// function it returns puts the global back and returns the count.
    #[wasm_bindgen(js_name = countQueueMicrotask)]
    fn count_queue_microtask() -> js_sys::Function;
}

#[wasm_bindgen_test]
async fn the_executor_wakes_futures_through_promises_not_queue_microtask() {
    microtasks::put_back();
    let global = js_sys::global();
    let key = wasm_bindgen::JsValue::from_str("queueMicrotask");
    let put_back = js_sys::Reflect::get(&global, &key).unwrap();
    assert!(put_back.is_function(), "the global is back for other code");
    let stop = count_queue_microtask();
    // Each settled promise wakes this task: a wake-up for the executor
    // to queue.
    for _ in 0..3 {
        let settled = js_sys::Promise::resolve(&wasm_bindgen::JsValue::from(1));
        JsFuture::from(settled).await.unwrap();
    }
    let calls = stop.call0(&wasm_bindgen::JsValue::UNDEFINED).unwrap();
    assert_eq!(calls.as_f64(), Some(0.0));
}
