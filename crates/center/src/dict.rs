//! The IK analyzer's dynamic dictionary: extension words and stop words, kept in the meta
//! database and served over HTTP by every center in the form IK's remote dictionary
//! polls (`remote_ext_dict`, `remote_ext_stopwords` in `IKAnalyzer.cfg.xml`).
//!
//! IK's poller sends `HEAD` every minute, with `If-Modified-Since` and `If-None-Match`
//! from its last answer, and fetches the list with `GET` when the `Last-Modified` or
//! `ETag` it gets differs. So:
//! - `Last-Modified` is when the dictionary's *published* set last changed, as the meta
//!   database recorded it: every center answers the same;
//! - `ETag` is a digest of the body: equal bodies, equal tags, on every center;
//! - the body is one word per line (`\n`), UTF-8 without a byte-order mark.
//!
//! A word is a draft until published (editable, not served); published, it is served and
//! can only be deleted.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::error::{CenterError, Result};
use crate::meta::Meta;

/// Words longer than this are refused (the column holds 255 characters).
const MAX_WORD_CHARS: usize = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dictionary {
    /// Extension words: IK's `remote_ext_dict`.
    Ext,
    /// Stop words: IK's `remote_ext_stopwords`.
    Stop,
}

impl Dictionary {
    pub const ALL: [Dictionary; 2] = [Dictionary::Ext, Dictionary::Stop];

    pub fn name(self) -> &'static str {
        match self {
            Dictionary::Ext => "ext",
            Dictionary::Stop => "stop",
        }
    }

    pub fn parse(name: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| {
                format!("no dictionary `{name}`: `ext` (extension words) or `stop` (stop words)")
            })
    }

    /// Where every center serves it.
    pub fn path(self) -> String {
        format!("/dict/{}", self.name())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Word {
    pub dictionary: Dictionary,
    pub word: String,
    pub published: bool,
    pub added_at_ms: i64,
    /// 0 while a draft.
    pub published_at_ms: i64,
}

impl Word {
    /// `word (published)`, for refusals.
    pub fn described(&self) -> String {
        let state = if self.published { "published" } else { "draft" };
        format!("{} ({state})", self.word)
    }
}

/// The word as stored: trimmed, and refused when it could not be served as one line.
pub fn check_word(raw: &str) -> Result<String, String> {
    let word = raw.trim();
    if word.is_empty() {
        return Err("an empty word".into());
    }
    if word.chars().count() > MAX_WORD_CHARS {
        return Err(format!(
            "`{word}` is longer than {MAX_WORD_CHARS} characters"
        ));
    }
    if let Some(c) = word.chars().find(|c| c.is_control() || *c == '\u{feff}') {
        return Err(format!(
            "`{}` holds U+{:04X}: a word is served as one line of text, without control characters or byte-order marks",
            word.escape_debug(),
            c as u32
        ));
    }
    Ok(word.to_owned())
}

/// Serves `/dict/ext` and `/dict/stop` on `listener` until `shutdown`.
pub async fn serve(
    meta: Meta,
    listener: tokio::net::TcpListener,
    limits: sluice_runtime::listen::Limits,
    shutdown: CancellationToken,
) -> Result<()> {
    let mut app = axum::Router::new();
    for dictionary in Dictionary::ALL {
        let meta = meta.clone();
        app = app.route(
            &dictionary.path(),
            get(move |headers: HeaderMap| {
                let meta = meta.clone();
                async move { answer(&meta, dictionary, &headers).await }
            }),
        );
    }
    let proxies = sluice_runtime::listen::SharedPeers::default();
    sluice_runtime::listen::serve_http(
        listener,
        app,
        None,
        limits,
        proxies,
        "dictionaries",
        shutdown,
    )
    .await;
    Ok(())
}

/// Binds the dictionary endpoint's address (`center.dictionary_listen`).
pub async fn bind(listen: SocketAddr) -> Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        CenterError::definite(format!(
            "center.dictionary_listen: cannot listen on {listen}: {e}"
        ))
    })?;
    let addr = listener.local_addr().unwrap_or(listen);
    tracing::info!(%addr, "serving the IK dictionaries at /dict/ext and /dict/stop");
    Ok(listener)
}

async fn answer(meta: &Meta, dictionary: Dictionary, request: &HeaderMap) -> Response {
    let published = match meta.published(dictionary).await {
        Ok(p) => p,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    };
    let list = Listing::new(&published.words, published.changed_at_ms);
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, header_value(&list.etag));
    headers.insert(
        header::LAST_MODIFIED,
        header_value(&httpdate::fmt_http_date(list.modified)),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if list.unchanged_for(request) {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    (StatusCode::OK, headers, list.body).into_response()
}

fn header_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).expect("ASCII without control characters")
}

