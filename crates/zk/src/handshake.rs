//! Learns the session timeout the server grants before the real session is opened.
//!
//! The server clamps the requested timeout into its `[minSessionTimeout,
//! maxSessionTimeout]`, and `zookeeper-async` does not expose the granted value. The
//! publishing lease (see [`crate::session`]) must be shorter than the timeout the server
//! enforces, so we ask: open a throw-away session with the same request, read the
//! granted timeout from the handshake answer and close that session again. This is the
//! documented client handshake of the ZooKeeper wire protocol (`ConnectRequest`,
//! `ConnectResponse`, `closeSession` op code -11).

use std::future::Future;
use std::io;
use std::time::Duration;

use sluice_model::RetryPolicy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use tracing::debug;
use zookeeper_async::ZooKeeper;

use crate::config::hosts;
use crate::error::{ZkCode, ZkError};

/// The session timeout the first answering server of `connect` grants for `requested`.
pub(crate) async fn negotiate_session_timeout(
    connect: &str,
    requested: Duration,
    deadline: Instant,
) -> Result<Duration, ZkError> {
    let mut detail = "the connect string names no server".to_owned();
    for host in hosts(connect) {
        match timeout_at(deadline, handshake(host, requested)).await {
            Ok(Ok(granted)) => return Ok(granted),
            Ok(Err(e)) => detail = format!("{host}: {e}"),
            Err(_) => {
                detail = format!("{host}: no handshake answer before the connect deadline");
                break;
            }
        }
    }
    Err(ZkError::Unreachable {
        connect: connect.to_owned(),
        detail,
    })
}

async fn handshake(host: &str, requested: Duration) -> io::Result<Duration> {
    let mut sock = TcpStream::connect(host).await?;
    sock.set_nodelay(true)?;
    sock.write_all(&connect_request(requested)).await?;

    let len = sock.read_i32().await?;
    if !(16..=4096).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a ZooKeeper handshake answer (length {len})"),
        ));
    }
    let mut body = vec![0u8; len as usize];
    sock.read_exact(&mut body).await?;
    let granted = parse_granted_timeout(&body)?;

    // Close the throw-away session and wait (briefly) for the answer, so the server
    // processes the close rather than timing the session out later.
    sock.write_all(&CLOSE_SESSION).await?;
    let _ = tokio::time::timeout(Duration::from_secs(1), sock.read_i32()).await;
    Ok(granted)
}

/// `closeSession`: length 8, xid 1, op code -11.
const CLOSE_SESSION: [u8; 12] = [0, 0, 0, 8, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xf5];

/// Length-prefixed `ConnectRequest` for a new session: protocol version 0, last seen zxid
/// 0, timeout in ms, session id 0, a zeroed 16-byte password, not read-only.
fn connect_request(requested: Duration) -> Vec<u8> {
    let timeout_ms = i32::try_from(requested.as_millis()).unwrap_or(i32::MAX);
    let mut body = Vec::with_capacity(45);
    body.extend_from_slice(&0i32.to_be_bytes());
    body.extend_from_slice(&0i64.to_be_bytes());
    body.extend_from_slice(&timeout_ms.to_be_bytes());
    body.extend_from_slice(&0i64.to_be_bytes());
    body.extend_from_slice(&16i32.to_be_bytes());
    body.extend_from_slice(&[0u8; 16]);
    body.push(0);
    let mut framed = Vec::with_capacity(4 + body.len());
    framed.extend_from_slice(&(body.len() as i32).to_be_bytes());
    framed.extend_from_slice(&body);
    framed
}

/// `ConnectResponse`: protocol version (i32), granted timeout in ms (i32), session id (i64),
/// password, read-only flag.
fn parse_granted_timeout(body: &[u8]) -> io::Result<Duration> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let timeout_ms = body
        .get(4..8)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| invalid("short handshake answer".to_owned()))?;
    if timeout_ms <= 0 {
        return Err(invalid(format!(
            "the server refused to open a session (timeout {timeout_ms})"
        )));
    }
    Ok(Duration::from_millis(timeout_ms as u64))
}

/// Pauses before retrying a request that lost its connection during set-up (within the
/// set-up's deadline).
const SETUP_RETRY: RetryPolicy =
    RetryPolicy::new(Duration::from_millis(50), Duration::from_millis(500));

/// Presents the digest credential on the current connection. ZooKeeper keeps it per
/// connection, not per session: the supervisor presents it again after each reconnect.
pub(crate) async fn authenticate(
    zk: &ZooKeeper,
    credential: &[u8],
    deadline: Instant,
) -> Result<(), ZkError> {
    until_deadline(deadline, "authenticate", "/", || {
        zk.add_auth("digest", credential.to_vec())
    })
    .await
}

/// Retries `request` while the connection is being (re-)established, until `deadline`.
pub(crate) async fn until_deadline<T, F, Fut>(
    deadline: Instant,
    op: &'static str,
    path: &str,
    mut request: F,
) -> Result<T, ZkError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ZkCode>>,
{
    let started = Instant::now();
    let timed_out = || ZkError::Timeout {
        op,
        path: path.to_owned(),
        timeout: deadline.saturating_duration_since(started),
    };
    let mut backoff = SETUP_RETRY.backoff();
    loop {
        match timeout_at(deadline, request()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(ZkCode::ConnectionLoss)) => {
                debug!(op, path, "connection lost while setting up; trying again");
                if timeout_at(deadline, tokio::time::sleep(backoff.next_pause()))
                    .await
                    .is_err()
                {
                    return Err(timed_out());
                }
            }
            Ok(Err(code)) => return Err(ZkError::zk(op, path, code)),
            Err(_) => return Err(timed_out()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_request_layout() {
        let req = connect_request(Duration::from_millis(6000));
        assert_eq!(req.len(), 4 + 45);
        assert_eq!(&req[..4], &45i32.to_be_bytes());
        assert_eq!(&req[4 + 12..4 + 16], &6000i32.to_be_bytes());
        assert_eq!(&req[4 + 24..4 + 28], &16i32.to_be_bytes());
    }

    #[test]
    fn granted_timeout() {
        let mut body = Vec::new();
        body.extend_from_slice(&0i32.to_be_bytes());
        body.extend_from_slice(&4000i32.to_be_bytes());
        body.extend_from_slice(&0x1234i64.to_be_bytes());
        assert_eq!(
            parse_granted_timeout(&body).unwrap(),
            Duration::from_millis(4000)
        );
        body[4..8].copy_from_slice(&0i32.to_be_bytes());
        assert!(parse_granted_timeout(&body).is_err());
        assert!(parse_granted_timeout(&body[..6]).is_err());
    }

    #[test]
    fn close_session_frame() {
        assert_eq!(&CLOSE_SESSION[8..], &(-11i32).to_be_bytes());
    }
}
