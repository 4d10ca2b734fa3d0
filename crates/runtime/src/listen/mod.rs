//! Every listener a service serves — a center's gRPC API, its console, search API and
//! dictionaries, every service's telemetry endpoint — takes connections through
//! [`accept`], so that no caller can hold more than it is allowed:
//! - at most [`Limits::connections`] connections at once (more wait in the kernel's
//!   backlog until one closes), and at most [`Limits::per_client`] from one client
//!   address (an IPv6 client counted by its /64): more are closed at once, so no one
//!   client can take every place;
//! - each TLS handshake in a task of its own, within [`Limits::handshake_within`], so a
//!   slow one delays nobody else;
//! - a client that has not sent its first bytes (an HTTP/2 preface, a request line)
//!   within [`Limits::first_bytes_within`] of connecting is closed.
//!
//! HTTP listeners ([`serve_http`], HTTP/1.1) add a deadline on each request's head
//! ([`Limits::head_within`], which also closes a keep-alive connection left idle that
//! long), on each whole request, body read included ([`Limits::request_within`]), and a
//! cap on bodies ([`Limits::body_bytes`]).

pub mod tls;

use std::future::Future as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::{ConnectInfo, DefaultBodyLimit, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// What one listener allows its callers (`[limits]` of a center's configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Connections open at once.
    pub connections: usize,
    /// Connections open at once from one client address (IPv6: one /64); unset, 128 or
    /// [`Limits::connections`] if that is less. Proxies a service trusts to name its
    /// clients are not held to it (see [`SharedPeers`]).
    pub per_client: Option<usize>,
    /// A client's TLS handshake.
    #[serde(with = "humantime_serde")]
    pub handshake_within: Duration,
    /// A client's first bytes after it connected (and shook hands).
    #[serde(with = "humantime_serde")]
    pub first_bytes_within: Duration,
    /// An HTTP request's head; also how long a keep-alive connection may idle.
    #[serde(with = "humantime_serde")]
    pub head_within: Duration,
    /// A whole request: its body read and its answer made.
    #[serde(with = "humantime_serde")]
    pub request_within: Duration,
    /// An HTTP request's body.
    pub body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 512,
            per_client: None,
            handshake_within: Duration::from_secs(10),
            first_bytes_within: Duration::from_secs(10),
            head_within: Duration::from_secs(10),
            request_within: Duration::from_secs(60),
            body_bytes: 4 << 20,
        }
    }
}

impl Limits {
    /// Connections one client may hold at once: see [`Limits::per_client`].
    pub fn per_client(&self) -> usize {
        self.per_client.unwrap_or(self.connections.min(128))
    }

    /// Problems of the values (no I/O), each naming its key under `prefix`.
    pub fn problems(&self, prefix: &str) -> Vec<String> {
        let mut p = Vec::new();
        if self.connections == 0 {
            p.push(format!("{prefix}.connections: must be at least 1"));
        }
        if self
            .per_client
            .is_some_and(|n| n == 0 || n > self.connections)
        {
            p.push(format!(
                "{prefix}.per_client: must be 1..={prefix}.connections ({})",
                self.connections
            ));
        }
        for (key, d) in [
            ("handshake_within", self.handshake_within),
            ("first_bytes_within", self.first_bytes_within),
            ("head_within", self.head_within),
            ("request_within", self.request_within),
        ] {
            if d.is_zero() {
                p.push(format!("{prefix}.{key}: must be above zero"));
            }
        }
        if self.body_bytes < 1024 {
            p.push(format!("{prefix}.body_bytes: must be at least 1024"));
        }
        p
    }
}

/// Who is at the other end of a connection: its address and, over TLS, the certificate
/// chain it presented (empty without one). In every request's extensions.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    pub certs: Arc<Vec<CertificateDer<'static>>>,
}

/// The address a client is counted by: its IPv4 address (an IPv4-mapped IPv6 one is
/// that), or the /64 network of its IPv6 address, which one client usually holds whole.
pub fn client_block(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.into(),
            None => {
                let bits = u128::from(v6) & !(u128::MAX >> 64);
                std::net::IpAddr::V6(bits.into())
            }
        },
        v4 => v4,
    }
}

/// Peers that many clients share — the proxies a service trusts to name its clients —
/// which [`Limits::per_client`] does not hold back (their clients are told apart, where
/// it matters, by the address the proxy names). None by default.
#[derive(Clone, Default)]
pub struct SharedPeers(Option<Arc<dyn Fn(std::net::IpAddr) -> bool + Send + Sync>>);

