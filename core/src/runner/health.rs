//! The runner's health endpoint: plain HTTP on a port of its own, for an
//! orchestrator's probes. `GET /live` and `GET /ready` answer 200 or 503
//! with a one-word body; `GET /status` (or `/`) answers the supervisor's
//! JSON; `GET /metrics` answers [`crate::metrics::render`] (Prometheus text,
//! recording from the moment the endpoint starts). Nothing else is served,
//! and nothing here can change the runner.

use super::Supervisor;
use crate::error::{Error, ErrorKind, Result};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A request line longer than this is refused: a probe sends a few dozen
/// bytes, and the endpoint must not buffer whatever a stranger sends.
const MAX_REQUEST: usize = 4096;

/// A probe that has not sent its request by then is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// A running health endpoint. Dropping it does not stop it; call
/// [`HealthServer::close`].
pub struct HealthServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl HealthServer {
    /// Where it listens (the port, when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop listening.
    pub fn close(&self) {
        self.task.abort();
    }
}

/// Listen on `addr` and answer probes from `supervisor`'s state. Runs on the
/// process runtime, so it keeps answering while handler threads are busy.
///
/// # Cancel safety
///
/// Cancel safe: the only await is the bind, and a future dropped there has
/// bound nothing. Once it returns, the server runs until
/// [`HealthServer::close`].
pub async fn serve_health(addr: SocketAddr, supervisor: Arc<Supervisor>) -> Result<HealthServer> {
    crate::metrics::enable();
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        Error::new(
            ErrorKind::InvalidArgument,
            format!("cannot listen for health probes on {addr}: {e} (choose another health port, or 0 for any)"),
        )
    })?;
    let addr = listener.local_addr().map_err(|e| Error::new(ErrorKind::InvalidArgument, e.to_string()))?;
    let task = crate::runtime::handle().spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { continue };
            let supervisor = supervisor.clone();
            tokio::spawn(async move {
                let mut buf = Vec::with_capacity(256);
                let mut chunk = [0u8; 512];
                let read = tokio::time::timeout(READ_TIMEOUT, async {
                    while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < MAX_REQUEST {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return false,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    true
                })
                .await;
                if !matches!(read, Ok(true)) {
                    return;
                }
                let line = String::from_utf8_lossy(&buf);
                let path = line.split_whitespace().nth(1).unwrap_or("/");
                let (code, content_type, body) = respond(&supervisor, path);
                let status = match code {
                    200 => "200 OK",
                    404 => "404 Not Found",
                    _ => "503 Service Unavailable",
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    Ok(HealthServer { addr, task })
}

fn respond(supervisor: &Supervisor, path: &str) -> (u16, &'static str, String) {
    let word = |ok: bool, yes: &str| if ok { (200, "text/plain", format!("{yes}\n")) } else { (503, "text/plain", format!("{}\n", supervisor.state().as_str())) };
    match path.split('?').next().unwrap_or("/") {
        "/live" | "/livez" => word(supervisor.live(), "live"),
        "/ready" | "/readyz" => word(supervisor.ready(), "ready"),
        "/" | "/status" => (200, "application/json", supervisor.status_json()),
        "/metrics" => (200, crate::metrics::CONTENT_TYPE, crate::metrics::render()),
        _ => (404, "text/plain", "not found: try /live, /ready, /status or /metrics\n".to_owned()),
    }
}
