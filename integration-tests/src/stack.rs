//! Where the real services are: the stack's endpoints, its MySQL accounts and binlog.

use std::time::Duration;

use mysql_async::prelude::*;
use sluice_elastic::{EsClient, EsClientConfig};

use crate::lane::Lane;

/// Where the real services are.
#[derive(Clone)]
pub struct Stack {
    pub mysql_url: String,
    pub mysql_host: String,
    pub mysql_port: u16,
    pub source_user: String,
    pub source_password: String,
    pub zookeeper: String,
    pub kafka: String,
    pub es_url: String,
    pub mysql: mysql_async::Pool,
    pub es: EsClient,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

const HOW: &str = "start the local stack with `make stack-up` (or point MARIADB_URL / MYSQL_URL / ZOOKEEPER / KAFKA_BROKERS / ES_URL at running services)";

impl Stack {
    /// Connects to every service, the source of the test's lane among them, failing with
    /// how to start one that is unreachable.
    pub async fn connect() -> Stack {
        let stack = Stack::connect_with_mysql(&Stack::shared_mysql_url()).await;
        let lane = Lane::current();
        let version: String = stack
            .conn()
            .await
            .query_first("SELECT VERSION()")
            .await
            .expect("the source's version")
            .unwrap_or_default();
        assert!(
            lane.matches(&version),
            "the {lane:?} lane's server ({}) is {version}: point {} at a {lane:?} server",
            lane.url_var().0,
            lane.url_var().0,
        );
        stack
    }

    /// The shared stack's source server of the test's lane (`MARIADB_URL` or `MYSQL_URL`),
    /// an admin URL.
    pub fn shared_mysql_url() -> String {
        let (var, default) = Lane::current().url_var();
        env_or(var, default)
    }

    /// The stack with another MySQL (an admin URL): a server of the test's own.
    pub async fn connect_with_mysql(mysql_url: &str) -> Stack {
        crate::init_tracing();
        let mysql_url = mysql_url.to_owned();
        let opts = mysql_async::Opts::from_url(&mysql_url)
            .unwrap_or_else(|e| panic!("{mysql_url} is not a mysql:// URL: {e}"));
        let mysql_host = opts.ip_or_hostname().to_string();
        let mysql_port = opts.tcp_port();
        let mysql = mysql_async::Pool::new(opts);
        let mut conn = mysql.get_conn().await.unwrap_or_else(|e| {
            panic!("MySQL at {mysql_host}:{mysql_port} is not reachable ({e}): {HOW}")
        });
        conn.query_drop("SELECT 1").await.expect("MySQL answers");
        drop(conn);

        let zookeeper = env_or("ZOOKEEPER", "127.0.0.1:12181");
        let zk_addr = zookeeper.split([',', '/']).next().unwrap_or_default();
        require_tcp("ZooKeeper", &zookeeper, zk_addr).await;
        // The secured lane's: Kafka's SASL_SSL listener, the OpenSearch with its security
        // plugin (the test's own calls as its admin).
        let secure = crate::secure::Secure::lane();
        let kafka = match secure {
            Some(s) => s.kafka_brokers.clone(),
            None => env_or("KAFKA_BROKERS", "127.0.0.1:19092"),
        };
        require_tcp("Kafka", &kafka, kafka.split(',').next().unwrap_or_default()).await;

        let es_url = match secure {
            Some(s) => s.es_url.clone(),
            None => env_or("ES_URL", "http://127.0.0.1:19200"),
        };
        let (username, password, tls) = match secure {
            Some(s) => (
                Some(s.es_admin.0.clone()),
                Some(s.es_admin.1.clone()),
                Some(sluice_model::TlsPem {
                    ca: Some(std::fs::read(&s.es_ca).expect("the stack's CA")),
                    ..Default::default()
                }),
            ),
            None => (
                std::env::var("ES_USERNAME").ok(),
                std::env::var("ES_PASSWORD").ok(),
                None,
            ),
        };
        let es = EsClient::new(EsClientConfig {
            url: es_url.parse().expect("ES_URL is a URL"),
            username,
            password,
            request_timeout: Duration::from_secs(60),
            tls,
        })
        .expect("Elasticsearch client");
        es.ping()
            .await
            .unwrap_or_else(|e| panic!("Elasticsearch at {es_url} is not reachable ({e}): {HOW}"));

        Stack {
            mysql_url,
            mysql_host,
            mysql_port,
            source_user: env_or("MYSQL_SOURCE_USER", "sluice"),
            source_password: env_or("MYSQL_SOURCE_PASSWORD", "sluice"),
            zookeeper,
            kafka,
            es_url,
            mysql,
            es,
        }
    }

