//! The IK dictionaries: list, add, edit, publish, delete.

use sluice_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::dict::{self, Dictionary};
use crate::meta::{Meta, MetaError};

use super::common::*;

pub(super) async fn list_words(
    api: &AdminApi,
    req: Request<ListWordsRequest>,
) -> Result<Response<ListWordsResponse>, Status> {
    let dictionary =
        dict::requested(&req.into_inner().dictionary).map_err(Status::invalid_argument)?;
    let words = api.shared.meta.words(dictionary).await.map_err(meta_err)?;
    Ok(Response::new(words_message(&words)))
}

pub(super) async fn add_words(
    api: &AdminApi,
    req: Request<WordsRequest>,
) -> Result<Response<ListWordsResponse>, Status> {
    change_words(api, req, async |meta, epoch, dictionary, words| {
        meta.add_words(epoch, dictionary, &words).await
    })
    .await
}

/// A change of the words `req` names, checked, made by the leader with `change`; the
/// answer is the words it returns.
async fn change_words(
    api: &AdminApi,
    req: Request<WordsRequest>,
    change: impl AsyncFnOnce(Meta, u64, Dictionary, Vec<String>) -> Result<Vec<dict::Word>, MetaError>,
) -> Result<Response<ListWordsResponse>, Status> {
    super::guard::about(
        &req,
        &audit_target(&req.get_ref().dictionary, &req.get_ref().words),
    );
    let (dictionary, words) = words_request(req.into_inner())?;
    let epoch = api.writable().await?;
    let changed = change(api.shared.meta.clone(), epoch, dictionary, words).await;
    Ok(Response::new(words_message(&changed.map_err(meta_err)?)))
}

pub(super) async fn edit_word(
    api: &AdminApi,
    req: Request<EditWordRequest>,
) -> Result<Response<Word>, Status> {
    super::guard::about(
        &req,
        &audit_target(&req.get_ref().dictionary, &[req.get_ref().word.clone()]),
    );
    let req = req.into_inner();
    let dictionary = Dictionary::parse(&req.dictionary).map_err(Status::invalid_argument)?;
    let [word, replacement] = [&req.word, &req.replacement]
        .map(|w| dict::check_word(w).map_err(Status::invalid_argument));
    let (word, replacement) = (word?, replacement?);
    let epoch = api.writable().await?;
    let meta = &api.shared.meta;
    let edited = meta.edit_word(epoch, dictionary, &word, &replacement).await;
    Ok(Response::new(word_message(&edited.map_err(meta_err)?)))
}

pub(super) async fn publish_words(
    api: &AdminApi,
    req: Request<WordsRequest>,
) -> Result<Response<ListWordsResponse>, Status> {
    change_words(api, req, async |meta, epoch, dictionary, words| {
        meta.publish_words(epoch, dictionary, &words).await
    })
    .await
}

pub(super) async fn delete_words(
    api: &AdminApi,
    req: Request<WordsRequest>,
) -> Result<Response<ListWordsResponse>, Status> {
    change_words(api, req, async |meta, epoch, dictionary, words| {
        meta.delete_words(epoch, dictionary, &words).await
    })
    .await
}

/// How the audit log names a change of `words` in `dictionary`: `dict/<name>: <words>`.
fn audit_target(dictionary: &str, words: &[String]) -> String {
    format!("dict/{}: {}", dictionary.trim(), words.join(", "))
}

pub(super) fn words_request(req: WordsRequest) -> Result<(Dictionary, Vec<String>), Status> {
    let dictionary = Dictionary::parse(&req.dictionary).map_err(Status::invalid_argument)?;
    let words = dict::checked(&req.words).map_err(Status::invalid_argument)?;
    Ok((dictionary, words))
}

pub(super) fn word_message(w: &dict::Word) -> Word {
    Word {
        dictionary: w.dictionary.name().into(),
        word: w.word.clone(),
        state: if w.published { "published" } else { "draft" }.into(),
        added_at_ms: w.added_at_ms,
        published_at_ms: w.published_at_ms,
    }
}

pub(super) fn words_message(words: &[dict::Word]) -> ListWordsResponse {
    ListWordsResponse {
        words: words.iter().map(word_message).collect(),
    }
}
