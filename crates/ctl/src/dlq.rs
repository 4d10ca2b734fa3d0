//! `sluicectl dlq`: dead letters, and their replay.

use clap::Subcommand;
use serde_json::json;
use sluice_proto::v1::*;

use crate::{ago, or_dash, print, Conn, Output};

#[derive(Subcommand)]
pub enum DlqCmd {
    /// Letters not replayed yet, newest first, each with its reason.
    List {
        /// Only this pipeline's.
        #[arg(long, default_value = "")]
        pipeline: String,
        /// At most this many (the center shows at most 1000 a page).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Past this many of the newest (the next page).
        #[arg(long, default_value_t = 0)]
        skip: u32,
        /// Letters already replayed too.
        #[arg(long)]
        include_replayed: bool,
    },
    /// Publishes letters' events again once their cause is fixed; their versions keep
    /// them from undoing newer changes. Each letter once, unless named by `--id`.
    Replay {
        /// Every letter of this pipeline not replayed yet.
        #[arg(long, default_value = "")]
        pipeline: String,
        /// This letter (`topic:partition:offset`, from `dlq list`), even if replayed before.
        #[arg(long = "id")]
        ids: Vec<String>,
        /// Every letter not replayed yet.
        #[arg(long, conflicts_with_all = ["pipeline", "ids"])]
        all: bool,
    },
}

pub async fn run(conn: &mut Conn<'_>, out: Output, cmd: &DlqCmd) -> anyhow::Result<()> {
    match cmd {
        DlqCmd::List {
            pipeline,
            limit,
            skip,
            include_replayed,
        } => {
            let req = ListDeadLettersRequest {
                pipeline: pipeline.clone(),
                limit: *limit,
                include_replayed: *include_replayed,
                skip: *skip,
            };
            let r = conn
                .call_with(
                    req,
                    |mut c, req| async move { c.list_dead_letters(req).await },
                )
                .await?;
            print_letters(out, &r);
        }
        DlqCmd::Replay { pipeline, ids, all } => {
            let req = ReplayDeadLettersRequest {
                pipeline: pipeline.clone(),
                ids: ids.clone(),
                all: *all,
            };
            let r = conn
                .call_with(
                    req,
                    |mut c, req| async move { c.replay_dead_letters(req).await },
                )
                .await?;
            print(
                out,
                &["letter", "outcome"],
                r.replayed
                    .iter()
                    .map(|id| vec![id.clone(), "replayed".to_owned()])
                    .chain(r.refused.iter().map(|why| {
                        let (id, why) = why.split_once(": ").unwrap_or((why, ""));
                        vec![id.to_owned(), format!("refused: {why}")]
                    }))
                    .collect(),
                json!({"replayed": r.replayed, "refused": r.refused, "truncated": r.truncated}),
            );
            if out == Output::Table && r.truncated {
                eprintln!(
                    "not every letter was read (the read stops at its bounds): those left unread were not replayed"
                );
            }
        }
    }
    Ok(())
}

/// The letters listed, and on a terminal how many more matched than were shown.
fn print_letters(out: Output, r: &ListDeadLettersResponse) {
    let letter_json = |l: &DeadLetter| {
        json!({"id": l.id, "at_ms": l.at_ms, "reason": l.reason, "pipeline": l.pipeline,
               "source": l.source, "table": l.table, "key": l.key, "origin": l.origin,
               "not_replayable": l.not_replayable, "replayed_at_ms": l.replayed_at_ms})
    };
    print(
        out,
        &["id", "when", "pipeline", "table", "key", "reason", "replay"],
        r.letters
            .iter()
            .map(|l| {
                let replay = match (l.replayed_at_ms, l.not_replayable.is_empty()) {
                    (0, true) => "yes".to_owned(),
                    (0, false) => format!("no: {}", l.not_replayable),
                    (at, _) => format!("replayed {}", ago(at)),
                };
                vec![
                    l.id.clone(),
                    ago(l.at_ms),
                    or_dash(&l.pipeline),
                    or_dash(&l.table),
                    or_dash(&l.key),
                    l.reason.clone(),
                    replay,
                ]
            })
            .collect(),
        json!({"letters": r.letters.iter().map(letter_json).collect::<Vec<_>>(),
               "matched": r.matched, "truncated": r.truncated}),
    );
    if out == Output::Table && (r.truncated || r.matched > r.letters.len() as u64) {
        eprintln!(
            "{} of {} matching letters shown{}",
            r.letters.len(),
            r.matched,
            if r.truncated {
                "; not every letter was read (the read stops at its bounds)"
            } else {
                ""
            }
        );
    }
}
