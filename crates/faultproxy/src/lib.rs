//! A fault proxy to put between a Sluice service and MySQL, Kafka, Elasticsearch or
//! ZooKeeper, for tests.
//!
//! [`Proxy`] relays TCP and can cut every connection and refuse new ones (its port closes),
//! black-hole traffic (connections stay open, no byte passes either way: a partition), or
//! delay every chunk. [`HttpProxy`] relays HTTP/1.1 request by request and can, for
//! requests whose path contains a given piece, answer a status of its own (429, 503)
//! without forwarding, or drop the connection in the middle of the exchange: before the
//! server has the whole request (nothing applied) or after it answered (applied, but the
//! client never hears), or hold a request until released. [`TlsFront`] terminates TLS
//! for a server that speaks none, and admits only clients with a certificate its CA
//! signed.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

mod tls;
pub use tls::TlsFront;

/// What a [`Proxy`] does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Relay everything.
    Open,
    /// Close every connection and refuse new ones: the port is closed (a process gone, a
    /// firewall's RST).
    Refuse,
    /// Accept and keep connections but pass no byte either way (a partition: the peer
    /// learns nothing until its own timeouts fire). When it ends, the connections that
    /// lived through it are cut, and what they held is dropped.
    Blackhole,
    /// Relay every chunk after this delay.
    Delay(Duration),
}

/// A TCP proxy to `upstream`, listening on a port of its own.
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    upstream: Arc<Mutex<String>>,
    /// Bumped to cut every live connection.
    cuts: watch::Sender<u64>,
    /// The local ports of the live connections to the upstream.
    live: Arc<Mutex<Vec<u16>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (mode, modes) = watch::channel(Mode::Open);
        let live = Arc::new(Mutex::new(Vec::new()));
        let upstream = Arc::new(Mutex::new(upstream.to_owned()));
        let (cuts, cut) = watch::channel(0);
        let task = tokio::spawn(accept(
            listener,
            addr,
            upstream.clone(),
            modes,
            cut,
            live.clone(),
        ));
        Proxy {
            addr,
            mode,
            upstream,
            cuts,
            live,
            task,
        }
    }

    /// `127.0.0.1:port`, to give the service instead of the real endpoint.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// The local ports of the proxy's live connections to the upstream: how the server
    /// sees them (`127.0.0.1:PORT` in MySQL's process list).
    pub fn upstream_ports(&self) -> Vec<u16> {
        self.live.lock().expect("live").clone()
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// New connections go to `upstream` from now on (a DNS name or a virtual IP moved to
    /// another server); live ones are left as they are (see [`Proxy::cut`]).
    pub fn retarget(&self, upstream: &str) {
        *self.upstream.lock().expect("upstream") = upstream.to_owned();
    }

    /// Closes every live connection; new ones are accepted as the mode says.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.set(Mode::Refuse);
        self.task.abort();
    }
}

/// Accepts connections while the mode is not [`Mode::Refuse`]; while it is, the port is
/// closed, and bound again when it changes.
async fn accept(
    listener: TcpListener,
    addr: SocketAddr,
    upstream: Arc<Mutex<String>>,
    mut mode: watch::Receiver<Mode>,
    cut: watch::Receiver<u64>,
    live: Arc<Mutex<Vec<u16>>>,
) {
    let mut listener = Some(listener);
    loop {
        if *mode.borrow_and_update() == Mode::Refuse {
            listener = None;
        } else if listener.is_none() {
            listener = Some(
                TcpListener::bind(addr)
                    .await
                    .expect("re-bind the proxy port"),
            );
        }
        tokio::select! {
            accepted = async { listener.as_ref().expect("guarded").accept().await },
                if listener.is_some() =>
            {
                if let Ok((client, _)) = accepted {
                    let to = upstream.lock().expect("upstream").clone();
                    tokio::spawn(relay(client, to, mode.clone(), cut.clone(), live.clone()));
                }
            }
            changed = mode.changed() => if changed.is_err() { return },
        }
    }
}

async fn relay(
    client: TcpStream,
    upstream: String,
    mode: watch::Receiver<Mode>,
    mut cut: watch::Receiver<u64>,
    live: Arc<Mutex<Vec<u16>>>,
) {
    cut.mark_unchanged();
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let port = server.local_addr().map(|a| a.port()).unwrap_or(0);
    live.lock().expect("live").push(port);
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // When either direction ends, both do (dropping the halves closes the sockets).
    tokio::select! {
        _ = pump(cr, sw, mode.clone()) => {}
        _ = pump(sr, cw, mode) => {}
        _ = cut.changed() => {}
    }
    live.lock().expect("live").retain(|p| *p != port);
}

