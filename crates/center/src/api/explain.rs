//! `ExplainDocument`: why a document looks the way it does. The document is read from
//! MySQL in one consistent snapshot, with the rows every table gave it, and set beside
//! the copy the alias's index holds: its version, the binlog position that version
//! stands for, and the fields that differ.

use serde_json::{Map, Value as Json};
use sluice_elastic::{versioned_index, Hit};
use sluice_model::ExternalVersion;
use sluice_mysql::docs::{Reader, TracedRows};
use sluice_proto::v1::*;
use tonic::{Request, Response, Status};

use super::common::*;

pub(super) async fn explain_document(
    api: &AdminApi,
    req: Request<ExplainRequest>,
) -> Result<Response<Explanation>, Status> {
    let req = req.into_inner();
    let id = req.id.trim();
    if id.is_empty() {
        return Err(Status::invalid_argument("id: name the document's _id"));
    }
    let p = api.existing(&req.pipeline).await?;
    let Some(es) = api.shared.es.clone() else {
        return Err(Status::failed_precondition(
            "this center has no Elasticsearch configured (`elasticsearch.url`): it cannot read the index",
        ));
    };
    let (src, plans) = crate::resync::plans(&api.shared, &p)
        .await
        .map_err(center_err)?;
    let (kind, key) = crate::resync::key_of_id(&plans, id)
        .map_err(|why| Status::invalid_argument(format!("id: {why}")))?;
    let read = read_mysql(&src, &plans[kind], key)
        .await
        .map_err(|e| center_err(e.into()))?;
    let alias = p.spec.alias();
    let index = match es
        .alias_targets(&alias)
        .await
        .map_err(|e| center_err(e.into()))?
        .pop()
    {
        Some(index) => index,
        None => versioned_index(&alias, p.live_or_first()),
    };
    let routing = read.built.as_ref().and_then(|b| b.routing.clone());
    let hit = es
        .mget_hits(&index, &[(id.to_owned(), routing)])
        .await
        .map_err(|e| center_err(e.into()))?
        .pop()
        .flatten();
    Ok(Response::new(explanation(
        &req.pipeline,
        id,
        index,
        hit,
        read,
    )))
}

/// What MySQL yields for the document now.
pub(super) struct MysqlRead {
    pub(super) built: Option<sluice_mysql::docs::Built>,
    pub(super) rows: Vec<TracedRows>,
    /// The snapshot's high watermark: nothing logged after it is in the read.
    high: sluice_model::BinlogPosition,
}

/// The document of `key` as MySQL yields it now, with the rows of every table that build
/// it, read in one consistent snapshot (`PreviewPipeline` reads the same way).
pub(super) async fn read_mysql(
    src: &sluice_mysql::SourceConfig,
    plan: &sluice_mysql::docs::DocPlan,
    key: Vec<Json>,
) -> Result<MysqlRead, sluice_mysql::MysqlError> {
    let mut reader = Reader::connect(src).await?;
    let marks = reader.begin_snapshot().await?;
    let read = plan.explain(&mut reader, key).await;
    reader.end().await?;
    reader.close().await;
    let (built, rows) = read?;
    Ok(MysqlRead {
        built: built.filter(|b| b.doc.is_some()),
        rows,
        high: marks.high,
    })
}

fn explanation(
    pipeline: &str,
    id: &str,
    index: String,
    hit: Option<Hit>,
    read: MysqlRead,
) -> Explanation {
    let mysql_doc: Option<&Map<String, Json>> = read.built.as_ref().and_then(|b| b.doc.as_ref());
    let indexed_doc = hit.as_ref().and_then(|h| h.source.as_object());
    let differences = match (indexed_doc, mysql_doc) {
        (Some(a), Some(b)) => sluice_model::diff::differing_fields(a, b)
            .into_iter()
            .map(|field| Difference {
                index: a.get(&field).map(Json::to_string).unwrap_or_default(),
                mysql: b.get(&field).map(Json::to_string).unwrap_or_default(),
                field,
            })
            .collect(),
        _ => Vec::new(),
    };
    let equal = match (indexed_doc, mysql_doc) {
        (Some(a), Some(b)) => a == b,
        (None, None) => hit.is_none(),
        _ => false,
    };
    let version = hit.as_ref().map_or(0, |h| h.version);
    let v = ExternalVersion::from_raw(version);
    let newer_than_read = hit.is_some() && {
        let high = &read.high;
        sluice_model::position::file_seq(&high.file)
            .ok()
            .is_some_and(|seq| (v.file_seq(), v.offset()) > (seq, high.pos))
    };
    Explanation {
        pipeline: pipeline.to_owned(),
        id: id.to_owned(),
        index,
        indexed: hit.is_some(),
        version,
        version_epoch: v.epoch() as u32,
        position: if hit.is_some() {
            position_of(v, &read.high.file)
        } else {
            String::new()
        },
        document: indexed_doc
            .map(|d| Json::Object(d.clone()).to_string())
            .unwrap_or_default(),
        in_mysql: mysql_doc.is_some(),
        built: mysql_doc
            .map(|d| Json::Object(d.clone()).to_string())
            .unwrap_or_default(),
        rows: rows_message(read.rows),
        equal,
        differences,
        read_at: read.high.to_string(),
        newer_than_read,
    }
}

/// The binlog position version `v` stands for, named like the source's files (`like`).
fn position_of(v: ExternalVersion, like: &str) -> String {
    let base = like.rsplit_once('.').map_or(like, |(base, _)| base);
    format!("{base}.{:06}:{}", v.file_seq(), v.offset())
}

/// Traced rows as the API carries them: each row as a JSON object.
pub(super) fn rows_message(rows: Vec<TracedRows>) -> Vec<ExplainedRows> {
    rows.into_iter()
        .map(|t| ExplainedRows {
            node: t.node,
            table: t.table,
            rows: t
                .rows
                .into_iter()
                .map(|r| Json::Object(r).to_string())
                .collect(),
        })
        .collect()
}