impl SharedPeers {
    pub fn new(is_shared: impl Fn(std::net::IpAddr) -> bool + Send + Sync + 'static) -> Self {
        SharedPeers(Some(Arc::new(is_shared)))
    }

    fn contains(&self, ip: std::net::IpAddr) -> bool {
        self.0.as_ref().is_some_and(|f| f(ip))
    }
}

/// Connections refused for a client having its share open, by listener.
static OVER_SHARE: std::sync::LazyLock<opentelemetry::metrics::Counter<u64>> =
    std::sync::LazyLock::new(|| {
        opentelemetry::global::meter("sluice")
            .u64_counter("sluice.listener.refused_connections")
            .with_description("Connections closed at once: their client had its share open")
            .build()
    });

/// Connections open per client block, each counted until its [`Conn`] is dropped.
#[derive(Default)]
struct PerClient(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

impl PerClient {
    fn take(self: &Arc<Self>, ip: std::net::IpAddr, most: usize) -> Option<ClientPlace> {
        let block = client_block(ip);
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(block).or_default();
        if *n >= most {
            return None;
        }
        *n += 1;
        Some(ClientPlace {
            counts: self.clone(),
            block,
        })
    }
}

/// One client's connection counted in [`PerClient`].
struct ClientPlace {
    counts: Arc<PerClient>,
    block: std::net::IpAddr,
}

impl Drop for ClientPlace {
    fn drop(&mut self) {
        let mut open = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.block) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.block);
            }
        }
    }
}

/// The bytes of an HTTP/2 client preface: a client has sent at least this much once it
/// has started talking, whatever it speaks.
const FIRST_BYTES: usize = 24;

