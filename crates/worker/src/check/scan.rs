//! A check's read of the index: the documents in a chunk's key range, in key order
//! (`search_after` on the root's key fields).

use std::collections::BTreeMap;

use serde_json::{json, Value as Json};
use sluice_elastic::Hit;
use sluice_mysql::Key;

use super::{Checks, Ctx, BATCH};
use crate::error::{Result, WorkerError};

/// The documents of `index` in the chunk's key range, by `_id` (`search_after` in key
/// order).
pub(super) async fn scan(
    c: &Checks,
    ctx: &Ctx<'_>,
    index: &str,
    lower: Option<&Key>,
    upper: Option<&Key>,
) -> Result<BTreeMap<String, Hit>> {
    let sort = sort_fields(c, ctx, index).await?;
    let query = range_query(ctx, &sort, lower, upper)?;
    let mut found = BTreeMap::new();
    let mut search_after: Option<Vec<Json>> = None;
    loop {
        let mut body = json!({
            "size": BATCH,
            "version": true,
            "query": query,
            "sort": sort.iter().map(|f| json!({ f: "asc" })).collect::<Vec<_>>(),
        });
        if let Some(a) = &search_after {
            body["search_after"] = json!(a);
        }
        let hits = c.es.search_hits(index, &body).await?;
        let full = hits.len() == BATCH;
        search_after = hits.last().map(|h| h.sort.clone());
        for hit in hits {
            found.insert(hit.id.clone(), hit);
        }
        if !full {
            return Ok(found);
        }
    }
}

/// The fields of `index` holding the root's primary key, as sortable fields (a text
/// field's `keyword` sub-field).
async fn sort_fields(c: &Checks, ctx: &Ctx<'_>, index: &str) -> Result<Vec<String>> {
    let mapping = c.es.get_mapping(index).await?;
    let props = mapping
        .as_object()
        .and_then(|m| m.values().next())
        .and_then(|m| m.pointer("/mappings/properties"))
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for name in key_fields(ctx)? {
        let field = &props[&name];
        let sortable = match field["type"].as_str() {
            Some("text") if field.pointer("/fields/keyword").is_some() => format!("{name}.keyword"),
            Some("text") | None => return Err(WorkerError::definite(format!(
                "key column `{name}` is not a sortable field of {} (a text field without a keyword sub-field, or not mapped): a check reads the index in key order",
                index
            ))),
            Some(_) => name,
        };
        out.push(sortable);
    }
    Ok(out)
}

/// The root's primary-key columns, which must be document fields.
fn key_fields(ctx: &Ctx<'_>) -> Result<Vec<String>> {
    let root = &ctx.plan.root;
    let output = root.names(&root.output);
    let keys = root.table.key_names();
    if let Some(k) = keys.iter().find(|k| !output.contains(k)) {
        return Err(WorkerError::definite(format!(
            "the documents lack key column `{k}` of {}.{}: a check reads the index in key order (add it to `columns`)",
            root.table.db, root.table.table
        )));
    }
    Ok(keys)
}

/// The documents of this kind whose key (in `fields`, as [`sort_fields`] names them) is
/// in `(lower, upper]`, compared in key order (a composite key lexicographically).
fn range_query(
    ctx: &Ctx<'_>,
    fields: &[String],
    lower: Option<&Key>,
    upper: Option<&Key>,
) -> Result<Json> {
    let values = |k: &Key| -> Result<Vec<Json>> {
        k.0.iter()
            .map(|part| {
                part.to_json().ok_or_else(|| {
                    WorkerError::definite(
                        "a check reads keys of numbers and strings only (this key has another type)"
                    )
                })
            })
            .collect()
    };
    let mut must = Vec::new();
    if let Some(k) = lower {
        must.push(lexicographic(fields, &values(k)?, "gt"));
    }
    if let Some(k) = upper {
        must.push(lexicographic(fields, &values(k)?, "lte"));
    }
    if let Some(join) = &ctx.plan.join {
        must.push(json!({ "term": { join.field.clone(): ctx.plan.name.clone() } }));
    }
    Ok(json!({ "bool": { "filter": must } }))
}

/// `(f0, f1, …) <op> (v0, v1, …)` for `op` `gt` or `lte`: for each `i`, the fields before
/// `i` equal and field `i` strictly beyond; `lte` also the whole tuple equal.
fn lexicographic(fields: &[String], values: &[Json], op: &str) -> Json {
    let strict = if op == "gt" { "gt" } else { "lt" };
    let mut any = Vec::new();
    for i in 0..fields.len() {
        let mut all: Vec<Json> = (0..i)
            .map(|j| json!({ "term": { fields[j].clone(): values[j] } }))
            .collect();
        all.push(json!({ "range": { fields[i].clone(): { strict: values[i] } } }));
        any.push(json!({ "bool": { "filter": all } }));
    }
    if op == "lte" {
        let all: Vec<Json> = fields
            .iter()
            .zip(values)
            .map(|(f, v)| json!({ "term": { f.clone(): v } }))
            .collect();
        any.push(json!({ "bool": { "filter": all } }));
    }
    json!({ "bool": { "should": any, "minimum_should_match": 1 } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composite_ranges_compare_lexicographically() {
        let q = lexicographic(&["a".into(), "b".into()], &[json!(1), json!("x")], "lte");
        let any = q["bool"]["should"].as_array().unwrap();
        assert_eq!(any.len(), 3, "a < 1, a = 1 and b < x, or both equal");
        assert_eq!(any[1]["bool"]["filter"][0], json!({"term": {"a": 1}}));
        assert_eq!(
            any[1]["bool"]["filter"][1],
            json!({"range": {"b": {"lt": "x"}}})
        );
    }
}
