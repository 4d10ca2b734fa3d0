//! A pipeline's tree compiled against its tables' columns: one [`DocPlan`] per kind of
//! document, every problem of the spec against the tables named by its key.

use std::collections::BTreeMap;

use sluice_model::pipeline::filter;
use sluice_model::pipeline::SHARD_COLUMN;
use sluice_model::{FieldOverride, PipelineSpec, Relation, RelationKind};

use super::{DocPlan, JoinTag, Link, Node, Tables};
use crate::snapshot::SnapshotTable;

/// Compiles `spec` against `tables`; every problem names its key.
pub fn compile(spec: &PipelineSpec, tables: &Tables) -> Result<Vec<DocPlan>, Vec<String>> {
    let mut problems = Vec::new();
    let table_of = |db: &str, t: &str, key: &str, problems: &mut Vec<String>| {
        let found = tables.get(&(db.to_owned(), t.to_owned()));
        if found.is_none() {
            problems.push(format!("{key}: `{db}.{t}` does not exist"));
        }
        found
    };
    let Some(root_table) = table_of(&spec.database, &spec.table, "table", &mut problems) else {
        return Err(problems);
    };
    let join_field = spec.join.as_ref().map(|j| j.field.clone());
    let (root_plan, id_names) =
        root_plan(spec, root_table, join_field.clone(), tables, &mut problems);
    let mut plans = Vec::new();
    plans.extend(root_plan);
    for r in spec
        .relations
        .iter()
        .filter(|r| r.kind == RelationKind::Child)
    {
        let key = format!("relations.{}", r.name);
        if let Some(plan) = child_plan(
            spec,
            r,
            &key,
            &id_names,
            join_field.clone(),
            tables,
            &mut problems,
        ) {
            plans.push(plan);
        }
    }
    if problems.is_empty() {
        Ok(plans)
    } else {
        Err(problems)
    }
}

/// The root documents' plan (without `child` relations) and the root's id column names.
fn root_plan(
    spec: &PipelineSpec,
    root_table: &SnapshotTable,
    join_field: Option<String>,
    tables: &Tables,
    problems: &mut Vec<String>,
) -> (Option<DocPlan>, Vec<String>) {
    let root_relations: Vec<&Relation> = spec
        .relations
        .iter()
        .filter(|r| r.kind != RelationKind::Child)
        .collect();
    let root = node(
        spec,
        NodeSpec {
            key: "",
            name: &spec.table,
            table: root_table,
            filter: &spec.filter,
            columns: &spec.columns,
            fields: &spec.fields,
            order_by: &[],
            relations: &root_relations,
        },
        None,
        tables,
        problems,
    );
    let id_names = if spec.id.is_empty() {
        root_table.key_names()
    } else {
        spec.id.clone()
    };
    let id = columns_of(root_table, &id_names, "id", problems);
    if spec.sharded && !id_names.iter().any(|c| c == SHARD_COLUMN) {
        for c in id_names.iter().filter(|c| root_table.counts(c)) {
            problems.push(format!(
                "id: `{c}` is AUTO_INCREMENT, so each shard counts its own rows and documents of different shards would collide: name a column unique across every shard, or add `{SHARD_COLUMN}` to the id"
            ));
        }
    }
    if id_names.is_empty() {
        problems.push(format!(
            "id: `{}.{}` has no primary key: name the columns that identify a document",
            spec.database, spec.table
        ));
    }
    let plan = root.map(|root| {
        let mut wanted = id.clone();
        wanted.extend(&root_table.key);
        DocPlan::new(
            spec.join
                .as_ref()
                .map_or_else(|| spec.table.clone(), |j| j.parent.clone()),
            with_selected(root, &wanted),
            id,
            join_field.map(|field| JoinTag {
                field,
                parent: None,
            }),
        )
    });
    (plan, id_names)
}

