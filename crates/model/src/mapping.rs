//! What an operator may say about a pipeline's index beyond what the MySQL types imply:
//! per-column mapping overrides and index settings. Checked in one place for the
//! center's admin API and the etl's config file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Field types whose values are analysed text (the only ones with analyzers and a
/// `keyword` sub-field).
pub const TEXT_TYPES: &[&str] = &["text", "match_only_text", "search_as_you_type"];

/// An override of one column's generated mapping. Unset parts keep what the column's
/// MySQL type generates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FieldOverride {
    /// The Elasticsearch field type (`keyword`, `text`, `long`, `date`...).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub es_type: Option<String>,
    /// The analyzer at index time (and at search time unless `search_analyzer` is set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub analyzer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search_analyzer: Option<String>,
    /// Whether a text field has a `keyword` sub-field (`<column>.keyword`). Default: yes
    /// for generated text fields.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyword: Option<bool>,
    /// Fields this column's value is also indexed into (`copy_to`); a target that is not
    /// a column becomes a text field of its own.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub copy_to: Vec<String>,
    /// `false`: kept in `_source`, not searchable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<bool>,
}

impl FieldOverride {
    /// What is wrong with the override of `column`, each naming the key
    /// (`fields.<column>.<key>`).
    pub fn problems(&self, column: &str) -> Vec<String> {
        let key = |k: &str| format!("fields.{column}.{k}");
        let mut out = Vec::new();
        if !is_field_name(column) {
            out.push(format!(
                "fields.{column}: `{column}` is not a column name (no dots, not empty)"
            ));
        }
        if let Some(t) = &self.es_type {
            if t.is_empty() || !t.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                out.push(format!(
                    "{}: `{t}` is not an Elasticsearch field type",
                    key("type")
                ));
            } else if !TEXT_TYPES.contains(&t.as_str()) {
                for (name, set) in [
                    ("analyzer", self.analyzer.is_some()),
                    ("search_analyzer", self.search_analyzer.is_some()),
                    ("keyword", self.keyword == Some(true)),
                ] {
                    if set {
                        out.push(format!(
                            "{}: only a text field has it, and type is `{t}`",
                            key(name)
                        ));
                    }
                }
            }
        }
        for (name, v) in [
            ("analyzer", &self.analyzer),
            ("search_analyzer", &self.search_analyzer),
        ] {
            if v.as_deref().is_some_and(str::is_empty) {
                out.push(format!("{}: empty analyzer name", key(name)));
            }
        }
        for target in &self.copy_to {
            if !is_field_name(target) || target == column {
                out.push(format!(
                    "{}: `{target}` is not another field's name",
                    key("copy_to")
                ));
            }
        }
        out
    }
}

/// What is wrong with a pipeline's overrides and index settings, keys relative to the
/// pipeline (`fields.<column>.<key>`, `refresh_interval`). `columns` is the pipeline's
/// column selection (empty: every column).
pub fn pipeline_problems(
    columns: &[String],
    fields: &BTreeMap<String, FieldOverride>,
    refresh_interval: &str,
) -> Vec<String> {
    let mut out: Vec<String> = fields
        .iter()
        .flat_map(|(column, o)| {
            let mut p = o.problems(column);
            if !columns.is_empty() && !columns.contains(column) {
                p.push(format!(
                    "fields.{column}: `{column}` is not among the pipeline's columns"
                ));
            }
            p
        })
        .collect();
    out.extend(refresh_interval_problem(refresh_interval));
    out
}

fn is_field_name(s: &str) -> bool {
    !s.is_empty() && !s.contains('.') && !s.starts_with('_')
}

/// `refresh_interval`: empty (the server's default), `-1` (off) or a number with a unit.
pub fn refresh_interval_problem(v: &str) -> Option<String> {
    if v.is_empty() || v == "-1" {
        return None;
    }
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &v[digits.len()..];
    let ok = !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit())
        && ["ms", "s", "m", "h", "d"].contains(&unit);
    (!ok).then(|| {
        format!("refresh_interval: `{v}` is not a time like `1s`, `30s`, `500ms`, or `-1` (off)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_the_key() {
        let ok = FieldOverride {
            es_type: Some("text".into()),
            analyzer: Some("english".into()),
            copy_to: vec!["all_text".into()],
            ..Default::default()
        };
        assert!(ok.problems("title").is_empty());
        let bad = FieldOverride {
            es_type: Some("long".into()),
            analyzer: Some("english".into()),
            copy_to: vec!["price".into(), "a.b".into()],
            ..Default::default()
        };
        let p = bad.problems("price");
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].starts_with("fields.price.analyzer:"), "{p:?}");
        assert!(p[1].contains("`price`") && p[2].contains("`a.b`"), "{p:?}");
        assert!(FieldOverride::default().problems("a.b")[0].starts_with("fields.a.b:"));
    }

    #[test]
    fn refresh_intervals() {
        for ok in ["", "-1", "1s", "500ms", "30s", "2m"] {
            assert_eq!(refresh_interval_problem(ok), None, "{ok}");
        }
        for bad in ["1", "s", "1x", "-2s", "1.5s"] {
            assert!(refresh_interval_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn unknown_override_keys_are_refused() {
        let e = serde_json::from_str::<FieldOverride>(r#"{"analyser": "english"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("analyser"), "{e}");
    }
}
