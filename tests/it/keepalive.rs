//! SSE keep-alive: a chat stream that has nothing to send (here: the engine
//! is held, as during a long prefill or a wait in the queue) sends
//! `: keep-alive` comments every `--sse-keepalive` seconds, and then the
//! answer as usual.

use it::{model, Server};
use serde_json::json;
use std::io::{Read, Write};

#[test]
fn a_silent_stream_sends_keep_alive_comments_then_the_answer() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--debug-endpoints", "--sse-keepalive", "1"]);
    s.hold();
    let body = json!({
        "messages": [{ "role": "user", "content": "Hello" }],
        "max_tokens": 6,
        "temperature": 0,
        "stream": true,
    })
    .to_string();
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    write!(
        sock,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(": keep-alive\n\n") {
        let n = sock.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    let before = String::from_utf8_lossy(&seen).into_owned();
    // Only the role chunk went out before the comment.
    assert_eq!(before.matches("\"content\":").count(), 1, "{before}");
    assert_eq!(s.stats()["queued"], 1, "the engine took the request while held");
    s.release();
    let _ = sock.read_to_end(&mut seen);
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("\"finish_reason\":"), "no finishing chunk: {text}");
    // (Chunked transfer encoding: the raw bytes hold chunk sizes between events.)
    assert!(text.contains("data: [DONE]"), "{text}");
}
