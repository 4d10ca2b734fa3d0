//! Secrets: passwords and tokens that configuration carries and no log may show, and the
//! references to them a source record may hold (`password_ref`), which resolve only where
//! the resolving service's own configuration allows.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Deserializer};

/// A secret (password, token). Never printed by `Debug` or `Display`, never serialized.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// What the services read as their own configuration: a source may never name it.
const OWN_PREFIX: &str = "SLUICE_";

/// The largest secret file read (a password, a token): a reference to a device or a log
/// cannot make a service read without end.
const MOST_BYTES: u64 = 64 * 1024;

/// Where a `password_ref` says a secret is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretRef {
    /// `env:NAME`: a variable of the resolving process's environment.
    Env(String),
    /// `file:/path`: a file of its file system (a mounted secret).
    File(PathBuf),
}

impl std::str::FromStr for SecretRef {
    type Err = String;

    fn from_str(r: &str) -> Result<SecretRef, String> {
        if let Some(name) = r.strip_prefix("env:") {
            if !is_env_name(name) {
                return Err(format!(
                    "`env:{name}`: a variable name is 1..=128 characters of [A-Za-z0-9_], not starting with a digit"
                ));
            }
            Ok(SecretRef::Env(name.to_owned()))
        } else if let Some(path) = r.strip_prefix("file:") {
            let path = Path::new(path);
            if !is_plain_absolute(path) {
                return Err(format!(
                    "`file:{}`: the path must be absolute, without `.` or `..` parts",
                    path.display()
                ));
            }
            Ok(SecretRef::File(path.to_owned()))
        } else {
            Err("must be `env:NAME` or `file:/path` (the password itself is never stored)".into())
        }
    }
}

fn is_env_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

fn is_plain_absolute(path: &Path) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// Which secrets a source's `password_ref` may name in this process (`[source_secrets]`):
/// environment variables by name or prefix, files by the directories that hold them.
/// Nothing else resolves, so whoever may define sources (an admin) reaches only the
/// secrets the operator of each service set aside for sources — never the service's own
/// (`SLUICE_…` variables, its meta-database or Kafka password, a service-account token).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRefs {
    /// Variables `env:NAME` may name: a whole name (`SHOP_DB_PASSWORD`) or a prefix ending
    /// in `*` (`SOURCE_PASSWORD_*`). Never a `SLUICE_` name.
    #[serde(default, deserialize_with = "crate::listed::strings")]
    pub env: Vec<String>,
    /// Directories whose files `file:/path` may name; a path is resolved (symbolic links
    /// followed) before it is checked, so a link cannot lead out of them.
    #[serde(default, deserialize_with = "crate::listed::paths")]
    pub dirs: Vec<PathBuf>,
}

impl SecretRefs {
    /// Problems of the allowlist itself (no I/O), each naming its key under `prefix`.
    pub fn problems(&self, prefix: &str) -> Vec<String> {
        let mut p = Vec::new();
        for (i, entry) in self.env.iter().enumerate() {
            let (stem, wild) = match entry.strip_suffix('*') {
                Some(stem) => (stem, true),
                None => (entry.as_str(), false),
            };
            let well_formed = (stem.is_empty() && wild) || is_env_name(stem);
            if !well_formed {
                p.push(format!(
                    "{prefix}.env[{i}]: `{entry}` must be a variable name, or a prefix of one followed by `*`"
                ));
            } else if could_be_own(stem, wild) {
                p.push(format!(
                    "{prefix}.env[{i}]: `{entry}` would let a source name the services' own settings (`{OWN_PREFIX}…` variables): choose names of their own for source passwords"
                ));
            }
        }
        for (i, dir) in self.dirs.iter().enumerate() {
            if !is_plain_absolute(dir) {
                p.push(format!(
                    "{prefix}.dirs[{i}]: `{}` must be an absolute path without `.` or `..` parts",
                    dir.display()
                ));
            } else if dir.parent().is_none() {
                p.push(format!(
                    "{prefix}.dirs[{i}]: `/` would let a source name every file of the host"
                ));
            }
        }
        p
    }

    /// Whether `reference` names a secret this allowlist admits, judged by its text alone
    /// (what a center checks when a source is put); `Err` says why not and what to set.
    pub fn admits(&self, reference: &str) -> Result<SecretRef, String> {
        let r: SecretRef = reference.parse()?;
        match &r {
            SecretRef::Env(name) => {
                if self.env_admits(name) {
                    Ok(r)
                } else {
                    Err(format!(
                        "`env:{name}` is not a variable this service lets sources name ({}): its operator lists names or prefixes in `source_secrets.env`",
                        listing(&self.env)
                    ))
                }
            }
            SecretRef::File(path) => {
                if self.dirs.iter().any(|d| path.starts_with(d)) {
                    Ok(r)
                } else {
                    Err(format!(
                        "`file:{}` is not in a directory this service lets sources name ({}): its operator lists them in `source_secrets.dirs`",
                        path.display(),
                        listing(&self.dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>())
                    ))
                }
            }
        }
    }