fn child_plan(
    spec: &PipelineSpec,
    r: &Relation,
    key: &str,
    parent_id: &[String],
    join_field: Option<String>,
    tables: &Tables,
    problems: &mut Vec<String>,
) -> Option<DocPlan> {
    let db = spec.database_of(r);
    let table = tables.get(&(db.to_owned(), r.table.clone()));
    let Some(table) = table else {
        problems.push(format!("{key}.table: `{db}.{}` does not exist", r.table));
        return None;
    };
    let keys: Vec<&String> = r.on.keys().collect();
    let mut sorted_id: Vec<&String> = parent_id.iter().collect();
    sorted_id.sort();
    if keys != sorted_id {
        problems.push(format!(
            "{key}.on: a child joins the root's id columns ({}), so each child knows its parent's _id",
            parent_id.join(", ")
        ));
        return None;
    }
    let routing_names: Vec<String> = parent_id.iter().map(|c| r.on[c].clone()).collect();
    let routing = columns_of(table, &routing_names, &format!("{key}.on"), problems);
    let id_names = table.key_names();
    if id_names.is_empty() {
        problems.push(format!(
            "{key}.table: `{db}.{}` has no primary key: child documents take their _id from it",
            r.table
        ));
    }
    let id = columns_of(table, &id_names, &format!("{key}.table"), problems);
    let relations: Vec<&Relation> = r.relations.iter().collect();
    let root = node(
        spec,
        NodeSpec {
            key,
            name: &r.name,
            table,
            filter: &r.filter,
            columns: &r.columns,
            fields: &r.fields,
            order_by: &[],
            relations: &relations,
        },
        None,
        tables,
        problems,
    )?;
    let mut wanted = id.clone();
    wanted.extend(&routing);
    wanted.extend(&table.key);
    Some(DocPlan::new(
        r.name.clone(),
        with_selected(root, &wanted),
        id,
        join_field.map(|field| JoinTag {
            field,
            parent: Some(routing),
        }),
    ))
}

/// What a node is made of, from the root or a relation.
struct NodeSpec<'a> {
    /// Key prefix for problems (`""` for the root, `relations.skus` below).
    key: &'a str,
    name: &'a str,
    table: &'a SnapshotTable,
    filter: &'a str,
    columns: &'a [String],
    fields: &'a BTreeMap<String, FieldOverride>,
    order_by: &'a [String],
    relations: &'a [&'a Relation],
}

/// Compiles one node of the tree and the nodes below it (`link`: `None` for a root).
fn node(
    spec: &PipelineSpec,
    n: NodeSpec<'_>,
    link: Option<(&Relation, &SnapshotTable)>,
    tables: &Tables,
    problems: &mut Vec<String>,
) -> Option<Node> {
    let t = n.table;
    let output = output_of(&n, problems);
    check_fields(&n, problems);
    // The filter's own problems are the spec's; here, only whether its columns exist.
    if let Ok(names) = filter::check(n.filter) {
        columns_of(t, &names, &sub_key(n.key, "filter"), problems);
    }
    let link = link.map(|(r, parent)| link_of(r, parent, &n, problems));
    let order = order_of(&n, problems);
    let children = children_of(spec, &n, &output, tables, problems);
    let mut select = output.clone();
    if let Some(l) = &link {
        select.extend(&l.child);
    }
    for c in &children {
        if let Some(l) = &c.link {
            select.extend(&l.parent);
        }
    }
    select.sort_unstable();
    select.dedup();
    Some(Node {
        name: n.name.to_owned(),
        table: t.clone(),
        link,
        select,
        output,
        filter: (!n.filter.is_empty()).then(|| n.filter.to_owned()),
        order,
        limit: None,
        distinct: false,
        nested: false,
        delayed: false,
        fields: n.fields.clone(),
        children,
    })
}

/// The spec key `k` under a node's key prefix `prefix` (`""` for the root).
fn sub_key(prefix: &str, k: &str) -> String {
    if prefix.is_empty() {
        k.to_owned()
    } else {
        format!("{prefix}.{k}")
    }
}

/// The columns a node puts into the document (all when it names none), in table order.
fn output_of(n: &NodeSpec<'_>, problems: &mut Vec<String>) -> Vec<usize> {
    let t = n.table;
    if n.columns.is_empty() {
        (0..t.stored_columns()).collect()
    } else {
        let mut cols = columns_of(t, n.columns, &sub_key(n.key, "columns"), problems);
        cols.sort_unstable();
        cols
    }
}

/// That every field override of a node names a column of its table.
fn check_fields(n: &NodeSpec<'_>, problems: &mut Vec<String>) {
    let t = n.table;
    for column in n.fields.keys() {
        if t.column(column).is_none() {
            problems.push(format!(
                "{}: `{column}` is not a column of `{}.{}`",
                sub_key(n.key, &format!("fields.{column}")),
                t.db,
                t.table
            ));
        }
    }
}

