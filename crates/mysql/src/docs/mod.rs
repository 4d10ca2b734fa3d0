//! Documents from several tables: a pipeline's tree compiled against its tables' columns
//! ([`compile`]), documents read back for a batch of keys with one query per relation
//! ([`DocPlan::read`]), and the walk from a changed row up to the documents that contain
//! it ([`DocPlan::roots_of`]). Knows nothing of Kafka or Elasticsearch.
//!
//! A pipeline compiles to one [`DocPlan`] per kind of document: the root's, and in
//! parent-child mode one per `child` relation (each child row a document of its own,
//! routed to its parent's shard). Values are decoded exactly as the binlog decoder and
//! the snapshot reader decode them, so a document read back equals one built from events.

mod compile;
mod read;
mod sql;

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value as Json};
use sluice_model::pipeline::{TableMatcher, TablePattern, SHARD_COLUMN};
use sluice_model::{FieldOverride, PipelineSpec, RelationKind};

pub use compile::compile;
pub use read::{Built, Floor, RangeRead, Reader, TracedRows};

use mysql_async::Conn;

use crate::error::MysqlError;
use crate::snapshot::SnapshotTable;
use crate::source::SourceConfig;

/// Tables as described by `information_schema`, by `(database, table)`.
pub type Tables = HashMap<(String, String), SnapshotTable>;

/// One kind of document of a pipeline.
#[derive(Debug, Clone)]
pub struct DocPlan {
    /// The root's name in the join field (parent-child mode), else the root table's name.
    pub name: String,
    pub root: Node,
    /// The root columns whose values make a document's `_id`, in order.
    pub id: Vec<usize>,
    /// Parent-child mode: the join field, and for a child kind the root columns that hold
    /// its parent's `_id` values (in the parent's id order): its routing.
    pub join: Option<JoinTag>,
    /// By database and table, the paths of the nodes reading it (every change event asks).
    paths: HashMap<String, HashMap<String, Vec<Vec<usize>>>>,
    /// The sharded nodes' patterns with their paths: a change of a shard the plan was
    /// not compiled with (dropped since, or not described yet) is theirs too.
    shard_paths: Vec<(TableMatcher, Vec<usize>)>,
}

#[derive(Debug, Clone)]
pub struct JoinTag {
    pub field: String,
    /// `Some` for child documents.
    pub parent: Option<Vec<usize>>,
}

/// A table in the tree: which of its rows, which columns, and its relations below.
#[derive(Debug, Clone)]
pub struct Node {
    /// The document field (the root: its table's name).
    pub name: String,
    pub table: SnapshotTable,
    /// How it joins its parent (`None` for a document's root).
    pub link: Option<Link>,
    /// Columns read (indexes into the table's columns), in table order.
    pub select: Vec<usize>,
    /// Columns put into the document (a subset of `select`), in table order.
    pub output: Vec<usize>,
    pub filter: Option<String>,
    /// `(column, descending)`.
    pub order: Vec<(usize, bool)>,
    pub limit: Option<u32>,
    pub distinct: bool,
    pub nested: bool,
    /// Its changes wait for the delayed job instead of rebuilding documents at once.
    pub delayed: bool,
    pub fields: BTreeMap<String, FieldOverride>,
    pub children: Vec<Node>,
}

/// A relation's join: `parent.parent[i] = this.child[i]`.
#[derive(Debug, Clone)]
pub struct Link {
    pub kind: RelationKind,
    /// Columns of the parent's table.
    pub parent: Vec<usize>,
    /// Columns of this table.
    pub child: Vec<usize>,
}

impl Node {
    /// The column names of `cols` (indexes into this table's columns).
    pub fn names(&self, cols: &[usize]) -> Vec<String> {
        cols.iter()
            .map(|&i| self.table.columns[i].name.clone())
            .collect()
    }

    /// Where column `col` sits in a row read with `select`.
    fn slot(&self, col: usize) -> usize {
        self.select
            .iter()
            .position(|&c| c == col)
            .expect("compiled nodes select what they use")
    }
}

impl DocPlan {
    /// The node at `path` (child indexes from the root).
    pub fn node(&self, path: &[usize]) -> &Node {
        path.iter().fold(&self.root, |n, &i| &n.children[i])
    }

