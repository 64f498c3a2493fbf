//! The web chat page at `/`: hand-written HTML, CSS and JavaScript compiled
//! into the binary (no CDN, no build step), so it works offline and always
//! matches the server that serves it.
//!
//! Served without the API key (only `/v1/*` needs it: the page asks for the
//! key itself and sends it to the API). Every asset carries an ETag from
//! its bytes and `Cache-Control: no-cache`: the browser keeps its copy but
//! revalidates it, so a new binary's page is picked up at once and an
//! unchanged one costs a 304. A Content-Security-Policy allows only this
//! origin's own scripts, styles and requests: even a rendering bug cannot
//! run injected script or reach another host.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

struct Asset {
    bytes: &'static str,
    content_type: &'static str,
}

const INDEX: Asset = Asset { bytes: include_str!("index.html"), content_type: "text/html; charset=utf-8" };
const APP: Asset = Asset { bytes: include_str!("app.js"), content_type: "text/javascript; charset=utf-8" };
const STREAM: Asset = Asset { bytes: include_str!("stream.js"), content_type: "text/javascript; charset=utf-8" };
const MARKDOWN: Asset = Asset { bytes: include_str!("markdown.js"), content_type: "text/javascript; charset=utf-8" };
const STYLE: Asset = Asset { bytes: include_str!("style.css"), content_type: "text/css; charset=utf-8" };

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; \
                   base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page's routes, merged into the API router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|h: HeaderMap| async move { serve(&INDEX, &h) }))
        .route("/page/app.js", get(|h: HeaderMap| async move { serve(&APP, &h) }))
        .route("/page/stream.js", get(|h: HeaderMap| async move { serve(&STREAM, &h) }))
        .route("/page/markdown.js", get(|h: HeaderMap| async move { serve(&MARKDOWN, &h) }))
        .route("/page/style.css", get(|h: HeaderMap| async move { serve(&STYLE, &h) }))
}

/// A strong validator: FNV-1a over the asset's bytes.
fn etag(bytes: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"{h:016x}\"")
}

fn serve(asset: &Asset, req: &HeaderMap) -> Response {
    let tag = etag(asset.bytes);
    let fresh = req
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag || t.trim() == "*"));
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, asset.content_type)], asset.bytes).into_response()
    };
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(&tag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etag_changes_with_the_bytes_and_a_matching_one_is_a_304() {
        assert_ne!(etag("a"), etag("b"));
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, HeaderValue::from_str(&etag(APP.bytes)).unwrap());
        assert_eq!(serve(&APP, &h).status(), StatusCode::NOT_MODIFIED);
        assert_eq!(serve(&STYLE, &h).status(), StatusCode::OK);
        let r = serve(&INDEX, &HeaderMap::new());
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(r.headers()[header::CACHE_CONTROL], "no-cache");
    }

    #[test]
    fn the_page_names_only_its_own_assets() {
        // Offline: no script, style or request may point at another host.
        for a in [&INDEX, &APP, &STREAM, &MARKDOWN, &STYLE] {
            assert!(!a.bytes.contains("http://") && !a.bytes.contains("https://"), "{}", a.content_type);
        }
        for path in ["/page/app.js", "/page/stream.js", "/page/markdown.js", "/page/style.css"] {
            assert!(INDEX.bytes.contains(path), "{path}");
        }
    }
}