/// How relation `r`'s node joins its parent's table `parent`.
fn link_of(
    r: &Relation,
    parent: &SnapshotTable,
    n: &NodeSpec<'_>,
    problems: &mut Vec<String>,
) -> Link {
    let (parents, children): (Vec<String>, Vec<String>) =
        r.on.iter().map(|(p, c)| (p.clone(), c.clone())).unzip();
    Link {
        kind: r.kind,
        parent: columns_of(parent, &parents, &sub_key(n.key, "on"), problems),
        child: columns_of(n.table, &children, &sub_key(n.key, "on"), problems),
    }
}

/// A node's `order_by` as `(column, descending)`, skipping keys that do not parse.
fn order_of(n: &NodeSpec<'_>, problems: &mut Vec<String>) -> Vec<(usize, bool)> {
    let t = n.table;
    let mut order = Vec::new();
    for o in n
        .order_by
        .iter()
        .filter_map(|o| sluice_model::pipeline::OrderKey::parse(o).ok())
    {
        match t.column(&o.column) {
            Some(c) => order.push((c, o.descending)),
            None => problems.push(format!(
                "{}: `{}` is not a column of `{}.{}`",
                sub_key(n.key, "order_by"),
                o.column,
                t.db,
                t.table
            )),
        }
    }
    order
}

/// The nodes of a node's relations, none named like one of its `output` columns.
fn children_of(
    spec: &PipelineSpec,
    n: &NodeSpec<'_>,
    output: &[usize],
    tables: &Tables,
    problems: &mut Vec<String>,
) -> Vec<Node> {
    let t = n.table;
    let mut children = Vec::new();
    for r in n.relations {
        let rkey = sub_key(n.key, &format!("relations.{}", r.name));
        if output.iter().any(|&c| t.columns[c].name == r.name) {
            problems.push(format!(
                "{rkey}: the parent's column `{}` has this name; rename the relation",
                r.name
            ));
        }
        if let Some(child) = child_node(spec, r, &rkey, t, tables, problems) {
            children.push(child);
        }
    }
    children
}

/// The node of relation `r` below a node of table `parent`, with the relation's settings.
fn child_node(
    spec: &PipelineSpec,
    r: &Relation,
    rkey: &str,
    parent: &SnapshotTable,
    tables: &Tables,
    problems: &mut Vec<String>,
) -> Option<Node> {
    let db = spec.database_of(r);
    let Some(child_table) = tables.get(&(db.to_owned(), r.table.clone())) else {
        problems.push(format!("{rkey}.table: `{db}.{}` does not exist", r.table));
        return None;
    };
    let below: Vec<&Relation> = r.relations.iter().collect();
    let child = node(
        spec,
        NodeSpec {
            key: rkey,
            name: &r.name,
            table: child_table,
            filter: &r.filter,
            columns: &r.columns,
            fields: &r.fields,
            order_by: &r.order_by,
            relations: &below,
        },
        Some((r, parent)),
        tables,
        problems,
    );
    let mut child = child?;
    child.limit = r.limit;
    child.distinct = r.distinct;
    child.nested = r.is_nested();
    child.delayed = r.delayed;
    if r.distinct {
        for &(c, _) in &child.order {
            if !child.output.contains(&c) {
                problems.push(format!(
                    "{rkey}.order_by: `{}` must be among the columns of a distinct relation",
                    t_name(child_table, c)
                ));
            }
        }
    }
    Some(child)
}

fn t_name(t: &SnapshotTable, c: usize) -> &str {
    &t.columns[c].name
}

/// `node` with `cols` selected too.
fn with_selected(mut node: Node, cols: &[usize]) -> Node {
    node.select.extend(cols);
    node.select.sort_unstable();
    node.select.dedup();
    node
}

/// The indexes of `names` in `t`; each missing one is a problem under `key`.
fn columns_of(
    t: &SnapshotTable,
    names: &[String],
    key: &str,
    problems: &mut Vec<String>,
) -> Vec<usize> {
    names
        .iter()
        .filter_map(|name| {
            let c = t.column(name);
            if c.is_none() {
                problems.push(format!(
                    "{key}: `{name}` is not a column of `{}.{}`",
                    t.db, t.table
                ));
            }
            c
        })
        .collect()
}
