//! Callers who hold no credential, or hold one and stall, get nothing of a center:
//! - hammering every listener (the gRPC API with wrong and made-up tokens and methods,
//!   the console with anonymous calls, invented methods and wrong passwords under invented
//!   user names, the search API with wrong tokens, the dictionaries) for a bounded time
//!   adds no more audit rows than there are kinds of refusal, no events, and an admin's
//!   console call answers quickly meanwhile;
//! - slow clients (connecting and saying nothing, stalling after the TLS handshake,
//!   dribbling an HTTP head, half an HTTP/2 preface) are closed by each listener within
//!   its deadline, side by side, while an admin is served.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use reqwest::StatusCode;
use serde_json::json;
use sluice_integration_tests::cluster::Bearer;
use sluice_integration_tests::console::Browser;
use sluice_integration_tests::ports::{console_port, dictionary_port, free_center_port, free_port};
use sluice_integration_tests::{eventually, stack::random_hex, TestCtx};
use sluice_proto::v1::admin_client::AdminClient;
use sluice_proto::v1::ListSourcesRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the callers hammer.
const HAMMER_FOR: Duration = Duration::from_secs(10);
/// Callers at once.
const CALLERS: usize = 16;
/// The audit rows the hammering may add at most: one per kind of refusal it can meet
/// (each kind is recorded once a minute, and it lasts less).
const MOST_ROWS: u64 = 16;
/// The slowest an admin's console call may be answered meanwhile.
const ADMIN_WITHIN: Duration = Duration::from_secs(2);

