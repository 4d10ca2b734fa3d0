//! Which source server a test runs on: MariaDB or Oracle MySQL. Every end-to-end test
//! runs on MariaDB; a test written inside [`on_sources!`](crate::on_sources) says the
//! flavours it runs on and becomes one test per flavour (`<test>::mariadb`,
//! `<test>::mysql`), each reaching its own server through [`Stack::connect`](crate::Stack::connect).
//!
//! nextest runs every test in a process of its own, so the lane is a process-wide
//! setting, made once by the test's first line.

use std::sync::OnceLock;

/// A source server's flavour, as the tests tell the lanes apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    MariaDb,
    /// MariaDB, its snapshots read between watermarks as MySQL's are
    /// (`SNAPSHOT_POSITIONS=watermarks` for the services and the test itself).
    MariaDbWatermarks,
    MySql,
}

static LANE: OnceLock<Lane> = OnceLock::new();

impl Lane {
    /// This process' lane: the one its test entered, MariaDB when it entered none.
    pub fn current() -> Lane {
        *LANE.get().unwrap_or(&Lane::MariaDb)
    }

    /// Makes `self` this process' lane. A second, different lane is a test's mistake.
    pub fn enter(self) {
        let was = *LANE.get_or_init(|| self);
        assert_eq!(was, self, "a test process runs on one source lane");
        if let Some((key, value)) = self.env() {
            // Before any thread of the test reads the environment.
            std::env::set_var(key, value);
        }
    }

    /// What the lane sets in the environment of the services and the test.
    pub fn env(self) -> Option<(&'static str, &'static str)> {
        (self == Lane::MariaDbWatermarks).then_some(("SNAPSHOT_POSITIONS", "watermarks"))
    }

    /// The server's flavour.
    pub fn flavor(self) -> Lane {
        match self {
            Lane::MariaDbWatermarks => Lane::MariaDb,
            lane => lane,
        }
    }

    /// Enters the lane an environment variable names (`mariadb`, the default, or
    /// `mysql`): what `make soak` and `make bench` run on.
    pub fn enter_from_env(var: &str) -> Result<Lane, String> {
        let lane = match std::env::var(var).as_deref() {
            Err(_) | Ok("") | Ok("mariadb") => Lane::MariaDb,
            Ok("mysql") => Lane::MySql,
            Ok(other) => return Err(format!("{var}={other}: mariadb or mysql")),
        };
        lane.enter();
        Ok(lane)
    }

    /// The lane's name in test names and figures' files.
    pub fn name(self) -> &'static str {
        match self {
            Lane::MariaDb => "mariadb",
            Lane::MariaDbWatermarks => "mariadb_watermarks",
            Lane::MySql => "mysql",
        }
    }

    /// The environment variable naming the lane's admin URL, and the local stack's server.
    pub fn url_var(self) -> (&'static str, &'static str) {
        match self.flavor() {
            Lane::MariaDb | Lane::MariaDbWatermarks => (
                "MARIADB_URL",
                "mysql://sluice_admin:sluice_admin@127.0.0.1:13306",
            ),
            Lane::MySql => (
                "MYSQL_URL",
                "mysql://sluice_admin:sluice_admin@127.0.0.1:13307",
            ),
        }
    }

    /// Whether a server's `VERSION()` is this lane's flavour.
    pub fn matches(self, version: &str) -> bool {
        version.to_ascii_lowercase().contains("mariadb") == (self.flavor() == Lane::MariaDb)
    }
}

/// One test per source flavour, of an `async fn` written beside it:
///
/// ```ignore
/// on_sources!(deletes_reach_the_index: mariadb, mysql);
/// async fn deletes_reach_the_index() { ... }
/// ```
/// makes the module `deletes_reach_the_index` with the tests `mariadb` and `mysql`, each
/// entering its lane and then running the function.
#[macro_export]
macro_rules! on_sources {
    ($name:ident: $($lane:ident),+ $(,)?) => {
        mod $name {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $lane() {
                    $crate::on_sources!(@enter $lane);
                    super::$name().await
                }
            )+
        }
    };
    (@enter mariadb) => { $crate::lane::Lane::MariaDb.enter() };
    (@enter mariadb_watermarks) => { $crate::lane::Lane::MariaDbWatermarks.enter() };
    (@enter mysql) => { $crate::lane::Lane::MySql.enter() };
}
