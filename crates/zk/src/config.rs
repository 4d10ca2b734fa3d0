//! How to reach ZooKeeper and where Sluice's tree lives.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

/// Shortest session timeout accepted. `zookeeper-async` re-arms its read deadline in whole
/// seconds of two thirds of the negotiated timeout; below 1.5 s that rounds to zero and the
/// client reconnects in a loop. 2 s keeps a margin.
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest session timeout accepted: a longer one only delays the hand-over of a dead
/// worker's tasks.
pub const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(120);

fn default_root() -> String {
    "/sluice".to_owned()
}

fn default_session_timeout() -> Duration {
    Duration::from_secs(6)
}

/// `[zookeeper]` section of a service's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZkConfig {
    /// `host:port[,host:port...]`, optionally followed by a chroot (`/chroot`).
    pub connect: String,
    /// Root of Sluice's tree (see the layout in the README's Architecture section). Default `/sluice`.
    #[serde(default = "default_root")]
    pub root: String,
    /// Session timeout to ask the server for (e.g. `"6s"`). The server clamps it into its
    /// `[minSessionTimeout, maxSessionTimeout]`; the session supervision uses the value the
    /// server actually granted. Default 6 s.
    #[serde(default = "default_session_timeout", with = "humantime_serde")]
    pub session_timeout: Duration,
    /// A digest credential, `user:password` (prefer `SLUICE_ZOOKEEPER__AUTH`). With it,
    /// every node Sluice creates carries an ACL that gives that identity alone every
    /// right, so only Sluice's services can read or change checkpoints, locks and
    /// assignments. Every service of a cluster needs the same one.
    #[serde(default)]
    pub auth: Option<sluice_model::Secret>,
}

impl ZkConfig {
    /// A configuration with the defaults for everything but the servers.
    pub fn new(connect: impl Into<String>) -> Self {
        Self {
            connect: connect.into(),
            root: default_root(),
            session_timeout: default_session_timeout(),
            auth: None,
        }
    }

    /// Checks the values without any I/O and reports every problem at once, each with the
    /// name of its key.
    pub fn validate(&self) -> Result<(), Vec<ConfigIssue>> {
        let mut issues = Vec::new();
        if let Err(reason) = check_connect(&self.connect) {
            issues.push(ConfigIssue {
                key: "connect",
                reason,
            });
        }
        if let Err(reason) = check_root(&self.root) {
            issues.push(ConfigIssue {
                key: "root",
                reason,
            });
        }
        if self.session_timeout < MIN_SESSION_TIMEOUT || self.session_timeout > MAX_SESSION_TIMEOUT
        {
            issues.push(ConfigIssue {
                key: "session_timeout",
                reason: format!(
                    "{:?} is outside {:?}..={:?}",
                    self.session_timeout, MIN_SESSION_TIMEOUT, MAX_SESSION_TIMEOUT
                ),
            });
        }
        if let Some(auth) = &self.auth {
            let ok = auth
                .expose()
                .split_once(':')
                .is_some_and(|(user, password)| !user.is_empty() && !password.is_empty());
            if !ok {
                issues.push(ConfigIssue {
                    key: "auth",
                    reason: "must be `user:password` (a digest credential)".to_owned(),
                });
            }
        }
        if issues.is_empty() {
            Ok(())
        } else {
            Err(issues)
        }
    }
}

/// One invalid configuration value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// The key inside the ZooKeeper section (`connect`, `root`, `session_timeout`, `auth`).
    pub key: &'static str,
    pub reason: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: {}", self.key, self.reason)
    }
}

/// The `host:port` entries of a connect string, without its chroot.
pub(crate) fn hosts(connect: &str) -> Vec<&str> {
    let servers = match connect.find('/') {
        Some(i) => &connect[..i],
        None => connect,
    };
    servers.split(',').map(str::trim).collect()
}

