//! Accepts connections and serves each over HTTP/1.1 with a deadline on
//! every request head (hyper closes a connection whose head has not
//! arrived in time, an idle keep-alive one included): a client that opens
//! connections and stalls cannot hold sockets and tasks forever. The
//! body's own deadline is `body_read`'s.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::pin::pin;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves `app` until `stop` resolves; then stops accepting, lets every
/// connection finish the response it is sending, and returns once all
/// have closed. `head_timeout` None: no deadline.
pub async fn serve_until(
    listener: TcpListener,
    app: Router,
    head_timeout: Option<Duration>,
    stop: impl Future<Output = ()>,
) {
    // Each connection holds a receiver until it closes, so the sender's
    // `closed()` resolves once every connection is gone.
    let (stopping, stopping_rx) = watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(head_timeout);
    let mut stop = pin!(stop);
    loop {
        let sock = tokio::select! {
            r = listener.accept() => match r {
                Ok((sock, _)) => sock,
                Err(e) => {
                    // Out of file descriptors and the like: the listener
                    // stays, and accepting again at once would spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        // Streamed tokens are small writes: Nagle would hold each for the
        // client's delayed acknowledgement.
        let _ = sock.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut stopping = stopping_rx.clone();
        let http = http.clone();
        tokio::spawn(async move {
            let mut conn = pin!(http.serve_connection(TokioIo::new(sock), service));
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended");
                },
                _ = async { stopping.wait_for(|s| *s).await.map(|_| ()) } => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    let _ = stopping.send(true);
    drop((stopping_rx, listener));
    stopping.closed().await;
}