/// Copies `from` to `to` chunk by chunk as the mode allows; returns when either side
/// closes, the mode turns to [`Mode::Refuse`], or a black-hole ends: a connection that
/// lived through a partition is cut when it heals, with what it held (as when a firewall
/// or a NAT forgot it), so no request from before the partition arrives after it.
async fn pump(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut partitioned = *mode.borrow_and_update() == Mode::Blackhole;
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                match *mode.borrow_and_update() {
                    Mode::Refuse => return,
                    Mode::Blackhole => partitioned = true,
                    _ if partitioned => return,
                    _ => {}
                }
                continue;
            }
        };
        // Hold the chunk while black-holed.
        loop {
            let now = *mode.borrow_and_update();
            match now {
                Mode::Refuse => return,
                Mode::Blackhole => {
                    partitioned = true;
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
                _ if partitioned => return,
                Mode::Delay(d) => {
                    tokio::time::sleep(d).await; // the injected latency itself
                    break;
                }
                Mode::Open => break,
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// What an [`HttpProxy`] does with one matching request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpFault {
    /// Answer this status with an Elasticsearch-style error body; nothing is forwarded.
    Answer(u16),
    /// Forward half of the request body, then close both connections: the server never
    /// has the whole request.
    DropBeforeForward,
    /// Forward the request, read the server's whole answer, then close the client's
    /// connection without a byte of it: applied, and the client cannot know.
    DropAfterForward,
    /// Hold the request (nothing forwarded) until [`HttpProxy::release`], then forward it.
    Hold,
}

struct HttpRules {
    path_contains: String,
    faults: VecDeque<HttpFault>,
    /// Matching requests seen.
    matched: u64,
    /// Requests being held now.
    held: usize,
    /// Held requests released, forwarded and answered by the server: each request's body
    /// and the server's answer.
    answered_after_hold: Vec<(String, String)>,
}

/// An HTTP/1.1 proxy to `upstream` (host:port) that injects queued faults into requests
/// whose path contains a given piece, one fault per matching request, in order.
pub struct HttpProxy {
    addr: SocketAddr,
    rules: Arc<Mutex<HttpRules>>,
    /// Bumped by each release: held requests go on.
    releases: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpProxy {
    /// Faults apply to requests whose path contains `path_contains` (`"_bulk"`).
    pub async fn start(upstream: &str, path_contains: &str) -> HttpProxy {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy");
        let addr = listener.local_addr().expect("proxy address");
        let rules = Arc::new(Mutex::new(HttpRules {
            path_contains: path_contains.to_owned(),
            faults: VecDeque::new(),
            matched: 0,
            held: 0,
            answered_after_hold: Vec::new(),
        }));
        let (releases, released) = watch::channel(0);
        let shared = rules.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let released = released.clone();
                tokio::spawn(serve(client, upstream.clone(), shared.clone(), released));
            }
        });
        HttpProxy {
            addr,
            rules,
            releases,
            task,
        }
    }

    /// Lets every request held now go on to the server.
    pub fn release(&self) {
        self.releases.send_modify(|n| *n += 1);
    }

    /// Requests being held now.
    pub fn held(&self) -> usize {
        self.rules.lock().expect("rules").held
    }

    /// Held requests that were released and answered by the server since the proxy
    /// started (forwarded whether or not their client still waits: a late write of a dead
    /// client), oldest first: each request's body and the server's whole answer.
    pub fn answered_after_hold(&self) -> Vec<(String, String)> {
        self.rules
            .lock()
            .expect("rules")
            .answered_after_hold
            .clone()
    }

    /// `http://127.0.0.1:port`, to give the service instead of the real URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queues `fault` for the next `times` matching requests (after those already queued).
    pub fn inject(&self, fault: HttpFault, times: usize) {
        let mut rules = self.rules.lock().expect("rules");
        rules.faults.extend(std::iter::repeat_n(fault, times));
    }

    /// Drops the faults not yet served: requests pass again.
    pub fn clear(&self) {
        self.rules.lock().expect("rules").faults.clear();
    }

    /// Faults queued and not yet served.
    pub fn pending(&self) -> usize {
        self.rules.lock().expect("rules").faults.len()
    }

    /// Matching requests seen (faulted or not).
    pub fn requests(&self) -> u64 {
        self.rules.lock().expect("rules").matched
    }
}

impl Drop for HttpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One request as read from the client.
struct Request {
    head: Vec<u8>,
    body: Vec<u8>,
    path: String,
}

