//! The web chat page at `/`: `tests/http/page_check.py` drives it in a real
//! headless Chromium (Debian's chromium + chromium-driver, selenium) against
//! the default model, with the openai SDK as the reference for every
//! answer (streaming, stop, new chat, errors, Shift+Enter, markdown, the
//! API key), saving screenshots under target/test-output/page/; here too,
//! how the assets are served (types, caching, no key needed for the page).

use it::{model, python, run_ok, Server};

fn need(path: &str) {
    assert!(
        std::path::Path::new(path).exists(),
        "{path} is missing: `cargo xtask test` installs Debian's chromium and chromium-driver"
    );
}

#[test]
fn the_chat_page_works_in_a_headless_browser() {
    need("/usr/bin/chromium");
    need("/usr/bin/chromedriver");
    let out = it::repo_root().join("target/test-output/page");
    let _ = std::fs::remove_dir_all(&out);
    let s = Server::start(&model("smollm2-135m-instruct"), &["--debug-endpoints"]);
    let keyed = Server::start(&model("tiny/tiny-llama-f32"), &["--api-key", "page-key"]);
    let script = it::repo_root().join("tests/http/page_check.py");
    let url = |s: &Server| format!("http://127.0.0.1:{}", s.port);
    let log = run_ok(python().arg(script).arg(url(&s)).arg(url(&keyed)).arg("page-key").arg(&out));
    assert!(log.contains("ALL OK"), "{log}");
    for shot in
        ["conversation", "code-answer", "markdown", "thinking", "stopped", "error", "api-key-missing", "api-key"]
    {
        let png = std::fs::read(out.join(format!("{shot}.png"))).unwrap_or_default();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 5000, "{shot}.png is not a screenshot");
    }
}

#[test]
fn the_page_is_served_with_types_and_validators_and_without_the_key() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--api-key", "k"]);
    let page = s.request("GET", "/", &[], b"");
    assert_eq!(page.status, 200, "the page needs no key: {}", page.text());
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(page.text().contains("<title>mlx-engine chat</title>"));
    for (path, ty) in [
        ("/page/app.js", "text/javascript; charset=utf-8"),
        ("/page/stream.js", "text/javascript; charset=utf-8"),
        ("/page/markdown.js", "text/javascript; charset=utf-8"),
        ("/page/style.css", "text/css; charset=utf-8"),
    ] {
        let r = s.request("GET", path, &[], b"");
        assert_eq!((r.status, r.header("content-type")), (200, Some(ty)), "{path}");
        assert_eq!(r.header("cache-control"), Some("no-cache"), "{path}: revalidated, so a new binary's page shows");
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        assert!(r.header("content-security-policy").is_some_and(|c| c.contains("script-src 'self'")), "{path}");
        let tag = r.header("etag").expect("an ETag").to_owned();
        let again = s.request("GET", path, &[("If-None-Match", &tag)], b"");
        assert_eq!(again.status, 304, "{path}: an unchanged asset is not sent again");
        assert!(again.body.is_empty());
        let stale = s.request("GET", path, &[("If-None-Match", "\"0\"")], b"");
        assert_eq!((stale.status, stale.body.len()), (200, r.body.len()), "{path}");
    }
    // The API behind the page still wants the key.
    assert_eq!(s.request("GET", "/v1/models", &[], b"").status, 401);
    assert_eq!(s.request("GET", "/v1/models", &[("Authorization", "Bearer k")], b"").status, 200);
    let r = s.request("GET", "/page/nothing.js", &[], b"");
    assert_eq!(r.status, 404, "{}", r.text());
}
