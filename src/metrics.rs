//! `metrics=ADDR:PORT`: the counters of `.tensorfs/stats.json` for Prometheus, in its text
//! exposition format, at `http://ADDR:PORT/metrics`. A plain HTTP/1.1 responder on one thread:
//! a scrape every few seconds needs nothing more, and it shares nothing with the serving path
//! but the counters it reads.

use crate::requests::fs::Fs;
use anyhow::{Result, anyhow};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// How long a scraper may take to send its request or read the answer.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head read.
const HEAD_LIMIT: usize = 16 << 10;

/// The listening socket, bound before anything is mounted, so that an address in use refuses
/// the mount in one line.
pub(crate) struct Endpoint(TcpListener);

impl Endpoint {
    pub(crate) fn bind(addr: &str) -> Result<Endpoint> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| anyhow!("mount option metrics={addr}: cannot listen there: {e}"))?;
        Ok(Endpoint(listener))
    }

    /// Serves scrapes of `fs`'s counters on a thread of its own, for the life of the process.
    pub(crate) fn serve(self, fs: Arc<Fs>) {
        let listener = self.0;
        let spawned = std::thread::Builder::new()
            .name("tensorfs-metrics".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    if let Err(e) = answer(stream, &fs) {
                        tracing::debug!("metrics: {e}");
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("metrics: no thread to serve them: {e}");
        }
    }
}

/// Reads one request and answers it: the exposition for `GET /metrics` (or `/`), 404 for any
/// other path, 405 for any other method.
fn answer(mut stream: TcpStream, fs: &Fs) -> std::io::Result<()> {
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HEAD_LIMIT {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics" | "/") => ("200 OK", fs.metrics_text()),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "not found: the metrics are at /metrics\n".into(),
        ),
        _ => ("405 Method Not Allowed", "only GET\n".into()),
    };
    let mut reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        reply.extend_from_slice(body.as_bytes());
    }
    stream.write_all(&reply)
}
