//! The runner's health endpoint: plain HTTP on a port of its own, for an
//! orchestrator's probes. `GET /live` and `GET /ready` answer 200 or 503
//! with a one-word body; `GET /status` (or `/`) answers the supervisor's
//! JSON; `GET /metrics` answers [`crate::metrics::render`] (Prometheus text,
//! recording from the moment the endpoint starts).
//!
//! Two requests change the runner: `POST /consumers/NAME/pause` and `POST
//! /consumers/NAME/resume` ([`Supervisor::pause`]), from the loopback
//! interface, or from anywhere with `Authorization: Bearer TOKEN` when
//! [`super::RunnerOptions::control_token`] is set. Nothing else is served.

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
    #[cfg(feature = "metrics")]
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
            let Ok((mut socket, peer)) = listener.accept().await else { continue };
            let supervisor = supervisor.clone();
            tokio::spawn(async move {
                let mut buf = Vec::with_capacity(256);
                let mut chunk = [0u8; 512];
                let read = tokio::time::timeout(READ_TIMEOUT, async {
                    // A probe's request line is all a GET needs; a control
                    // request is read to the end of its headers.
                    let done = |buf: &[u8]| {
                        if buf.starts_with(b"POST") {
                            buf.windows(4).any(|w| w == b"\r\n\r\n")
                        } else {
                            buf.windows(2).any(|w| w == b"\r\n")
                        }
                    };
                    while !done(&buf) && buf.len() < MAX_REQUEST {
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
                let (code, content_type, body) = if line.starts_with("POST") {
                    control(&supervisor, path, &line, peer.ip().is_loopback()).await
                } else {
                    respond(&supervisor, path)
                };
                let status = match code {
                    200 => "200 OK",
                    403 => "403 Forbidden",
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

/// `POST /consumers/NAME/pause` or `/resume`.
async fn control(supervisor: &Supervisor, path: &str, request: &str, loopback: bool) -> (u16, &'static str, String) {
    let plain = |code, body: String| (code, "text/plain", body);
    if let Err(why) = authorize_control(supervisor.options().control_token.as_deref(), request, loopback) {
        return plain(403, why.to_owned());
    }
    let path = path.split('?').next().unwrap_or("/");
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (name, action) = match parts.as_slice() {
        ["consumers", name, action @ ("pause" | "resume")] => (percent_decoded(name), *action),
        _ => return plain(404, "not found: POST /consumers/NAME/pause or /consumers/NAME/resume\n".to_owned()),
    };
    let done = if action == "pause" { supervisor.pause(&name).await } else { supervisor.resume(&name).await };
    match done {
        Ok(()) => plain(200, format!("{} {name}\n", if action == "pause" { "paused" } else { "resumed" })),
        Err(e) if *e.kind() == ErrorKind::InvalidArgument => plain(404, format!("{e}\n")),
        Err(e) => plain(503, format!("{e}\n")),
    }
}

/// Whether a control request may change the runner: with a control token
/// set, only one whose `Authorization: Bearer` header (in the request's
/// head, `request`) carries it, from anywhere; without one, any request
/// from the loopback interface. `Err` is the 403 body, which says what to
/// send. The `--processes` parent checks its requests with this too.
pub fn authorize_control(token: Option<&str>, request: &str, loopback: bool) -> std::result::Result<(), &'static str> {
    // The scheme's case is the client's to choose (RFC 9110); a token read
    // from a secret file often ends in a line break, which is not part of it.
    let bearer = request
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
        .and_then(|(_, v)| {
            let v = v.trim();
            v.get(..7).filter(|s| s.eq_ignore_ascii_case("bearer ")).map(|_| v[7..].trim())
        });
    match token.map(str::trim).filter(|t| !t.is_empty()) {
        Some(t) if bearer.is_some_and(|b| constant_time_eq(b.as_bytes(), t.as_bytes())) => Ok(()),
        Some(_) => Err("forbidden: send Authorization: Bearer with the runner's control token (ACEMQ_CONTROL_TOKEN)\n"),
        None if loopback => Ok(()),
        None => Err("forbidden: control requests are taken from 127.0.0.1 only; set a control token (ACEMQ_CONTROL_TOKEN) to send them from elsewhere\n"),
    }
}

/// `Payments%3A%3AConsumer` as `Payments::Consumer`: a class name in a path.
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Compared without an early exit, so the time taken says nothing of how
/// much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn respond(supervisor: &Supervisor, path: &str) -> (u16, &'static str, String) {
    let word = |ok: bool, yes: &str| if ok { (200, "text/plain", format!("{yes}\n")) } else { (503, "text/plain", format!("{}\n", supervisor.state().as_str())) };
    match path.split('?').next().unwrap_or("/") {
        "/live" | "/livez" => word(supervisor.live(), "live"),
        "/ready" | "/readyz" => word(supervisor.ready(), "ready"),
        "/" | "/status" => (200, "application/json", supervisor.status_json()),
        #[cfg(feature = "metrics")]
        "/metrics" => (200, crate::metrics::CONTENT_TYPE, crate::metrics::render()),
        #[cfg(not(feature = "metrics"))]
        "/metrics" => (404, "text/plain", "no metrics: this build leaves out acemq's `metrics` feature\n".to_owned()),
        _ => (404, "text/plain", "not found: try /live, /ready, /status or /metrics\n".to_owned()),
    }
}
