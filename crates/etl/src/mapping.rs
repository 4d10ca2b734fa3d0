//! Elasticsearch mappings generated from the MySQL column types the change events carry.

use serde_json::{json, Map, Value};
use sluice_core::ColumnInfo;

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

/// `properties` for the selected columns (all when `selected` is empty).
pub fn properties(columns: &[ColumnInfo], selected: &[String]) -> Map<String, Value> {
    columns
        .iter()
        .filter(|c| selected.is_empty() || selected.contains(&c.name))
        .map(|c| (c.name.clone(), field_mapping(&c.sql_type)))
        .collect()
}

/// The body that creates a pipeline's index version. `dynamic: false` keeps fields the
/// mapping does not know (a column added later) in `_source` without guessing a type;
/// the etl adds such columns to the mapping explicitly.
pub fn index_body(
    properties: Map<String, Value>,
    shards: u32,
    replicas: u32,
    tombstone_retention: &str,
) -> Value {
    json!({
        "settings": {
            "number_of_shards": shards,
            "number_of_replicas": replicas,
            "index.gc_deletes": tombstone_retention,
        },
        "mappings": {
            "dynamic": false,
            "properties": properties,
        }
    })
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
}
