//! Clients that open a connection and stop sending: a request head that
//! never completes loses its connection, and a body that stops part-way
//! gets a 408 in the path's API shape, each after `--read-timeout`, as does
//! one that trickles in too slowly to finish; the server answers others
//! meanwhile and afterwards. Routes off the API read no body.

use it::{model, Server};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const TIMEOUT_S: u64 = 1;

fn start() -> Server {
    Server::start(&model("tiny/tiny-llama-f32"), &["--read-timeout", &TIMEOUT_S.to_string()])
}

fn connect(s: &Server) -> TcpStream {
    let sock = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    // A server without the deadline would hold the read forever: fail instead.
    sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    sock
}

/// A connection and the instant the server's clock for it can start from at
/// the earliest: taken before connecting, as the server may start its timer
/// at accept, before `connect` returns here.
fn connect_clocked(s: &Server) -> (TcpStream, Instant) {
    let since = Instant::now();
    (connect(s), since)
}

/// Everything until the server closes, and how long that took.
fn read_until_closed(mut sock: TcpStream, since: Instant) -> (String, Duration) {
    let mut raw = Vec::new();
    sock.read_to_end(&mut raw).unwrap_or_else(|e| panic!("the server kept the stalled connection: {e}"));
    (String::from_utf8_lossy(&raw).into_owned(), since.elapsed())
}

fn answered(s: &Server) {
    let r = s.post("/v1/completions", &json!({ "prompt": [1, 2, 3], "max_tokens": 2 }));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_request_head_that_never_completes_loses_its_connection() {
    let s = start();
    let (mut sock, since) = connect_clocked(&s);
    write!(sock, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: app").unwrap();
    answered(&s);
    let (raw, took) = read_until_closed(sock, since);
    assert!(took >= Duration::from_secs(TIMEOUT_S), "closed after {took:?}");
    assert!(!raw.contains("200 OK"), "{raw}");
    // An idle keep-alive connection is closed the same way.
    let mut sock = connect(&s);
    write!(sock, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let since = Instant::now();
    let (raw, took) = read_until_closed(sock, since);
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(took >= Duration::from_secs(TIMEOUT_S), "closed after {took:?}");
    answered(&s);
}

#[test]
fn a_body_that_stops_part_way_gets_a_408_in_the_apis_shape() {
    let s = start();
    for path in ["/v1/chat/completions", "/v1/responses", "/v1/messages"] {
        let (mut sock, since) = connect_clocked(&s);
        write!(
            sock,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{{\"messages\": ["
        )
        .unwrap();
        answered(&s);
        let (raw, took) = read_until_closed(sock, since);
        assert!(took >= Duration::from_secs(TIMEOUT_S), "{path}: answered after {took:?}");
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{path}: {raw}"));
        assert!(head.starts_with("HTTP/1.1 408"), "{path}: {raw}");
        assert!(head.to_lowercase().contains("content-type: application/json"), "{path}: {raw}");
        let v: Value = serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{path}: {e}: {raw}"));
        if path == "/v1/messages" {
            assert_eq!(v["type"], "error", "{v}");
        }
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("stopped arriving")), "{v}");
    }
    answered(&s);
}

#[test]
fn a_body_trickling_in_inside_the_deadline_still_gets_a_408() {
    // Bytes 0.4 s apart never leave a gap of the 1 s deadline; past the
    // first second a body must average 500 bytes a second, so the answer
    // comes at about 1 s and says the body is too slow. Without that rule it
    // would come at 1.8 s (a gap after the last byte) and say it stopped.
    // Nothing is written after 0.8 s, so no write meets a closed socket and
    // resets the answer away.
    let s = start();
    let (mut sock, since) = connect_clocked(&s);
    write!(sock, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{{").unwrap();
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(400));
        sock.write_all(b" ").unwrap();
    }
    let (raw, _) = read_until_closed(sock, since);
    assert!(raw.starts_with("HTTP/1.1 408"), "{raw}");
    assert!(raw.contains("arrives too slowly"), "{raw}");
    answered(&s);
}

#[test]
fn a_route_off_the_api_leaves_a_stalled_body_unread() {
    // Only the API's routes read bodies: others answer without waiting for
    // one (with --api-key, an unauthenticated client cannot make the server
    // buffer bodies there).
    let s = start();
    let mut sock = connect(&s);
    write!(sock, "POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n{{\"a\": ").unwrap();
    let mut head = [0u8; 12];
    sock.read_exact(&mut head).unwrap();
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 405"), "{head}");
    answered(&s);
}
