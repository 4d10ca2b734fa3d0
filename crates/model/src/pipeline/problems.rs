//! What is wrong with a pipeline spec on its face, before its tables are looked at: every
//! problem names its key relative to the pipeline (`relations.skus.on`).

use std::collections::BTreeSet;

use super::shard::{TablePattern, SHARD_COLUMN};
use super::{
    filter, is_column_name, is_field_name, is_index_name, is_name, parse_time_of_day, OrderKey,
    PipelineSpec, Relation, RelationKind, MAX_DEPTH,
};
use crate::mapping::pipeline_problems;

impl PipelineSpec {
    /// What is wrong with the spec on its face (without looking at the tables), every
    /// problem naming its key relative to the pipeline (`relations.skus.on`).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if !is_name(&self.name, 128) {
            p.push(format!(
                "name: `{}` must be 1..=128 characters of [A-Za-z0-9._-]",
                self.name
            ));
        }
        if !is_name(&self.source, 64) {
            p.push(format!(
                "source: `{}` must be 1..=64 characters of [A-Za-z0-9._-]",
                self.source
            ));
        }
        for (key, v) in [("database", &self.database), ("table", &self.table)] {
            if v.is_empty() {
                p.push(format!("{key}: required"));
            }
        }
        if !self.input.is_sluice() && self.input.topic_prefix.is_empty() {
            p.push("input.topic_prefix: required with format = \"debezium\" (the connector's topic.prefix)".into());
        }
        if self.input.is_sluice() && !self.input.topic_prefix.is_empty() {
            p.push("input.topic_prefix: only with format = \"debezium\"".into());
        }
        let alias = self.alias();
        if !is_index_name(&alias) {
            p.push(format!(
                "alias: `{alias}` is not a valid index name (lowercase, no spaces or \\/*?\"<>|,#:)"
            ));
        }
        if self.shards == 0 {
            p.push("shards: must be at least 1".into());
        }
        if humantime::parse_duration(&self.tombstone_retention).is_err() {
            p.push(format!(
                "tombstone_retention: `{}` is not a duration like 7d or 12h",
                self.tombstone_retention
            ));
        }
        for c in &self.id {
            if !is_column_name(c) {
                p.push(format!("id: `{c}` is not a column name"));
            }
        }
        self.shard_problems(&mut p);
        if !self.filter.is_empty() {
            if let Err(why) = filter::check(&self.filter) {
                p.push(format!("filter: {why}"));
            }
        }
        p.extend(pipeline_problems(
            &self.columns,
            &self.fields,
            &self.refresh_interval,
        ));
        let root = (self.database.clone(), self.table.clone());
        self.relation_problems("", &self.relations, 1, &[root], &mut p);
        self.join_problems(&mut p);
        self.check.problems(&mut p);
        if !self.delayed.daily_at.is_empty() {
            if let Err(why) = parse_time_of_day(&self.delayed.daily_at) {
                p.push(format!("delayed.daily_at: {why}"));
            }
        }
        p
    }

    fn relation_problems(
        &self,
        prefix: &str,
        relations: &[Relation],
        depth: usize,
        ancestors: &[(String, String)],
        p: &mut Vec<String>,
    ) {
        let mut names = BTreeSet::new();
        for r in relations {
            let key = format!("{prefix}relations.{}", r.name);
            if !is_field_name(&r.name) {
                p.push(format!(
                    "{key}: `{}` is not a field name (no dots, not empty, not starting with _)",
                    r.name
                ));
            }
            if !names.insert(r.name.as_str()) {
                p.push(format!(
                    "{key}: another relation of the same parent has this name"
                ));
            }
            self.own_problems(&key, r, p);
            self.kind_problems(&key, r, depth, p);
            if r.distinct && !r.relations.is_empty() {
                p.push(format!(
                    "{key}.distinct: a distinct relation cannot have relations of its own (its rows are merged, so theirs would be ambiguous)"
                ));
            }
            let table = (self.database_of(r).to_owned(), r.table.clone());
            if ancestors.contains(&table) {
                p.push(format!(
                    "{key}.table: `{}.{}` is already above it in the tree: a table cannot contain itself (a cycle)",
                    table.0, table.1
                ));
                continue;
            }
            if depth >= MAX_DEPTH {
                p.push(format!(
                    "{key}.relations: relations nest at most {MAX_DEPTH} levels deep"
                ));
                continue;
            }
            let mut below = ancestors.to_vec();
            below.push(table);
            for sub in r.relations.iter().filter(|s| s.kind == RelationKind::Child) {
                p.push(format!(
                    "{key}.relations.{}.kind: a child relation must be directly under the root",
                    sub.name
                ));
            }
            let nested: Vec<Relation> = r
                .relations
                .iter()
                .filter(|s| s.kind != RelationKind::Child)
                .cloned()
                .collect();
            self.relation_problems(&format!("{key}."), &nested, depth + 1, &below, p);
        }
    }

    /// A relation's own fields: its table, source, join columns, filter, order and
    /// column settings.
    fn own_problems(&self, key: &str, r: &Relation, p: &mut Vec<String>) {
        if r.table.is_empty() {
            p.push(format!("{key}.table: required"));
        }
        if !r.source.is_empty() && r.source != self.source {
            p.push(format!(
                "{key}.source: `{}` is not the pipeline's source `{}`: every table of a pipeline comes from one source (versions compare only within one binlog)",
                r.source, self.source
            ));
        }
        if r.on.is_empty() {
            p.push(format!(
                "{key}.on: required (the parent's column = this table's column)"
            ));
        }
        for (parent, child) in &r.on {
            for c in [parent, child] {
                if !is_column_name(c) {
                    p.push(format!("{key}.on: `{c}` is not a column name"));
                }
            }
        }
        if !r.filter.is_empty() {
            if let Err(why) = filter::check(&r.filter) {
                p.push(format!("{key}.filter: {why}"));
            }
        }
        for (i, o) in r.order_by.iter().enumerate() {
            if let Err(why) = OrderKey::parse(o) {
                p.push(format!("{key}.order_by[{i}]: {why}"));
            }
        }
        p.extend(
            pipeline_problems(&r.columns, &r.fields, "")
                .into_iter()
                .map(|why| format!("{key}.{why}")),
        );
    }

    /// What a relation's kind allows: a limit, and where a child may stand and what it
    /// cannot have.
    fn kind_problems(&self, key: &str, r: &Relation, depth: usize, p: &mut Vec<String>) {
        match r.kind {
            RelationKind::OneToOne => {
                if r.limit.is_some() {
                    p.push(format!(
                        "{key}.limit: only a one_to_many relation has a limit"
                    ));
                }
            }
            RelationKind::OneToMany => {
                if r.limit == Some(0) {
                    p.push(format!("{key}.limit: must be at least 1"));
                }
            }
            RelationKind::Child => {
                if depth > 1 {
                    p.push(format!(
                        "{key}.kind: a child relation must be directly under the root (its documents are routed to the root's)"
                    ));
                }
                for (set, what) in [
                    (r.delayed, "delayed"),
                    (r.nested.is_some(), "nested"),
                    (r.distinct, "distinct"),
                    (!r.order_by.is_empty(), "order_by"),
                    (r.limit.is_some(), "limit"),
                ] {
                    if set {
                        p.push(format!(
                            "{key}.{what}: a child relation's rows are documents of their own; {what} does not apply"
                        ));
                    }
                }
                if !self.id.is_empty() {
                    let keys: BTreeSet<&String> = r.on.keys().collect();
                    let id: BTreeSet<&String> = self.id.iter().collect();
                    if keys != id {
                        p.push(format!(
                            "{key}.on: a child joins the root's id columns ({}), so each child knows its parent's _id",
                            self.id.join(", ")
                        ));
                    }
                }
            }
        }
    }

    /// What sharded tables need: patterns that compile, a root's `id` named, and
    /// Sluice's own input in a pipeline without child documents.
    fn shard_problems(&self, p: &mut Vec<String>) {
        if self.sharded {
            if let Err(why) = TablePattern::new(&self.database, &self.table).matcher() {
                p.push(why);
            }
            if self.id.is_empty() {
                p.push(format!(
                    "id: required for a sharded root (each shard's primary key may repeat in another): name columns unique across every shard, or add `{SHARD_COLUMN}` to make the shard part of the id"
                ));
            }
        }
        let mut any = self.sharded;
        self.visit(&mut |key, r, _| {
            if self.sharded && !r.sharded && r.database.is_empty() {
                p.push(format!(
                    "{key}.database: required under a sharded root (the pipeline's `database` is a pattern; name the database of `{}`)",
                    r.table
                ));
            }
            if !r.sharded {
                return;
            }
            any = true;
            if let Err(why) = TablePattern::new(self.database_of(r), &r.table).matcher() {
                p.push(format!("{key}.{why}"));
            }
            if r.kind == RelationKind::Child {
                p.push(format!("{key}.sharded: a child relation cannot be sharded"));
            }
        });
        if any && !self.input.is_sluice() {
            p.push("sharded: sharded tables are read from Sluice's own input only (input.format = \"sluice\")".into());
        }
        if any && self.has_children() {
            p.push("sharded: a pipeline with child relations cannot have sharded tables".into());
        }
    }

    fn join_problems(&self, p: &mut Vec<String>) {
        let Some(join) = &self.join else { return };
        if !self.has_children() {
            p.push("join: only a pipeline with child relations has a join field".into());
            return;
        }
        if !is_field_name(&join.field) {
            p.push(format!("join.field: `{}` is not a field name", join.field));
        }
        if !join.parent.is_empty() && !is_field_name(&join.parent) {
            p.push(format!("join.parent: `{}` is not a name", join.parent));
        }
        let parent = if join.parent.is_empty() {
            &self.table
        } else {
            &join.parent
        };
        if self.relations.iter().any(|r| &r.name == parent) {
            p.push(format!(
                "join.parent: `{parent}` is also a child relation's name"
            ));
        }
    }
}
