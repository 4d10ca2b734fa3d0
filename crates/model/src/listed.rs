//! Lists in configuration that an environment variable can set too: a TOML array, or one
//! string of comma-separated items (`SLUICE_SOURCE_PLAINTEXT_HOSTS=db1,db2`).

use std::path::PathBuf;

use serde::{Deserialize, Deserializer};

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    Many(Vec<String>),
    One(String),
}

/// A list of strings from an array or a comma-separated string (items trimmed, empty ones
/// dropped).
pub fn strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::Many(v) => v,
        OneOrMany::One(s) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    })
}

/// As [`strings`], for paths.
pub fn paths<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
    strings(d).map(|v| v.into_iter().map(PathBuf::from).collect())
}

#[cfg(test)]
mod tests {
    #[derive(serde::Deserialize)]
    struct S {
        #[serde(deserialize_with = "super::strings")]
        v: Vec<String>,
    }

    #[test]
    fn an_array_or_a_comma_separated_string() {
        let a: S = toml::from_str(r#"v = ["a", "b"]"#).unwrap();
        let b: S = toml::from_str(r#"v = " a, b ,""#).unwrap();
        assert_eq!(a.v, ["a", "b"]);
        assert_eq!(b.v, ["a", "b"]);
    }
}