    fn new(name: String, root: Node, id: Vec<usize>, join: Option<JoinTag>) -> Self {
        let mut plan = DocPlan {
            name,
            root,
            id,
            join,
            paths: HashMap::new(),
            shard_paths: Vec::new(),
        };
        let mut paths: HashMap<String, HashMap<String, Vec<Vec<usize>>>> = HashMap::new();
        let mut shard_paths = Vec::new();
        for (path, n) in plan.walk() {
            if n.table.shards.is_some() {
                let pattern = TablePattern::new(&n.table.db, &n.table.table);
                // Compiled: the patterns compiled when the tables were described.
                shard_paths.extend(pattern.matcher().ok().map(|m| (m, path.clone())));
            }
            for (db, table) in n.table.names() {
                paths
                    .entry(db)
                    .or_default()
                    .entry(table)
                    .or_default()
                    .push(path.clone());
            }
        }
        plan.paths = paths;
        plan.shard_paths = shard_paths;
        plan
    }

    /// Every node with its path, parents before children.
    fn walk(&self) -> Vec<(Vec<usize>, &Node)> {
        fn walk<'a>(n: &'a Node, path: &mut Vec<usize>, out: &mut Vec<(Vec<usize>, &'a Node)>) {
            out.push((path.clone(), n));
            for (i, c) in n.children.iter().enumerate() {
                path.push(i);
                walk(c, path, out);
                path.pop();
            }
        }
        let mut out = Vec::new();
        walk(&self.root, &mut Vec::new(), &mut out);
        out
    }

    /// The paths of every node reading `db.table` (a shard of a sharded node's table
    /// too, known to the plan or not).
    pub fn paths_of(&self, db: &str, table: &str) -> Vec<&[usize]> {
        let known = (self.paths.get(db).and_then(|t| t.get(table))).map_or(&[][..], Vec::as_slice);
        let mut out: Vec<&[usize]> = known.iter().map(Vec::as_slice).collect();
        for (m, path) in &self.shard_paths {
            if m.matches(db, table) && !out.contains(&path.as_slice()) {
                out.push(path);
            }
        }
        out
    }

    /// The names of the nodes on `path`, below the root (a path that outlives a
    /// compilation of the pipeline: see [`DocPlan::path_named`]).
    pub fn path_names(&self, path: &[usize]) -> Vec<String> {
        let mut node = &self.root;
        path.iter()
            .map(|&i| {
                node = &node.children[i];
                node.name.clone()
            })
            .collect()
    }

    /// The path of the node that [`DocPlan::path_names`] named; `None` when the tree
    /// no longer has it.
    pub fn path_named(&self, names: &[String]) -> Option<Vec<usize>> {
        let mut node = &self.root;
        names
            .iter()
            .map(|name| {
                let i = node.children.iter().position(|c| &c.name == name)?;
                node = &node.children[i];
                Some(i)
            })
            .collect()
    }

    /// The plan reading only shard `db`.`table` of its sharded root (a build's chunk);
    /// `None` when the root has no such shard (any more).
    pub fn for_shard(&self, db: &str, table: &str) -> Option<DocPlan> {
        let shard = (db.to_owned(), table.to_owned());
        if !self.root.table.shards.as_ref()?.contains(&shard) {
            return None;
        }
        let mut plan = self.clone();
        plan.root.table = self.root.table.shard(db, table);
        Some(plan)
    }

    /// The document fields of its parts: the relations directly under the root, which a
    /// change below them patches alone (see [`DocPlan::read_parts`]).
    pub fn part_names(&self) -> Vec<String> {
        self.root.children.iter().map(|c| c.name.clone()).collect()
    }

    /// Every node, parents before children.
    pub fn nodes(&self) -> Vec<&Node> {
        self.walk().into_iter().map(|(_, n)| n).collect()
    }

    /// The document `_id` for id values (in id order). Child documents (parent-child
    /// mode) share the index with their parents, and usually count from 1 as they do:
    /// their `_id` is `<name>#<id>`.
    pub fn document_id(&self, key: &[Json]) -> Option<String> {
        let id = sluice_model::event::id_of(key)?;
        Some(match self.join.as_ref().and_then(|j| j.parent.as_ref()) {
            Some(_) => format!("{}#{id}", self.name),
            None => id,
        })
    }

    /// The values of `node`'s columns `cols` in a row image (`None` if one is missing or
    /// NULL).
    pub fn image_values(
        node: &Node,
        cols: &[usize],
        image: &Map<String, Json>,
    ) -> Option<Vec<Json>> {
        cols.iter()
            .map(|&c| {
                image
                    .get(&node.table.columns[c].name)
                    .filter(|v| !v.is_null())
                    .cloned()
            })
            .collect()
    }

