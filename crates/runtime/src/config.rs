//! Layered configuration: a TOML file, then `SLUICE_…` environment variables (`__` for
//! nesting, e.g. `SLUICE_KAFKA__BROKERS`). Every service's config struct denies unknown
//! fields; errors name the offending key by its full path.

use std::path::Path;

use serde::de::DeserializeOwned;
use sluice_model::TlsFiles;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: Box<config::ConfigError>,
    },
    #[error("config key `{key}`: {message}")]
    Invalid { key: String, message: String },
    #[error("invalid configuration:\n{}", .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Problems(Vec<String>),
}

/// Loads `T` from `path` (TOML) overlaid with `<prefix>_…` environment variables.
pub fn load_config<T: DeserializeOwned>(
    path: Option<&Path>,
    env_prefix: &str,
) -> Result<T, ConfigError> {
    load_config_from(path, env_prefix, std::env::vars())
}

/// As [`load_config`], with `env` in place of the process environment (to check what a
/// deployment would give a service).
pub fn load_config_from<T: DeserializeOwned>(
    path: Option<&Path>,
    env_prefix: &str,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<T, ConfigError> {
    let mut builder = config::Config::builder();
    if let Some(path) = path {
        builder = builder.add_source(
            config::File::from(path)
                .format(config::FileFormat::Toml)
                .required(true),
        );
    }
    // The variables that choose the file and the log format are not config keys.
    let not_keys = [
        format!("{env_prefix}_CONFIG_FILE"),
        format!("{env_prefix}_LOG_FORMAT"),
    ];
    let env = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(env_prefix) && !not_keys.contains(k))
        .collect();
    builder = builder.add_source(
        config::Environment::with_prefix(env_prefix)
            .prefix_separator("_")
            .separator("__")
            .try_parsing(true)
            .source(Some(env)),
    );
    let cfg = builder.build().map_err(|source| ConfigError::Read {
        source: Box::new(source),
        path: path
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "<environment>".into()),
    })?;
    serde_path_to_error::deserialize(cfg).map_err(|e| {
        // The path includes an unknown field's own name ("kafka.brokerz").
        let key = e.path().to_string();
        let message = e.into_inner().to_string();
        ConfigError::Invalid { key, message }
    })
}

/// The TLS files of `settings` that cannot be read, each named by its key: what a service
/// checks at start, so that it does not fail its first connection in the driver's words.
pub fn unreadable_tls(settings: &[(String, &TlsFiles)]) -> Result<(), ConfigError> {
    let found: Vec<String> = settings
        .iter()
        .filter_map(|(key, t)| t.read(key).err())
        .collect();
    if found.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::Problems(found))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use sluice_model::Secret;
    use std::io::Write;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        name: String,
        inner: Inner,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        size: u32,
        password: Secret,
    }

    fn write(text: &str) -> tempfile_path::TempPath {
        tempfile_path::TempPath::with(text)
    }

    mod tempfile_path {
        use super::*;
        pub struct TempPath(pub std::path::PathBuf);
        impl TempPath {
            pub fn with(text: &str) -> Self {
                static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let p = std::env::temp_dir()
                    .join(format!("sluice-cfg-{}-{n}.toml", std::process::id()));
                std::fs::File::create(&p)
                    .unwrap()
                    .write_all(text.as_bytes())
                    .unwrap();
                Self(p)
            }
        }
        impl Drop for TempPath {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn unknown_nested_key_is_named_with_its_path() {
        let f = write("name = \"a\"\n[inner]\nsize = 1\npassword = \"p\"\nsise = 2\n");
        let err = load_config::<Outer>(Some(&f.0), "SLUICE_TEST_UNKNOWN").unwrap_err();
        match err {
            ConfigError::Invalid { key, .. } => assert_eq!(key, "inner.sise"),
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn wrong_type_is_named_and_secret_hidden() {
        let f = write("name = \"a\"\n[inner]\nsize = \"big\"\npassword = \"hunter2\"\n");
        let err = load_config::<Outer>(Some(&f.0), "SLUICE_TEST_TYPE").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("inner.size"), "{text}");
        let ok = write("name = \"a\"\n[inner]\nsize = 3\npassword = \"hunter2\"\n");
        let outer: Outer = load_config(Some(&ok.0), "SLUICE_TEST_OK").unwrap();
        assert!(!format!("{outer:?}").contains("hunter2"));
    }
}
