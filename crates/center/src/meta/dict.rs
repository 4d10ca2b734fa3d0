//! The dynamic dictionary's words (`crate::dict`). Every change runs fenced by the
//! leader's epoch; a change of a dictionary's published set also moves its `changed_at`,
//! which IK's poller sees as `Last-Modified`.

use mysql_async::prelude::*;
use mysql_async::{Row, Transaction};

use super::{insert_event, Meta, MetaError};
use crate::dict::{Dictionary, Word};

const COLUMNS: &str = "dictionary, word, published,
    CAST(UNIX_TIMESTAMP(added_at) * 1000 AS SIGNED),
    CAST(COALESCE(UNIX_TIMESTAMP(published_at) * 1000, 0) AS SIGNED)";

/// What a dictionary serves: its published words in the order they were added, and when
/// that set last changed (milliseconds since the epoch; 0 when it never did).
pub struct Published {
    pub words: Vec<String>,
    pub changed_at_ms: i64,
}

impl Meta {
    /// Every word of `dictionary` (of both when `None`), in the order they were added.
    pub async fn words(&self, dictionary: Option<Dictionary>) -> Result<Vec<Word>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<Row> = match dictionary {
            Some(d) => {
                conn.exec(
                    format!("SELECT {COLUMNS} FROM dict_words WHERE dictionary = ? ORDER BY id"),
                    (d.name(),),
                )
                .await?
            }
            None => {
                conn.query(format!(
                    "SELECT {COLUMNS} FROM dict_words ORDER BY dictionary, id"
                ))
                .await?
            }
        };
        rows.into_iter().map(word_from_row).collect()
    }

    pub async fn published(&self, dictionary: Dictionary) -> Result<Published, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let words: Vec<String> = conn
            .exec(
                "SELECT word FROM dict_words WHERE dictionary = ? AND published = 1 ORDER BY id",
                (dictionary.name(),),
            )
            .await?;
        let changed_at_ms: Option<i64> = conn
            .exec_first(
                "SELECT CAST(UNIX_TIMESTAMP(changed_at) * 1000 AS SIGNED) FROM dict_changes WHERE dictionary = ?",
                (dictionary.name(),),
            )
            .await?;
        Ok(Published {
            words,
            changed_at_ms: changed_at_ms.unwrap_or(0),
        })
    }

    /// Adds `words` as drafts. Refuses (adding none) when any is already there.
    pub async fn add_words(
        &self,
        epoch: u64,
        dictionary: Dictionary,
        words: &[String],
    ) -> Result<Vec<Word>, MetaError> {
        let mut tx = self.fenced(epoch).await?;
        let present = locked(&mut tx, dictionary, words).await?;
        if !present.is_empty() {
            tx.rollback().await?;
            let named: Vec<String> = present.iter().map(Word::described).collect();
            return Err(MetaError::Refused(format!(
                "already in the {} dictionary: {}",
                dictionary.name(),
                named.join(", ")
            )));
        }
        tx.exec_batch(
            "INSERT INTO dict_words (dictionary, word) VALUES (?, ?)",
            words.iter().map(|w| (dictionary.name(), w)),
        )
        .await?;
        let message = format!("{} draft word(s) added", words.len());
        finish(tx, &self.origin, dictionary, &message, words).await
    }

    /// Replaces a draft word. A published word is served already: it can only be deleted.
    pub async fn edit_word(
        &self,
        epoch: u64,
        dictionary: Dictionary,
        word: &str,
        replacement: &str,
    ) -> Result<Word, MetaError> {
        let mut tx = self.fenced(epoch).await?;
        let both = [word.to_owned(), replacement.to_owned()];
        let present = locked(&mut tx, dictionary, &both).await?;
        let refusal = match present.iter().find(|w| w.word == word) {
            None => Some(format!("no word `{word}` in the {} dictionary", dictionary.name())),
            Some(w) if w.published => Some(format!(
                "`{word}` is published: published words cannot be edited, only deleted (then add the new one)"
            )),
            Some(_) if word != replacement && present.iter().any(|w| w.word == replacement) => {
                Some(format!("`{replacement}` is already in the {} dictionary", dictionary.name()))
            }
            Some(_) => None,
        };
        if let Some(refusal) = refusal {
            tx.rollback().await?;
            return Err(MetaError::Refused(refusal));
        }
        tx.exec_drop(
            "UPDATE dict_words SET word = ? WHERE dictionary = ? AND word = ?",
            (replacement, dictionary.name(), word),
        )
        .await?;
        let message = format!("draft `{word}` edited to `{replacement}`");
        let edited = finish(tx, &self.origin, dictionary, &message, &both[1..]).await?;
        Ok(edited.into_iter().next().expect("the edited word, locked"))
    }

    /// Publishes draft `words`; published ones stay as they are. Refuses unknown words.
    pub async fn publish_words(
        &self,
        epoch: u64,
        dictionary: Dictionary,
        words: &[String],
    ) -> Result<Vec<Word>, MetaError> {
        let (mut tx, present) = self.known(epoch, dictionary, words).await?;
        let drafts: Vec<&Word> = present.iter().filter(|w| !w.published).collect();
        tx.exec_batch(
            "UPDATE dict_words SET published = 1, published_at = CURRENT_TIMESTAMP(3)
             WHERE dictionary = ? AND word = ?",
            drafts.iter().map(|w| (dictionary.name(), &w.word)),
        )
        .await?;
        if !drafts.is_empty() {
            changed(&mut tx, dictionary).await?;
        }
        let message = format!("{} word(s) published", drafts.len());
        finish(tx, &self.origin, dictionary, &message, words).await
    }

    /// Deletes `words`, drafts or published; returns them as they were. Refuses unknown
    /// words.
    pub async fn delete_words(
        &self,
        epoch: u64,
        dictionary: Dictionary,
        words: &[String],
    ) -> Result<Vec<Word>, MetaError> {
        let (mut tx, present) = self.known(epoch, dictionary, words).await?;
        tx.exec_batch(
            "DELETE FROM dict_words WHERE dictionary = ? AND word = ?",
            words.iter().map(|w| (dictionary.name(), w)),
        )
        .await?;
        if present.iter().any(|w| w.published) {
            changed(&mut tx, dictionary).await?;
        }
        let message = format!("{} word(s) deleted", present.len());
        insert_event(
            &mut tx,
            &self.origin,
            "dictionary",
            &subject(dictionary),
            &message,
        )
        .await?;
        tx.commit().await?;
        Ok(present)
    }

    /// A fenced transaction holding every one of `words` locked, with their rows; a
    /// refusal naming those that are not in the dictionary.
    async fn known(
        &self,
        epoch: u64,
        dictionary: Dictionary,
        words: &[String],
    ) -> Result<(Transaction<'static>, Vec<Word>), MetaError> {
        let mut tx = self.fenced(epoch).await?;
        let present = locked(&mut tx, dictionary, words).await?;
        if let Some(refusal) = unknown(dictionary, words, &present) {
            tx.rollback().await?;
            return Err(MetaError::Refused(refusal));
        }
        Ok((tx, present))
    }
}