    fn env_admits(&self, name: &str) -> bool {
        !is_own(name)
            && self.env.iter().any(|e| match e.strip_suffix('*') {
                Some(stem) => name.starts_with(stem),
                None => name == e,
            })
    }

    /// The secret `reference` names, read in this process, once [`SecretRefs::admits`]
    /// lets it: a file only when it is a regular file of at most 64 KiB whose real path
    /// (links followed) is inside an allowed directory.
    pub fn resolve(&self, reference: &str) -> Result<Secret, String> {
        match self.admits(reference)? {
            SecretRef::Env(name) => std::env::var(&name)
                .map(Secret::new)
                .map_err(|_| format!("the environment variable {name} is not set here")),
            SecretRef::File(path) => self.read_file(&path),
        }
    }

    fn read_file(&self, path: &Path) -> Result<Secret, String> {
        let shown = path.display();
        let real = std::fs::canonicalize(path).map_err(|e| format!("`file:{shown}`: {e}"))?;
        let inside = self
            .dirs
            .iter()
            .any(|d| std::fs::canonicalize(d).is_ok_and(|d| real.starts_with(d)));
        if !inside {
            return Err(format!(
                "`file:{shown}` leads out of the allowed directories (it is {})",
                real.display()
            ));
        }
        let failed = |e: std::io::Error| format!("`file:{shown}`: {e}");
        // Opened without waiting (a pipe swapped in would wait for a writer) and without
        // following a link swapped in for the file it resolved to, then checked as opened,
        // and read no further than allowed.
        let file = {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
                .open(&real)
                .map_err(failed)?
        };
        if !file.metadata().map_err(failed)?.is_file() {
            return Err(format!("`file:{shown}` is not a regular file"));
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(file, MOST_BYTES + 1), &mut bytes)
            .map_err(failed)?;
        if bytes.len() as u64 > MOST_BYTES {
            return Err(format!(
                "`file:{shown}` holds more than {MOST_BYTES} bytes, the most a secret file holds"
            ));
        }
        String::from_utf8(bytes)
            .map(|s| Secret::new(s.trim_end_matches(['\n', '\r'])))
            .map_err(|_| format!("`file:{shown}` is not UTF-8 text"))
    }
}

/// Whether `name` is one of the services' own variables (in any case: the settings
/// are read from the environment without regard to it).
fn is_own(name: &str) -> bool {
    name.len() >= OWN_PREFIX.len() && name[..OWN_PREFIX.len()].eq_ignore_ascii_case(OWN_PREFIX)
}

/// Whether names starting with `stem` (any name at all with `wild`) can be the services'
/// own variables.
fn could_be_own(stem: &str, wild: bool) -> bool {
    let stem_is_start =
        stem.len() <= OWN_PREFIX.len() && OWN_PREFIX[..stem.len()].eq_ignore_ascii_case(stem);
    is_own(stem) || (wild && stem_is_start)
}

