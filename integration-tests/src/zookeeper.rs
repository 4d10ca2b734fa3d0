//! A ZooKeeper server of the test's own (the stack's installation, a data directory of
//! its own), reached by the services through a fault proxy: the test can restart it,
//! keeping its data, and cut every client connection at once (a reconnect storm)
//! without touching the stack's ZooKeeper other tests share.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::eventually;
use crate::proxy::Proxy;

/// Where the stack's installation keeps ZooKeeper and the one logging binding it adds
/// (as `deploy/stack.sh` starts it).
const CLASSPATH: &str =
    "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar";

pub struct PrivateZookeeper {
    /// In front of the server: the address services are given.
    pub proxy: Proxy,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateZookeeper {
    pub async fn start() -> PrivateZookeeper {
        let port = crate::ports::free_port();
        let dir = crate::paths::target_dir()
            .join("it")
            .join(crate::unique("zookeeper-"));
        std::fs::create_dir_all(dir.join("data")).expect("ZooKeeper data directory");
        // Short ticks for quick expiry, no fsync (a throwaway server), no per-IP cap
        // (every client is 127.0.0.1): the stack's settings.
        std::fs::write(
            dir.join("zoo.cfg"),
            format!(
                "tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={data}\nclientPort={port}\n\
                 clientPortAddress=127.0.0.1\nminSessionTimeout=1000\nmaxSessionTimeout=30000\n\
                 maxClientCnxns=0\nforceSync=no\nadmin.enableServer=false\n4lw.commands.whitelist=*\n",
                data = dir.join("data").display()
            ),
        )
        .expect("zoo.cfg");
        std::fs::write(
            dir.join("log4j.properties"),
            "log4j.rootLogger=INFO, CONSOLE\nlog4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n\
             log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n\
             log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p %m%n\n",
        )
        .expect("log4j.properties");
        let proxy = Proxy::start(&format!("127.0.0.1:{port}")).await;
        let mut zk = PrivateZookeeper {
            proxy,
            port,
            dir,
            child: None,
        };
        zk.launch().await;
        zk
    }

    /// The server's own address (the test's own clients connect here, past the proxy).
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    async fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("zookeeper.log"))
            .expect("ZooKeeper log");
        let child = Command::new("java")
            .args(["-Xms32m", "-Xmx192m", "-XX:+UseSerialGC"])
            .arg(format!(
                "-Dlog4j.configuration=file:{}",
                self.dir.join("log4j.properties").display()
            ))
            .args([
                "-cp",
                CLASSPATH,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            ])
            .arg(self.dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start ZooKeeper (deploy/install.sh installs it)");
        self.child = Some(child);
        let addr = self.addr();
        eventually(
            "the test's ZooKeeper answers",
            Duration::from_secs(45),
            || async {
                // A server still starting may take the connection and neither answer nor
                // close it: each attempt has a bound of its own.
                let attempt = tokio::time::timeout(Duration::from_secs(2), ruok(&addr));
                attempt
                    .await
                    .unwrap_or_else(|_| Err("ruok: no answer within 2 s".into()))
            },
        )
        .await;
    }

    /// Kills the server (`kill -9`: whatever it had not written is what a crash loses)
    /// and starts it again on the same data; returns once it answers.
    pub async fn restart(&mut self, down_for: Duration) {
        self.kill();
        tokio::time::sleep(down_for).await; // the length of the outage, not a wait
        self.launch().await;
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// ZooKeeper's `ruok` four-letter command: `Ok` when the server answers `imok`.
async fn ruok(addr: &str) -> Result<(), String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(b"ruok").await.map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    (answer == "imok")
        .then_some(())
        .ok_or_else(|| format!("ruok answered {answer:?}"))
}

impl Drop for PrivateZookeeper {
    fn drop(&mut self) {
        self.kill();
    }
}
