//! The `[search]` section: where the API listens, the applications that may call it and
//! the search templates they may run.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

pub use crate::template::TemplateConfig;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSection {
    /// Where the search API listens (HTTP/JSON). Unset: not served.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// The longest an application may ask to wait for its own write (`wait_ms`).
    #[serde(default = "default_max_wait", with = "humantime_serde")]
    pub max_wait: Duration,
    #[serde(default)]
    pub apps: Vec<AppConfig>,
    #[serde(default)]
    pub templates: Vec<TemplateConfig>,
}

impl Default for SearchSection {
    fn default() -> Self {
        Self {
            listen: None,
            max_wait: default_max_wait(),
            apps: Vec::new(),
            templates: Vec::new(),
        }
    }
}

fn default_max_wait() -> Duration {
    Duration::from_secs(10)
}

/// An application: its credential, what it may search, and how fast.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    pub name: String,
    /// SHA-256 of its bearer token, in hex (`printf %s "$TOKEN" | sha256sum`): the
    /// configuration never holds the token itself.
    pub token_sha256: String,
    /// The aliases it may search (a pipeline's alias; never a versioned index).
    pub aliases: Vec<String>,
    /// The templates it may run.
    pub templates: Vec<String>,
    /// Requests per second it may make on each center, with bursts of `burst`.
    #[serde(default = "default_rate")]
    pub rate_per_sec: u32,
    #[serde(default)]
    pub burst: Option<u32>,
}

fn default_rate() -> u32 {
    100
}

impl SearchSection {
    /// What is wrong with the section, each naming its key under `prefix`.
    pub fn problems(&self, prefix: &str) -> Vec<String> {
        let mut p = Vec::new();
        if self.max_wait.is_zero() {
            p.push(format!("{prefix}.max_wait: must be above zero"));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in self.templates.iter().enumerate() {
            let key = format!("{prefix}.templates[{i}]");
            if !names.insert(t.name.as_str()) {
                p.push(format!("{key}.name: `{}` is defined twice", t.name));
            }
            p.extend(crate::template::problems(t, &key));
        }
        let mut apps = std::collections::BTreeSet::new();
        for (i, a) in self.apps.iter().enumerate() {
            let key = format!("{prefix}.apps[{i}]");
            if a.name.trim().is_empty() {
                p.push(format!("{key}.name: must not be empty"));
            }
            if !apps.insert(a.name.as_str()) {
                p.push(format!("{key}.name: `{}` is defined twice", a.name));
            }
            let hex = a.token_sha256.trim();
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                p.push(format!(
                    "{key}.token_sha256: must be 64 hex digits (printf %s \"$TOKEN\" | sha256sum)"
                ));
            }
            if a.aliases.is_empty() {
                p.push(format!("{key}.aliases: name at least one alias"));
            }
            for t in &a.templates {
                if !names.contains(t.as_str()) {
                    p.push(format!(
                        "{key}.templates: no template `{t}` in {prefix}.templates"
                    ));
                }
            }
            if a.rate_per_sec == 0 {
                p.push(format!("{key}.rate_per_sec: must be at least 1"));
            }
            if a.burst == Some(0) {
                p.push(format!("{key}.burst: must be at least 1"));
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mistake_names_its_key() {
        let section: SearchSection = toml::from_str(
            r#"
            max_wait = "0s"
            [[apps]]
            name = "shop"
            token_sha256 = "abc"
            aliases = []
            templates = ["by_title", "nope"]
            rate_per_sec = 0
            [[templates]]
            name = "by_title"
            params = { q = { type = "string" }, n = { type = "integer", default = "x" } }
            query = { query = { match = { title = "{{q}}" } }, size = "{{size}}" }
            "#,
        )
        .unwrap();
        let problems = section.problems("search");
        for expected in [
            "search.max_wait: must be above zero",
            "search.apps[0].token_sha256: must be 64 hex digits",
            "search.apps[0].aliases: name at least one alias",
            "search.apps[0].templates: no template `nope` in search.templates",
            "search.apps[0].rate_per_sec: must be at least 1",
            "search.templates[0].params.n.default: not an integer",
            "search.templates[0].query: `{{size}}` names no parameter",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(expected)),
                "{expected} not in {problems:#?}"
            );
        }
        assert_eq!(problems.len(), 7, "{problems:#?}");
    }
}
