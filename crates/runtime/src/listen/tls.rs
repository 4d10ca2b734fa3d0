//! A listener's TLS from PEM files: a certificate chain and its key, and — for mutual
//! TLS — the CA whose certificates clients must present.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// What the files are called in errors: the configuration keys that name them.
pub struct Keys<'a> {
    pub cert: &'a str,
    pub key: &'a str,
    pub client_ca: &'a str,
}

/// A TLS acceptor offering `alpn` (e.g. `h2`, `http/1.1`), with `cert` and `key`, asking
/// clients for a certificate `client_ca` signed when given. Errors name the key.
pub fn acceptor(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    alpn: &[&[u8]],
    keys: &Keys<'_>,
) -> Result<TlsAcceptor, String> {
    let read = |path: &Path, name: &str| {
        std::fs::read(path).map_err(|e| format!("{name}: {}: {e}", path.display()))
    };
    let certs = CertificateDer::pem_slice_iter(&read(cert, keys.cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", keys.cert))?;
    let private = PrivateKeyDer::from_pem_slice(&read(key, keys.key)?)
        .map_err(|e| format!("{}: {e}", keys.key))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(&read(ca, keys.client_ca)?) {
                let c = c.map_err(|e| format!("{}: {e}", keys.client_ca))?;
                roots
                    .add(c)
                    .map_err(|e| format!("{}: {e}", keys.client_ca))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{}: {e}", keys.client_ca))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, private)
        .map_err(|e| format!("{} / {}: {e}", keys.cert, keys.key))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(TlsAcceptor::from(Arc::new(config)))
}