async fn rows(ctx: &TestCtx) -> (u64, u64) {
    let db = ctx.meta_db();
    let mut c = ctx.stack.conn().await;
    let audit: u64 = c
        .query_first(format!("SELECT COUNT(*) FROM `{db}`.audit"))
        .await
        .unwrap()
        .unwrap();
    let events: u64 = c
        .query_first(format!(
            "SELECT COUNT(*) FROM `{db}`.events WHERE kind <> 'leader'"
        ))
        .await
        .unwrap()
        .unwrap();
    (audit, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_without_credentials_grow_nothing_and_slow_no_admin() {
    let ctx = TestCtx::new("hammer").await;
    let search_port = free_port();
    ctx.center_section(&format!("[search]\nlisten = \"127.0.0.1:{search_port}\"\n"));
    let cluster = ctx.start_cluster(1, 0).await;
    let grpc = format!("http://{}", cluster.addrs[0]);
    let api_port: u16 = cluster.addrs[0]
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let console = Browser {
        http: reqwest::Client::new(),
        url: cluster.console_url(0),
    };
    let (cookie, csrf) = console
        .login(None, "admin", &ctx.secrets.admin_password)
        .await;
    let before = rows(&ctx).await;

    let calls = Arc::new([(); 4].map(|_| AtomicU64::new(0)));
    let until = Instant::now() + HAMMER_FOR;
    let mut callers = tokio::task::JoinSet::new();
    for n in 0..CALLERS {
        let (grpc, calls, url) = (grpc.clone(), calls.clone(), console.url.clone());
        callers.spawn(async move {
            let http = reqwest::Client::new();
            let channel = tonic::transport::Endpoint::from_shared(grpc)
                .unwrap()
                .connect_lazy();
            let mut i = 0u64;
            while Instant::now() < until {
                i += 1;
                let made_up = format!("user-{n}-{i}-{}", random_hex());
                match i % 4 {
                    // The gRPC API: a wrong token, a made-up user token, a made-up method.
                    0 => {
                        let token = if i % 8 == 0 {
                            format!("sluice_{}", random_hex())
                        } else {
                            random_hex()
                        };
                        let mut c =
                            AdminClient::with_interceptor(channel.clone(), Bearer::new(&token));
                        let _ = c.list_sources(ListSourcesRequest {}).await;
                        let mut raw = tonic::client::Grpc::new(channel.clone());
                        if raw.ready().await.is_ok() {
                            let path = format!("/sluice.v1.Admin/Nonesuch{i}");
                            let _ = raw
                                .unary::<_, ListSourcesRequest, _>(
                                    tonic::Request::new(ListSourcesRequest {}),
                                    path.try_into().unwrap(),
                                    tonic_prost::ProstCodec::default(),
                                )
                                .await;
                        }
                        calls[0].fetch_add(2, Ordering::Relaxed);
                    }
                    // The console: no session, a made-up method, a wrong password under a
                    // made-up name claiming to come from elsewhere.
                    1 => {
                        let _ = http
                            .post(format!("{url}/api/ListSources"))
                            .body("{}")
                            .send()
                            .await;
                        let _ = http
                            .post(format!("{url}/api/{made_up}"))
                            .body("{}")
                            .send()
                            .await;
                        let _ = http
                            .post(format!("{url}/login"))
                            .header("content-type", "application/json")
                            .header("x-forwarded-for", format!("203.0.113.{}", i % 250))
                            .body(
                                json!({"user": made_up, "password": "not-the-password"})
                                    .to_string(),
                            )
                            .send()
                            .await;
                        calls[1].fetch_add(3, Ordering::Relaxed);
                    }
                    // The search API with a wrong token.
                    2 => {
                        let _ = http
                            .post(format!(
                                "http://127.0.0.1:{search_port}/v1/aliases/{made_up}/search"
                            ))
                            .bearer_auth(random_hex())
                            .body("{}")
                            .send()
                            .await;
                        calls[2].fetch_add(1, Ordering::Relaxed);
                    }
                    // The dictionaries, open to all.
                    _ => {
                        let _ = http
                            .get(format!(
                                "http://127.0.0.1:{}/dict/ext",
                                dictionary_port(api_port)
                            ))
                            .send()
                            .await;
                        calls[3].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    // Meanwhile an admin uses the console.
    let mut answered = Vec::new();
    while Instant::now() < until {
        let t0 = Instant::now();
        let r = console
            .post("/api/ListSources", Some(&cookie), Some(&csrf), json!({}))
            .await;
        assert_eq!(r.status(), StatusCode::OK, "{:?}", r.text().await);
        answered.push(t0.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while callers.join_next().await.is_some() {}
    let after = rows(&ctx).await;
    answered.sort();
    let (p50, slowest) = (answered[answered.len() / 2], *answered.last().unwrap());
    let made: Vec<u64> = calls.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    println!(
        "hostile callers for {HAMMER_FOR:?}: gRPC {} calls, console {}, search API {}, dictionaries {}; \
         audit rows added {}, events added {}; the admin's console call p50 {p50:?}, slowest {slowest:?} ({} calls)",
        made[0], made[1], made[2], made[3], after.0 - before.0, after.1 - before.1, answered.len()
    );
    assert!(made.iter().all(|n| *n > 50), "the callers ran: {made:?}");
    assert!(
        after.0 - before.0 <= MOST_ROWS,
        "{} audit rows added by {} refused calls",
        after.0 - before.0,
        made.iter().sum::<u64>()
    );
    assert_eq!(
        after.1, before.1,
        "events added by callers without credentials"
    );
    assert!(slowest < ADMIN_WITHIN, "the admin waited {slowest:?}");
    // Every name recorded is one the center knows.
    let audit = cluster.ctl(&["audit", "--limit", "100"]).unwrap();
    for e in audit.as_array().unwrap() {
        let (user, method) = (e["user"].as_str().unwrap(), e["method"].as_str().unwrap());
        assert!(
            !user.starts_with("user-")
                && !method.starts_with("Nonesuch")
                && !method.starts_with("user-"),
            "{e}"
        );
    }
    let refused = cluster.centers[0]
        .metric_sum("sluice_center_refused_calls_total", &[])
        .await
        .unwrap();
    assert!(
        refused >= made[0] as f64 / 2.0,
        "refusals counted: {refused}"
    );

    drop(cluster);
    ctx.cleanup().await;
}

/// Slow clients are closed within each listener's deadlines (2 s here), however many at
/// once, and an admin is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_closed_within_the_deadlines_while_an_admin_is_served() {
    let ctx = TestCtx::new("slowloris").await;
    let tls = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.work/stack/tls");
    assert!(
        tls.join("server.pem").exists(),
        "no certificates in {}: start the local stack with `make stack-up`",
        tls.display()
    );
    let port = free_center_port();
    let search_port = free_port();
    ctx.center_section(&format!(
        "[search]\nlisten = \"127.0.0.1:{search_port}\"\n\n[limits]\nhandshake_within = \"2s\"\nfirst_bytes_within = \"2s\"\nhead_within = \"2s\"\nper_client = 8\n"
    ));
    let api = format!(
        "[api]\nauth = \"token\"\ntoken = \"{}\"\nworker_token = \"{}\"\nadmin_password = \"{}\"\ntls_cert = \"{d}/server.pem\"\ntls_key = \"{d}/server.key\"\ntrusted_proxies = [\"127.0.3.0/24\"]\n",
        ctx.secrets.api_token,
        ctx.secrets.worker_token,
        ctx.secrets.admin_password,
        d = tls.display()
    );
    let mut center = ctx.center_with_api(0, port, &api);
    center.start();
    let ca_pem = std::fs::read(tls.join("ca.pem")).unwrap();
    let console = Browser {
        http: reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca_pem).unwrap())
            .build()
            .unwrap(),
        url: format!("https://127.0.0.1:{}", console_port(port)),
    };
    eventually(
        "the console answers over HTTPS",
        Duration::from_secs(30),
        || async {
            match console.http.get(&console.url).send().await {
                Ok(r) if r.status() == StatusCode::OK => Ok(()),
                other => Err(format!("{other:?}\n{}", center.log_tail())),
            }
        },
    )
    .await;
    let (cookie, csrf) = console
        .login(None, "admin", &ctx.secrets.admin_password)
        .await;

    let listeners = [
        ("grpc", port),
        ("console", console_port(port)),
        ("search", search_port),
    ];
    let connector = {
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        for c in tokio_rustls::rustls::pki_types::pem::PemObject::pem_slice_iter(&ca_pem) {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    };
    // How long until the server closes a client that does `ploy`, in seconds.
    #[derive(Clone, Copy, Debug)]
    enum Ploy {
        Silent,
        SilentAfterHandshake,
        Dribbling,
    }
    // A connection from `source` (any of 127/8 is this host).
    let connect_from = |source: [u8; 4], port: u16| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((source, 0).into()).unwrap();
        socket.connect(([127, 0, 0, 1], port).into()).await.unwrap()
    };
    let closed_after = |listener: &'static str, port: u16, ploy: Ploy, source: [u8; 4]| {
        let connector = connector.clone();
        async move {
            let t0 = Instant::now();
            let tcp = connect_from(source, port).await;
            let mut buf = [0u8; 1024];
            let ended = match ploy {
                Ploy::Silent => {
                    let mut tcp = tcp;
                    tokio::time::timeout(Duration::from_secs(10), async {
                        while tcp.read(&mut buf).await.is_ok_and(|n| n > 0) {}
                    })
                    .await
                }
                _ => {
                    let name =
                        tokio_rustls::rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
                    let mut tls = connector.connect(name, tcp).await.expect("a TLS handshake");
                    let dribble = async {
                        match (ploy, listener) {
                            (Ploy::Dribbling, "grpc") => {
                                // Half of an HTTP/2 client preface.
                                let _ = tls.write_all(b"PRI * HTTP/2.0\r\n").await;
                            }
                            (Ploy::Dribbling, _) => {
                                let _ = tls.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await;
                                for n in 0.. {
                                    tokio::time::sleep(Duration::from_millis(300)).await;
                                    if tls
                                        .write_all(format!("X-{n}: y\r\n").as_bytes())
                                        .await
                                        .is_err()
                                    {
                                        return;
                                    }
                                }
                            }
                            _ => {}
                        }
                        while tls.read(&mut buf).await.is_ok_and(|n| n > 0) {}
                    };
                    tokio::time::timeout(Duration::from_secs(10), dribble).await
                }
            };
            assert!(
                ended.is_ok(),
                "{listener}: a {ploy:?} client was not closed within 10 s"
            );
            t0.elapsed()
        }
    };
    // Each slow client from an address of its own: one address may hold 8 connections.
    let mut clients = tokio::task::JoinSet::new();
    for (listener, port) in listeners {
        for n in 0..60 {
            let ploy = match n % 3 {
                0 => Ploy::Silent,
                1 => Ploy::SilentAfterHandshake,
                _ => Ploy::Dribbling,
            };
            let f = closed_after(listener, port, ploy, [127, 0, 1, n]);
            clients.spawn(async move { (listener, ploy, f.await) });
        }
    }
    // Meanwhile the admin is served, over HTTPS and gRPC with TLS.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    let r = console
        .post("/api/ListSources", Some(&cookie), Some(&csrf), json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let channel = tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca_pem)),
        )
        .unwrap()
        .connect()
        .await
        .expect("the gRPC API over TLS");
    AdminClient::with_interceptor(channel, Bearer::new(&ctx.secrets.api_token))
        .list_sources(ListSourcesRequest {})
        .await
        .expect("the admin's gRPC call");
    let admin = t0.elapsed();
    let mut slowest = std::collections::BTreeMap::new();
    while let Some(done) = clients.join_next().await {
        let (listener, ploy, took) = done.unwrap();
        let key = format!("{listener} {ploy:?}");
        let e = slowest.entry(key).or_insert(Duration::ZERO);
        *e = (*e).max(took);
    }
    println!("slow clients closed after (slowest of 20 each): {slowest:#?}; the admin's two calls meanwhile: {admin:?}");
    for (what, took) in &slowest {
        // Each deadline is 2 s; a dribbler's head deadline counts from its connection.
        assert!(
            *took < Duration::from_secs(5),
            "{what}: closed after {took:?}"
        );
    }
    assert!(admin < Duration::from_secs(2), "the admin waited {admin:?}");

    // One address holds at most its share: the 9th connection from it is closed at once,
    // well before the 2 s its silence would be allowed.
    for (listener, port) in listeners {
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(connect_from([127, 0, 2, 1], port).await);
        }
        let t0 = Instant::now();
        let mut ninth = connect_from([127, 0, 2, 1], port).await;
        let mut buf = [0u8; 16];
        let ended = tokio::time::timeout(Duration::from_secs(5), ninth.read(&mut buf)).await;
        let took = t0.elapsed();
        assert!(
            matches!(ended, Ok(Ok(0)) | Ok(Err(_))) && took < Duration::from_secs(1),
            "{listener}: a 9th connection from one address was closed after {took:?} ({ended:?})"
        );
        let counted = center
            .metric(
                "sluice_listener_refused_connections_total",
                &[("listener", listener)],
            )
            .await;
        assert!(
            counted >= 1.0,
            "{listener}: refused connections counted: {counted}"
        );
        drop(held);
        // A proxy the center trusts to name its clients speaks for many: not held to it
        // where it names them (the console and the search API).
        if listener != "grpc" {
            let mut held = Vec::new();
            for _ in 0..9 {
                held.push(connect_from([127, 0, 3, 1], port).await);
            }
            let ended = tokio::time::timeout(Duration::from_secs(1), held[8].read(&mut buf)).await;
            assert!(
                ended.is_err(),
                "{listener}: a trusted proxy's 9th connection was closed ({ended:?})"
            );
        }
    }
    drop(center);
    ctx.cleanup().await;
}
