//! Real credentials on Kafka and the sink: the stack's Kafka has a SASL_SSL listener with
//! SCRAM users and its secured OpenSearch speaks only TLS with basic auth. A service with
//! a wrong password or without the CA that signed the server's certificate stops at
//! start naming the setting to fix; with the right ones it starts. (The secured lane of
//! `make test` runs cluster tests through both.)

use std::time::Duration;

use sluice_integration_tests::secure::Secure;
use sluice_integration_tests::{eventually, Service, TestCtx};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_or_an_untrusted_certificate_stops_a_service_naming_the_setting() {
    let s = Secure::load();
    let ctx = TestCtx::new("secured").await;
    let etl = |n: u32, kafka_password: &str, kafka_ca: bool, es_password: &str, es_ca: bool| {
        let mut kafka = format!(
            "[kafka]\nbrokers = \"{}\"\npartitions = 1\n[kafka.properties]\n\"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanisms\" = \"{}\"\n\"sasl.username\" = \"{}\"\n",
            s.kafka_brokers, s.kafka_mechanism, s.kafka_user
        );
        if kafka_ca {
            kafka.push_str(&format!(
                "\"ssl.ca.location\" = \"{}\"\n",
                s.kafka_ca.display()
            ));
        }
        let mut es = format!(
            "[elasticsearch]\nurl = \"{}\"\nusername = \"{}\"\n",
            s.es_url, s.es_etl.0
        );
        if es_ca {
            es.push_str(&format!(
                "[elasticsearch.tls]\nca = \"{}\"\n",
                s.es_ca.display()
            ));
        }
        let etl = format!(
            "[etl]\ngroup_id = \"{}-{n}\"\ninstance_id = \"{}-{n}\"\n",
            ctx.group, ctx.group
        );
        let topics = ctx.topics_section();
        ctx.etl_of_sections(&format!("etl-{n}"), &[&etl, &kafka, &topics, &es])
            .with_env("SLUICE_KAFKA__SASL_PASSWORD", kafka_password)
            .with_env("SLUICE_ELASTICSEARCH__PASSWORD", es_password)
    };
    let stops_naming = |service: Service, what: &str, named: &str| {
        let (status, out) = service.run_to_exit(Duration::from_secs(60));
        assert!(!status.success(), "an etl started {what}:\n{out}");
        assert!(
            out.contains(named),
            "{what}: the error names `{named}`:\n{out}"
        );
    };
    let (kpw, epw) = (s.kafka_password.as_str(), s.es_etl.1.as_str());
    stops_naming(
        etl(1, "not-the-password", true, epw, true),
        "with a wrong Kafka password",
        "kafka.sasl_password",
    );
    stops_naming(
        etl(2, kpw, false, epw, true),
        "without the brokers' CA",
        "kafka.properties ssl.ca.location",
    );
    stops_naming(
        etl(3, kpw, true, "not-the-password", true),
        "with a wrong OpenSearch password",
        "elasticsearch.username / elasticsearch.password",
    );
    stops_naming(
        etl(4, kpw, true, epw, false),
        "without the cluster's CA",
        "elasticsearch.tls.ca",
    );

    let mut etl = etl(5, kpw, true, epw, true);
    etl.start();
    eventually(
        "the etl with the right credentials is ready",
        Duration::from_secs(60),
        || async {
            match etl.ops("/readyz").await {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{other:?}\n{}", etl.log_tail())),
            }
        },
    )
    .await;
    drop(etl);
    ctx.cleanup().await;
}
