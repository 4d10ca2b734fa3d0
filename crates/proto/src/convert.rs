//! The API edge: the shared definitions of a pipeline and a source to and from their
//! messages. Nothing else converts.

use std::collections::BTreeMap;

use sluice_model::pipeline::{CheckSpec, DelayedSpec, JoinField, DEFAULT_JOIN_FIELD};
use sluice_model::{Availability, FieldOverride, PipelineSpec, Relation, RelationKind, SourceSpec};

use crate::v1;

/// What the center says about a pipeline besides its spec (read-only in the API).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PipelineState {
    pub live_version: u32,
    pub building_version: u32,
    pub history: Vec<u32>,
    /// The history versions live changes are still applied to.
    pub current_history: Vec<u32>,
    /// Why the live (or building) version needs a rebuild; empty: it does not.
    pub needs_rebuild: String,
    /// Per source, how far the etl applied the pipeline.
    pub applied: Vec<Applied>,
}

/// A source's position up to which the etl applied a pipeline, and how long ago it knew.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub source: String,
    pub checkpoint: sluice_model::Checkpoint,
    pub lag_ms: u64,
}

impl PipelineState {
    pub fn availability(&self) -> Availability {
        Availability::of(self.live_version, self.building_version)
    }
}

pub fn pipeline(spec: &PipelineSpec, state: &PipelineState) -> v1::Pipeline {
    v1::Pipeline {
        name: spec.name.clone(),
        source: spec.source.clone(),
        database: spec.database.clone(),
        table: spec.table.clone(),
        alias: spec.alias.clone(),
        columns: spec.columns.clone(),
        shards: spec.shards,
        replicas: spec.replicas,
        tombstone_retention: spec.tombstone_retention.clone(),
        state: state.availability().as_str().into(),
        availability: v1::PipelineAvailability::from(state.availability()).into(),
        live_version: state.live_version,
        building_version: state.building_version,
        history: state.history.clone(),
        fields: field_mappings(&spec.fields),
        refresh_interval: spec.refresh_interval.clone(),
        needs_rebuild: state.needs_rebuild.clone(),
        filter: spec.filter.clone(),
        id: spec.id.clone(),
        relations: spec.relations.iter().map(relation).collect(),
        sharded: spec.sharded,
        join: spec.join.as_ref().map(|j| v1::JoinField {
            field: j.field.clone(),
            parent: j.parent.clone(),
        }),
        auto_rebuild: spec.auto_rebuild,
        area_updates: spec.area_updates,
        keep_history: Some(spec.keep_history),
        current_history: state.current_history.clone(),
        check: (!spec.check.is_empty()).then(|| v1::PipelineCheck {
            updated_column: spec.check.updated_column.clone(),
            daily_at: spec.check.daily_at.clone(),
            since: spec.check.since.clone(),
            repair: spec.check.repair,
        }),
        delayed: (!spec.delayed.is_empty()).then(|| v1::PipelineDelayed {
            daily_at: spec.delayed.daily_at.clone(),
        }),
        applied: state
            .applied
            .iter()
            .map(|a| v1::PipelineApplied {
                source: a.source.clone(),
                position: a.checkpoint.position.to_string(),
                gtid: a
                    .checkpoint
                    .gtid
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                epoch: u32::from(a.checkpoint.epoch),
                lag_ms: a.lag_ms,
            })
            .collect(),
    }
}

/// The spec a message asks for (its read-only parts ignored); the error names the key.
pub fn pipeline_spec(p: v1::Pipeline) -> Result<PipelineSpec, String> {
    Ok(PipelineSpec {
        name: p.name,
        source: p.source,
        database: p.database,
        table: p.table,
        sharded: p.sharded,
        alias: p.alias,
        id: p.id,
        filter: p.filter,
        columns: p.columns,
        fields: overrides(&p.fields),
        relations: p
            .relations
            .into_iter()
            .map(|r| relation_spec("relations", r))
            .collect::<Result<_, _>>()?,
        join: p.join.map(|j| JoinField {
            field: if j.field.is_empty() {
                DEFAULT_JOIN_FIELD.into()
            } else {
                j.field
            },
            parent: j.parent,
        }),
        shards: p.shards,
        replicas: p.replicas,
        tombstone_retention: p.tombstone_retention,
        refresh_interval: p.refresh_interval,
        auto_rebuild: p.auto_rebuild,
        area_updates: p.area_updates,
        keep_history: p
            .keep_history
            .unwrap_or(sluice_model::pipeline::DEFAULT_KEEP_HISTORY),
        check: p.check.map_or_else(CheckSpec::default, |c| CheckSpec {
            updated_column: c.updated_column,
            daily_at: c.daily_at,
            since: c.since,
            repair: c.repair,
        }),
        delayed: p
            .delayed
            .map_or_else(DelayedSpec::default, |d| DelayedSpec {
                daily_at: d.daily_at,
            }),
        // Debezium input is an etl's own pipeline's, for now (README, "Input from Debezium").
        input: Default::default(),
    })
}