    /// A change event's row image of `db`.`table` as `node` reads its rows: for a sharded
    /// table, with the row's shard in [`SHARD_COLUMN`].
    pub fn event_image<'a>(
        node: &Node,
        db: &str,
        table: &str,
        image: &'a Map<String, Json>,
    ) -> std::borrow::Cow<'a, Map<String, Json>> {
        if node.table.shards.is_none() {
            return std::borrow::Cow::Borrowed(image);
        }
        let mut image = image.clone();
        let shard = sluice_model::pipeline::shard::shard_name(db, table);
        image.insert(SHARD_COLUMN.to_owned(), Json::String(shard));
        std::borrow::Cow::Owned(image)
    }

    /// A child document's routing (its parent's `_id`) from its row image.
    pub fn routing_of(&self, image: &Map<String, Json>) -> Option<String> {
        let cols = self.join.as_ref()?.parent.as_ref()?;
        let values = Self::image_values(&self.root, cols, image)?;
        sluice_model::event::id_of(&values)
    }
}

/// Describes every table of `spec` that exists (a sharded one as every shard it names
/// now), and says why a sharded one cannot be read as one table (each naming its key).
pub async fn describe(
    src: &SourceConfig,
    conn: &mut Conn,
    spec: &PipelineSpec,
) -> Result<(Tables, Vec<String>), MysqlError> {
    let mut tables = Tables::new();
    let mut problems = Vec::new();
    let patterns = spec.patterns();
    for (db, table) in spec.tables() {
        let pattern = TablePattern::new(&db, &table);
        if !patterns.contains(&pattern) {
            if let Some(t) = SnapshotTable::describe_any(src, conn, &db, &table).await? {
                tables.insert((db, table), t);
            }
            continue;
        }
        let Ok(matcher) = pattern.matcher() else {
            continue; // the spec's own problem
        };
        let mut shards = Vec::new();
        for (d, t) in shards_of(src, conn, &matcher).await? {
            shards.extend(SnapshotTable::describe_any(src, conn, &d, &t).await?);
        }
        match SnapshotTable::sharded(&db, &table, shards) {
            Ok(t) => {
                tables.insert((db, table), t);
            }
            Err(why) => problems.push(format!("{}: {why}", table_key(spec, &pattern))),
        }
    }
    Ok((tables, problems))
}

/// The tables `matcher` names, in order.
async fn shards_of(
    src: &SourceConfig,
    conn: &mut Conn,
    matcher: &sluice_model::pipeline::TableMatcher,
) -> Result<Vec<(String, String)>, MysqlError> {
    use mysql_async::prelude::Queryable as _;
    let all: Vec<(String, String)> = conn
        .query(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES
             WHERE TABLE_TYPE = 'BASE TABLE'
               AND TABLE_SCHEMA NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')
             ORDER BY TABLE_SCHEMA, TABLE_NAME",
        )
        .await
        .map_err(crate::preflight::query_err(
            src,
            "list the shards of a sharded table",
        ))?;
    Ok(all
        .into_iter()
        .filter(|(d, t)| matcher.matches(d, t))
        .collect())
}

/// The spec key of the table `pattern` names: `table` for the root, else its relation's.
fn table_key(spec: &PipelineSpec, pattern: &TablePattern) -> String {
    if spec.sharded && TablePattern::new(&spec.database, &spec.table) == *pattern {
        return "table".into();
    }
    let mut key = String::from("table");
    spec.visit(&mut |path, r, _| {
        if r.sharded && TablePattern::new(spec.database_of(r), &r.table) == *pattern {
            key = format!("{path}.table");
        }
    });
    key
}

/// Connects, describes the tables of `spec` and compiles it: the inner error lists what
/// in the spec does not fit the tables, each naming its key.
pub async fn load(
    src: &SourceConfig,
    spec: &PipelineSpec,
) -> Result<Result<Vec<DocPlan>, Vec<String>>, MysqlError> {
    let mut conn = crate::preflight::connect(src).await?;
    let described = describe(src, &mut conn, spec).await;
    let _ = conn.disconnect().await;
    Ok(compile_described(spec, described?))
}

/// Compiles `spec` against the tables [`describe`] found, with the problems it found.
fn compile_described(
    spec: &PipelineSpec,
    (tables, mut problems): (Tables, Vec<String>),
) -> Result<Vec<DocPlan>, Vec<String>> {
    match compile(spec, &tables) {
        Ok(plans) if problems.is_empty() => Ok(plans),
        Ok(_) => Err(problems),
        Err(more) => {
            problems.extend(more);
            Err(problems)
        }
    }
}

