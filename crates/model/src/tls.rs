//! TLS settings a service gives each server it connects to (MySQL, Elasticsearch): the CA
//! the server's certificate is checked against and, when the server asks for one, a client
//! certificate. One shape for every client, so `[source_tls]`, `[meta.tls]` and
//! `[elasticsearch.tls]` read and are checked alike.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// With it every connection is TLS, the server's certificate checked against `ca` (else
/// the system's roots) and its name against the host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
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

/// [`TlsFiles`] read into memory, for clients that take PEM bytes rather than paths.
#[derive(Clone, Default)]
pub struct TlsPem {
    pub ca: Option<Vec<u8>>,
    /// The client certificate followed by its key, both PEM.
    pub identity: Option<Vec<u8>>,
    pub skip_hostname_check: bool,
}

impl std::fmt::Debug for TlsPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPem")
            .field("ca", &self.ca.as_ref().map(Vec::len))
            .field("identity", &self.identity.as_ref().map(|_| "<redacted>"))
            .field("skip_hostname_check", &self.skip_hostname_check)
            .finish()
    }
}

impl TlsFiles {
    /// Problems with the values (no I/O), each naming its key under `prefix`: a
    /// certificate without its key, or the reverse; a host name not checked against the
    /// system's roots (any certificate a public CA signed, for any name, would pass).
    pub fn problems(&self, prefix: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.skip_hostname_check && self.ca.is_none() {
            out.push(format!(
                "{prefix}.skip_hostname_check: needs {prefix}.ca (only a CA of your own may vouch for a certificate whose names are not checked)"
            ));
        }
        if self.cert.is_some() != self.key.is_some() {
            out.push(format!(
                "{prefix}.cert / {prefix}.key: give both (a client certificate and its key) or neither"
            ));
        }
        out
    }

    /// Reads every file, so a service can stop at start with the key of one it cannot
    /// read rather than fail its first connection with the driver's words.
    pub fn read(&self, prefix: &str) -> Result<TlsPem, String> {
        let read = |key: &str, path: &Path| {
            std::fs::read(path)
                .map_err(|e| format!("{prefix}.{key}: cannot read {}: {e}", path.display()))
        };
        let ca = self.ca.as_deref().map(|p| read("ca", p)).transpose()?;
        let identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let mut pem = read("cert", cert)?;
                pem.push(b'\n');
                pem.extend(read("key", key)?);
                Some(pem)
            }
            (None, None) => None,
            _ => return Err(self.problems(prefix).join("; ")),
        };
        Ok(TlsPem {
            ca,
            identity,
            skip_hostname_check: self.skip_hostname_check,
        })
    }
}

/// The problems of every setting in `settings` (key, files), without I/O.
pub fn problems_of(settings: &[(String, &TlsFiles)]) -> Vec<String> {
    settings
        .iter()
        .flat_map(|(key, t)| t.problems(key))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_without_its_key_is_named() {
        let tls = TlsFiles {
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
        assert!(TlsFiles::default().problems("x").is_empty());
        let unchecked = TlsFiles {
            skip_hostname_check: true,
            ..TlsFiles::default()
        };
        let problems = unchecked.problems("meta.tls");
        assert!(
            problems.len() == 1
                && problems[0].starts_with("meta.tls.skip_hostname_check: needs meta.tls.ca"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_file_that_cannot_be_read_names_its_key() {
        let dir = std::env::temp_dir().join(format!("sluice-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.pem"), b"CA").unwrap();
        std::fs::write(dir.join("client.pem"), b"CERT").unwrap();
        let tls = TlsFiles {
            ca: Some(dir.join("ca.pem")),
            cert: Some(dir.join("client.pem")),
            key: Some(dir.join("missing.key")),
            skip_hostname_check: false,
        };
        let err = tls.read("elasticsearch.tls").unwrap_err();
        assert!(
            err.starts_with("elasticsearch.tls.key: cannot read "),
            "{err}"
        );
        assert!(err.contains("missing.key"), "{err}");

        std::fs::write(dir.join("client.key"), b"KEY").unwrap();
        let tls = TlsFiles {
            key: Some(dir.join("client.key")),
            ..tls
        };
        let pem = tls.read("elasticsearch.tls").unwrap();
        assert_eq!(pem.ca.as_deref(), Some(&b"CA"[..]));
        assert_eq!(pem.identity.as_deref(), Some(&b"CERT\nKEY"[..]));
        assert!(!format!("{pem:?}").contains("KEY"), "{pem:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