/// A connection admitted within the limits: it holds its place until dropped.
pub struct Conn {
    io: Io,
    peer: Peer,
    /// Until the client's first bytes arrived: how many are still awaited, and by when.
    first: Option<(usize, Pin<Box<tokio::time::Sleep>>)>,
    _place: OwnedSemaphorePermit,
    _client: Option<ClientPlace>,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    pub fn peer(&self) -> &Peer {
        &self.peer
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let read = match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        };
        let Some((left, deadline)) = &mut this.first else {
            return read;
        };
        match read {
            Poll::Ready(Ok(())) => {
                let got = buf.filled().len() - before;
                *left = left.saturating_sub(got);
                if *left == 0 || got == 0 {
                    this.first = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client sent nothing in time",
                ))),
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// Counts a connection closed for its client's share and says so, at most once a minute
/// per listener (a client refused at speed must not flood the log).
fn over_share(name: &'static str, addr: SocketAddr, warned: &mut Option<std::time::Instant>) {
    OVER_SHARE.add(1, &[opentelemetry::KeyValue::new("listener", name)]);
    let now = std::time::Instant::now();
    if warned.is_none_or(|at| now.duration_since(at) >= Duration::from_secs(60)) {
        *warned = Some(now);
        tracing::warn!(listener = name, peer = %addr, "a client has its share of connections open (limits.per_client): its new ones are closed");
    }
}

/// Accepts connections on `listener` within `limits` (with TLS when `tls` is given) until
/// `shutdown`; each admitted one arrives on the receiver, its handshake done. `name`
/// says which listener in logs.
pub fn accept(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    shared: SharedPeers,
    name: &'static str,
    shutdown: CancellationToken,
) -> mpsc::Receiver<Conn> {
    let (tx, rx) = mpsc::channel(64);
    let places = Arc::new(Semaphore::new(limits.connections));
    let per_client = Arc::new(PerClient::default());
    let mut warned = None;
    tokio::spawn(async move {
        loop {
            let place = tokio::select! {
                p = places.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                () = shutdown.cancelled() => return,
            };
            let (tcp, addr) = tokio::select! {
                a = listener.accept() => match a {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors, say: wait a moment rather than spin.
                        tracing::warn!(listener = name, error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = shutdown.cancelled() => return,
            };
            let client = if shared.contains(addr.ip()) {
                None
            } else {
                match per_client.take(addr.ip(), limits.per_client()) {
                    Some(place) => Some(place),
                    None => {
                        over_share(name, addr, &mut warned);
                        continue;
                    }
                }
            };
            let _ = tcp.set_nodelay(true);
            let (tx, tls) = (tx.clone(), tls.clone());
            tokio::spawn(async move {
                let Some((io, certs)) = handshake(tcp, tls, limits, name, addr).await else {
                    return;
                };
                let conn = Conn {
                    io,
                    peer: Peer {
                        addr,
                        certs: Arc::new(certs),
                    },
                    first: Some((
                        FIRST_BYTES,
                        Box::pin(tokio::time::sleep(limits.first_bytes_within)),
                    )),
                    _place: place,
                    _client: client,
                };
                let _ = tx.send(conn).await;
            });
        }
    });
    rx
}

/// A connection's TLS handshake (none without `tls`), within its deadline: its stream
/// and the certificate chain the client presented, or `None` once it failed.
async fn handshake(
    tcp: TcpStream,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    name: &'static str,
    addr: SocketAddr,
) -> Option<(Io, Vec<CertificateDer<'static>>)> {
    let Some(acceptor) = tls else {
        return Some((Io::Plain(tcp), Vec::new()));
    };
    match tokio::time::timeout(limits.handshake_within, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => {
            let certs = (s.get_ref().1.peer_certificates())
                .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                .unwrap_or_default();
            Some((Io::Tls(Box::new(s)), certs))
        }
        Ok(Err(e)) => {
            tracing::debug!(listener = name, peer = %addr, error = %e, "a TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(listener = name, peer = %addr, "a TLS handshake took too long");
            None
        }
    }
}

/// Serves `app` over HTTP/1.1 on `listener` within `limits` (see the module's header)
/// until `shutdown`; then lets requests under way finish for up to five seconds. Each
/// request has the client's [`Peer`] and its `ConnectInfo<SocketAddr>` in its extensions.
pub async fn serve_http(
    listener: TcpListener,
    app: axum::Router,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    shared: SharedPeers,
    name: &'static str,
    shutdown: CancellationToken,
) {
    let within = limits.request_within;
    let app = app
        .layer(DefaultBodyLimit::max(limits.body_bytes))
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| answered_within(within, req, next),
        ));
    let mut conns = accept(listener, tls, limits, shared, name, shutdown.clone());
    let mut running = tokio::task::JoinSet::new();
    loop {
        let conn = tokio::select! {
            c = conns.recv() => match c {
                Some(c) => c,
                None => break,
            },
            () = shutdown.cancelled() => break,
        };
        while running.try_join_next().is_some() {}
        let peer = conn.peer.clone();
        let service = tower::ServiceExt::map_request(
            app.clone(),
            move |mut req: axum::http::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer.addr));
                req.extensions_mut().insert(peer.clone());
                req
            },
        );
        let stop = shutdown.clone();
        running.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.head_within)
                .max_buf_size(256 * 1024);
            let served = builder.serve_connection(
                hyper_util::rt::TokioIo::new(conn),
                hyper_util::service::TowerToHyperService::new(service),
            );
            let mut served = std::pin::pin!(served);
            tokio::select! {
                _ = served.as_mut() => {}
                () = stop.cancelled() => {
                    served.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(5), served).await;
                }
            }
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while running.join_next().await.is_some() {}
    })
    .await;
}

/// `next`'s answer, or 503 once `limit` passed (the body still unread counts).
async fn answered_within(limit: Duration, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(answer) => answer,
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the request was not answered within {} s\n",
                limit.as_secs()
            ),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_counted_by_their_address_or_their_ipv6_block() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(client_block(ip("10.0.0.7")), ip("10.0.0.7"));
        assert_eq!(client_block(ip("::ffff:10.0.0.7")), ip("10.0.0.7"));
        assert_eq!(
            client_block(ip("2001:db8:1:2:aaaa::1")),
            ip("2001:db8:1:2::")
        );
        let counts = Arc::new(PerClient::default());
        let first = counts.take(ip("2001:db8:1:2::1"), 2).unwrap();
        let _second = counts.take(ip("2001:db8:1:2::9"), 2).unwrap();
        assert!(
            counts.take(ip("2001:db8:1:2::5"), 2).is_none(),
            "the block has its share"
        );
        assert!(
            counts.take(ip("10.0.0.1"), 2).is_some(),
            "another client has its own"
        );
        drop(first);
        assert!(
            counts.take(ip("2001:db8:1:2::5"), 2).is_some(),
            "a place freed"
        );
    }
}
