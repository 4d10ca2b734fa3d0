//! Whether the brokers take this service's credentials, asked once at start so that a
//! wrong password or an untrusted certificate stops the service naming the setting to
//! fix, rather than surfacing later as a timeout in librdkafka's words.

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer as _, ProducerContext};

use crate::{KafkaConfig, TracingContext};

/// librdkafka's errors while asking, kept to tell why it failed.
#[derive(Default)]
struct Recorded(Mutex<Vec<(Option<RDKafkaErrorCode>, String)>>);

impl ClientContext for Recorded {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        if matches!(
            level,
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning
        ) {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((None, log_message.to_owned()));
        }
        TracingContext.log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((code, reason.to_owned()));
        TracingContext.error(error, reason);
    }
}

impl ProducerContext for Recorded {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// What a failure to reach the brokers means for the configuration, if it says anything
/// definite: `None` for what may pass (a broker down, a network in trouble).
pub fn refused_because(code: Option<RDKafkaErrorCode>, reason: &str) -> Option<String> {
    let lower = reason.to_ascii_lowercase();
    if code == Some(RDKafkaErrorCode::Authentication)
        || lower.contains("sasl authentication")
        || lower.contains("authentication failed")
    {
        return Some(format!(
            "kafka.sasl_password (with kafka.properties sasl.username and sasl.mechanisms): the brokers refused these credentials ({reason})"
        ));
    }
    if lower.contains("certificate verify failed") || lower.contains("ssl handshake failed") {
        return Some(format!(
            "kafka.properties ssl.ca.location: the brokers' certificate is not trusted ({reason})"
        ));
    }
    None
}

/// Asks the brokers for their metadata within `within`: `Err` says which setting is wrong
/// when they refused the credentials or the certificate; a broker that does not answer is
/// no error here (it is retried where it is used).
pub async fn check_access(cfg: &KafkaConfig, within: Duration) -> Result<(), String> {
    let mut c = cfg.client_config();
    cfg.apply_overrides(&mut c);
    // A producer: polling it serves librdkafka's error and log callbacks, which say why
    // a connection failed (a metadata request alone only times out).
    let client: BaseProducer<Recorded> = c
        .create_with_context(Recorded::default())
        .map_err(|e| format!("kafka: cannot make a client: {e}"))?;
    // In short slices, so that a refusal librdkafka reports (it logs it, and retries)
    // ends the wait at once.
    let refused = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + within;
        let inner = client.client();
        loop {
            let slice = Duration::from_millis(500);
            let answered = inner.fetch_metadata(None, slice);
            client.poll(Duration::from_millis(50));
            let seen = std::mem::take(&mut *inner.context().0.lock().unwrap_or_else(|e| e.into_inner()));
            let why = seen.iter().find_map(|(code, reason)| refused_because(*code, reason));
            match answered {
                Ok(_) => return Ok(()),
                Err(e) => {
                    let why = why.or_else(|| refused_because(e.rdkafka_error_code(), &e.to_string()));
                    if let Some(why) = why {
                        return Err(why);
                    }
                    if std::time::Instant::now() >= deadline {
                        tracing::warn!(error = %e, "the Kafka brokers did not answer at start; going on (retried where used)");
                        return Ok(());
                    }
                }
            }
        }
    })
    .await
    .map_err(|e| format!("kafka: the check did not finish: {e}"))?;
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_setting_and_outages_do_not_count() {
        let auth = refused_because(
            Some(RDKafkaErrorCode::Authentication),
            "SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512",
        )
        .unwrap();
        assert!(auth.starts_with("kafka.sasl_password"), "{auth}");
        let tls = refused_because(
            None,
            "ssl://127.0.0.1:19094/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed",
        )
        .unwrap();
        assert!(tls.starts_with("kafka.properties ssl.ca.location"), "{tls}");
        assert_eq!(
            refused_because(
                Some(RDKafkaErrorCode::AllBrokersDown),
                "1/1 brokers are down"
            ),
            None
        );
    }
}
