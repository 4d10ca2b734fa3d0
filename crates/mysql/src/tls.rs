//! TLS to a MySQL server: the CA its certificate is checked against and, for accounts
//! created `REQUIRE X509` (or `SUBJECT`/`ISSUER`), a client certificate.

use std::path::PathBuf;

use mysql_async::{ClientIdentity, SslOpts};
use serde::Deserialize;

/// `[source_tls]`, a source's `tls`, `[meta.tls]`: with it every connection is TLS, the
/// server's certificate checked against `ca` (else the system's roots) and its name
/// against the host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MysqlTls {
    /// PEM file of the CA(s) that sign the server's certificate; only they are trusted.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// PEM client certificate (chain) and its private key, presented to the server.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Accept a certificate whose names do not include the host connected to (a server
    /// reached by an address its certificate does not name). Default false.
    #[serde(default)]
    pub skip_hostname_check: bool,
}

impl MysqlTls {
    /// What the driver takes.
    pub fn ssl_opts(&self) -> SslOpts {
        let mut opts = SslOpts::default()
            .with_danger_skip_domain_validation(self.skip_hostname_check)
            .with_client_identity(match (&self.cert, &self.key) {
                (Some(cert), Some(key)) => {
                    Some(ClientIdentity::new(cert.clone().into(), key.clone().into()))
                }
                _ => None,
            });
        if let Some(ca) = &self.ca {
            opts = opts
                .with_root_certs(vec![ca.clone().into()])
                .with_disable_built_in_roots(true);
        }
        opts
    }

    /// Problems with the values (no I/O: the files are read at connect), each naming its
    /// key under `prefix`: a certificate without its key, or the reverse.
    pub fn problems(&self, prefix: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.cert.is_some() != self.key.is_some() {
            out.push(format!(
                "{prefix}.cert / {prefix}.key: give both (a client certificate and its key) or neither"
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_without_its_key_is_named() {
        let tls = MysqlTls {
            ca: Some("/etc/ca.pem".into()),
            cert: Some("/etc/client.pem".into()),
            key: None,
            skip_hostname_check: false,
        };
        let problems = tls.problems("source_tls");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("source_tls.cert / source_tls.key"),
            "{problems:?}"
        );
        assert!(MysqlTls::default().problems("x").is_empty());
    }
}