fn check_connect(connect: &str) -> Result<(), String> {
    if connect.trim().is_empty() {
        return Err("is empty; expected host:port[,host:port...][/chroot]".to_owned());
    }
    for host in hosts(connect) {
        let port_ok = host
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p != 0));
        if !port_ok {
            return Err(format!(
                "`{host}` is not host:port; expected host:port[,host:port...][/chroot]"
            ));
        }
    }
    if let Some(i) = connect.find('/') {
        let chroot = &connect[i..];
        if chroot != "/" {
            check_root(chroot).map_err(|e| format!("chroot {e}"))?;
        }
    }
    Ok(())
}

fn check_root(root: &str) -> Result<(), String> {
    if !root.starts_with('/') {
        return Err(format!(
            "`{root}` must be an absolute path (start with `/`)"
        ));
    }
    if root == "/" || root.ends_with('/') {
        return Err(format!(
            "`{root}` must name a node below `/` and not end with `/`"
        ));
    }
    for segment in root[1..].split('/') {
        check_name(segment).map_err(|e| format!("`{root}`: {e}"))?;
    }
    Ok(())
}

/// A single path segment: a task id, a worker id.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty path segment".to_owned());
    }
    if name == "." || name == ".." {
        return Err(format!("`{name}` is not a valid znode name"));
    }
    if name.contains('/') {
        return Err(format!("`{name}` must not contain `/`"));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(format!("{name:?} contains control characters"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ZkConfig, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn defaults_apply() {
        let cfg = parse(r#"{"connect":"127.0.0.1:2181"}"#).unwrap();
        assert_eq!(cfg, ZkConfig::new("127.0.0.1:2181"));
        assert_eq!(cfg.root, "/sluice");
        assert_eq!(cfg.session_timeout, Duration::from_secs(6));
        assert_eq!(cfg.validate(), Ok(()));
    }

    #[test]
    fn durations_are_humantime() {
        let cfg = parse(r#"{"connect":"a:1,b:2/chroot","root":"/x/y","session_timeout":"4500ms"}"#)
            .unwrap();
        assert_eq!(cfg.session_timeout, Duration::from_millis(4500));
        assert_eq!(cfg.validate(), Ok(()));
        assert!(parse(r#"{"connect":"a:1","session_timeout":4}"#).is_err());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = parse(r#"{"connect":"a:1","sesion_timeout":"4s"}"#).unwrap_err();
        assert!(err.to_string().contains("sesion_timeout"), "{err}");
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let cfg = ZkConfig {
            connect: "localhost".to_owned(),
            root: "sluice/".to_owned(),
            session_timeout: Duration::from_millis(500),
            auth: Some(sluice_model::Secret::new("no-colon")),
        };
        let issues = cfg.validate().unwrap_err();
        let keys: Vec<_> = issues.iter().map(|i| i.key).collect();
        assert_eq!(keys, ["connect", "root", "session_timeout", "auth"]);
        assert!(
            !issues[3].to_string().contains("no-colon"),
            "the secret stays out"
        );
        assert!(issues[0].to_string().starts_with("`connect`: `localhost`"));
    }

    #[test]
    fn roots_and_names() {
        for bad in ["/", "/a/", "a", "/a//b", "/a/../b", "/a/./b"] {
            assert!(check_root(bad).is_err(), "{bad}");
        }
        for good in ["/a", "/sluice-test-1", "/a/b"] {
            assert_eq!(check_root(good), Ok(()), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a\nb"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(check_name("db1.example:3306"), Ok(()));
    }

    #[test]
    fn connect_strings() {
        assert_eq!(hosts("a:1, b:2/chroot"), ["a:1", "b:2"]);
        assert!(check_connect("a:1,b:2/").is_ok());
        assert!(check_connect("[::1]:2181").is_ok());
        assert!(check_connect("a:0").is_err());
        assert!(check_connect("a:1,").is_err());
        assert!(check_connect("a:1/bad/").is_err());
    }
}
