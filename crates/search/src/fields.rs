//! Which fields of a document an application may read by id: no more than its templates'
//! searches would show it. A template without a `_source` filter (or `true`) shows every
//! field; `false` shows none; a list of paths, or `includes`, shows those. A template
//! whose `_source` excludes fields, or that names its filter by a parameter, counts as
//! showing only what it explicitly includes — less than it may, never more.

use serde_json::{Map, Value};

use crate::config::TemplateConfig;

/// The fields an application may read of a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fields {
    All,
    /// Field paths (`title`, `brand.name`), `*` matching any characters.
    Only(Vec<String>),
}

impl Fields {
    /// What the templates `templates` show, together.
    pub fn shown_by<'a>(templates: impl IntoIterator<Item = &'a TemplateConfig>) -> Fields {
        let mut only = Vec::new();
        for t in templates {
            match t.query.get("_source") {
                None | Some(Value::Bool(true)) => return Fields::All,
                Some(Value::Bool(false)) => {}
                Some(Value::String(p)) if !p.contains("{{") => only.push(p.clone()),
                Some(Value::Array(paths)) => only.extend(paths_of(paths)),
                Some(Value::Object(filter)) => {
                    if let Some(Value::Array(paths)) = filter.get("includes") {
                        only.extend(paths_of(paths));
                    } else if let Some(Value::String(p)) = filter.get("includes") {
                        only.push(p.clone());
                    }
                }
                Some(_) => {}
            }
        }
        only.sort();
        only.dedup();
        Fields::Only(only)
    }

    /// `document` with only the fields these show.
    pub fn filter(&self, document: Value) -> Value {
        match self {
            Fields::All => document,
            Fields::Only(patterns) => match document {
                Value::Object(map) => Value::Object(kept(map, "", patterns)),
                _ => Value::Object(Map::new()),
            },
        }
    }

    pub fn is_nothing(&self) -> bool {
        matches!(self, Fields::Only(p) if p.is_empty())
    }
}

fn paths_of(paths: &[Value]) -> impl Iterator<Item = String> + '_ {
    paths
        .iter()
        .filter_map(Value::as_str)
        .filter(|p| !p.contains("{{"))
        .map(str::to_owned)
}

/// The members of `map` (at `prefix`) that a pattern names, or that hold one a pattern
/// names further down.
fn kept(map: Map<String, Value>, prefix: &str, patterns: &[String]) -> Map<String, Value> {
    let mut out = Map::new();
    for (key, value) in map {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        if patterns.iter().any(|p| matches(p, &path)) {
            out.insert(key, value);
            continue;
        }
        let deeper = |v: Value| match v {
            Value::Object(m) => {
                let m = kept(m, &path, patterns);
                (!m.is_empty()).then_some(Value::Object(m))
            }
            _ => None,
        };
        match value {
            Value::Object(_) => {
                if let Some(v) = deeper(value) {
                    out.insert(key, v);
                }
            }
            Value::Array(items) => {
                let items: Vec<Value> = items.into_iter().filter_map(deeper).collect();
                if !items.is_empty() {
                    out.insert(key, Value::Array(items));
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether `pattern` (with `*` for any characters) names `path` in full.
fn matches(pattern: &str, path: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = path.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(query: Value) -> TemplateConfig {
        TemplateConfig {
            name: "t".into(),
            params: Default::default(),
            query,
        }
    }

    #[test]
    fn what_the_templates_show_together() {
        let by =
            |qs: Vec<Value>| Fields::shown_by(&qs.into_iter().map(template).collect::<Vec<_>>());
        assert_eq!(by(vec![json!({"query": {}})]), Fields::All);
        assert_eq!(by(vec![json!({"_source": true})]), Fields::All);
        assert_eq!(
            by(vec![
                json!({"_source": ["title", "brand.*"]}),
                json!({"_source": {"includes": ["price"], "excludes": ["x"]}})
            ]),
            Fields::Only(vec!["brand.*".into(), "price".into(), "title".into()])
        );
        assert!(by(vec![json!({"_source": false})]).is_nothing());
        assert!(
            by(vec![json!({"_source": {"excludes": ["secret"]}})]).is_nothing(),
            "less, never more"
        );
        assert!(by(vec![json!({"_source": "{{which}}"})]).is_nothing());
        assert!(by(vec![]).is_nothing());
    }

    #[test]
    fn a_document_keeps_only_the_fields_named() {
        let f = Fields::Only(vec![
            "title".into(),
            "brand.name".into(),
            "skus.code".into(),
            "x*".into(),
        ]);
        let doc = json!({
            "title": "t", "secret": "s", "brand": {"name": "b", "margin": 3},
            "skus": [{"code": "c1", "cost": 1}, {"cost": 2}], "xa": 1, "xb": {"c": 2}
        });
        assert_eq!(
            f.filter(doc),
            json!({"title": "t", "brand": {"name": "b"}, "skus": [{"code": "c1"}], "xa": 1, "xb": {"c": 2}})
        );
        assert_eq!(Fields::All.filter(json!({"a": 1})), json!({"a": 1}));
    }

    #[test]
    fn patterns_match_whole_paths() {
        assert!(matches("title", "title") && !matches("title", "titles"));
        assert!(matches("brand.*", "brand.name") && !matches("brand.*", "brands"));
        assert!(matches("*.name", "brand.name") && matches("a*b*c", "aXXbYc"));
        assert!(!matches("a*b*c", "aXXbYd"));
    }
}
