//! SSE keep-alive on every streaming API: a stream that has nothing to
//! send sends something every `--sse-keepalive` seconds — chat and
//! Responses an SSE comment (`: keep-alive`), Anthropic Messages a `ping`
//! event — and then the answer as usual. Silence is arranged by state,
//! never by time: the engine is held (as during a long prefill or a wait
//! in the queue), or it has run a few steps of a forced tool call whose
//! syntax is held back until the call is whole.

use it::{hermes_folder, model, Server};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;

/// A streamed POST on a raw socket, and what it has sent so far.
struct Stream {
    sock: TcpStream,
    seen: Vec<u8>,
}

impl Stream {
    fn open(s: &Server, path: &str, body: &Value) -> Self {
        let body = body.to_string();
        let mut sock = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        sock.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
        write!(
            sock,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        Self { sock, seen: Vec::new() }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen).into_owned()
    }

    /// Reads until `marker` occurs `n` times in the stream.
    fn until(&mut self, marker: &str, n: usize) -> String {
        let mut buf = [0u8; 4096];
        while self.text().matches(marker).count() < n {
            let got = self.sock.read(&mut buf).unwrap();
            assert!(got > 0, "the stream ended before {n}× {marker:?}: {}", self.text());
            self.seen.extend_from_slice(&buf[..got]);
        }
        self.text()
    }

    fn rest(mut self) -> String {
        let _ = self.sock.read_to_end(&mut self.seen);
        self.text()
    }
}

/// One API's stream: its path, a request body, what its keep-alive looks
/// like, how many of those it sends before any silence (Anthropic pings
/// once after `message_start`), what only an answer's output sends, and
/// how its stream ends.
struct Api {
    path: &'static str,
    body: Value,
    keepalive: &'static str,
    at_start: usize,
    output: &'static str,
    end: &'static str,
}

fn apis(tools: bool) -> Vec<Api> {
    let q = json!([{ "role": "user", "content": "What is the weather in Paris?" }]);
    let params = json!({ "type": "object", "properties": { "city": { "type": "string", "maxLength": 8 } }, "required": ["city"] });
    let mut chat = json!({ "messages": q, "max_tokens": 40, "temperature": 0, "stream": true });
    let mut anthropic = json!({ "model": "m", "messages": q, "max_tokens": 40, "temperature": 0, "stream": true });
    let mut responses = json!({ "input": q, "max_output_tokens": 40, "temperature": 0, "stream": true });
    if tools {
        chat["tools"] = json!([{ "type": "function", "function": { "name": "get_weather", "parameters": params } }]);
        chat["tool_choice"] = json!("required");
        anthropic["tools"] = json!([{ "name": "get_weather", "input_schema": params }]);
        anthropic["tool_choice"] = json!({ "type": "any" });
        responses["tools"] = json!([{ "type": "function", "name": "get_weather", "parameters": params }]);
        responses["tool_choice"] = json!("required");
    }
    vec![
        Api {
            path: "/v1/chat/completions",
            body: chat,
            keepalive: ": keep-alive\n\n",
            at_start: 0,
            output: if tools { "\"tool_calls\"" } else { "\"delta\":{\"content\"" },
            end: "data: [DONE]",
        },
        Api {
            path: "/v1/messages",
            body: anthropic,
            keepalive: "event: ping\n",
            at_start: 1,
            output: "content_block_start",
            end: "event: message_stop",
        },
        Api {
            path: "/v1/responses",
            body: responses,
            keepalive: ": keep-alive\n\n",
            at_start: 0,
            output: "response.output_item.added",
            // (A cut answer ends incomplete; a forced call ends the response.)
            end: if tools { "event: response.completed" } else { "event: response.incomplete" },
        },
    ]
}

#[test]
fn a_silent_stream_sends_keep_alives_then_the_answer_on_every_api() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--debug-endpoints", "--sse-keepalive", "1"]);
    for api in apis(false) {
        s.hold();
        let mut st = Stream::open(&s, api.path, &api.body);
        let before = st.until(api.keepalive, api.at_start + 1);
        assert_eq!(s.stats()["queued"], 1, "{}: the engine took the request while held", api.path);
        assert!(!before.contains(api.output), "{}: nothing of the answer before the keep-alive: {before}", api.path);
        s.release();
        let all = st.rest();
        assert!(all.contains(api.end), "{}: the answer follows: {all}", api.path);
    }
}

#[test]
fn held_back_call_syntax_gets_keep_alives_on_every_api() {
    let s = Server::start(&hermes_folder("keepalive-it"), &["--debug-endpoints", "--sse-keepalive", "1"]);
    for api in apis(true) {
        s.hold();
        let generated = s.stats()["generated_tokens"].as_u64().unwrap();
        let mut st = Stream::open(&s, api.path, &api.body);
        s.wait_for("the request to be queued", |st| st["queued"] == 1);
        // A few steps of the forced call: its syntax is written, and held
        // until the call is whole.
        let r = s.request("POST", "/debug/release?steps=3", &[], b"");
        assert_eq!(r.status, 200, "{}", r.text());
        s.wait_for("the engine to write tokens and hold", |st| {
            st["hold"]["parked"] == true && st["generated_tokens"].as_u64().unwrap() >= generated + 3
        });
        let sent = st.text().matches(api.keepalive).count();
        let during = st.until(api.keepalive, sent.max(api.at_start) + 1);
        assert!(!during.contains(api.output), "{}: the call's tokens were held back: {during}", api.path);
        s.release();
        let all = st.rest();
        assert!(all.contains(api.output) && all.contains(api.end), "{}: then the call: {all}", api.path);
    }
}
