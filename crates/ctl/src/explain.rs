//! `sluicectl pipelines explain`: why a document looks the way it does.

use serde_json::{json, Value};
use sluice_proto::v1::Explanation;

use crate::Output;

pub fn print(out: Output, e: &Explanation) {
    if out == Output::Json {
        let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap_or(Value::Null);
        let v = json!({
            "pipeline": e.pipeline, "id": e.id, "index": e.index, "indexed": e.indexed,
            "version": e.version, "version_epoch": e.version_epoch, "position": e.position,
            "document": parse(&e.document), "in_mysql": e.in_mysql, "built": parse(&e.built),
            "rows": e.rows.iter().map(|t| json!({
                "node": t.node, "table": t.table,
                "rows": t.rows.iter().map(|r| parse(r)).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "equal": e.equal,
            "differences": e.differences.iter().map(|d| json!({
                "field": d.field, "index": parse(&d.index), "mysql": parse(&d.mysql),
            })).collect::<Vec<_>>(),
            "read_at": e.read_at, "newer_than_read": e.newer_than_read,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return;
    }
    println!("document {} of {} in {}", e.id, e.pipeline, e.index);
    if e.indexed {
        println!(
            "  version {} (epoch {}, binlog {})",
            e.version, e.version_epoch, e.position
        );
        println!("  indexed: {}", e.document);
    } else {
        println!("  not in the index");
    }
    if e.in_mysql {
        println!("  MySQL now: {}", e.built);
    } else {
        println!("  MySQL yields no document for it now");
    }
    println!("  read at {}", e.read_at);
    for t in &e.rows {
        let node = if t.node.is_empty() { "root" } else { &t.node };
        println!("  {node} ({}): {} rows", t.table, t.rows.len());
        for r in &t.rows {
            println!("    {r}");
        }
    }
    if e.newer_than_read {
        println!("  the indexed copy was written for a change after the read: explain it again");
    } else if e.equal {
        println!("  the index equals what MySQL yields");
    } else {
        println!("  differs from what MySQL yields:");
        for d in &e.differences {
            println!(
                "    {}: index {} / MySQL {}",
                d.field,
                or_absent(&d.index),
                or_absent(&d.mysql)
            );
        }
    }
}

fn or_absent(v: &str) -> &str {
    if v.is_empty() {
        "(absent)"
    } else {
        v
    }
}
