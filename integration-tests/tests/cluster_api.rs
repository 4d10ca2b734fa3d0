//! The center's gRPC API as clients meet it: health and reflection open to probes and
//! grpcurl, writes refused by followers with the leader's address, input errors naming
//! the field, and mutual TLS admitting only clients with a certificate the CA signed.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sluice_integration_tests::cluster::Bearer;
use sluice_integration_tests::on_sources;
use sluice_integration_tests::ports::free_center_port;
use sluice_integration_tests::{eventually, Service, TestCtx, PASSWORD_VAR};
use sluice_proto::v1::admin_client::AdminClient;
use sluice_proto::v1::Source;
use tokio_stream::StreamExt as _;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_are_open_and_followers_name_the_leader() {
    let ctx = TestCtx::new("api").await;
    let cluster = ctx.start_cluster(2, 0).await;
    let (leader, _) = cluster.wait_leader(Duration::from_secs(10), None).await;
    let follower = 1 - leader;

    for addr in &cluster.addrs {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let health = HealthClient::new(channel.clone());
        eventually(
            "the center reports SERVING",
            Duration::from_secs(10),
            || {
                let mut health = health.clone();
                async move {
                    let status = health
                        .check(HealthCheckRequest {
                            service: "sluice.v1.Admin".into(),
                        })
                        .await
                        .map_err(|e| e.to_string())?
                        .into_inner()
                        .status;
                    if status == ServingStatus::Serving as i32 {
                        Ok(())
                    } else {
                        Err(format!("{addr}: status {status}"))
                    }
                }
            },
        )
        .await;

        let mut reflection = ServerReflectionClient::new(channel);
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut answers = reflection
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .unwrap()
            .into_inner();
        let Some(Ok(answer)) = answers.next().await else {
            panic!("no reflection answer from {addr}");
        };
        let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
            panic!("unexpected reflection answer {answer:?}");
        };
        let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        for wanted in [
            "sluice.v1.Admin",
            "sluice.v1.WorkerReports",
            "grpc.health.v1.Health",
        ] {
            assert!(
                names.iter().any(|n| n == wanted),
                "{wanted} not in {names:?}"
            );
        }
    }

    // A follower refuses a write and names the leader; sluicectl follows it.
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.addrs[follower]))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut admin = AdminClient::with_interceptor(channel, Bearer::new(&ctx.secrets.api_token));
    let source = Source {
        name: "s1".into(),
        host: "db.example".into(),
        port: 3306,
        user: "sluice".into(),
        password_ref: "env:PW".into(),
        server_id: 77,
        tables: vec![],
        epoch: 0,
    };
    let refused = admin.put_source(source.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(
        refused
            .metadata()
            .get("sluice-leader")
            .and_then(|v| v.to_str().ok()),
        Some(cluster.addrs[leader].as_str())
    );
    // Bad input is refused with the field named, before anything is stored.
    let bad = admin
        .put_source(Source {
            password_ref: "hunter2".into(),
            ..source.clone()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(
        bad.message().starts_with("password_ref:"),
        "{}",
        bad.message()
    );

    let only_follower = Command::new(Service::binary("sluicectl"))
        .args(["--center", &format!("http://{}", cluster.addrs[follower])])
        .args([
            "-o",
            "json",
            "sources",
            "put",
            "s1",
            "--host",
            "db.example",
            "--user",
            "u",
        ])
        .args(["--password-ref", "env:PW", "--server-id", "77"])
        .env("SLUICECTL_TOKEN", &ctx.secrets.api_token)
        .output()
        .unwrap();
    assert!(
        only_follower.status.success(),
        "{}",
        String::from_utf8_lossy(&only_follower.stderr)
    );
    let listed = cluster.ctl(&["sources", "list"]).unwrap();
    assert_eq!(listed[0]["name"], "s1", "{listed}");
    assert_eq!(listed[0]["password_ref"], "env:PW");
    // Moving a source to another server would resume at a position of the old one.
    let moved = cluster
        .ctl(&[
            "sources",
            "put",
            "s1",
            "--host",
            "db2.example",
            "--user",
            "u",
            "--password-ref",
            "env:PW",
            "--server-id",
            "77",
        ])
        .unwrap_err();
    assert!(
        moved.contains("host/port cannot change")
            && moved.contains("sluicectl sources failover s1 --host db2.example"),
        "{moved}"
    );

    drop(cluster);
    ctx.cleanup().await;
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl (deploy/install.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, both CA-signed,
/// and a second client certificate signed by nobody the server trusts.
fn certificates(dir: &Path) {
    // A key and certificate signed by itself: the CA, and an intruder nobody trusts.
    let self_signed = |name: &str| {
        let (key, pem, subject) = (
            format!("{name}.key"),
            format!("{name}.pem"),
            format!("/CN={name}"),
        );
        openssl(
            dir,
            &[
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", &subject,
                "-keyout", &key, "-out", &pem,
            ],
        );
    };
    self_signed("sluice-it-ca");
    self_signed("intruder");
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for (name, ext) in [
        ("server", "server.ext"),
        ("client", "client.ext"),
        ("stranger", "client.ext"),
    ] {
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        let subject = format!("/CN=sluice-it-{name}");
        openssl(
            dir,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-subj", &subject, "-keyout", &key, "-out",
                &csr,
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "sluice-it-ca.pem",
                "-CAkey",
                "sluice-it-ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &pem,
                "-extfile",
                ext,
            ],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_only_clients_the_ca_signed_each_as_the_user_its_cn_names() {
    let ctx = TestCtx::new("mtls").await;
    let dir = ctx.dir.join("tls");
    std::fs::create_dir_all(&dir).unwrap();
    certificates(&dir);
    let port = free_center_port();
    let api = format!(
        "[api]\nauth = \"mtls\"\nadmin_user = \"sluice-it-client\"\ntls_cert = \"{d}/server.pem\"\ntls_key = \"{d}/server.key\"\nclient_ca = \"{d}/sluice-it-ca.pem\"\n",
        d = dir.display()
    );
    let mut center = ctx.center_with_api(0, port, &api);
    center.start();
    let d = dir.display().to_string();
    let ctl = |cert: &str, args: &[&str]| {
        Command::new(Service::binary("sluicectl"))
            .args([
                "--center",
                &format!("https://127.0.0.1:{port}"),
                "-o",
                "json",
            ])
            .args(["--ca", &format!("{d}/sluice-it-ca.pem")])
            .args([
                "--cert",
                &format!("{d}/{cert}.pem"),
                "--key",
                &format!("{d}/{cert}.key"),
            ])
            .args(args)
            .env_remove("SLUICECTL_TOKEN")
            .output()
            .unwrap()
    };
    let answered = eventually(
        "the center answers a signed client",
        Duration::from_secs(30),
        || async {
            let out = ctl("client", &["leader"]);
            let said = String::from_utf8_lossy(&out.stdout).into_owned();
            // (Answered before the election ended, the leader is still blank.)
            if out.status.success() && said.contains("\"leader_id\": \"c0\"") {
                Ok(said)
            } else {
                Err(format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    center.log_tail()
                ))
            }
        },
    )
    .await;
    assert!(answered.contains("\"leader_id\": \"c0\""), "{answered}");
    let intruder = ctl("intruder", &["leader"]);
    assert!(
        !intruder.status.success(),
        "a client the CA did not sign was admitted"
    );
    // A certificate acts as the user its CN names: the configured first admin, or a user
    // an admin added; a CN that names nobody is refused, naming the fix.
    let said = |out: std::process::Output| {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = said(ctl("client", &["whoami"]));
    assert!(
        ok && text.contains("sluice-it-client") && text.contains("certificate"),
        "{text}"
    );
    let (ok, text) = said(ctl("stranger", &["leader"]));
    assert!(
        !ok && text.contains("CN `sluice-it-stranger` names no user") && text.contains("users put"),
        "{text}"
    );
    let (ok, text) = said(ctl(
        "client",
        &["users", "put", "sluice-it-stranger", "--role", "viewer"],
    ));
    assert!(ok, "{text}");
    let (ok, text) = said(ctl("stranger", &["leader"]));
    assert!(ok, "a viewer reads: {text}");
    let (ok, text) = said(ctl("stranger", &["rebalance"]));
    assert!(
        !ok && text.contains("operator"),
        "a viewer changes nothing: {text}"
    );
    // Nor does a person's certificate speak for a worker; another certificate leaves it to
    // the report key, which only the process registered as the worker holds.
    let identity = tonic::transport::Identity::from_pem(
        std::fs::read(dir.join("stranger.pem")).unwrap(),
        std::fs::read(dir.join("stranger.key")).unwrap(),
    );
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            std::fs::read(dir.join("sluice-it-ca.pem")).unwrap(),
        ))
        .identity(identity);
    let channel = tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("a signed client connects");
    let reports = sluice_proto::v1::worker_reports_client::WorkerReportsClient::new(channel);
    let refused = |worker: &'static str, says: &'static str| {
        let report = sluice_proto::v1::WorkerReport {
            worker: worker.into(),
            ..Default::default()
        };
        let mut reports = reports.clone();
        async move {
            let refused = reports.report(report).await.unwrap_err();
            assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
            assert!(refused.message().contains(says), "{worker}: {refused:?}");
        }
    };
    refused("w0", "names user `sluice-it-stranger`").await;
    refused("sluice-it-stranger", "names user").await;
    let (ok, text) = said(ctl("client", &["users", "delete", "sluice-it-stranger"]));
    assert!(ok, "{text}");
    refused("w0", "registered as it").await;
    drop(center);
    ctx.cleanup().await;
}

on_sources!(a_source_is_tested_before_it_is_saved_and_its_tables_listed_with_their_columns: mariadb, mysql);
/// `sources test` connects as the workers would without saving anything: ready, with the
/// server and the tables its patterns capture (columns, primary key marked); with a
/// password that is wrong, the problem is named and it exits non-zero. `sources tables`
/// lists a saved source's tables the same way.
async fn a_source_is_tested_before_it_is_saved_and_its_tables_listed_with_their_columns() {
    let ctx = TestCtx::new("srctest").await;
    ctx.items_table(10).await;
    let cluster = ctx.start_cluster(1, 0).await;
    let (host, port) = ctx.source_endpoint();
    let (port, server_id) = (port.to_string(), (ctx.server_id + 3).to_string());
    let tables = format!("{}.*", ctx.db);
    let password_ref = format!("env:{PASSWORD_VAR}");
    let args = |name: &'static str, password_ref: &str| -> Vec<String> {
        [
            "sources",
            "test",
            name,
            "--host",
            &host,
            "--port",
            &port,
            "--user",
            &ctx.stack.source_user,
            "--password-ref",
            password_ref,
            "--server-id",
            &server_id,
            "--tables",
            &tables,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let run = |a: Vec<String>| cluster.ctl(&a.iter().map(String::as_str).collect::<Vec<_>>());

    let ready = run(args("probe", &password_ref)).unwrap();
    assert_eq!(ready["problems"], serde_json::json!([]), "{ready}");
    assert!(
        ready["server"]
            .as_str()
            .is_some_and(|s| s.contains("MySQL") || s.contains("MariaDB")),
        "{ready}"
    );
    let items = &ready["tables"][0];
    assert_eq!(items["table"], "items", "{ready}");
    assert_eq!(items["columns"][0]["name"], "id", "{ready}");
    assert_eq!(items["columns"][0]["key"], true, "{ready}");
    assert_eq!(items["columns"][1]["key"], false, "{ready}");
    assert_eq!(
        cluster.ctl(&["sources", "list"]).unwrap(),
        serde_json::json!([]),
        "nothing saved"
    );

    // A password the server refuses: the problem says so, and nothing is saved.
    let wrong_pw = ctx.dir.join("wrong.password");
    std::fs::write(&wrong_pw, "not-the-password").unwrap();
    let wrong = run(args("probe", &format!("file:{}", wrong_pw.display()))).unwrap_err();
    assert!(
        wrong.contains("cannot stream as given") && wrong.to_lowercase().contains("denied"),
        "{wrong}"
    );

    // A saved source's tables.
    let source = ctx.put_source(&cluster, "items", 1);
    let listed = cluster.ctl(&["sources", "tables", &source.name]).unwrap();
    assert_eq!(listed[0]["table"], "items", "{listed}");
    assert_eq!(
        listed[0]["columns"].as_array().map(Vec::len),
        Some(3),
        "{listed}"
    );
    drop(cluster);
    ctx.cleanup().await;
}
