//! TLS to a MySQL server (`[source_tls]`, a source's `tls`, `[meta.tls]`): the CA its
//! certificate is checked against and, for accounts created `REQUIRE X509` (or
//! `SUBJECT`/`ISSUER`), a client certificate.

use mysql_async::{ClientIdentity, SslOpts};
use sluice_model::TlsFiles;

/// What the driver takes. It reads the files at connect; a service checks them at start
/// with [`TlsFiles::read`].
pub fn ssl_opts(tls: &TlsFiles) -> SslOpts {
    let mut opts = SslOpts::default()
        .with_danger_skip_domain_validation(tls.skip_hostname_check)
        .with_client_identity(match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => {
                Some(ClientIdentity::new(cert.clone().into(), key.clone().into()))
            }
            _ => None,
        });
    if let Some(ca) = &tls.ca {
        opts = opts
            .with_root_certs(vec![ca.clone().into()])
            .with_disable_built_in_roots(true);
    }
    opts
}

/// A service's MySQL TLS settings by key: `source_tls`, shared by the center's sources, and
/// each file source's own `tls`.
pub fn settings<'a>(
    shared: Option<&'a TlsFiles>,
    sources: &'a [crate::SourceConfig],
) -> Vec<(String, &'a TlsFiles)> {
    let shared = shared.map(|t| ("source_tls".to_owned(), t));
    let own = sources
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.tls.as_ref().map(|t| (format!("sources[{i}].tls"), t)));
    shared.into_iter().chain(own).collect()
}