/// One answer: the body and its validators.
struct Listing {
    body: String,
    etag: String,
    /// Whole seconds, as `Last-Modified` carries it.
    modified: SystemTime,
}

impl Listing {
    fn new(words: &[String], changed_at_ms: i64) -> Self {
        let body: String = words.iter().map(|w| format!("{w}\n")).collect();
        let etag = format!("\"{:016x}\"", fnv1a(body.as_bytes()));
        let modified = UNIX_EPOCH + Duration::from_secs(changed_at_ms.max(0) as u64 / 1000);
        Self {
            body,
            etag,
            modified,
        }
    }

    /// Whether the poller's copy is current: its `If-None-Match` names our tag, or (when
    /// it sent none) its `If-Modified-Since` is not older than our `Last-Modified`.
    fn unchanged_for(&self, request: &HeaderMap) -> bool {
        let text = |name| {
            request
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
        };
        match text(header::IF_NONE_MATCH) {
            Some(tags) => tags
                .split(',')
                .map(str::trim)
                .any(|t| t == "*" || t.trim_start_matches("W/") == self.etag),
            None => text(header::IF_MODIFIED_SINCE)
                .and_then(|d| httpdate::parse_http_date(d).ok())
                .is_some_and(|since| self.modified <= since),
        }
    }
}

/// 64-bit FNV-1a: a stable digest for the `ETag` (not a security boundary).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The API's view of the dictionary; `dictionary` names one or is empty for both.
pub fn requested(dictionary: &str) -> Result<Option<Dictionary>, String> {
    if dictionary.is_empty() {
        Ok(None)
    } else {
        Dictionary::parse(dictionary).map(Some)
    }
}

/// Checks every word of a request, naming each bad one; at most 1,000 per call.
pub fn checked(words: &[String]) -> Result<Vec<String>, String> {
    if words.is_empty() {
        return Err("no words given".into());
    }
    if words.len() > 1000 {
        return Err(format!("{} words in one call; at most 1000", words.len()));
    }
    let mut out: Vec<String> = Vec::with_capacity(words.len());
    let mut problems = Vec::new();
    for raw in words {
        match check_word(raw) {
            Ok(w) if !out.contains(&w) => out.push(w),
            Ok(_) => {}
            Err(e) => problems.push(e),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_is_one_clean_line() {
        assert_eq!(check_word("  中华人民共和国 ").unwrap(), "中华人民共和国");
        for bad in ["", "  ", "two\nlines", "tab\there", "\u{feff}bom"] {
            assert!(check_word(bad).is_err(), "{bad:?} was taken");
        }
        assert!(check_word(&"字".repeat(256)).is_err());
        let e = checked(&["ok".into(), "ba\rd".into()]).unwrap_err();
        assert!(e.contains("U+000D"), "{e}");
        assert_eq!(checked(&["a".into(), " a".into()]).unwrap(), vec!["a"]);
    }

    #[test]
    fn the_validators_follow_the_published_set() {
        let words = vec!["蓝牙耳机".to_owned(), "降噪".to_owned()];
        let list = Listing::new(&words, 1_700_000_000_500);
        assert_eq!(list.body, "蓝牙耳机\n降噪\n");
        assert!(!list.body.starts_with('\u{feff}'));
        assert_eq!(
            list.etag,
            Listing::new(&words, 0).etag,
            "the tag is the content's"
        );
        assert_ne!(list.etag, Listing::new(&words[..1], 0).etag);
        let mut asked = HeaderMap::new();
        assert!(!list.unchanged_for(&asked));
        asked.insert(header::IF_NONE_MATCH, header_value(&list.etag));
        assert!(list.unchanged_for(&asked));
        asked.insert(header::IF_NONE_MATCH, header_value("\"0\""));
        assert!(
            !list.unchanged_for(&asked),
            "a stale tag wins over the date"
        );
        let mut dated = HeaderMap::new();
        let date = httpdate::fmt_http_date(list.modified);
        dated.insert(header::IF_MODIFIED_SINCE, header_value(&date));
        assert!(list.unchanged_for(&dated));
        let earlier = httpdate::fmt_http_date(list.modified - Duration::from_secs(1));
        dated.insert(header::IF_MODIFIED_SINCE, header_value(&earlier));
        assert!(!list.unchanged_for(&dated));
    }
}
