//! `sluicectl delayed`: the changes of delayed relations waiting for the delayed job,
//! and the job itself.

use anyhow::bail;
use clap::Subcommand;
use serde_json::{json, Value};
use sluice_model::RunState;
use sluice_proto::v1::*;

use crate::check::{print_checks, until_done};
use crate::{ago, print, Conn, Output};

#[derive(Subcommand)]
pub enum DelayedCmd {
    /// The changes waiting (or being applied), oldest first: each changed row once, with
    /// how many changes it folds.
    List {
        pipeline: String,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Apply them now instead of at the pipeline's `delayed.daily_at`: the documents they
    /// reach are rebuilt, in chunks spread over the workers.
    Apply {
        pipeline: String,
        /// Follow it with a progress bar; exit 1 when it failed.
        #[arg(long)]
        wait: bool,
    },
    /// The pipeline's delayed jobs, newest first.
    Jobs {
        pipeline: String,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
}

pub async fn run(conn: &mut Conn<'_>, out: Output, cmd: &DelayedCmd) -> anyhow::Result<()> {
    match cmd {
        DelayedCmd::List { pipeline, limit } => {
            let req = ListDelayedRequest {
                pipeline: pipeline.clone(),
                limit: *limit,
            };
            let r = conn
                .call_with(req, |mut c, req| async move { c.list_delayed(req).await })
                .await?;
            list(out, &r);
        }
        DelayedCmd::Apply { pipeline, wait } => {
            let req = ApplyDelayedRequest {
                pipeline: pipeline.clone(),
            };
            let c = conn
                .call_with(req, |mut c, req| async move { c.apply_delayed(req).await })
                .await?;
            let c = if *wait {
                until_done(conn, c.id, out).await?
            } else {
                c
            };
            print_checks(out, std::slice::from_ref(&c));
            if c.state_of() == Some(RunState::Failed) {
                bail!("delayed job {} failed: {}", c.id, c.error);
            }
        }
        DelayedCmd::Jobs { pipeline, limit } => {
            crate::check::list(conn, out, pipeline, "delayed", *limit).await?;
        }
    }
    Ok(())
}

fn list(out: Output, r: &ListDelayedResponse) {
    print(
        out,
        &[
            "relation", "values", "version", "changes", "first", "last", "state",
        ],
        r.changes
            .iter()
            .map(|c| {
                vec![
                    c.node.clone(),
                    c.values.clone(),
                    c.version.to_string(),
                    c.changes.to_string(),
                    ago(c.first_seen_ms),
                    ago(c.last_seen_ms),
                    if c.job == 0 {
                        "waiting".into()
                    } else {
                        format!("job {}", c.job)
                    },
                ]
            })
            .collect(),
        json!({
            "pending": r.pending,
            "applying": r.applying,
            "changes": r.changes.iter().map(|c| json!({
                "relation": c.node, "values": serde_json::from_str::<Value>(&c.values).unwrap_or(Value::Null),
                "version": c.version, "changes": c.changes, "first_seen_ms": c.first_seen_ms,
                "last_seen_ms": c.last_seen_ms, "job": c.job,
            })).collect::<Vec<_>>(),
        }),
    );
    if out == Output::Table {
        println!("{} waiting, {} being applied", r.pending, r.applying);
    }
}
