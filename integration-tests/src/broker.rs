//! A Kafka broker of the test's own (tansu, as the stack's), reached only through a fault
//! proxy: the broker advertises the proxy's address, so every client connection, the
//! ones opened after a metadata answer included, passes the proxy and a black-hole there
//! makes Kafka unreachable for everyone without losing what the broker holds.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::eventually;
use crate::proxy::Proxy;

pub struct PrivateKafka {
    pub proxy: Proxy,
    child: Child,
}

/// The tansu deploy/install.sh builds (patched: see the script), or `TANSU_BIN`.
fn tansu_bin() -> String {
    if let Ok(bin) = std::env::var("TANSU_BIN") {
        return bin;
    }
    let home = std::env::var("TANSU_HOME").unwrap_or_else(|_| {
        format!(
            "{}/.local/lib/sluice-tansu",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    format!("{home}/bin/tansu")
}

impl PrivateKafka {
    pub async fn start() -> PrivateKafka {
        let port = crate::cluster::free_port();
        let proxy = Proxy::start(&format!("127.0.0.1:{port}")).await;
        let log = crate::services::target_dir()
            .join("it")
            .join(crate::unique("tansu-"))
            .with_extension("log");
        std::fs::create_dir_all(log.parent().expect("a directory")).expect("log directory");
        let log = std::fs::File::create(&log).expect("tansu log");
        // Every setting explicit: tansu also reads them from the environment.
        let child = Command::new(tansu_bin())
            .args(["broker", "--cluster-id", "sluice-it"])
            .arg(format!("--listener-url=tcp://127.0.0.1:{port}"))
            .arg(format!("--advertised-listener-url=tcp://{}", proxy.addr()))
            .arg("--storage-engine=memory://tansu/")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start tansu (deploy/install.sh installs it)");
        eventually(
            "the test's Kafka broker listening",
            Duration::from_secs(30),
            || async {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        )
        .await;
        PrivateKafka { proxy, child }
    }

    /// The bootstrap address clients are given (the proxy's).
    pub fn brokers(&self) -> String {
        self.proxy.addr()
    }
}

impl Drop for PrivateKafka {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
