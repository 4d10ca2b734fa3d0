//! The web console (README, "Console"): driven in Debian's headless Chromium by
//! Playwright as an admin, a viewer and an operator (`integration-tests/browser/
//! console.mjs`, screenshots under `target/console-screenshots/`), and its sessions
//! checked from outside a browser: the cookie's flags, CSRF, session fixation, logout,
//! and failed logins limited.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use reqwest::header::{self, HeaderValue};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sluice_integration_tests::console::Browser;
use sluice_integration_tests::ports::{console_port, free_center_port};
use sluice_integration_tests::{paths, TestCtx};

/// The browser's test directory, with playwright-core installed, or a panic saying how.
fn browser_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("browser");
    assert!(
        dir.join("node_modules/playwright-core/package.json")
            .exists()
            && Path::new("/usr/bin/chromium").exists(),
        "the console's browser tests need Chromium and playwright-core: run `deploy/install.sh` \
         (or `make install`), which installs Debian's chromium and runs npm install in {}",
        dir.display()
    );
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_uses_the_console_in_a_real_browser() {
    let dir = browser_dir();
    let ctx = TestCtx::new("console").await;
    ctx.items_table(200).await;
    let cluster = ctx.start_cluster(1, 1).await;
    cluster.wait_leader(Duration::from_secs(10), None).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    cluster
        .wait_running(&[&items], Duration::from_secs(30))
        .await;
    let (viewer_pw, operator_pw) = ("vera-password-1", "olga-password-1");
    cluster
        .ctl_env(
            &[
                "users",
                "put",
                "vera",
                "--role",
                "viewer",
                "--password-env",
                "PW",
            ],
            &[("PW", viewer_pw)],
        )
        .unwrap();

    // A table and a column named as markup: the console shows them as text.
    ctx.exec("CREATE TABLE `<script>alert(1)</script>` (id INT PRIMARY KEY, `<script>alert(1)</script>` INT)")
        .await;
    let (host, port) = ctx.source_endpoint();
    // A second table, for a pipeline of two levels made in the spec editor.
    ctx.exec("CREATE TABLE item_notes (id INT PRIMARY KEY, item_id BIGINT NOT NULL, note VARCHAR(40), KEY (item_id))")
        .await;
    ctx.exec("INSERT INTO item_notes VALUES (1, 7, 'first note of 7'), (2, 7, 'second note of 7'), (3, 8, 'a note of 8')")
        .await;

    let shots = paths::target_dir().join("console-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    let out = Command::new("node")
        .arg(dir.join("console.mjs"))
        .current_dir(&dir)
        .env("CONSOLE_URL", cluster.console_url(0))
        .env("ES_URL", &ctx.stack.es_url)
        .env("ADMIN_PASSWORD", &ctx.secrets.admin_password)
        .env("VIEWER_PASSWORD", viewer_pw)
        .env("OPERATOR_PASSWORD", operator_pw)
        .env("SOURCE", &items.name)
        .env("NEW_SOURCE", format!("{}-console", ctx.instance))
        .env("SOURCE_HOST", &host)
        .env("SOURCE_PORT", port.to_string())
        .env("SOURCE_USER", &ctx.stack.source_user)
        .env(
            "SOURCE_PASSWORD_REF",
            format!("env:{}", sluice_integration_tests::PASSWORD_VAR),
        )
        .env("SOURCE_SERVER_ID", (ctx.server_id + 9).to_string())
        .env("DATABASE", &ctx.db)
        .env("PIPELINE", &items.pipeline.alias)
        .env("SHOTS", &shots)
        .output()
        .expect("run node (deploy/install.sh installs it)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{said}");
    assert!(
        out.status.success(),
        "the browser checks failed (screenshots in {}):\n{said}\n{}",
        shots.display(),
        cluster.logs()
    );
    for screen in [
        "login",
        "overview",
        "sources",
        "source-test",
        "editor",
        "users",
        "audit",
        "viewer",
        "pipelines",
        "explain",
        "resync",
        "verified",
        "rollback",
    ] {
        assert!(
            shots.join(format!("{screen}.png")).exists(),
            "no screenshot of {screen}"
        );
    }

    // The build the operator started in the browser ran to its alias swap (the browser
    // saw the live version become v2).
    let built = cluster.ctl(&["pipelines", "list"]).unwrap();
    assert_eq!(built[0]["live_version"], 2, "{built}");
    // Everything the browser changed or was refused is in the audit log, by its user.
    let audit = cluster.ctl(&["audit", "--limit", "200"]).unwrap();
    let has = |user: &str, method: &str, outcome: &str| {
        audit
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["user"] == user && e["method"] == method && e["outcome"] == outcome)
    };
    for (user, method, outcome) in [
        ("admin", "Login", "ok"),
        ("admin", "PutUser", "ok"),
        ("admin", "PutUser", "InvalidArgument"),
        ("admin", "PutSource", "ok"),
        ("admin", "PutPipeline", "ok"),
        ("vera", "Login", "ok"),
        ("vera", "Rebalance", "PermissionDenied"),
        ("olga", "Login", "ok"),
        ("olga", "BuildPipeline", "ok"),
        ("olga", "ResyncDocuments", "ok"),
        ("olga", "StartCompare", "ok"),
        ("olga", "SwapPipeline", "ok"),
        ("olga", "RollbackPipeline", "ok"),
        ("olga", "AddWords", "ok"),
        ("olga", "PublishWords", "ok"),
        ("olga", "StartCheck", "ok"),
    ] {
        assert!(
            has(user, method, outcome),
            "no audit entry {user} {method} {outcome}:\n{audit:#}"
        );
    }
    drop(cluster);
    ctx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_resist_csrf_fixation_and_guessing() {
    let ctx = TestCtx::new("consolesec").await;
    // The test stands where a TLS proxy would (its address trusted to name clients), and
    // sessions end after 2 s unused.
    ctx.env_for("sluice-center", "SLUICE_API__TRUSTED_PROXIES", "127.0.0.1");
    ctx.env_for("sluice-center", "SLUICE_API__SESSION_IDLE", "2s");
    let cluster = ctx.start_cluster(1, 0).await;
    cluster.wait_leader(Duration::from_secs(10), None).await;
    let b = Browser {
        http: reqwest::Client::new(),
        url: cluster.console_url(0),
    };
    let admin_pw = ctx.secrets.admin_password.clone();

    // The page forbids anything but its own origin.
    let page = b.http.get(&b.url).send().await.unwrap();
    let csp = page
        .headers()
        .get(header::CONTENT_SECURITY_POLICY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert_eq!(
        page.headers().get(header::X_CONTENT_TYPE_OPTIONS),
        Some(&HeaderValue::from_static("nosniff"))
    );

    // A login posted as a form (another site's, say) is refused.
    let r = b
        .http
        .post(format!("{}/login", b.url))
        .header(header::CONTENT_TYPE, "text/plain")
        .body(json!({"user": "admin", "password": admin_pw}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // A cookie planted before the login is not the session the login makes, and opens
    // nothing.
    let (cookie, csrf) = b.login(Some("sluice_planted"), "admin", &admin_pw).await;
    assert_ne!(cookie, "sluice_planted");
    assert_eq!(
        b.session_status("sluice_planted").await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(b.session_status(&cookie).await, StatusCode::OK);

    // A change without the session's CSRF token, or with another, is refused.
    let r = b
        .post("/api/Rebalance", Some(&cookie), None, json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let said: Value = r.json().await.unwrap();
    assert!(
        said["message"].as_str().unwrap().contains("x-csrf-token"),
        "{said}"
    );
    let r = b
        .post(
            "/api/Rebalance",
            Some(&cookie),
            Some("sluice_other"),
            json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = b
        .post("/api/Rebalance", Some(&cookie), Some(&csrf), json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK, "{:?}", r.text().await);

    // Logged out, the cookie opens nothing.
    let r = b
        .post("/logout", Some(&cookie), Some(&csrf), json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(b.session_status(&cookie).await, StatusCode::UNAUTHORIZED);

    // A session kept in use outlives the idle limit (2 s here); one left unused does not.
    let (kept, _) = b.login(None, "admin", &admin_pw).await;
    let (left, _) = b.login(None, "admin", &admin_pw).await;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        assert_eq!(
            b.session_status(&kept).await,
            StatusCode::OK,
            "a session in use"
        );
        // What is under test is what time does to a session: let some pass.
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(
        b.session_status(&left).await,
        StatusCode::UNAUTHORIZED,
        "a session unused for longer than api.session_idle"
    );

    // A new password ends the sessions opened with the old one.
    let put_pat = |pw: &str| {
        let args = [
            "users",
            "put",
            "pat",
            "--role",
            "viewer",
            "--password-env",
            "PW",
        ];
        cluster.ctl_env(&args, &[("PW", pw)]).unwrap();
    };
    put_pat("pat-password-1");
    let (old, _) = b.login(None, "pat", "pat-password-1").await;
    assert_eq!(b.session_status(&old).await, StatusCode::OK);
    put_pat("pat-password-2");
    assert_eq!(
        b.session_status(&old).await,
        StatusCode::UNAUTHORIZED,
        "a session opened with the old password"
    );
    let (new, _) = b.login(None, "pat", "pat-password-2").await;
    assert_eq!(b.session_status(&new).await, StatusCode::OK);

    // Wrong passwords from one client (behind the trusted proxy this test is): refused,
    // then limited there, even with the right one; the right password from another
    // client is let in at once, so guessing never locks the admin out. A client cannot
    // name itself past the proxy: the proxy's appended address is the one counted.
    let from = |client: &str, user: &str, password: &str| {
        let r = b
            .http
            .post(format!("{}/login", b.url))
            .header(header::CONTENT_TYPE, "application/json")
            .header("x-forwarded-for", client)
            .body(json!({"user": user, "password": password}).to_string());
        async move { r.send().await.unwrap() }
    };
    for n in 0..5 {
        let forged = format!("10.9.9.{n}, 198.51.100.66");
        let r = from(&forged, "admin", "guess-guess").await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    let r = from("198.51.100.66", "admin", &admin_pw).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let said: Value = r.json().await.unwrap();
    assert!(
        said["message"]
            .as_str()
            .unwrap()
            .contains("too many failed logins"),
        "{said}"
    );
    let r = from("198.51.100.7", "admin", &admin_pw).await;
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "the right password from elsewhere"
    );

    let audit = cluster.ctl(&["audit", "--limit", "50"]).unwrap();
    let outcomes: Vec<(String, String, String)> = audit
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
            (s("user"), s("method"), s("outcome"))
        })
        .collect();
    // Refusals are recorded as the authenticated identity they had (none here: a CSRF
    // token missing is not the session's user asking), each kind once a minute at most.
    let row = |u: &str, m: &str, o: &str| (u.to_owned(), m.to_owned(), o.to_owned());
    let unknown = "(not recognised)";
    let expected = vec![
        row("admin", "Login", "ok"),
        row(unknown, "Rebalance", "PermissionDenied"),
        row("admin", "Rebalance", "ok"),
        row("admin", "Logout", "ok"),
        row("admin", "Login", "ok"),
        row("admin", "Login", "ok"),
        row("admin", "PutUser", "ok"),
        row("pat", "Login", "ok"),
        row("admin", "PutUser", "ok"),
        row("pat", "Login", "ok"),
        row(unknown, "Login", "Unauthenticated"),
        row(unknown, "Login", "ResourceExhausted"),
        row("admin", "Login", "ok"),
    ];
    assert_eq!(outcomes, expected, "{audit:#}");
    let entries = audit.as_array().unwrap();
    let peers: Vec<&str> = entries[..2]
        .iter()
        .map(|e| e["peer"].as_str().unwrap())
        .collect();
    assert!(
        peers[0].starts_with("198.51.100.7 via 127.0.0.1:")
            && peers[1].starts_with("198.51.100.66 via 127.0.0.1:"),
        "the clients the proxy named: {peers:?}"
    );

    drop(cluster);
    ctx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_console_sends_changes_to_the_leader() {
    let ctx = TestCtx::new("consolefollow").await;
    let cluster = ctx.start_cluster(2, 0).await;
    let (leader, _) = cluster.wait_leader(Duration::from_secs(10), None).await;
    let follower = Browser {
        http: reqwest::Client::new(),
        url: cluster.console_url(1 - leader),
    };
    // The follower serves its console once its first-admin step (a password hash) is done,
    // which may be after the other center leads.
    let addr = follower.url.trim_start_matches("http://").to_owned();
    sluice_integration_tests::eventually(
        "the follower's console listens",
        Duration::from_secs(20),
        || async {
            tokio::net::TcpStream::connect(&addr)
                .await
                .map(drop)
                .map_err(|e| format!("{addr}: {e}"))
        },
    )
    .await;
    let (cookie, csrf) = follower
        .login(None, "admin", &ctx.secrets.admin_password)
        .await;
    // Read where it is asked; a change made on the leader, answered through the follower.
    let r = follower
        .post("/api/ListWords", Some(&cookie), Some(&csrf), json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let words = json!({"dictionary": "ext", "words": ["followerword"]});
    let r = follower
        .post("/api/AddWords", Some(&cookie), Some(&csrf), words.clone())
        .await;
    assert_eq!(r.status(), StatusCode::OK, "{:?}", r.text().await);
    let listed = cluster.ctl(&["dict", "list"]).unwrap();
    assert!(listed.to_string().contains("followerword"), "{listed}");
    // A wrong CSRF token is refused as anywhere.
    let r = follower
        .post("/api/AddWords", Some(&cookie), Some("sluice_wrong"), words)
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Recorded once, by the leader, and the refusal by the follower.
    let audit = cluster.ctl(&["audit", "--method", "AddWords"]).unwrap();
    let entries: Vec<(String, String)> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
            (s("target"), s("outcome"))
        })
        .collect();
    let entry = |t: &str, o: &str| (t.to_owned(), o.to_owned());
    assert_eq!(
        entries,
        [
            entry("as admin", "PermissionDenied"),
            entry("dict/ext: followerword", "ok")
        ],
        "{audit:#}"
    );
    drop(cluster);
    ctx.cleanup().await;
}

/// With the API's certificate the console and the search API both serve HTTPS, and
/// neither answers plain HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_api_certificate_the_console_is_served_over_https() {
    let ctx = TestCtx::new("consoletls").await;
    let tls = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.work/stack/tls");
    assert!(
        tls.join("server.pem").exists(),
        "no certificates in {}: start the local stack with `make stack-up`",
        tls.display()
    );
    let port = free_center_port();
    let api = format!(
        "[api]\nauth = \"token\"\ntoken = \"console-tls-token-0123456789\"\nworker_token = \"console-tls-worker-token\"\nadmin_password = \"{}\"\ntls_cert = \"{d}/server.pem\"\ntls_key = \"{d}/server.key\"\n",
        ctx.secrets.admin_password,
        d = tls.display()
    );
    let search_port = sluice_integration_tests::ports::free_port();
    ctx.center_section(&format!("[search]\nlisten = \"127.0.0.1:{search_port}\"\n"));
    let mut center = ctx.center_with_api(0, port, &api);
    center.start();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(tls.join("ca.pem")).unwrap()).unwrap();
    let b = Browser {
        http: reqwest::Client::builder()
            .add_root_certificate(ca)
            .build()
            .unwrap(),
        url: format!("https://127.0.0.1:{}", console_port(port)),
    };
    let page = sluice_integration_tests::eventually(
        "the console answers over HTTPS",
        Duration::from_secs(30),
        || async {
            match b.http.get(&b.url).send().await {
                Ok(r) if r.status() == StatusCode::OK => Ok(r.text().await.unwrap_or_default()),
                other => Err(format!("{other:?}\n{}", center.log_tail())),
            }
        },
    )
    .await;
    assert!(page.contains("/app.js"), "{page}");
    let (cookie, csrf) = b.login(None, "admin", &ctx.secrets.admin_password).await;
    let r = b
        .post("/api/ListUsers", Some(&cookie), Some(&csrf), json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    // Plain HTTP to it gets no page.
    let plain = reqwest::get(format!("http://127.0.0.1:{}/", console_port(port))).await;
    assert!(
        plain.map_or(true, |r| r.status() != StatusCode::OK),
        "the console answered plain HTTP"
    );
    let spec = b
        .http
        .get(format!("https://127.0.0.1:{search_port}/openapi.json"))
        .send()
        .await
        .expect("the search API over HTTPS");
    assert_eq!(spec.status(), StatusCode::OK);
    let plain = reqwest::get(format!("http://127.0.0.1:{search_port}/openapi.json")).await;
    assert!(
        plain.map_or(true, |r| r.status() != StatusCode::OK),
        "the search API answered plain HTTP"
    );
    drop(center);
    ctx.cleanup().await;
}
