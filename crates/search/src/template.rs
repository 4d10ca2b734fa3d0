//! Search templates with typed parameters. A template's query is an Elasticsearch search
//! body in which a JSON string that is exactly `"{{name}}"` stands for parameter `name`:
//! the caller's value replaces that string as a JSON value of the declared type, so a
//! value can never change the query's shape (no text is spliced).

use serde::Deserialize;
use serde_json::{Map, Value};

/// A parameterised query: `query` is an Elasticsearch search body in which a JSON
/// string `"{{name}}"` stands for parameter `name`'s value (of its declared type, never
/// spliced into text).
///
/// `params` and `query` may also be given as JSON text (what a Helm chart renders).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateConfig {
    pub name: String,
    #[serde(default, deserialize_with = "table_or_json")]
    pub params: std::collections::BTreeMap<String, ParamSpec>,
    #[serde(deserialize_with = "table_or_json")]
    pub query: Value,
}

/// A value given as itself, or as a string of JSON text.
fn table_or_json<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let value = Value::deserialize(d)?;
    let value = match value {
        Value::String(text) => serde_json::from_str(&text).map_err(serde::de::Error::custom)?,
        other => other,
    };
    serde_json::from_value(value).map_err(serde::de::Error::custom)
}

/// A parameter's declared type, and its default (which makes it optional).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamSpec {
    #[serde(rename = "type")]
    pub kind: ParamType,
    #[serde(default)]
    pub default: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamType {
    String,
    Integer,
    Number,
    Boolean,
    /// A list of strings (a `terms` query's values).
    Strings,
    /// A list of integers.
    Integers,
}

impl ParamType {
    fn name(self) -> &'static str {
        match self {
            ParamType::String => "a string",
            ParamType::Integer => "an integer",
            ParamType::Number => "a number",
            ParamType::Boolean => "a boolean",
            ParamType::Strings => "a list of strings",
            ParamType::Integers => "a list of integers",
        }
    }

    fn admits(self, v: &Value) -> bool {
        let integer = |v: &Value| v.is_i64() || v.is_u64();
        match self {
            ParamType::String => v.is_string(),
            ParamType::Integer => integer(v),
            ParamType::Number => v.is_number(),
            ParamType::Boolean => v.is_boolean(),
            ParamType::Strings => v.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
            ParamType::Integers => v.as_array().is_some_and(|a| a.iter().all(integer)),
        }
    }
}

/// The parameter a string stands for, when it is a placeholder.
fn placeholder(s: &str) -> Option<&str> {
    s.strip_prefix("{{")?.strip_suffix("}}").map(str::trim)
}

/// What is wrong with template `t`, each naming its key under `key`.
pub(crate) fn problems(t: &TemplateConfig, key: &str) -> Vec<String> {
    let mut p = Vec::new();
    if t.name.trim().is_empty() {
        p.push(format!("{key}.name: must not be empty"));
    }
    for (name, spec) in &t.params {
        if let Some(d) = &spec.default {
            if !spec.kind.admits(d) {
                p.push(format!(
                    "{key}.params.{name}.default: not {}",
                    spec.kind.name()
                ));
            }
        }
    }
    if !t.query.is_object() {
        p.push(format!(
            "{key}.query: must be a search body (a JSON object)"
        ));
    }
    let mut strings = Vec::new();
    strings_of(&t.query, &mut strings);
    for s in strings {
        match placeholder(s) {
            Some(name) if !t.params.contains_key(name) => {
                p.push(format!("{key}.query: `{s}` names no parameter"));
            }
            None if s.contains("{{") => p.push(format!(
                "{key}.query: `{s}`: a placeholder must be a whole JSON string (\"{{{{name}}}}\")"
            )),
            _ => {}
        }
    }
    p
}

fn strings_of<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|v| strings_of(v, out)),
        Value::Object(o) => o.values().for_each(|v| strings_of(v, out)),
        _ => {}
    }
}

