//! The statements a document read runs, as text with `?` placeholders. Lists of keys are
//! padded to a few fixed lengths (repeating the last key, which changes nothing), so a
//! connection prepares a handful of statements however the batch sizes vary.

use sluice_model::pipeline::{shard::shard_name, SHARD_COLUMN};

use super::Node;
use crate::snapshot::quote;

/// Most key tuples in one `IN` list.
pub const MAX_IN: usize = 512;

/// The padded length of a list of `n` keys (`n <= MAX_IN`).
pub fn padded(n: usize) -> usize {
    n.next_power_of_two().clamp(8, MAX_IN)
}

fn list(node: &Node, cols: &[usize]) -> String {
    node.names(cols)
        .iter()
        .map(|c| quote(c))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `cols IN (…)` for `n` keys: `a IN (?, ?)` or `(a, b) IN ((?, ?), (?, ?))`.
pub fn in_list(node: &Node, cols: &[usize], n: usize) -> String {
    let one = if cols.len() == 1 {
        "?".to_owned()
    } else {
        format!("({})", vec!["?"; cols.len()].join(", "))
    };
    let tuples = vec![one.as_str(); n].join(", ");
    if cols.len() == 1 {
        format!("{} IN ({tuples})", list(node, cols))
    } else {
        format!("({}) IN ({tuples})", list(node, cols))
    }
}

/// The table a node reads; for a sharded one, every shard's rows with each one's
/// `_shard` (conditions on it are pushed into each shard's part by MySQL 8.0.29+ and
/// MariaDB alike).
fn from(node: &Node) -> String {
    let t = &node.table;
    let Some(shards) = &t.shards else {
        return format!("{}.{}", quote(&t.db), quote(&t.table));
    };
    let stored: Vec<usize> = (0..t.stored_columns()).collect();
    let cols = list(node, &stored);
    let parts: Vec<String> = shards
        .iter()
        .map(|(db, table)| {
            format!(
                "SELECT {cols}, {} AS {} FROM {}.{}",
                literal(&shard_name(db, table)),
                quote(SHARD_COLUMN),
                quote(db),
                quote(table)
            )
        })
        .collect();
    format!("({}) AS `__sluice_shards`", parts.join(" UNION ALL "))
}

/// `s` as an SQL string literal.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

fn and_filter(node: &Node) -> String {
    node.filter
        .as_ref()
        .map(|f| format!(" AND ({f})"))
        .unwrap_or_default()
}

/// A document root's rows by `cols` (its id, or a column to walk up by), filtered unless
/// `unfiltered` (a walk up must find rows the filter hides too).
pub fn rows_by(
    node: &Node,
    select: &[usize],
    cols: &[usize],
    n: usize,
    unfiltered: bool,
) -> String {
    format!(
        "SELECT {} FROM {} WHERE {}{}",
        list(node, select),
        from(node),
        in_list(node, cols, n),
        if unfiltered {
            String::new()
        } else {
            and_filter(node)
        }
    )
}

/// A document root's rows with primary keys in `(after, upto]` (either end open), in key
/// order, at most `limit`.
pub fn root_range(node: &Node, after: bool, upto: bool, limit: usize) -> String {
    let key = list(node, &node.table.key);
    let marks = vec!["?"; node.table.key.len()].join(", ");
    let mut conditions = Vec::new();
    if after {
        conditions.push(format!("({key}) > ({marks})"));
    }
    if upto {
        conditions.push(format!("({key}) <= ({marks})"));
    }
    if let Some(f) = &node.filter {
        conditions.push(format!("({f})"));
    }
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    format!(
        "SELECT {} FROM {}{filter} ORDER BY {key} LIMIT {limit}",
        list(node, &node.select),
        from(node)
    )
}

/// A relation's rows for `n` parent keys: filtered, in `order_by` order with ties broken
/// by the primary key (by every selected column when distinct or keyless), and with a
/// limit, the first rows of each parent only (`ROW_NUMBER()` per parent: MySQL 8.0+,
/// MariaDB 10.2+).
pub fn children(node: &Node, n: usize) -> String {
    let link = node.link.as_ref().expect("a relation has a link");
    let select = list(node, &node.select);
    let tie: &[usize] = if node.distinct || node.table.key.is_empty() {
        &node.select
    } else {
        &node.table.key
    };
    let mut order: Vec<String> = node
        .order
        .iter()
        .map(|&(c, desc)| {
            let col = quote(&node.table.columns[c].name);
            if desc {
                format!("{col} DESC")
            } else {
                col
            }
        })
        .collect();
    order.extend(node.names(tie).iter().map(|c| quote(c)));
    let order = order.join(", ");
    let distinct = if node.distinct { "DISTINCT " } else { "" };
    let rows = format!(
        "SELECT {distinct}{select} FROM {} WHERE {}{}",
        from(node),
        in_list(node, &link.child, n),
        and_filter(node)
    );
    match node.limit {
        None => format!("{rows} ORDER BY {order}"),
        Some(limit) => {
            let partition = list(node, &link.child);
            let source = if node.distinct {
                format!("SELECT {select}, ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY {order}) AS `__sluice_n` FROM ({rows}) AS `d`")
            } else {
                format!("SELECT {select}, ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY {order}) AS `__sluice_n` FROM {} WHERE {}{}",
                    from(node), in_list(node, &link.child, n), and_filter(node))
            };
            format!("SELECT {select} FROM ({source}) AS `ranked` WHERE `__sluice_n` <= {limit} ORDER BY `__sluice_n`")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::docs::compile;
    use crate::docs::tests::{shop_spec, shop_tables};

    #[test]
    fn statements_for_the_shop_tree() {
        let plans = compile(&shop_spec(), &shop_tables()).unwrap();
        let root = &plans[0].root;
        assert_eq!(
            rows_by(root, &root.select, &plans[0].id, 2, false),
            "SELECT `id`, `title`, `brand_id` FROM `shop`.`products` WHERE `id` IN (?, ?) AND (deleted = 0)"
        );
        assert_eq!(
            rows_by(root, &[0], &[2], 1, true),
            "SELECT `id` FROM `shop`.`products` WHERE `brand_id` IN (?)"
        );
        assert_eq!(
            root_range(root, true, false, 500),
            "SELECT `id`, `title`, `brand_id` FROM `shop`.`products` WHERE (`id`) > (?) AND (deleted = 0) ORDER BY `id` LIMIT 500"
        );
        assert_eq!(
            children(&root.children[1].children[0], 2),
            "SELECT `id`, `sku_id`, `price` FROM `shop`.`sku_prices` WHERE `sku_id` IN (?, ?) ORDER BY `id`"
        );
        assert_eq!(
            children(&root.children[2], 1),
            "SELECT `product_id`, `tag`, `created_at` FROM (SELECT `product_id`, `tag`, `created_at`, \
             ROW_NUMBER() OVER (PARTITION BY `product_id` ORDER BY `created_at` DESC, `product_id`, `tag`) AS `__sluice_n` \
             FROM `shop`.`product_tags` WHERE `product_id` IN (?)) AS `ranked` WHERE `__sluice_n` <= 5 ORDER BY `__sluice_n`"
        );
    }

    #[test]
    fn a_sharded_root_reads_every_shard_by_id_and_a_build_one_shard_by_its_key() {
        use crate::docs::tests::table;
        let cols = [("id", "int"), ("order_no", "bigint"), ("total", "int")];
        let shards = ["db_0", "db_1"]
            .into_iter()
            .map(|db| table(db, "orders_0", &cols, &["id"]))
            .collect();
        let sharded =
            crate::snapshot::SnapshotTable::sharded(r"db_\d+", r"orders_\d+", shards).unwrap();
        let mut spec = sluice_model::PipelineSpec::table("orders", "s", r"db_\d+", r"orders_\d+");
        spec.sharded = true;
        spec.id = vec!["order_no".into()];
        let tables =
            crate::docs::Tables::from([((spec.database.clone(), spec.table.clone()), sharded)]);
        let plan = &compile(&spec, &tables).unwrap()[0];
        let root = &plan.root;
        assert_eq!(
            root.names(&root.output),
            ["id", "order_no", "total"],
            "the shard column is not a field"
        );
        assert_eq!(
            root.names(&root.table.key),
            ["id", "_shard"],
            "ids of two shards may be equal"
        );
        let shards = "(SELECT `id`, `order_no`, `total`, 'db_0.orders_0' AS `_shard` FROM `db_0`.`orders_0` \
             UNION ALL SELECT `id`, `order_no`, `total`, 'db_1.orders_0' AS `_shard` FROM `db_1`.`orders_0`) AS `__sluice_shards`";
        assert_eq!(
            rows_by(root, &root.select, &plan.id, 1, false),
            format!(
                "SELECT `id`, `order_no`, `total`, `_shard` FROM {shards} WHERE `order_no` IN (?)"
            )
        );
        assert_eq!(plan.paths_of("db_1", "orders_0"), [Vec::<usize>::new()]);
        assert_eq!(
            plan.paths_of("db_2", "orders_0"),
            [Vec::<usize>::new()],
            "a shard the plan does not know (dropped since, or new) is the root's too"
        );
        assert!(plan.paths_of("db_2", "orders_x").is_empty());
        let one = plan.for_shard("db_1", "orders_0").unwrap();
        assert_eq!(
            root_range(&one.root, true, false, 10),
            "SELECT `id`, `order_no`, `total`, `_shard` FROM (SELECT `id`, `order_no`, `total`, 'db_1.orders_0' AS `_shard` \
             FROM `db_1`.`orders_0`) AS `__sluice_shards` WHERE (`id`) > (?) ORDER BY `id` LIMIT 10"
        );
        assert!(plan.for_shard("db_9", "orders_0").is_none());

        let mut counted = table("db_0", "orders_0", &cols, &["id"]);
        counted.columns[1].auto_increment = true;
        let sharded =
            crate::snapshot::SnapshotTable::sharded(r"db_\d+", r"orders_\d+", vec![counted])
                .unwrap();
        let tables =
            crate::docs::Tables::from([((spec.database.clone(), spec.table.clone()), sharded)]);
        let problems = compile(&spec, &tables).unwrap_err();
        assert!(
            problems[0].starts_with("id: `order_no` is AUTO_INCREMENT"),
            "{problems:?}"
        );
        spec.id = vec!["_shard".into(), "order_no".into()];
        assert!(
            compile(&spec, &tables).is_ok(),
            "the shard in the id: no collision"
        );

        // A column added shard by shard is read once every shard has it.
        let unlike = vec![
            table("db_0", "orders_0", &cols, &["id"]),
            table("db_1", "orders_0", &cols[..2], &["id"]),
        ];
        let t = crate::snapshot::SnapshotTable::sharded("d", "t", unlike).unwrap();
        assert_eq!(
            t.infos.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["id", "order_no"]
        );
        assert_eq!(
            t.sources()[0].1.len(),
            3,
            "each shard's own columns, as its events carry them"
        );
        assert_eq!(t.key_names(), ["id", "_shard"]);
        let rekeyed = vec![
            table("db_0", "orders_0", &cols, &["id"]),
            table("db_1", "orders_0", &cols, &["order_no"]),
        ];
        let why = crate::snapshot::SnapshotTable::sharded("d", "t", rekeyed).unwrap_err();
        assert!(
            why.starts_with("the shards' primary keys differ: `db_0.orders_0` has (id)"),
            "{why}"
        );
    }

    #[test]
    fn distinct_and_composite_keys() {
        let mut spec = shop_spec();
        spec.relations[2].distinct = true;
        spec.relations[2].limit = None;
        spec.relations[2].order_by.clear();
        spec.relations[2].columns = vec!["tag".into()];
        let plans = compile(&spec, &shop_tables()).unwrap();
        let tags = &plans[0].root.children[2];
        assert_eq!(
            children(tags, 1),
            "SELECT DISTINCT `product_id`, `tag` FROM `shop`.`product_tags` WHERE `product_id` IN (?) ORDER BY `product_id`, `tag`"
        );
        assert_eq!(
            in_list(tags, &tags.table.key, 2),
            "(`product_id`, `tag`) IN ((?, ?), (?, ?))"
        );
        assert_eq!((padded(1), padded(9), padded(600)), (8, 16, MAX_IN));
    }
}