fn relation(r: &Relation) -> v1::Relation {
    v1::Relation {
        name: r.name.clone(),
        kind: match r.kind {
            RelationKind::OneToOne => v1::RelationKind::OneToOne,
            RelationKind::OneToMany => v1::RelationKind::OneToMany,
            RelationKind::Child => v1::RelationKind::Child,
        } as i32,
        table: r.table.clone(),
        sharded: r.sharded,
        database: r.database.clone(),
        source: r.source.clone(),
        on: r.on.clone().into_iter().collect(),
        nested: r.nested,
        columns: r.columns.clone(),
        filter: r.filter.clone(),
        distinct: r.distinct,
        order_by: r.order_by.clone(),
        limit: r.limit.unwrap_or(0),
        fields: field_mappings(&r.fields),
        relations: r.relations.iter().map(relation).collect(),
        delayed: r.delayed,
    }
}

fn relation_spec(prefix: &str, r: v1::Relation) -> Result<Relation, String> {
    let key = format!("{prefix}.{}", r.name);
    let kind = match v1::RelationKind::try_from(r.kind) {
        Ok(v1::RelationKind::OneToOne) => RelationKind::OneToOne,
        Ok(v1::RelationKind::OneToMany) => RelationKind::OneToMany,
        Ok(v1::RelationKind::Child) => RelationKind::Child,
        Ok(v1::RelationKind::Unspecified) | Err(_) => {
            return Err(format!(
                "{key}.kind: required (one_to_one, one_to_many or child)"
            ))
        }
    };
    let below = format!("{key}.relations");
    Ok(Relation {
        name: r.name,
        kind,
        table: r.table,
        sharded: r.sharded,
        database: r.database,
        source: r.source,
        on: r.on.into_iter().collect(),
        nested: r.nested,
        columns: r.columns,
        filter: r.filter,
        distinct: r.distinct,
        order_by: r.order_by,
        limit: (r.limit > 0).then_some(r.limit),
        fields: overrides(&r.fields),
        relations: r
            .relations
            .into_iter()
            .map(|sub| relation_spec(&below, sub))
            .collect::<Result<_, _>>()?,
        delayed: r.delayed,
    })
}

/// The API's field mappings as the overrides the mapping applies.
pub fn overrides(fields: &BTreeMap<String, v1::FieldMapping>) -> BTreeMap<String, FieldOverride> {
    let set = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    fields
        .iter()
        .map(|(column, f)| {
            let o = FieldOverride {
                es_type: set(&f.r#type),
                analyzer: set(&f.analyzer),
                search_analyzer: set(&f.search_analyzer),
                keyword: f.keyword,
                copy_to: f.copy_to.clone(),
                index: f.index,
            };
            (column.clone(), o)
        })
        .collect()
}

/// The inverse of [`overrides`].
pub fn field_mappings(
    fields: &BTreeMap<String, FieldOverride>,
) -> BTreeMap<String, v1::FieldMapping> {
    fields
        .iter()
        .map(|(column, o)| {
            let f = v1::FieldMapping {
                r#type: o.es_type.clone().unwrap_or_default(),
                analyzer: o.analyzer.clone().unwrap_or_default(),
                search_analyzer: o.search_analyzer.clone().unwrap_or_default(),
                keyword: o.keyword,
                copy_to: o.copy_to.clone(),
                index: o.index,
            };
            (column.clone(), f)
        })
        .collect()
}

pub fn source(s: &SourceSpec) -> v1::Source {
    v1::Source {
        name: s.name.clone(),
        host: s.host.clone(),
        port: s.port.into(),
        user: s.user.clone(),
        password_ref: s.password_ref.clone(),
        server_id: s.server_id,
        tables: s.tables.clone(),
        epoch: s.coordinates.epoch.into(),
    }
}

/// The source a message asks for; a port of 0 means MySQL's default.
pub fn source_spec(s: v1::Source) -> Result<SourceSpec, String> {
    let port = match s.port {
        0 => 3306,
        p => u16::try_from(p).map_err(|_| format!("port: {p} is not a TCP port"))?,
    };
    Ok(SourceSpec {
        name: s.name,
        host: s.host,
        port,
        user: s.user,
        password_ref: s.password_ref,
        server_id: s.server_id,
        tables: s.tables,
        shards: Vec::new(),
        // The center's, whatever the message says.
        coordinates: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_survives_the_round_trip() {
        let json = r#"{"name":"p","source":"s","database":"d","table":"products","filter":"deleted = 0",
            "id":["code"],"fields":{"title":{"analyzer":"english"}},
            "relations":[{"name":"skus","kind":"one_to_many","table":"skus","on":{"id":"product_id"},
              "nested":false,"order_by":["price desc"],"limit":3,"distinct":false,
              "relations":[{"name":"w","kind":"one_to_one","table":"warehouses","on":{"wid":"id"},"delayed":true}]}],
            "shards":2,"replicas":0,"tombstone_retention":"1d","delayed":{"daily_at":"02:00"}}"#;
        let spec: PipelineSpec = serde_json::from_str(json).unwrap();
        let state = PipelineState {
            live_version: 3,
            ..Default::default()
        };
        let message = pipeline(&spec, &state);
        assert_eq!(message.state, "available");
        assert_eq!(pipeline_spec(message).unwrap(), spec);
    }

    #[test]
    fn a_relation_without_a_kind_is_named() {
        let p = v1::Pipeline {
            relations: vec![v1::Relation {
                name: "skus".into(),
                relations: vec![v1::Relation {
                    name: "prices".into(),
                    ..Default::default()
                }],
                kind: v1::RelationKind::OneToMany as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            pipeline_spec(p).unwrap_err(),
            "relations.skus.relations.prices.kind: required (one_to_one, one_to_many or child)"
        );
    }
}