/// The search body template `t` makes of `params`; the error names the parameter and
/// what was wrong with it.
pub fn render(t: &TemplateConfig, params: &Map<String, Value>) -> Result<Value, String> {
    if let Some(unknown) = params.keys().find(|k| !t.params.contains_key(*k)) {
        let known: Vec<&str> = t.params.keys().map(String::as_str).collect();
        return Err(format!(
            "params.{unknown}: template `{}` has no such parameter (it has: {})",
            t.name,
            if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            }
        ));
    }
    let mut values = Map::new();
    for (name, spec) in &t.params {
        let value = match (params.get(name), &spec.default) {
            (Some(v), _) => v,
            (None, Some(d)) => d,
            (None, None) => {
                return Err(format!("params.{name}: required ({})", spec.kind.name()));
            }
        };
        if !spec.kind.admits(value) {
            return Err(format!(
                "params.{name}: must be {}, not {value}",
                spec.kind.name()
            ));
        }
        values.insert(name.clone(), value.clone());
    }
    Ok(substitute(&t.query, &values))
}

fn substitute(v: &Value, values: &Map<String, Value>) -> Value {
    match v {
        Value::String(s) => match placeholder(s).and_then(|name| values.get(name)) {
            Some(value) => value.clone(),
            None => v.clone(),
        },
        Value::Array(a) => Value::Array(a.iter().map(|v| substitute(v, values)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), substitute(v, values)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template() -> TemplateConfig {
        serde_json::from_value(json!({
            "name": "by_title",
            "params": {
                "q": {"type": "string"},
                "brands": {"type": "strings", "default": []},
                "size": {"type": "integer", "default": 10}
            },
            "query": {
                "size": "{{size}}",
                "query": {"bool": {
                    "must": [{"match": {"title": "{{q}}"}}],
                    "filter": [{"terms": {"brand": "{{ brands }}"}}]
                }}
            }
        }))
        .unwrap()
    }

    #[test]
    fn values_replace_whole_placeholders_with_their_declared_types() {
        let t = template();
        assert!(problems(&t, "t").is_empty());
        let params = json!({"q": "red \"shoe\"}} {{size}}", "brands": ["acme"]});
        let body = render(&t, params.as_object().unwrap()).unwrap();
        assert_eq!(
            body,
            json!({
                "size": 10,
                "query": {"bool": {
                    "must": [{"match": {"title": "red \"shoe\"}} {{size}}"}}],
                    "filter": [{"terms": {"brand": ["acme"]}}]
                }}
            })
        );
    }

    #[test]
    fn a_wrong_missing_or_unknown_parameter_is_named() {
        let t = template();
        let err = |p: Value| render(&t, p.as_object().unwrap()).unwrap_err();
        assert_eq!(err(json!({})), "params.q: required (a string)");
        assert_eq!(
            err(json!({"q": "x", "size": "ten"})),
            "params.size: must be an integer, not \"ten\""
        );
        assert_eq!(
            err(json!({"q": "x", "brands": [1]})),
            "params.brands: must be a list of strings, not [1]"
        );
        assert_eq!(
            err(json!({"q": "x", "script": "boom"})),
            "params.script: template `by_title` has no such parameter (it has: brands, q, size)"
        );
    }

    #[test]
    fn params_and_query_may_come_as_json_text() {
        let t: TemplateConfig = serde_json::from_value(json!({
            "name": "t",
            "params": "{\"q\": {\"type\": \"string\"}}",
            "query": "{\"query\": {\"match\": {\"title\": \"{{q}}\"}}}"
        }))
        .unwrap();
        assert!(problems(&t, "t").is_empty());
        let body = render(&t, json!({"q": "x"}).as_object().unwrap()).unwrap();
        assert_eq!(body, json!({"query": {"match": {"title": "x"}}}));
    }

    #[test]
    fn a_placeholder_inside_text_is_refused_at_load() {
        let mut t = template();
        t.query = json!({"query": {"match": {"title": "prefix {{q}}"}}});
        assert_eq!(
            problems(&t, "search.templates[0]"),
            ["search.templates[0].query: `prefix {{q}}`: a placeholder must be a whole JSON string (\"{{name}}\")"]
        );
    }
}