    pub async fn conn(&self) -> mysql_async::Conn {
        self.mysql.get_conn().await.expect("MySQL connection")
    }
}

/// Fails the test, saying how to start the service, unless `addr` accepts connections.
async fn require_tcp(service: &str, endpoint: &str, addr: &str) {
    let connected =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr)).await;
    if !matches!(connected, Ok(Ok(_))) {
        panic!("{service} at {endpoint} is not reachable: {HOW}");
    }
}

/// Where the binlog of the server `conn` is connected to ends now, asked as that server's
/// flavour and version ask it.
pub async fn binlog_end(
    conn: &mut mysql_async::Conn,
) -> Result<sluice_model::BinlogPosition, String> {
    let version: String = conn
        .query_first("SELECT VERSION()")
        .await
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    let sql = sluice_mysql::Server::from_version(&version).binlog_status();
    let row: mysql_async::Row = conn
        .query_first(sql)
        .await
        .map_err(|e| format!("{sql}: {e}"))?
        .ok_or_else(|| format!("{sql} is empty: is the binlog on?"))?;
    Ok(sluice_model::BinlogPosition::new(
        row.get::<String, _>(0).ok_or("no file")?,
        row.get::<u64, _>(1).ok_or("no position")?,
    ))
}

/// MySQL accounts of a test's own, with random passwords found nowhere else: an admin
/// (the centers' meta database) and a reader with a source's grants. `stack` is the
/// stack as services configured through it reach MySQL with them.
pub struct OwnAccounts {
    pub stack: Stack,
    pub admin: String,
    pub admin_password: String,
    pub reader: String,
    pub reader_password: String,
}

impl OwnAccounts {
    /// Creates both accounts on `base`'s server, each with `require` (`""`, or e.g.
    /// `"REQUIRE X509"`).
    pub async fn create(base: &Stack, require: &str) -> OwnAccounts {
        let tag = &random_hex()[..8];
        let accounts = OwnAccounts {
            admin: format!("ta_{tag}"),
            admin_password: format!("adm-{}", random_hex()),
            reader: format!("tr_{tag}"),
            reader_password: format!("src-{}", random_hex()),
            stack: base.clone(),
        };
        let (a, r) = (&accounts.admin, &accounts.reader);
        let mut conn = base.conn().await;
        for sql in [
            format!(
                "CREATE USER '{a}'@'%' IDENTIFIED BY '{}' {require}",
                accounts.admin_password
            ),
            format!("GRANT ALL ON *.* TO '{a}'@'%'"),
            format!(
                "CREATE USER '{r}'@'%' IDENTIFIED BY '{}' {require}",
                accounts.reader_password
            ),
            format!(
                "GRANT SELECT, RELOAD, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{r}'@'%'"
            ),
        ] {
            conn.query_drop(sql).await.expect("create a MySQL account");
        }
        let mut stack = base.clone();
        stack.mysql_url = format!(
            "mysql://{a}:{}@{}:{}",
            accounts.admin_password, base.mysql_host, base.mysql_port
        );
        stack.source_user = r.clone();
        stack.source_password = accounts.reader_password.clone();
        OwnAccounts { stack, ..accounts }
    }

    /// Drops both accounts (best effort).
    pub async fn remove(self) {
        let mut conn = self.stack.conn().await;
        for user in [&self.admin, &self.reader] {
            let _ = conn.query_drop(format!("DROP USER '{user}'@'%'")).await;
        }
    }
}

/// 16 random hex digits (the standard library's per-process random hasher keys, mixed
/// with the time and a counter).
pub fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(crate::COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    format!("{:016x}", h.finish())
}
