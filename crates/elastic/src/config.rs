//! The `[elasticsearch]` section services share.

use std::time::Duration;

use serde::Deserialize;
use sluice_model::{Secret, TlsFiles};

use crate::{EsClient, EsClientConfig, EsError};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EsSection {
    /// Elasticsearch 7/8 or OpenSearch 2+, e.g. `https://es:9200`.
    pub url: url::Url,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<Secret>,
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// For an `https` URL: the CA to trust instead of the system's, and a client
    /// certificate for clusters that ask for one.
    #[serde(default)]
    pub tls: Option<TlsFiles>,
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

impl EsSection {
    /// Reads the TLS files (an unreadable one is named by its key under
    /// `elasticsearch.tls`) and builds the client.
    pub fn client(&self) -> Result<EsClient, EsError> {
        let tls = match &self.tls {
            Some(files) => Some(files.read("elasticsearch.tls").map_err(EsError::Config)?),
            None => None,
        };
        EsClient::new(EsClientConfig {
            url: self.url.clone(),
            username: self.username.clone(),
            password: self.password.as_ref().map(|s| s.expose().to_owned()),
            request_timeout: self.request_timeout,
            tls,
        })
    }

    /// Asks the cluster who it is, once, at start: `Err` names the setting when it refused
    /// the credentials or its certificate is not trusted; a cluster that does not answer
    /// is no error here (it is retried where it is used).
    pub async fn check_access(client: &EsClient, prefix: &str) -> Result<(), String> {
        let asked = tokio::time::timeout(std::time::Duration::from_secs(10), client.ping());
        let Ok(answered) = asked.await else {
            tracing::warn!(
                setting = %format!("{prefix}.url"),
                "Elasticsearch did not answer within 10 s at start; going on (retried where used)"
            );
            return Ok(());
        };
        match answered {
            Ok(_) => Ok(()),
            Err(e) => match e.refused_setting(prefix) {
                Some(why) => Err(why),
                None => {
                    tracing::warn!(error = %e, "Elasticsearch did not answer at start; going on (retried where used)");
                    Ok(())
                }
            },
        }
    }

    /// Problems, each naming its key under `prefix`.
    pub fn problems(&self, prefix: &str) -> Vec<String> {
        let mut p = Vec::new();
        if self.password.is_some() && self.username.is_none() {
            p.push(format!("{prefix}.password: set {prefix}.username too"));
        }
        if let Some(tls) = &self.tls {
            if self.url.scheme() != "https" {
                p.push(format!(
                    "{prefix}.tls: set only for an https {prefix}.url (it is {})",
                    self.url.scheme()
                ));
            }
            p.extend(tls.problems(&format!("{prefix}.tls")));
        }
        p
    }
}
