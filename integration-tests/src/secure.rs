//! The stack's endpoints with real credentials (`deploy/stack.sh` writes them to
//! `.work/stack/secure.env`): Kafka's SASL_SSL listener with its SCRAM user, and the
//! OpenSearch node with its security plugin (TLS, basic auth, a least-privilege user for
//! the etl and one for the center). With `SECURED_LANE=1` (the secured lane of
//! `make test`) every service of a test, and the test's own clients, go through them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The variable that puts a test process on the secured lane.
pub const LANE: &str = "SECURED_LANE";

#[derive(Debug, Clone)]
pub struct Secure {
    pub kafka_brokers: String,
    pub kafka_mechanism: String,
    pub kafka_user: String,
    pub kafka_password: String,
    pub kafka_ca: PathBuf,
    pub es_url: String,
    pub es_ca: PathBuf,
    /// The etl's user (writes documents; the workers' checks use it too).
    pub es_etl: (String, String),
    /// The centers' user (indexes and aliases).
    pub es_center: (String, String),
    /// Everything, for the test's own checks.
    pub es_admin: (String, String),
}

impl Secure {
    /// The stack's secured endpoints, or a message saying how to get them.
    pub fn load() -> Secure {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.work/stack/secure.env");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}: start the local stack with `make stack-up` (it runs Kafka's SASL_SSL \
                 listener and the secured OpenSearch, and writes this file)",
                path.display()
            )
        });
        let vars: HashMap<&str, &str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .collect();
        let var = |k: &str| -> String {
            vars.get(k).map(|v| v.to_string()).unwrap_or_else(|| {
                panic!(
                    "{} names no {k}: restart the stack (`make stack-up`)",
                    path.display()
                )
            })
        };
        Secure {
            kafka_brokers: var("SECURE_KAFKA_BROKERS"),
            kafka_mechanism: var("SECURE_KAFKA_MECHANISM"),
            kafka_user: var("SECURE_KAFKA_USER"),
            kafka_password: var("SECURE_KAFKA_PASSWORD"),
            kafka_ca: var("SECURE_KAFKA_CA").into(),
            es_url: var("SECURE_ES_URL"),
            es_ca: var("SECURE_ES_CA").into(),
            es_etl: (var("SECURE_ES_ETL_USER"), var("SECURE_ES_ETL_PASSWORD")),
            es_center: (
                var("SECURE_ES_CENTER_USER"),
                var("SECURE_ES_CENTER_PASSWORD"),
            ),
            es_admin: (var("SECURE_ES_ADMIN_USER"), var("SECURE_ES_ADMIN_PASSWORD")),
        }
    }

    /// The secured endpoints when this process is on the secured lane.
    pub fn lane() -> Option<&'static Secure> {
        static SECURE: OnceLock<Option<Secure>> = OnceLock::new();
        SECURE
            .get_or_init(|| (std::env::var(LANE).is_ok_and(|v| v == "1")).then(Secure::load))
            .as_ref()
    }

    /// librdkafka's settings for the SASL_SSL listener (the password apart).
    pub fn kafka_properties(&self) -> Vec<(&'static str, String)> {
        vec![
            ("security.protocol", "SASL_SSL".into()),
            ("sasl.mechanisms", self.kafka_mechanism.clone()),
            ("sasl.username", self.kafka_user.clone()),
            ("ssl.ca.location", self.kafka_ca.display().to_string()),
        ]
    }

    /// A service's `[kafka.properties]` for the listener.
    pub fn kafka_toml(&self) -> String {
        let mut t = String::from("[kafka.properties]\n");
        for (k, v) in self.kafka_properties() {
            t.push_str(&format!("{k:?} = {v:?}\n"));
        }
        t
    }

    /// A client's configuration for the listener.
    pub fn kafka_config(&self) -> sluice_kafka::KafkaConfig {
        let mut cfg = sluice_kafka::KafkaConfig::new(self.kafka_brokers.clone());
        for (k, v) in self.kafka_properties() {
            cfg.properties.insert(k.to_owned(), v);
        }
        cfg.sasl_password = Some(sluice_model::Secret::new(&self.kafka_password));
        cfg
    }

    /// The user a service of binary `bin` reaches the secured cluster as.
    pub fn es_user_of(&self, bin: &str) -> &(String, String) {
        match bin {
            "sluice-center" => &self.es_center,
            _ => &self.es_etl,
        }
    }
}
