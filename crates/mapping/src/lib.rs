//! Elasticsearch mappings generated from the MySQL column types the change events carry,
//! and from a pipeline's compiled documents: what the etl creates an index with, and what
//! the center shows an operator before a spec is saved.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};
use sluice_model::mapping::TEXT_TYPES;
use sluice_model::{ColumnInfo, FieldOverride};
use sluice_mysql::docs::{DocPlan, Node};

/// The mapping of one column, from its envelope type (`bigint unsigned`, `decimal(10,2)`…).
pub fn field_mapping(sql_type: &str) -> Value {
    let base = sql_type.split('(').next().unwrap_or(sql_type).trim();
    let unsigned = sql_type.ends_with("unsigned");
    match base.trim_end_matches(" unsigned") {
        "bigint" if unsigned => json!({"type": "unsigned_long"}),
        "tinyint" | "smallint" | "mediumint" | "int" | "bigint" => json!({"type": "long"}),
        "year" => json!({"type": "integer"}),
        "bit" => {
            if bit_width(sql_type) == 64 {
                json!({"type": "unsigned_long"})
            } else {
                json!({"type": "long"})
            }
        }
        "float" => json!({"type": "float"}),
        "double" => json!({"type": "double"}),
        "decimal" => {
            let (precision, scale) = decimal_shape(sql_type);
            if precision <= 18 && scale <= 9 {
                json!({"type": "scaled_float", "scaling_factor": 10u64.pow(scale)})
            } else {
                json!({"type": "double"})
            }
        }
        "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" => {
            json!({"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}})
        }
        "enum" | "set" | "time" => json!({"type": "keyword"}),
        "date" | "datetime" | "timestamp" => json!({"type": "date"}),
        "json" => json!({"type": "object", "enabled": false}),
        // An array of floats; a k-NN field (dense_vector, knn_vector) is a `fields` override.
        "vector" => json!({"type": "float"}),
        // binary, varbinary, blobs, geometry and anything unknown: kept, not searchable.
        _ => json!({"type": "binary"}),
    }
}

fn decimal_shape(sql_type: &str) -> (u32, u32) {
    let inner = sql_type
        .split('(')
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap_or("");
    let mut it = inner
        .split(',')
        .map(|n| n.trim().parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(65), it.next().unwrap_or(30))
}

fn bit_width(sql_type: &str) -> u32 {
    sql_type
        .split('(')
        .nth(1)
        .and_then(|s| s.trim_end_matches(')').parse().ok())
        .unwrap_or(1)
}

/// A column's mapping: generated from its type, then the operator's override applied.
/// Analyzers and the `keyword` sub-field only apply to text fields; for another type they
/// are left out and the second value says so.
pub fn column_mapping(sql_type: &str, o: Option<&FieldOverride>) -> (Value, Option<String>) {
    let mut m = field_mapping(sql_type);
    let Some(o) = o else { return (m, None) };
    if let Some(t) = &o.es_type {
        if m["type"] != t.as_str() {
            m = json!({ "type": t });
            if TEXT_TYPES.contains(&t.as_str()) {
                m["fields"] = json!({"keyword": {"type": "keyword", "ignore_above": 256}});
            }
        }
    }
    let text = m["type"].as_str().is_some_and(|t| TEXT_TYPES.contains(&t));
    let mut ignored = Vec::new();
    for (key, v) in [
        ("analyzer", &o.analyzer),
        ("search_analyzer", &o.search_analyzer),
    ] {
        match v {
            Some(v) if text => m[key] = json!(v),
            Some(_) => ignored.push(key),
            None => {}
        }
    }
    match o.keyword {
        Some(false) => {
            if let Some(fields) = m.as_object_mut() {
                fields.remove("fields");
            }
        }
        Some(true) if !text => ignored.push("keyword"),
        Some(true) if m.get("fields").is_none() => {
            m["fields"] = json!({"keyword": {"type": "keyword", "ignore_above": 256}});
        }
        _ => {}
    }
    if !o.copy_to.is_empty() {
        m["copy_to"] = json!(o.copy_to);
    }
    if let Some(index) = o.index {
        m["index"] = json!(index);
    }
    let why = (!ignored.is_empty()).then(|| {
        format!(
            "{} left out: the field is `{}`, not text; set its type to text",
            ignored.join(", "),
            m["type"].as_str().unwrap_or("?")
        )
    });
    (m, why)
}

/// `properties` for the selected columns (all when `selected` is empty), overrides
/// applied, plus a text field for each `copy_to` target that is not a column. The second
/// value lists the parts of overrides that could not apply, by column.
pub fn properties(
    columns: &[ColumnInfo],
    selected: &[String],
    fields: &BTreeMap<String, FieldOverride>,
) -> (Map<String, Value>, Vec<String>) {
    let mut props = Map::new();
    let mut ignored = Vec::new();
    for c in columns
        .iter()
        .filter(|c| selected.is_empty() || selected.contains(&c.name))
    {
        let (m, why) = column_mapping(&c.sql_type, fields.get(&c.name));
        if let Some(why) = why {
            ignored.push(format!("fields.{}: {why}", c.name));
        }
        props.insert(c.name.clone(), m);
    }
    for target in fields.values().flat_map(|o| &o.copy_to) {
        if !props.contains_key(target) {
            props.insert(target.clone(), json!({"type": "text"}));
        }
    }
    (props, ignored)
}

/// How a live field mapping compares with the wanted one.
#[derive(Debug, PartialEq)]
pub enum Fit {
    Same,
    /// Different only in what the server changes in place (`search_analyzer`, `copy_to`,
    /// `ignore_above`, an added sub-field).
    InPlace,
    /// Only a new index can have it; why.
    Rebuild(String),
}

/// Compares field `name` as the index has it (`live`) with `wanted`.
pub fn fit(name: &str, live: &Value, wanted: &Value) -> Fit {
    // Parameters fixed once the field exists, with the value the server assumes when
    // the mapping leaves them out.
    const FIXED: &[(&str, Option<&str>)] = &[
        ("type", Some("object")),
        ("analyzer", None),
        ("index", Some("true")),
        ("scaling_factor", None),
        ("enabled", Some("true")),
        ("format", None),
        ("relations", None),
    ];
    const UPDATABLE: &[&str] = &["search_analyzer", "copy_to", "ignore_above"];
    for (key, default) in FIXED {
        let (l, w) = (norm(live.get(key)), norm(wanted.get(key)));
        let (l, w) = (
            l.or(default.map(String::from)),
            w.or(default.map(String::from)),
        );
        if l != w {
            return Fit::Rebuild(format!(
                "field `{name}`: {key} is {} in the index, {} wanted",
                l.as_deref().unwrap_or("unset"),
                w.as_deref().unwrap_or("unset")
            ));
        }
    }
    let mut in_place = UPDATABLE
        .iter()
        .any(|key| norm(live.get(key)) != norm(wanted.get(key)));
    let no_fields = Map::new();
    let sub = |v: &Value| v.get("fields").and_then(Value::as_object).cloned();
    let (live_sub, wanted_sub) = (
        sub(live).unwrap_or_else(|| no_fields.clone()),
        sub(wanted).unwrap_or(no_fields),
    );
    for (sub_name, l) in &live_sub {
        match wanted_sub.get(sub_name) {
            None => {
                return Fit::Rebuild(format!(
                    "field `{name}`: its sub-field `{sub_name}` cannot be removed in place"
                ))
            }
            Some(w) => match fit(&format!("{name}.{sub_name}"), l, w) {
                Fit::Same => {}
                Fit::InPlace => in_place = true,
                rebuild => return rebuild,
            },
        }
    }
    in_place |= wanted_sub.keys().any(|k| !live_sub.contains_key(k));
    // An object's (or nested field's) own fields: new ones are added in place; ones the
    // pipeline no longer has stay, unused.
    let props = |v: &Value| v.get("properties").and_then(Value::as_object).cloned();
    let live_props = props(live).unwrap_or_default();
    for (field, w) in props(wanted).unwrap_or_default() {
        match live_props.get(&field) {
            None => in_place = true,
            Some(l) => match fit(&format!("{name}.{field}"), l, &w) {
                Fit::Same => {}
                Fit::InPlace => in_place = true,
                rebuild => return rebuild,
            },
        }
    }
    if in_place {
        Fit::InPlace
    } else {
        Fit::Same
    }
}

/// A pipeline's generated mapping, and the parts of overrides that could not apply.
pub struct TreeMapping {
    pub properties: Map<String, Value>,
    pub ignored: Vec<String>,
}

/// `properties` for a pipeline whose documents are read back from MySQL: the root's
/// columns, each relation an `object` or `nested` field with its own, and in parent-child
/// mode the fields of every kind of document plus the `join` field. The error lists the
/// fields two kinds of document map differently.
pub fn tree_properties(plans: &[DocPlan]) -> Result<TreeMapping, Vec<String>> {
    let mut ignored = Vec::new();
    let mut props = Map::new();
    let mut conflicts = Vec::new();
    for plan in plans {
        for (field, m) in node_properties(&plan.root, "", &mut ignored) {
            match props.get(&field) {
                Some(other) if *other != m => conflicts.push(format!(
                    "field `{field}`: the `{}` documents map it as {m}, another kind as {other}; rename one (columns) or override its type (fields)",
                    plan.name
                )),
                _ => {
                    props.insert(field, m);
                }
            }
        }
    }
    if let Some(field) = plans
        .first()
        .and_then(|p| p.join.as_ref())
        .map(|j| j.field.clone())
    {
        let children: Vec<&str> = plans[1..].iter().map(|p| p.name.as_str()).collect();
        let children = match children.as_slice() {
            [one] => json!(one),
            many => json!(many),
        };
        props.insert(
            field,
            json!({"type": "join", "relations": { plans[0].name.clone(): children }}),
        );
    }
    if conflicts.is_empty() {
        Ok(TreeMapping {
            properties: props,
            ignored,
        })
    } else {
        Err(conflicts)
    }
}

/// A node's columns (overrides applied) and its relations' fields; `prefix` keys what
/// could not apply (`relations.skus.`).
fn node_properties(node: &Node, prefix: &str, ignored: &mut Vec<String>) -> Map<String, Value> {
    let output = node.names(&node.output);
    let (mut props, why) = properties(&node.table.infos, &output, &node.fields);
    ignored.extend(why.into_iter().map(|w| format!("{prefix}{w}")));
    for child in &node.children {
        let inner = node_properties(
            child,
            &format!("{prefix}relations.{}.", child.name),
            ignored,
        );
        let kind = if child.nested { "nested" } else { "object" };
        props.insert(
            child.name.clone(),
            json!({"type": kind, "properties": inner}),
        );
    }
    props
}

/// A mapping parameter's value for comparison: numbers as numbers (`100` = `100.0`),
/// booleans and their string forms alike (`false` = `"false"`), a single `copy_to` like a
/// list of one.
fn norm(v: Option<&Value>) -> Option<String> {
    Some(match v? {
        Value::Number(n) => n.as_f64().map_or_else(|| n.to_string(), |f| f.to_string()),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => a[0].as_str()?.to_owned(),
        other => other.to_string(),
    })
}

/// The body that creates a pipeline's index version. `dynamic: false` keeps fields the
/// mapping does not know (a column added later) in `_source` without guessing a type;
/// the etl adds such columns to the mapping explicitly.
pub fn index_body(properties: Map<String, Value>, settings: &IndexSettings) -> Value {
    let mut s = json!({
        "number_of_shards": settings.shards,
        "number_of_replicas": settings.replicas,
        "index.gc_deletes": settings.tombstone_retention,
    });
    if !settings.refresh_interval.is_empty() {
        s["refresh_interval"] = json!(settings.refresh_interval);
    }
    json!({
        "settings": s,
        "mappings": {
            "dynamic": false,
            "properties": properties,
        }
    })
}

/// A pipeline's index settings.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexSettings {
    pub shards: u32,
    pub replicas: u32,
    pub tombstone_retention: String,
    /// Empty: the server's default.
    pub refresh_interval: String,
}

impl IndexSettings {
    /// Compares with an index's settings as `GET /<index>/_settings` gives them (its
    /// `settings.index` object): the dynamic settings to change in place, or why only a
    /// new index can have them.
    pub fn diff(&self, live: &Value) -> Result<Map<String, Value>, String> {
        let get = |k: &str| {
            live.get(k)
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
        };
        if let Some(shards) = get("number_of_shards") {
            if shards != self.shards.to_string() {
                return Err(format!(
                    "shards: the index has {shards}, the pipeline asks for {}",
                    self.shards
                ));
            }
        }
        let mut change = Map::new();
        if get("number_of_replicas").is_some_and(|r| r != self.replicas.to_string()) {
            change.insert("number_of_replicas".into(), json!(self.replicas));
        }
        if get("gc_deletes").as_deref() != Some(self.tombstone_retention.as_str()) {
            change.insert("index.gc_deletes".into(), json!(self.tombstone_retention));
        }
        if !self.refresh_interval.is_empty()
            && get("refresh_interval").as_deref() != Some(self.refresh_interval.as_str())
        {
            change.insert("refresh_interval".into(), json!(self.refresh_interval));
        }
        Ok(change)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_map_to_fields_that_hold_every_value() {
        assert_eq!(field_mapping("bigint unsigned")["type"], "unsigned_long");
        assert_eq!(field_mapping("int unsigned")["type"], "long");
        assert_eq!(
            field_mapping("decimal(10,2)"),
            json!({"type": "scaled_float", "scaling_factor": 100})
        );
        assert_eq!(field_mapping("decimal(65,30)")["type"], "double");
        assert_eq!(field_mapping("datetime(6)")["type"], "date");
        assert_eq!(
            field_mapping("varchar")["fields"]["keyword"]["type"],
            "keyword"
        );
        assert_eq!(field_mapping("bit(64)")["type"], "unsigned_long");
        assert_eq!(field_mapping("bit(3)")["type"], "long");
        assert_eq!(
            field_mapping("json"),
            json!({"type": "object", "enabled": false})
        );
        assert_eq!(field_mapping("longblob")["type"], "binary");
    }

    fn text_override(f: impl FnOnce(&mut FieldOverride)) -> FieldOverride {
        let mut o = FieldOverride::default();
        f(&mut o);
        o
    }

    #[test]
    fn overrides_apply_over_the_generated_mapping() {
        let o = text_override(|o| {
            o.analyzer = Some("english".into());
            o.search_analyzer = Some("standard".into());
            o.keyword = Some(false);
            o.copy_to = vec!["all_text".into()];
        });
        assert_eq!(
            column_mapping("varchar(64)", Some(&o)),
            (
                json!({"type": "text", "analyzer": "english", "search_analyzer": "standard", "copy_to": ["all_text"]}),
                None
            )
        );
        let o = text_override(|o| {
            o.es_type = Some("keyword".into());
            o.index = Some(false);
        });
        assert_eq!(
            column_mapping("varchar(64)", Some(&o)).0,
            json!({"type": "keyword", "index": false})
        );
        // The generated type when the override names it again: its details stay.
        let o = text_override(|o| o.es_type = Some("scaled_float".into()));
        assert_eq!(
            column_mapping("decimal(10,2)", Some(&o)).0["scaling_factor"],
            100
        );
        // Text-only parts on a number are left out, and said so.
        let o = text_override(|o| o.analyzer = Some("english".into()));
        let (m, why) = column_mapping("int", Some(&o));
        assert_eq!(m, json!({"type": "long"}));
        assert!(why.unwrap().contains("analyzer left out"));
    }

    #[test]
    fn copy_to_targets_become_fields() {
        let columns = vec![
            ColumnInfo {
                name: "id".into(),
                sql_type: "int".into(),
                key: true,
            },
            ColumnInfo {
                name: "title".into(),
                sql_type: "varchar(10)".into(),
                key: false,
            },
        ];
        let fields = BTreeMap::from([(
            "title".to_string(),
            text_override(|o| o.copy_to = vec!["everything".into()]),
        )]);
        let (props, ignored) = properties(&columns, &[], &fields);
        assert_eq!(props["everything"], json!({"type": "text"}));
        assert_eq!(props.len(), 3);
        assert!(ignored.is_empty());
        let (props, _) = properties(&columns, &["title".into()], &BTreeMap::new());
        assert_eq!(props.keys().collect::<Vec<_>>(), ["title"]);
    }

    #[test]
    fn fit_tells_in_place_changes_from_rebuilds() {
        let text = field_mapping("varchar(5)");
        assert_eq!(fit("t", &text, &text), Fit::Same);
        // As the server gives numbers and booleans back.
        assert_eq!(
            fit(
                "p",
                &json!({"type": "scaled_float", "scaling_factor": 100.0, "index": "true"}),
                &json!({"type": "scaled_float", "scaling_factor": 100})
            ),
            Fit::Same
        );
        let Fit::Rebuild(why) = fit("p", &field_mapping("int"), &text) else {
            panic!("a type change needs a rebuild")
        };
        assert_eq!(why, "field `p`: type is long in the index, text wanted");
        let english = {
            let mut m = text.clone();
            m["analyzer"] = json!("english");
            m
        };
        assert!(matches!(fit("t", &text, &english), Fit::Rebuild(_)));
        let mut search = text.clone();
        search["search_analyzer"] = json!("simple");
        assert_eq!(fit("t", &text, &search), Fit::InPlace);
        let mut copied = text.clone();
        copied["copy_to"] = json!("all");
        assert_eq!(fit("t", &text, &copied), Fit::InPlace);
        assert_eq!(
            fit(
                "t",
                &copied,
                &json!({"type": "text", "copy_to": ["all"], "fields": text["fields"]})
            ),
            Fit::Same
        );
        let bare = json!({"type": "text"});
        assert_eq!(
            fit("t", &bare, &text),
            Fit::InPlace,
            "a sub-field is added in place"
        );
        assert!(matches!(fit("t", &text, &bare), Fit::Rebuild(w) if w.contains("`keyword`")));
        let mut hidden = field_mapping("int");
        hidden["index"] = json!(false);
        assert!(matches!(
            fit("n", &field_mapping("int"), &hidden),
            Fit::Rebuild(_)
        ));
    }

    #[test]
    fn settings_change_in_place_except_shards() {
        let wanted = IndexSettings {
            shards: 1,
            replicas: 0,
            tombstone_retention: "7d".into(),
            refresh_interval: "5s".into(),
        };
        let live = json!({"number_of_shards": "1", "number_of_replicas": "1", "gc_deletes": "7d"});
        assert_eq!(
            Value::Object(wanted.diff(&live).unwrap()),
            json!({"number_of_replicas": 0, "refresh_interval": "5s"})
        );
        let same = json!({"number_of_shards": "1", "number_of_replicas": "0", "gc_deletes": "7d", "refresh_interval": "5s"});
        assert!(wanted.diff(&same).unwrap().is_empty());
        let three = json!({"number_of_shards": "3"});
        assert_eq!(
            wanted.diff(&three).unwrap_err(),
            "shards: the index has 3, the pipeline asks for 1"
        );
    }
}