/// The rows of `words` that exist, locked for the rest of the transaction.
async fn locked(
    tx: &mut Transaction<'static>,
    dictionary: Dictionary,
    words: &[String],
) -> Result<Vec<Word>, MetaError> {
    if words.is_empty() {
        return Ok(Vec::new());
    }
    let marks = vec!["?"; words.len()].join(", ");
    let mut params: Vec<mysql_async::Value> = vec![dictionary.name().into()];
    params.extend(words.iter().map(|w| w.as_str().into()));
    let rows: Vec<Row> = tx
        .exec(
            format!(
                "SELECT {COLUMNS} FROM dict_words WHERE dictionary = ? AND word IN ({marks}) ORDER BY id FOR UPDATE"
            ),
            params,
        )
        .await?;
    rows.into_iter().map(word_from_row).collect()
}

fn unknown(dictionary: Dictionary, words: &[String], present: &[Word]) -> Option<String> {
    let missing: Vec<&str> = words
        .iter()
        .filter(|w| !present.iter().any(|p| &p.word == *w))
        .map(String::as_str)
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "not in the {} dictionary: {}",
            dictionary.name(),
            missing.join(", ")
        )
    })
}

async fn changed(tx: &mut Transaction<'static>, dictionary: Dictionary) -> Result<(), MetaError> {
    tx.exec_drop(
        "INSERT INTO dict_changes (dictionary) VALUES (?)
         ON DUPLICATE KEY UPDATE changed_at = CURRENT_TIMESTAMP(3)",
        (dictionary.name(),),
    )
    .await?;
    Ok(())
}

fn subject(dictionary: Dictionary) -> String {
    format!("dict/{}", dictionary.name())
}

/// Records the change, commits, and answers `words` as they now are.
async fn finish(
    mut tx: Transaction<'static>,
    origin: &str,
    dictionary: Dictionary,
    message: &str,
    words: &[String],
) -> Result<Vec<Word>, MetaError> {
    insert_event(&mut tx, origin, "dictionary", &subject(dictionary), message).await?;
    let now = locked(&mut tx, dictionary, words).await?;
    tx.commit().await?;
    Ok(now)
}

fn word_from_row(row: Row) -> Result<Word, MetaError> {
    let (dictionary, word, published, added_at_ms, published_at_ms): (
        String,
        String,
        bool,
        i64,
        i64,
    ) = mysql_async::from_row_opt(row)
        .map_err(|e| MetaError::Corrupt(format!("dict_words: {e}")))?;
    Ok(Word {
        dictionary: Dictionary::parse(&dictionary)
            .map_err(|e| MetaError::Corrupt(format!("dict_words.dictionary: {e}")))?,
        word,
        published,
        added_at_ms,
        published_at_ms,
    })
}
