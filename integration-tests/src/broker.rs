//! A Kafka broker of the test's own (Apache Kafka in KRaft mode, as the stack's, started
//! by `deploy/stack.sh kafka-private`), reached only through a fault proxy: the broker
//! advertises the proxy's address, so every client connection, the ones opened after a
//! metadata answer included, passes the proxy and a black-hole there makes Kafka
//! unreachable for everyone without losing what the broker holds.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::eventually;
use crate::proxy::Proxy;

pub struct PrivateKafka {
    pub proxy: Proxy,
    child: Child,
}

impl PrivateKafka {
    pub async fn start() -> PrivateKafka {
        let port = crate::ports::free_port();
        let controller = crate::ports::free_port();
        let proxy = Proxy::start(&format!("127.0.0.1:{port}")).await;
        let dir = crate::paths::target_dir()
            .join("it")
            .join(crate::unique("kafka-"));
        std::fs::create_dir_all(&dir).expect("the broker's directory");
        let log = std::fs::File::create(dir.join("kafka.log")).expect("the broker's log");
        let stack = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/stack.sh");
        let child = Command::new(stack)
            .arg("kafka-private")
            .arg(&dir)
            .arg(port.to_string())
            .arg(controller.to_string())
            .arg(proxy.addr())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start a private Kafka broker (deploy/install.sh installs Kafka)");
        let log = dir.join("kafka.log");
        eventually(
            "the test's Kafka broker serving",
            Duration::from_secs(90),
            || async {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text.contains("Kafka Server started") {
                    Ok(())
                } else {
                    Err(crate::last_lines(&log, 10))
                }
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