/// Connections to one source for reading documents, reused between reads.
pub struct SourcePool {
    src: SourceConfig,
    pool: mysql_async::Pool,
    /// The server, once a reader asked.
    server: std::sync::Mutex<Option<crate::Server>>,
}

impl SourcePool {
    pub fn new(src: SourceConfig) -> Self {
        let pool = mysql_async::Pool::new(src.reader_opts());
        Self {
            src,
            pool,
            server: std::sync::Mutex::default(),
        }
    }

    pub fn config(&self) -> &SourceConfig {
        &self.src
    }

    /// A reader on a pooled connection.
    pub async fn reader(&self) -> Result<Reader<'_>, MysqlError> {
        let known = self
            .server
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        self.src.may_send_password()?;
        let conn = crate::auth::unwound(self.pool.get_conn())
            .await
            .map_err(|error| MysqlError::Connect {
                source_name: self.src.name.clone(),
                error,
            })?;
        let mut reader = Reader::new(&self.src, conn, known.clone());
        if known.is_none() {
            let server = reader.server().await?;
            *self.server.lock().unwrap_or_else(|e| e.into_inner()) = Some(server);
        }
        Ok(reader)
    }

    pub async fn close(self) {
        let _ = self.pool.disconnect().await;
    }
}

/// A join key: the values as text (so `5` joins `'5'`, as MySQL compares them), or
/// `None` when one is NULL (which joins nothing).
pub(crate) fn join_key<'a>(values: impl IntoIterator<Item = &'a Json>) -> Option<String> {
    let mut key = String::new();
    for (i, v) in values.into_iter().enumerate() {
        if i > 0 {
            key.push('\u{1f}');
        }
        match v {
            Json::Null => return None,
            Json::String(s) => key.push_str(s),
            other => key.push_str(&other.to_string()),
        }
    }
    Some(key)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::decode::Kind;

    /// A table description without a server: `(name, sql type)` columns, primary key.
    pub(crate) fn table(
        db: &str,
        name: &str,
        cols: &[(&str, &str)],
        key: &[&str],
    ) -> SnapshotTable {
        let columns = cols
            .iter()
            .map(|(n, t)| {
                let kind = match *t {
                    "int" | "bigint" => Kind::Int,
                    "datetime" => Kind::DateTime,
                    "decimal(10,2)" => Kind::Decimal,
                    _ => Kind::Text,
                };
                (n.to_string(), (kind, 0, t.to_string()))
            })
            .collect();
        let key: Vec<String> = key.iter().map(|k| k.to_string()).collect();
        SnapshotTable::from_parts(db, name, columns, &key)
    }

    pub(crate) fn shop_tables() -> Tables {
        let mut t = Tables::new();
        for tbl in [
            table(
                "shop",
                "products",
                &[
                    ("id", "int"),
                    ("title", "varchar"),
                    ("brand_id", "int"),
                    ("deleted", "int"),
                ],
                &["id"],
            ),
            table(
                "shop",
                "brands",
                &[("id", "int"), ("name", "varchar")],
                &["id"],
            ),
            table(
                "shop",
                "skus",
                &[("id", "int"), ("product_id", "int"), ("code", "varchar")],
                &["id"],
            ),
            table(
                "shop",
                "sku_prices",
                &[("id", "int"), ("sku_id", "int"), ("price", "decimal(10,2)")],
                &["id"],
            ),
            table(
                "shop",
                "product_tags",
                &[
                    ("product_id", "int"),
                    ("tag", "varchar"),
                    ("created_at", "datetime"),
                ],
                &["product_id", "tag"],
            ),
        ] {
            t.insert((tbl.db.clone(), tbl.table.clone()), tbl);
        }
        t
    }

    pub(crate) fn shop_spec() -> PipelineSpec {
        serde_json::from_value(serde_json::json!({
            "name": "products", "source": "s", "database": "shop", "table": "products",
            "filter": "deleted = 0", "columns": ["id", "title"],
            "relations": [
                {"name": "brand", "kind": "one_to_one", "table": "brands", "on": {"brand_id": "id"}},
                {"name": "skus", "kind": "one_to_many", "table": "skus", "on": {"id": "product_id"},
                 "relations": [{"name": "prices", "kind": "one_to_many", "table": "sku_prices", "on": {"id": "sku_id"}}]},
                {"name": "tags", "kind": "one_to_many", "table": "product_tags", "on": {"id": "product_id"},
                 "nested": false, "order_by": ["created_at desc"], "limit": 5, "columns": ["tag", "created_at"]}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn the_shop_tree_compiles_with_what_each_level_must_read() {
        let plans = compile(&shop_spec(), &shop_tables()).unwrap();
        assert_eq!(plans.len(), 1);
        let p = &plans[0];
        let root = &p.root;
        // Output: id, title; read too: brand_id (joins brands).
        assert_eq!(root.names(&root.output), ["id", "title"]);
        assert_eq!(root.names(&root.select), ["id", "title", "brand_id"]);
        assert_eq!(root.names(&p.id), ["id"]);
        let skus = &root.children[1];
        assert!(skus.nested);
        assert_eq!(
            skus.names(&skus.link.as_ref().unwrap().child),
            ["product_id"]
        );
        let tags = &root.children[2];
        assert!(!tags.nested);
        assert_eq!(tags.limit, Some(5));
        assert_eq!(tags.names(&tags.output), ["tag", "created_at"]);
        assert_eq!(
            tags.names(&tags.select),
            ["product_id", "tag", "created_at"]
        );
        assert_eq!(p.paths_of("shop", "sku_prices"), [vec![1, 0]]);
        assert_eq!(p.paths_of("shop", "nothing"), Vec::<Vec<usize>>::new());
        assert_eq!(p.nodes().len(), 5);
        assert_eq!(p.node(&[1, 0]).name, "prices");
    }

    #[test]
    fn unknown_tables_and_columns_are_named() {
        let mut spec = shop_spec();
        spec.relations[0].on = BTreeMap::from([("maker_id".into(), "id".into())]);
        spec.relations[1].relations[0].table = "prices".into();
        spec.relations[2].order_by = vec!["made_at".into()];
        spec.relations[2].columns = vec!["tag".into(), "colour".into()];
        spec.filter = "deleted = 0 AND hidden = 0".into();
        let p = compile(&spec, &shop_tables()).unwrap_err();
        for want in [
            "relations.brand.on: `maker_id` is not a column of `shop.products`",
            "relations.skus.relations.prices.table: `shop.prices` does not exist",
            "relations.tags.order_by: `made_at` is not a column of `shop.product_tags`",
            "relations.tags.columns: `colour` is not a column of `shop.product_tags`",
            "filter: `hidden` is not a column of `shop.products`",
        ] {
            assert!(p.contains(&want.to_owned()), "{want}\nnot in {p:#?}");
        }
    }

    #[test]
    fn child_relations_are_documents_routed_by_the_parent_id() {
        let mut tables = shop_tables();
        let answers = table(
            "shop",
            "reviews",
            &[("id", "int"), ("product_id", "int"), ("body", "text")],
            &["id"],
        );
        tables.insert(("shop".into(), "reviews".into()), answers);
        let mut spec = shop_spec();
        spec.relations.push(
            serde_json::from_value(serde_json::json!(
                {"name": "review", "kind": "child", "table": "reviews", "on": {"id": "product_id"}}
            ))
            .unwrap(),
        );
        let spec = spec.normalized();
        let plans = compile(&spec, &tables).unwrap();
        assert_eq!(plans.len(), 2);
        assert_eq!(plans[0].name, "products");
        assert_eq!(
            plans[0].root.children.len(),
            3,
            "the child is not nested in the parent"
        );
        let review = &plans[1];
        assert_eq!(review.name, "review");
        let routing = review.join.as_ref().unwrap().parent.as_ref().unwrap();
        assert_eq!(review.root.names(routing), ["product_id"]);
        let image = serde_json::json!({"id": 9, "product_id": 42, "body": "x"});
        assert_eq!(
            review.routing_of(image.as_object().unwrap()).as_deref(),
            Some("42")
        );
        assert_eq!(
            review.document_id(&[Json::from(9)]).as_deref(),
            Some("review#9")
        );
        assert_eq!(plans[0].document_id(&[Json::from(9)]).as_deref(), Some("9"));
    }

    #[test]
    fn join_keys_compare_as_mysql_does_and_null_joins_nothing() {
        assert_eq!(join_key([&Json::from(5)]), join_key([&Json::from("5")]));
        assert_eq!(join_key([&Json::from(1), &Json::Null]), None);
        assert_ne!(
            join_key([&Json::from("a"), &Json::from("bc")]),
            join_key([&Json::from("ab"), &Json::from("c")])
        );
    }
}
