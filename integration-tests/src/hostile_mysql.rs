//! A hostile MySQL server: it greets as MySQL does, then tries what a server an attacker
//! controls would, to get a source's password out of the service connecting to it (an
//! admin may add a source at any address). It records every byte it is sent, so a test
//! can say the password — or a scramble an offline guess could test — never arrived.

use std::path::Path;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// What the server does once a client connects.
#[derive(Clone)]
pub enum Ploy {
    /// Greets with `mysql_native_password`, then switches the client to
    /// `caching_sha2_password`, asks for the full exchange and hands out `key` as its RSA
    /// public key (an invalid PEM one crashes a careless client).
    SwitchAndOfferKey { key: Vec<u8> },
    /// Offers TLS with a certificate no CA the client trusts signed (`cert`, `key`: PEM
    /// files), and reads whatever comes through it.
    UntrustedTls { cert: Vec<u8>, key: Vec<u8> },
}

/// What the server saw.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// TCP connections accepted.
    pub connections: usize,
    /// Every byte clients sent, TLS-decrypted where a session was made.
    pub bytes: Vec<u8>,
    /// Whether a client completed a TLS handshake with the untrusted certificate.
    pub tls_sessions: usize,
    /// Whether a client got as far as sending a handshake response (credentials).
    pub handshake_responses: usize,
}

pub struct HostileMysql {
    pub port: u16,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

const NATIVE: &str = "mysql_native_password";
const SHA2: &str = "caching_sha2_password";

impl HostileMysql {
    /// Listens on `ip` (a loopback address of its own, such as `127.0.0.2`, so that
    /// allowing the stack's MySQL host does not allow it).
    pub async fn start(ip: &str, ploy: Ploy) -> HostileMysql {
        let listener = TcpListener::bind((ip, 0)).await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let s = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                s.lock().expect("seen").connections += 1;
                tokio::spawn(serve(tcp, ploy.clone(), s.clone()));
            }
        });
        HostileMysql { port, seen, task }
    }

    pub fn seen(&self) -> Seen {
        self.seen.lock().expect("seen").clone()
    }

    /// Whether `secret`, or a scramble of it a guess could be checked against, is among
    /// the bytes received: the password itself, or any handshake response at all (its
    /// auth data is the scramble).
    pub fn got_anything_of(&self, secret: &str) -> bool {
        let seen = self.seen();
        seen.handshake_responses > 0
            || seen.tls_sessions > 0
            || seen
                .bytes
                .windows(secret.len())
                .any(|w| w == secret.as_bytes())
    }
}

impl Drop for HostileMysql {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A self-signed certificate and key (PEM) for `127.0.0.1`, made with openssl in `dir`.
pub fn self_signed(dir: &Path) -> (Vec<u8>, Vec<u8>) {
    let (cert, key) = (dir.join("hostile.pem"), dir.join("hostile.key"));
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (deploy/install.sh installs it)");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (std::fs::read(cert).unwrap(), std::fs::read(key).unwrap())
}

async fn serve(mut tcp: tokio::net::TcpStream, ploy: Ploy, seen: Arc<Mutex<Seen>>) {
    let tls = matches!(ploy, Ploy::UntrustedTls { .. });
    if write_packet(&mut tcp, 0, &greeting(tls)).await.is_err() {
        return;
    }
    match ploy {
        Ploy::SwitchAndOfferKey { key } => {
            let _ = switch_and_offer(&mut tcp, &key, &seen).await;
        }
        Ploy::UntrustedTls { cert, key } => {
            // The SSLRequest (capabilities only), then the TLS handshake.
            let Ok((_, request)) = read_packet(&mut tcp, &seen).await else {
                return;
            };
            if request.len() != 32 {
                // Not an SSLRequest: a handshake response in the clear.
                seen.lock().expect("seen").handshake_responses += 1;
                return;
            }
            let acceptor = TlsAcceptor::from(Arc::new(
                tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
                    tokio_rustls::rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_no_client_auth()
                .with_single_cert(
                    CertificateDer::pem_slice_iter(&cert)
                        .collect::<Result<_, _>>()
                        .expect("cert"),
                    PrivateKeyDer::from_pem_slice(&key).expect("key"),
                )
                .expect("TLS config"),
            ));
            let Ok(mut inner) = acceptor.accept(tcp).await else {
                return;
            };
            seen.lock().expect("seen").tls_sessions += 1;
            if read_packet(&mut inner, &seen).await.is_ok() {
                seen.lock().expect("seen").handshake_responses += 1;
            }
        }
    }
}

async fn switch_and_offer(
    tcp: &mut tokio::net::TcpStream,
    key: &[u8],
    seen: &Mutex<Seen>,
) -> std::io::Result<()> {
    let (seq, _response) = read_packet(tcp, seen).await?;
    seen.lock().expect("seen").handshake_responses += 1;
    let mut switch = vec![0xfe];
    switch.extend_from_slice(SHA2.as_bytes());
    switch.push(0);
    switch.extend_from_slice(b"01234567890123456789");
    switch.push(0);
    write_packet(tcp, seq + 1, &switch).await?;
    let (seq, _scramble) = read_packet(tcp, seen).await?;
    write_packet(tcp, seq + 1, &[0x01, 0x04]).await?;
    let (seq, ask) = read_packet(tcp, seen).await?;
    if ask == [0x02] {
        let mut answer = vec![0x01];
        answer.extend_from_slice(key);
        write_packet(tcp, seq + 1, &answer).await?;
        let _ = read_packet(tcp, seen).await?;
    }
    Ok(())
}

/// A protocol-10 handshake announcing `mysql_native_password` (and TLS when `tls`).
fn greeting(tls: bool) -> Vec<u8> {
    let mut caps: u32 = 0x0000_0001
        | 0x0000_0004
        | 0x0000_0008
        | 0x0000_0200
        | 0x0000_2000
        | 0x0000_8000
        | 0x0001_0000
        | 0x0002_0000
        | 0x0008_0000
        | 0x0010_0000
        | 0x0020_0000;
    if tls {
        caps |= 0x0000_0800;
    }
    let mut p = vec![10];
    p.extend_from_slice(b"8.0.99-hostile\0");
    p.extend_from_slice(&42u32.to_le_bytes());
    p.extend_from_slice(b"abcdefgh");
    p.push(0);
    p.extend_from_slice(&(caps as u16).to_le_bytes());
    p.push(0x21);
    p.extend_from_slice(&2u16.to_le_bytes());
    p.extend_from_slice(&((caps >> 16) as u16).to_le_bytes());
    p.push(21);
    p.extend_from_slice(&[0; 10]);
    p.extend_from_slice(b"ijklmnopqrst\0");
    p.extend_from_slice(NATIVE.as_bytes());
    p.push(0);
    p
}

async fn write_packet(
    w: &mut (impl AsyncWrite + Unpin),
    seq: u8,
    payload: &[u8],
) -> std::io::Result<()> {
    let len = payload.len() as u32;
    let mut frame = len.to_le_bytes()[..3].to_vec();
    frame.push(seq);
    frame.extend_from_slice(payload);
    w.write_all(&frame).await?;
    w.flush().await
}

async fn read_packet(
    r: &mut (impl AsyncRead + Unpin),
    seen: &Mutex<Seen>,
) -> std::io::Result<(u8, Vec<u8>)> {
    let mut header = [0u8; 4];
    r.read_exact(&mut header).await?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    let mut s = seen.lock().expect("seen");
    s.bytes.extend_from_slice(&header);
    s.bytes.extend_from_slice(&payload);
    Ok((header[3], payload))
}
