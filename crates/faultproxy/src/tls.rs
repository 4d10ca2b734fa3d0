//! A TLS front: a server without TLS (the local Elasticsearch) reached as a cluster that
//! requires it, with a certificate of a test CA and client certificates.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// Accepts TLS on a port of its own with `cert`/`key`, admits only clients presenting a
/// certificate `client_ca` signed, and relays the plain bytes to `upstream`.
pub struct TlsFront {
    port: u16,
    refused: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    /// Panics (it is a test's fixture) when a file cannot be read or is not PEM.
    pub async fn start(upstream: &str, cert: &Path, key: &Path, client_ca: &Path) -> TlsFront {
        let acceptor = TlsAcceptor::from(Arc::new(server_config(cert, key, client_ca)));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a TLS front");
        let port = listener.local_addr().expect("front address").port();
        let refused = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(serve(
            listener,
            acceptor,
            upstream.to_owned(),
            refused.clone(),
        ));
        TlsFront {
            port,
            refused,
            task,
        }
    }

    /// `https://127.0.0.1:PORT/`, an address the local stack's server certificate names.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}/", self.port)
    }

    /// Handshakes that failed: no client certificate, one of another CA, or a client that
    /// did not trust the front's.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn server_config(cert: &Path, key: &Path, client_ca: &Path) -> ServerConfig {
    let provider = Arc::new(ring::default_provider());
    let mut roots = RootCertStore::empty();
    for ca in pem_certs(client_ca) {
        roots.add(ca).expect("a CA certificate");
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .expect("a client certificate verifier");
    let key = PrivateKeyDer::from_pem_file(key)
        .unwrap_or_else(|e| panic!("{}: not a PEM private key: {e}", key.display()));
    ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(pem_certs(cert), key)
        .expect("the front's certificate and key")
}

fn pem_certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .unwrap_or_else(|e| panic!("{}: not PEM certificates: {e}", path.display()))
}

async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    upstream: String,
    refused: Arc<AtomicU64>,
) {
    while let Ok((client, _)) = listener.accept().await {
        let (acceptor, upstream, refused) = (acceptor.clone(), upstream.clone(), refused.clone());
        tokio::spawn(async move {
            let Ok(mut client) = acceptor.accept(client).await else {
                refused.fetch_add(1, Ordering::Relaxed);
                return;
            };
            if let Ok(mut server) = TcpStream::connect(&upstream).await {
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            }
        });
    }
}
