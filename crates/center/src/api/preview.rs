//! `PreviewPipeline`: a spec checked and shown before it is saved — its problems at the
//! keys they name, the spec as TOML and JSON, the mapping it generates and, for a root
//! id, the document it would build, read live from MySQL.

use serde_json::Value as Json;
use sluice_model::PipelineSpec;
use sluice_mysql::docs::DocPlan;
use sluice_proto::convert::{self, PipelineState};
use sluice_proto::spec_text;
use sluice_proto::v1::*;
use tonic::{Request, Response, Status};

use super::common::*;

pub(super) async fn preview_pipeline(
    api: &AdminApi,
    req: Request<PreviewRequest>,
) -> Result<Response<PipelinePreview>, Status> {
    let req = req.into_inner();
    let mut out = PipelinePreview::default();
    let spec = if req.text.trim().is_empty() {
        convert::pipeline_spec(req.pipeline.unwrap_or_default()).map_err(|e| problem("", &e))
    } else {
        spec_text::parse(&req.text).map_err(|e| problem(&e.key, &e.message))
    };
    let spec = match spec {
        Ok(spec) => spec.normalized(),
        Err(p) => {
            out.problems.push(p);
            return Ok(Response::new(out));
        }
    };
    out.pipeline = Some(convert::pipeline(&spec, &PipelineState::default()));
    out.toml =
        spec_text::to_toml(&spec).unwrap_or_else(|e| format!("# cannot be written as TOML: {e}"));
    out.json = spec_text::to_json(&spec);
    out.problems = spec.problems().iter().map(|p| keyed(p)).collect();
    if !out.problems.is_empty() {
        return Ok(Response::new(out));
    }
    let (src, plans) = match api.compiled(&spec).await? {
        Ok(compiled) => compiled,
        Err(problems) => {
            out.problems = problems.iter().map(|p| keyed(p)).collect();
            return Ok(Response::new(out));
        }
    };
    match mapping(&spec, &plans) {
        Ok(props) => out.mapping = serde_json::to_string_pretty(&props).unwrap_or_default(),
        Err(conflicts) => out
            .problems
            .extend(conflicts.iter().map(|p| problem("", p))),
    }
    let id = req.id.trim();
    if !id.is_empty() {
        let (kind, key) = crate::resync::key_of_id(&plans, id)
            .map_err(|why| Status::invalid_argument(format!("id: {why}")))?;
        let read = super::explain::read_mysql(&src, &plans[kind], key)
            .await
            .map_err(|e| center_err(e.into()))?;
        out.document = read
            .built
            .and_then(|b| b.doc)
            .map(|d| Json::Object(d).to_string())
            .unwrap_or_default();
        out.rows = super::explain::rows_message(read.rows);
    }
    Ok(Response::new(out))
}

/// The index mapping's `properties` the etl would create for `spec`: a flat pipeline's
/// from its root's columns, a tree's from its documents. `Err` lists conflicts.
fn mapping(
    spec: &PipelineSpec,
    plans: &[DocPlan],
) -> Result<serde_json::Map<String, Json>, Vec<String>> {
    if spec.is_flat() {
        let root = &plans[0].root.table;
        let (props, _) = sluice_mapping::properties(&root.infos, &spec.columns, &spec.fields);
        return Ok(props);
    }
    sluice_mapping::tree_properties(plans).map(|m| m.properties)
}

/// A problem as the spec's checks word it (`key: message`), split at its key.
fn keyed(p: &str) -> SpecProblem {
    match p.split_once(": ") {
        Some((key, message)) if !key.contains(' ') => problem(key, message),
        _ => problem("", p),
    }
}

fn problem(key: &str, message: &str) -> SpecProblem {
    SpecProblem {
        key: key.to_owned(),
        message: message.to_owned(),
    }
}