fn listing(items: &[String]) -> String {
    if items.is_empty() {
        "none is allowed".into()
    } else {
        format!("allowed: {}", items.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(env: &[&str], dirs: &[&Path]) -> SecretRefs {
        SecretRefs {
            env: env.iter().map(|s| s.to_string()).collect(),
            dirs: dirs.iter().map(|d| d.to_path_buf()).collect(),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("sluice-secrets-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn only_allowed_variables_resolve_and_never_the_services_own() {
        std::env::set_var("SHOP_DB_PASSWORD_FOR_TEST", "s3cret");
        std::env::set_var("SLUICE_META__PASSWORD_FOR_TEST", "meta");
        let r = refs(&["SHOP_DB_PASSWORD_FOR_TEST", "SOURCE_PW_*"], &[]);
        assert_eq!(
            r.resolve("env:SHOP_DB_PASSWORD_FOR_TEST").unwrap().expose(),
            "s3cret"
        );
        assert!(r.admits("env:SOURCE_PW_CRM").is_ok());
        let e = r.resolve("env:SLUICE_META__PASSWORD_FOR_TEST").unwrap_err();
        assert!(e.contains("source_secrets.env"), "{e}");
        assert!(r.admits("env:HOME").is_err());
        assert!(
            r.admits("env:SHOP_DB_PASSWORD_FOR_TEST_2").is_err(),
            "a whole name is not a prefix"
        );
        let none = SecretRefs::default();
        let e = none.admits("env:SHOP_DB_PASSWORD_FOR_TEST").unwrap_err();
        assert!(e.contains("none is allowed"), "{e}");
        // Even an allowlist of everything never reaches the services' own settings.
        let all = refs(&["*"], &[]);
        assert!(all.admits("env:SLUICE_API__TOKEN").is_err());
        assert!(all.admits("env:sluice_api__token").is_err(), "in any case");
    }

    #[test]
    fn an_allowlist_that_could_name_the_services_settings_is_refused() {
        let p = refs(
            &[
                "*", "SLU*", "SLUICE_X", "SLUICE_*", "OK_*", "BAD-NAME", "DB_PW", "slu*",
                "Sluice_X",
            ],
            &[
                Path::new("/"),
                Path::new("rel"),
                Path::new("/etc/sluice/../x"),
            ],
        )
        .problems("source_secrets");
        let keys: Vec<&str> = p.iter().map(|s| s.split(':').next().unwrap()).collect();
        assert_eq!(
            keys,
            [
                "source_secrets.env[0]",
                "source_secrets.env[1]",
                "source_secrets.env[2]",
                "source_secrets.env[3]",
                "source_secrets.env[5]",
                "source_secrets.env[7]",
                "source_secrets.env[8]",
                "source_secrets.dirs[0]",
                "source_secrets.dirs[1]",
                "source_secrets.dirs[2]",
            ],
            "{p:#?}"
        );
    }

    #[test]
    fn files_resolve_only_inside_allowed_directories_links_followed() {
        let allowed = scratch("allowed");
        let elsewhere = scratch("elsewhere");
        std::fs::write(allowed.join("shop"), "pw\n").unwrap();
        std::fs::write(elsewhere.join("meta"), "meta-pw").unwrap();
        std::os::unix::fs::symlink(elsewhere.join("meta"), allowed.join("link")).unwrap();
        std::fs::write(allowed.join("big"), vec![b'x'; 70_000]).unwrap();
        let r = refs(&[], &[&allowed]);
        let at = |name: &str| format!("file:{}", allowed.join(name).display());
        assert_eq!(r.resolve(&at("shop")).unwrap().expose(), "pw");
        let e = r.resolve(&at("link")).unwrap_err();
        assert!(e.contains("leads out of the allowed directories"), "{e}");
        let e = r
            .resolve(&format!("file:{}", elsewhere.join("meta").display()))
            .unwrap_err();
        assert!(e.contains("source_secrets.dirs"), "{e}");
        let e = r
            .resolve(&format!("file:{}/../elsewhere/meta", allowed.display()))
            .unwrap_err();
        assert!(e.contains("without `.` or `..`"), "{e}");
        assert!(r
            .resolve(&at("big"))
            .unwrap_err()
            .contains("more than 65536"));
        assert!(r
            .resolve(&format!("file:{}", allowed.display()))
            .unwrap_err()
            .contains("not a regular file"));
        // A pipe is refused at once, not waited on for a writer.
        let made = std::process::Command::new("mkfifo")
            .arg(allowed.join("pipe"))
            .status()
            .unwrap();
        assert!(made.success());
        assert!(r
            .resolve(&at("pipe"))
            .unwrap_err()
            .contains("not a regular file"));
        // A refused path says nothing of whether it exists.
        let missing = r.resolve("file:/nonexistent/x").unwrap_err();
        let present = r.resolve("file:/etc/hostname").unwrap_err();
        assert_eq!(
            missing.replace("/nonexistent/x", "P"),
            present.replace("/etc/hostname", "P")
        );
        let _ = std::fs::remove_dir_all(&allowed);
        let _ = std::fs::remove_dir_all(&elsewhere);
    }

    #[test]
    fn references_read_as_written() {
        assert_eq!(
            "env:A_B".parse::<SecretRef>(),
            Ok(SecretRef::Env("A_B".into()))
        );
        assert_eq!(
            "file:/run/secrets/x".parse::<SecretRef>(),
            Ok(SecretRef::File("/run/secrets/x".into()))
        );
        for bad in [
            "hunter2",
            "env:",
            "env:A-B",
            "env:1A",
            "file:rel/x",
            "file:/a/../b",
            "file:",
        ] {
            assert!(bad.parse::<SecretRef>().is_err(), "{bad}");
        }
    }
}
