//! The console over HTTPS, with the API's certificate (`api.tls_cert`, `api.tls_key`):
//! its session cookie is `Secure`, which a browser keeps only from an HTTPS page (or a
//! loopback one). No client certificate is asked for: the console has its own logins.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::error::{CenterError, Result as CenterResult};

/// How long a client may take over its TLS handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

/// The console's TLS settings from the API's certificate and key (PEM files).
pub(super) fn acceptor(cert: &Path, key: &Path) -> CenterResult<TlsAcceptor> {
    let read = |path: &Path, key: &str| {
        std::fs::read(path)
            .map_err(|e| CenterError::definite(format!("{key}: {}: {e}", path.display())))
    };
    let certs = CertificateDer::pem_slice_iter(&read(cert, "api.tls_cert")?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CenterError::definite(format!("api.tls_cert: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(&read(key, "api.tls_key")?)
        .map_err(|e| CenterError::definite(format!("api.tls_key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|e| {
            CenterError::definite(format!("api.tls_cert/api.tls_key for the console: {e}"))
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts connections and completes their handshakes, one at a time (each within
/// [`HANDSHAKE_WITHIN`]); one that fails is dropped and the next is taken.
pub(super) struct TlsListener {
    pub(super) tcp: TcpListener,
    pub(super) acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (tcp, peer) = match self.tcp.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, say: wait a moment rather than spin.
                    tracing::warn!(error = %e, "the console cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            match tokio::time::timeout(HANDSHAKE_WITHIN, self.acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => return (tls, peer),
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "a console TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "a console TLS handshake took too long"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