async fn serve(
    mut client: TcpStream,
    upstream: String,
    rules: Arc<Mutex<HttpRules>>,
    mut released: watch::Receiver<u64>,
) {
    let _ = client.set_nodelay(true);
    let mut pending = Vec::new();
    loop {
        let Some(request) = read_request(&mut client, &mut pending).await else {
            return;
        };
        let fault = {
            let mut r = rules.lock().expect("rules");
            if request.path.contains(&r.path_contains) {
                r.matched += 1;
                r.faults.pop_front()
            } else {
                None
            }
        };
        if fault == Some(HttpFault::Hold) {
            let before = *released.borrow_and_update();
            rules.lock().expect("rules").held += 1;
            let _ = released.wait_for(|n| *n > before).await;
            rules.lock().expect("rules").held -= 1;
        }
        match fault {
            Some(HttpFault::Answer(status)) => {
                if client.write_all(&canned(status)).await.is_err() {
                    return;
                }
            }
            Some(HttpFault::DropBeforeForward) => {
                if let Ok(mut server) = TcpStream::connect(&upstream).await {
                    let _ = server.write_all(&request.head).await;
                    let _ = server
                        .write_all(&request.body[..request.body.len() / 2])
                        .await;
                }
                return;
            }
            Some(HttpFault::DropAfterForward) => {
                let _ = forward(&upstream, &request).await;
                return;
            }
            Some(HttpFault::Hold) | None => {
                let Some(answer) = forward(&upstream, &request).await else {
                    return;
                };
                if fault.is_some() {
                    let exchange = (
                        String::from_utf8_lossy(&request.body).into_owned(),
                        String::from_utf8_lossy(&answer).into_owned(),
                    );
                    rules
                        .lock()
                        .expect("rules")
                        .answered_after_hold
                        .push(exchange);
                }
                if client.write_all(&answer).await.is_err() {
                    return;
                }
                // The server was asked to close after its answer; so does the client.
                if header_value(&answer, "connection").as_deref() == Some("close") {
                    return;
                }
            }
        }
    }
}

/// Reads one request (head and `Content-Length` body); `None` when the client closed.
async fn read_request(client: &mut TcpStream, pending: &mut Vec<u8>) -> Option<Request> {
    let mut buf = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = find(pending, b"\r\n\r\n") {
            break i + 4;
        }
        let n = client.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        pending.extend_from_slice(&buf[..n]);
    };
    let head: Vec<u8> = pending.drain(..head_end).collect();
    let length: usize = header_value(&head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while pending.len() < length {
        let n = client.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        pending.extend_from_slice(&buf[..n]);
    }
    let body: Vec<u8> = pending.drain(..length).collect();
    let line = String::from_utf8_lossy(&head[..find(&head, b"\r\n").unwrap_or(0)]).into_owned();
    let path = line.split(' ').nth(1).unwrap_or_default().to_owned();
    Some(Request {
        head: with_connection_close(&head),
        body,
        path,
    })
}

/// Sends `request` on a fresh connection and reads the answer to its end.
async fn forward(upstream: &str, request: &Request) -> Option<Vec<u8>> {
    let mut server = TcpStream::connect(upstream).await.ok()?;
    server.write_all(&request.head).await.ok()?;
    server.write_all(&request.body).await.ok()?;
    let mut answer = Vec::new();
    server.read_to_end(&mut answer).await.ok()?;
    (!answer.is_empty()).then_some(answer)
}

/// The request head with its `Connection` header replaced by `close`, so the server's
/// answer ends where its connection does.
fn with_connection_close(head: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut out = String::new();
    for line in text.split("\r\n").filter(|l| !l.is_empty()) {
        if !line.to_ascii_lowercase().starts_with("connection:") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    out.into_bytes()
}

fn header_value(message: &[u8], name: &str) -> Option<String> {
    let end = find(message, b"\r\n\r\n").unwrap_or(message.len());
    String::from_utf8_lossy(&message[..end])
        .split("\r\n")
        .skip(1)
        .find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_ascii_lowercase())
        })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// An Elasticsearch-style whole-request error answer.
fn canned(status: u16) -> Vec<u8> {
    let (reason, error_type) = match status {
        429 => ("Too Many Requests", "es_rejected_execution_exception"),
        503 => ("Service Unavailable", "unavailable_shards_exception"),
        _ => ("Error", "injected_fault"),
    };
    let body = format!(
        r#"{{"error":{{"type":"{error_type}","reason":"injected by the test's fault proxy"}},"status":{status}}}"#
    );
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
