//! A hostile caller of the admin API — an admin, or whoever holds an admin token — adds a
//! source at an address it controls and tries to make a service send it a secret: the
//! meta database's password or any other of the host's by reference, or a source's
//! password over a connection whose far end nothing checked, through `sources test`,
//! `sources put` then `sources tables`, and a worker streaming the stored source. Nothing
//! arrives: references outside `[source_secrets]` are refused at put time, a connection
//! without TLS to a host not in `source_plaintext_hosts` never opens, TLS to a server
//! whose certificate no trusted CA signed ends in the handshake, and a server that hands
//! out a key the driver cannot take fails that connection, not the service. Meanwhile a
//! source whose password comes from an allowed file streams.

use std::time::Duration;

use sluice_integration_tests::hostile_mysql::{self_signed, HostileMysql, Ploy};
use sluice_integration_tests::{TestCtx, PASSWORD_VAR};

const HOSTILE_IP: &str = "127.0.0.2";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_an_attacker_controls_receives_no_secret() {
    let ctx = TestCtx::new("hostile").await;
    let dir = ctx.dir.clone();
    let secrets = dir.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::write(
        secrets.join("shop"),
        format!("{}\n", ctx.stack.source_password),
    )
    .unwrap();
    let outside = dir.join("outside");
    std::fs::write(&outside, "not for sources").unwrap();
    for bin in ["sluice-center", "sluice-worker", "sluice-etl"] {
        // Passwords go in plain to the stack's MySQL host only, and sources may name the
        // tests' variables and the files in `secrets`.
        ctx.env_for(bin, "SLUICE_SOURCE_PLAINTEXT_HOSTS", &ctx.stack.mysql_host);
        ctx.env_for(
            bin,
            "SLUICE_SOURCE_SECRETS__DIRS",
            secrets.to_str().unwrap(),
        );
    }
    let hostile = HostileMysql::start(
        HOSTILE_IP,
        Ploy::SwitchAndOfferKey {
            key: b"-----BEGIN PUBLIC KEY-----\nnot a key\n".to_vec(),
        },
    )
    .await;
    let port = hostile.port.to_string();
    ctx.exec("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40))")
        .await;
    let cluster = ctx.start_cluster(1, 1).await;

    // 1. References the center does not let sources name: refused at put time and by
    //    `sources test`, before anything connects, each saying which setting decides.
    let own = dir.join("center-0.toml");
    let refused = [
        ("env:SLUICE_META__PASSWORD".to_owned(), "source_secrets.env"),
        ("env:HOME".to_owned(), "source_secrets.env"),
        ("file:/proc/self/environ".to_owned(), "source_secrets.dirs"),
        (format!("file:{}", own.display()), "source_secrets.dirs"),
        (format!("file:{}", outside.display()), "source_secrets.dirs"),
        (
            format!("file:{}/../outside", secrets.display()),
            "without `.` or `..`",
        ),
    ];
    for (reference, names) in &refused {
        for verb in ["put", "test"] {
            let e = cluster
                .ctl(&[
                    "sources",
                    verb,
                    "evil",
                    "--host",
                    HOSTILE_IP,
                    "--port",
                    &port,
                    "--user",
                    "u",
                    "--password-ref",
                    reference,
                    "--server-id",
                    "901",
                ])
                .expect_err("a reference outside the allowlist");
            assert!(
                e.contains("password_ref") && e.contains(names),
                "sources {verb} with {reference}: {e}"
            );
        }
    }
    assert_eq!(hostile.seen().connections, 0, "nothing connected yet");

    // 2. An allowed reference, but the host is not one passwords may go to in plain.
    let allowed = format!("env:{PASSWORD_VAR}");
    let args = |verb: &'static str| -> Vec<String> {
        [
            "sources",
            verb,
            "evil",
            "--host",
            HOSTILE_IP,
            "--port",
            &port,
            "--user",
            "u",
            "--password-ref",
            &allowed,
            "--server-id",
            "901",
            "--tables",
            "x.y",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let test = args("test");
    let e = cluster
        .ctl(&test.iter().map(String::as_str).collect::<Vec<_>>())
        .expect_err("no plain connection to that host");
    assert!(
        e.contains("source_plaintext_hosts") && e.contains("configure TLS"),
        "{e}"
    );
    let put = args("put");
    cluster
        .ctl(&put.iter().map(String::as_str).collect::<Vec<_>>())
        .expect("the source itself is fine to keep");
    let e = cluster
        .ctl(&["sources", "tables", "evil"])
        .expect_err("no tables over a refused connection");
    assert!(e.contains("source_plaintext_hosts"), "{e}");
    // The worker it is assigned to refuses too, and says so.
    cluster
        .wait_event("evil", "task_failed", &["source_plaintext_hosts"])
        .await;

    // 3. A source whose password comes from an allowed file streams as any other.
    let secret_file = format!("file:{}", secrets.join("shop").display());
    let items = ctx.put_source_with(&cluster, "items", 1, &secret_file);
    ctx.put_pipeline(&cluster, &items, &[] as &[&str]).unwrap();
    cluster
        .wait_running(&[&items], Duration::from_secs(60))
        .await;
    ctx.exec("INSERT INTO items VALUES (1, 'one'), (2, 'two')")
        .await;
    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(60))
        .await;
    assert_eq!(
        hostile.seen().connections,
        0,
        "no service connected to the hostile server"
    );
    assert!(!hostile.got_anything_of(&ctx.stack.source_password));

    // 4. Where the operator did allow plain connections, a key the driver cannot take
    //    fails that connection with what happened, and the next one is tried as usual.
    let plain = sluice_mysql::SourceConfig {
        name: "evil".into(),
        host: HOSTILE_IP.into(),
        port: hostile.port,
        user: "u".into(),
        password: sluice_model::Secret::new("pw-for-the-hostile-test"),
        server_id: 901,
        tables: Vec::new(),
        shards: Vec::new(),
        tls: None,
        allow_plaintext: true,
    };
    for _ in 0..2 {
        let e = sluice_mysql::preflight(&plain, None).await.unwrap_err();
        assert!(e.to_string().contains("could not be used"), "{e}");
    }

    // 5. TLS to a server whose certificate no trusted CA signed: the handshake fails and
    //    nothing follows it.
    let (cert, key) = self_signed(&ctx.dir);
    let untrusted = HostileMysql::start(HOSTILE_IP, Ploy::UntrustedTls { cert, key }).await;
    let ca = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.work/stack/tls/ca.pem");
    assert!(
        ca.exists(),
        "no stack CA at {}: start the stack (`make stack-up`)",
        ca.display()
    );
    let over_tls = sluice_mysql::SourceConfig {
        port: untrusted.port,
        tls: Some(sluice_model::TlsFiles {
            ca: Some(ca),
            ..Default::default()
        }),
        allow_plaintext: false,
        ..plain.clone()
    };
    let e = sluice_mysql::preflight(&over_tls, None).await.unwrap_err();
    let seen = untrusted.seen();
    assert_eq!(seen.connections, 1, "{e}");
    assert_eq!((seen.tls_sessions, seen.handshake_responses), (0, 0), "{e}");
    assert!(!untrusted.got_anything_of("pw-for-the-hostile-test"));

    drop(cluster);
    ctx.cleanup().await;
}
