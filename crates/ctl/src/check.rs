//! `sluicectl pipelines check` and `pipelines checks`: consistency checks of an index
//! against MySQL.

use std::time::Duration;

use anyhow::bail;
use serde_json::{json, Value};
use sluice_model::{RunKind, RunState};
use sluice_proto::v1::*;

use crate::progress::{Progress, Step};
use crate::{ago, print, Conn, Output};

/// A check (or compare) that started; with `wait`, follows it with a progress bar and
/// fails (exit code 1) when it failed or found drift it did not repair.
pub async fn started(conn: &mut Conn<'_>, out: Output, c: Check, wait: bool) -> anyhow::Result<()> {
    if !wait {
        print_checks(out, &[c]);
        return Ok(());
    }
    let c = until_done(conn, c.id, out).await?;
    print_checks(out, std::slice::from_ref(&c));
    if c.state_of() == Some(RunState::Failed) {
        bail!("check {} failed: {}", c.id, c.error);
    }
    let drift = c.missing + c.extra + c.different;
    if drift > 0 && !c.repair {
        let command = if c.kind_of() == Some(RunKind::Compare) {
            "compare"
        } else {
            "check"
        };
        bail!(
            "{command} {} found {drift} documents wrong (repair: sluicectl pipelines {command} {} --repair)",
            c.id,
            c.pipeline
        );
    }
    Ok(())
}

/// A pipeline's checks or delayed jobs (`kind`; empty: both), newest first.
pub async fn list(
    conn: &mut Conn<'_>,
    out: Output,
    pipeline: &str,
    kind: &str,
    limit: u32,
) -> anyhow::Result<()> {
    let req = ListChecksRequest {
        pipeline: pipeline.to_owned(),
        limit,
        kind: kind.to_owned(),
    };
    let r = conn
        .call_with(req, |mut c, req| async move { c.list_checks(req).await })
        .await?;
    print_checks(out, &r.checks);
    Ok(())
}

/// A progress bar until the check (or delayed job) ends; returns it as it ended.
pub async fn until_done(conn: &mut Conn<'_>, id: u64, out: Output) -> anyhow::Result<Check> {
    let mut progress: Option<Progress> = None;
    loop {
        let c = conn
            .call(|mut c| async move { c.get_check(GetCheckRequest { id }).await })
            .await?;
        if out == Output::Table {
            progress
                .get_or_insert_with(|| Progress::stderr(check_label(&c)))
                .show(check_step(&c));
        }
        if c.state_of() != Some(RunState::Running) {
            if let Some(p) = progress {
                p.finish();
            }
            return Ok(c);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn check_label(c: &Check) -> String {
    if c.kind_of() == Some(RunKind::Delayed) {
        format!("delayed job {} of {}", c.id, c.pipeline)
    } else if c.kind_of() == Some(RunKind::Resync) {
        format!("resync {} of {} ({})", c.id, c.pipeline, c.scope)
    } else {
        format!("{} {} of {} v{}", c.kind, c.id, c.pipeline, c.version)
    }
}

fn check_step(c: &Check) -> Step {
    let took = (sluice_model::now_ms() - c.started_at_ms).max(1) as f64 / 1000.0;
    let documents = format!(
        "{}/{} chunks, {} documents ({:.0}/s)",
        c.chunks_done,
        c.chunks,
        c.keys,
        c.keys as f64 / took
    );
    let detail = if c.kind_of() == Some(RunKind::Delayed) {
        format!("{} changes, {documents}, {} rebuilt", c.changes, c.repaired)
    } else if c.kind_of() == Some(RunKind::Resync) {
        format!("{documents}, {} rebuilt", c.repaired)
    } else {
        format!(
            "{documents}, {} missing, {} extra, {} different",
            c.missing, c.extra, c.different
        )
    };
    Step {
        done: u64::from(c.chunks_done),
        total: u64::from(c.chunks),
        stage: c.state.clone(),
        detail,
    }
}

pub fn print_checks(out: Output, checks: &[Check]) {
    print(
        out,
        &[
            "id",
            "kind",
            "version",
            "scope",
            "state",
            "by",
            "started",
            "chunks",
            "documents",
            "missing",
            "extra",
            "different",
            "skipped",
            "repaired",
        ],
        checks
            .iter()
            .map(|c| {
                vec![
                    c.id.to_string(),
                    c.kind.clone(),
                    format!("v{}", c.version),
                    if c.kind_of() == Some(RunKind::Delayed) {
                        format!("{} changes", c.changes)
                    } else if !c.scope.is_empty() {
                        c.scope.clone()
                    } else if c.since.is_empty() {
                        "full".into()
                    } else {
                        format!("since {}", c.since)
                    },
                    c.state.clone(),
                    c.trigger.clone(),
                    ago(c.started_at_ms),
                    format!("{}/{}", c.chunks_done, c.chunks),
                    c.keys.to_string(),
                    c.missing.to_string(),
                    c.extra.to_string(),
                    c.different.to_string(),
                    c.skipped.to_string(),
                    if c.repair {
                        c.repaired.to_string()
                    } else {
                        "-".into()
                    },
                ]
            })
            .collect(),
        Value::Array(checks.iter().map(check_json).collect()),
    );
    if out == Output::Table {
        for c in checks {
            if !c.error.is_empty() {
                println!("{} {}: {}", c.kind, c.id, c.error);
            }
            for e in &c.examples {
                println!("{} {}: {} {} {}", c.kind, c.id, e.kind, e.id, e.detail);
            }
            if let Some(l) = &c.live {
                println!(
                    "{} {}: against live v{}: {} same, {} only new, {} only live, {} different, {} skipped",
                    c.kind, c.id, l.version, l.same, l.only_new, l.only_live, l.different, l.skipped
                );
                for e in &l.examples {
                    println!("{} {}: {} {} {}", c.kind, c.id, e.kind, e.id, e.detail);
                }
            }
        }
    }
}

fn check_json(c: &Check) -> Value {
    json!({
        "id": c.id, "kind": c.kind, "scope": c.scope, "changes": c.changes, "pipeline": c.pipeline, "version": c.version, "since": c.since,
        "repair": c.repair, "state": c.state, "trigger": c.trigger,
        "started_at_ms": c.started_at_ms, "finished_at_ms": c.finished_at_ms,
        "chunks": c.chunks, "chunks_done": c.chunks_done, "documents": c.keys,
        "missing": c.missing, "extra": c.extra, "different": c.different,
        "skipped": c.skipped, "repaired": c.repaired, "error": c.error,
        "examples": examples_json(&c.examples),
        "live": c.live.as_ref().map(|l| json!({
            "version": l.version, "same": l.same, "only_new": l.only_new,
            "only_live": l.only_live, "different": l.different, "skipped": l.skipped,
            "examples": examples_json(&l.examples),
        })),
    })
}

fn examples_json(examples: &[CheckExample]) -> Vec<Value> {
    examples
        .iter()
        .map(|e| json!({"kind": e.kind, "id": e.id, "detail": e.detail}))
        .collect()
}
