//! No silent limits: `/v1/models` reports the context length, and a
//! request whose prompt plus `max_tokens` would run past it is a 400 that
//! says so (one token less is served).

use it::{model, Server};
use serde_json::json;
use std::io::{Read, Write};

#[test]
fn models_report_the_context_and_requests_past_it_are_refused() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &[]);
    let r = s.request("GET", "/v1/models", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let m = &r.json()["data"][0];
    let ctx = 4096; // max_position_embeddings of the tiny models
    assert_eq!(m["context_length"], ctx, "{m}");
    assert_eq!(m["max_model_len"], ctx, "{m}");

    let prompt: Vec<u32> = (0..100).map(|i| 100 + i).collect();
    let room = ctx - prompt.len();
    let r = s.post("/v1/completions", &json!({ "prompt": prompt, "max_tokens": room + 1 }));
    assert_eq!(r.status, 400, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], "context_length_exceeded", "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("4096") && msg.contains("100 tokens") && msg.contains(&(room + 1).to_string()), "{msg}");
    let r = s
        .post("/v1/chat/completions", &json!({ "messages": [{ "role": "user", "content": "hi" }], "max_tokens": ctx }));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");

    // Exactly the room left is accepted: the stream's headers say 200 (the
    // connection is dropped then, which cancels the generation).
    let body = json!({ "prompt": prompt, "max_tokens": room, "stream": true }).to_string();
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    write!(
        sock,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut head = [0u8; 12];
    sock.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&head));
}
