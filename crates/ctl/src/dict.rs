//! `sluicectl dict`: the IK analyzer's dynamic dictionaries (extension and stop words).

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use sluice_proto::v1::*;

use crate::{ago, print, Conn, Output};

#[derive(Subcommand)]
pub enum DictCmd {
    /// Every word with its state (draft or published).
    List {
        /// Only this dictionary: `ext` (extension words) or `stop` (stop words).
        #[arg(long, default_value = "")]
        dictionary: String,
    },
    /// Adds draft words: not served until published.
    Add(WordsArgs),
    /// Replaces a draft word (published words can only be deleted).
    Edit {
        #[command(flatten)]
        which: Which,
        word: String,
        replacement: String,
    },
    /// Publishes draft words: every center serves them to IK's poller from then on.
    Publish(WordsArgs),
    /// Deletes words, drafts or published.
    Delete(WordsArgs),
}

#[derive(Args)]
pub struct Which {
    /// `ext` (extension words, IK's `remote_ext_dict`) or `stop` (`remote_ext_stopwords`).
    #[arg(long, default_value = "ext")]
    dictionary: String,
}

#[derive(Args)]
pub struct WordsArgs {
    #[command(flatten)]
    which: Which,
    #[arg(required = true)]
    words: Vec<String>,
}

impl WordsArgs {
    fn request(&self) -> WordsRequest {
        WordsRequest {
            dictionary: self.which.dictionary.clone(),
            words: self.words.clone(),
        }
    }
}

pub async fn run(conn: &mut Conn<'_>, out: Output, cmd: &DictCmd) -> anyhow::Result<()> {
    match cmd {
        DictCmd::List { dictionary } => {
            let req = ListWordsRequest {
                dictionary: dictionary.clone(),
            };
            let r = conn
                .call_with(req, |mut c, req| async move { c.list_words(req).await })
                .await?;
            show(out, &r.words, "");
        }
        DictCmd::Add(a) => {
            let req = a.request();
            let r = conn
                .call_with(req, |mut c, req| async move { c.add_words(req).await })
                .await?;
            show(out, &r.words, "");
        }
        DictCmd::Edit {
            which,
            word,
            replacement,
        } => {
            let req = EditWordRequest {
                dictionary: which.dictionary.clone(),
                word: word.clone(),
                replacement: replacement.clone(),
            };
            let w = conn
                .call_with(req, |mut c, req| async move { c.edit_word(req).await })
                .await?;
            show(out, &[w], "");
        }
        DictCmd::Publish(a) => {
            let req = a.request();
            let r = conn
                .call_with(req, |mut c, req| async move { c.publish_words(req).await })
                .await?;
            show(out, &r.words, "");
        }
        DictCmd::Delete(a) => {
            let req = a.request();
            let r = conn
                .call_with(req, |mut c, req| async move { c.delete_words(req).await })
                .await?;
            show(out, &r.words, "deleted");
        }
    }
    Ok(())
}

/// The words as a table; `outcome` replaces their state (e.g. `deleted`).
fn show(out: Output, words: &[Word], outcome: &str) {
    let state = |w: &Word| {
        if outcome.is_empty() {
            w.state.clone()
        } else {
            outcome.to_owned()
        }
    };
    print(
        out,
        &["dictionary", "word", "state", "added", "published"],
        words
            .iter()
            .map(|w| {
                vec![
                    w.dictionary.clone(),
                    w.word.clone(),
                    state(w),
                    ago(w.added_at_ms),
                    ago(w.published_at_ms),
                ]
            })
            .collect(),
        Value::Array(
            words
                .iter()
                .map(|w| {
                    json!({"dictionary": w.dictionary, "word": w.word, "state": state(w),
                           "added_at_ms": w.added_at_ms, "published_at_ms": w.published_at_ms})
                })
                .collect(),
        ),
    );
}
