//! The IK analyzer's dynamic dictionaries: words managed with `sluicectl dict` (drafts
//! editable, published ones only deletable), served by every center in the contract IK's
//! remote-dictionary poller follows. The test plays that poller against two centers.

use reqwest::header::{self, HeaderMap};
use reqwest::StatusCode;
use serde_json::Value;
use sluice_integration_tests::ports::dictionary_port;
use sluice_integration_tests::{Cluster, TestCtx};

/// IK's `Monitor`, as it polls `remote_ext_dict` / `remote_ext_stopwords`: a `HEAD` with
/// the validators of its last answer; when the answer is 200 and its `Last-Modified` or
/// `ETag` differs, a `GET` of the list (one word per line, in the charset the
/// `Content-Type` names, UTF-8 by default), each line trimmed, empty ones skipped.
struct IkPoller {
    url: String,
    client: reqwest::Client,
    last_modified: Option<String>,
    etag: Option<String>,
    words: Vec<String>,
}

impl IkPoller {
    fn new(center_api: &str, dictionary: &str) -> Self {
        let port: u16 = center_api.rsplit(':').next().unwrap().parse().unwrap();
        Self {
            url: format!(
                "http://127.0.0.1:{}/dict/{dictionary}",
                dictionary_port(port)
            ),
            client: reqwest::Client::new(),
            last_modified: None,
            etag: None,
            words: Vec::new(),
        }
    }

    /// One round; whether it reloaded the words.
    async fn poll(&mut self) -> bool {
        let mut head = self.client.head(&self.url);
        if let Some(lm) = &self.last_modified {
            head = head.header(header::IF_MODIFIED_SINCE, lm);
        }
        if let Some(tag) = &self.etag {
            head = head.header(header::IF_NONE_MATCH, tag);
        }
        let answer = head.send().await.expect("HEAD");
        match answer.status() {
            StatusCode::NOT_MODIFIED => false,
            StatusCode::OK => {
                let (lm, tag) = validators(answer.headers());
                if lm == self.last_modified && tag == self.etag {
                    return false;
                }
                self.words = self.fetch().await;
                (self.last_modified, self.etag) = (lm, tag);
                true
            }
            other => panic!("HEAD {}: {other}", self.url),
        }
    }

    async fn fetch(&self) -> Vec<String> {
        let answer = self.client.get(&self.url).send().await.expect("GET");
        assert_eq!(answer.status(), StatusCode::OK, "GET {}", self.url);
        let content_type = answer.headers()[header::CONTENT_TYPE].to_str().unwrap();
        assert!(
            content_type.to_ascii_lowercase().contains("charset=utf-8"),
            "IK reads the charset from the Content-Type: {content_type}"
        );
        let body = answer.bytes().await.expect("body");
        assert!(!body.starts_with(b"\xEF\xBB\xBF"), "no byte-order mark");
        let text = std::str::from_utf8(&body).expect("UTF-8");
        assert!(text.is_empty() || text.ends_with('\n'), "{text:?}");
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    }
}

fn validators(h: &HeaderMap) -> (Option<String>, Option<String>) {
    let text = |name| h.get(name).map(|v| v.to_str().unwrap().to_owned());
    let (lm, tag) = (text(header::LAST_MODIFIED), text(header::ETAG));
    assert!(
        lm.is_some() && tag.is_some(),
        "IK needs both validators: {h:?}"
    );
    (lm, tag)
}

fn words(cluster: &Cluster, dictionary: &str) -> Vec<(String, String)> {
    let listed = cluster
        .ctl(&["dict", "list", "--dictionary", dictionary])
        .unwrap();
    listed
        .as_array()
        .unwrap()
        .iter()
        .map(|w: &Value| {
            (
                w["word"].as_str().unwrap().to_owned(),
                w["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(w, s)| (w.to_string(), s.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ik_polls_published_words_from_every_center() {
    let ctx = TestCtx::new("dict").await;
    let cluster = ctx.start_cluster(2, 0).await;
    let mut ext: Vec<IkPoller> = cluster
        .addrs
        .iter()
        .map(|a| IkPoller::new(a, "ext"))
        .collect();
    let mut stop = IkPoller::new(&cluster.addrs[1], "stop");

    // The first poll loads the (empty) lists, as IK does at start.
    for p in ext.iter_mut().chain([&mut stop]) {
        assert!(p.poll().await, "the first poll loads");
        assert!(p.words.is_empty());
        assert!(!p.poll().await, "nothing changed");
    }

    // Drafts are not served, and stay editable.
    cluster
        .ctl(&["dict", "add", "蓝牙耳机", "降噪", "  kubernetes "])
        .unwrap();
    cluster
        .ctl(&["dict", "add", "--dictionary", "stop", "的", "了"])
        .unwrap();
    cluster.ctl(&["dict", "edit", "降噪", "主动降噪"]).unwrap();
    for p in &mut ext {
        assert!(!p.poll().await, "drafts are not served");
    }
    assert_eq!(
        words(&cluster, "ext"),
        pairs(&[
            ("蓝牙耳机", "draft"),
            ("主动降噪", "draft"),
            ("kubernetes", "draft")
        ])
    );

    // Published, every center serves them, with the same validators.
    cluster
        .ctl(&["dict", "publish", "蓝牙耳机", "主动降噪"])
        .unwrap();
    for p in &mut ext {
        assert!(p.poll().await, "published words are served");
        assert_eq!(p.words, ["蓝牙耳机", "主动降噪"]);
    }
    assert_eq!(
        (&ext[0].last_modified, &ext[0].etag),
        (&ext[1].last_modified, &ext[1].etag),
        "every center answers alike"
    );
    assert!(!stop.poll().await, "the other dictionary did not change");

    // Published words can only be deleted; mistakes are refused with the reason.
    let refusals = [
        (
            vec!["dict", "edit", "蓝牙耳机", "耳机"],
            "published words cannot be edited",
        ),
        (
            vec!["dict", "add", "主动降噪", "新词"],
            "already in the ext dictionary: 主动降噪 (published)",
        ),
        (vec!["dict", "add", "two\nlines"], "U+000A"),
        (
            vec!["dict", "publish", "没有这个词"],
            "not in the ext dictionary: 没有这个词",
        ),
        (
            vec!["dict", "list", "--dictionary", "synonyms"],
            "no dictionary `synonyms`",
        ),
    ];
    for (args, reason) in refusals {
        let e = cluster.ctl(&args).unwrap_err();
        assert!(e.contains(reason), "{args:?}: {e}");
    }
    assert_eq!(
        words(&cluster, "ext"),
        pairs(&[
            ("蓝牙耳机", "published"),
            ("主动降噪", "published"),
            ("kubernetes", "draft")
        ]),
        "a refused call changes nothing (`新词` was not added either)"
    );

    cluster
        .ctl(&["dict", "publish", "--dictionary", "stop", "的"])
        .unwrap();
    assert!(stop.poll().await);
    assert_eq!(stop.words, ["的"]);

    cluster
        .ctl(&["dict", "delete", "蓝牙耳机", "kubernetes"])
        .unwrap();
    for p in &mut ext {
        assert!(p.poll().await, "a deleted published word leaves the list");
        assert_eq!(p.words, ["主动降噪"]);
    }
    assert!(!stop.poll().await);
    assert_eq!(words(&cluster, "ext"), pairs(&[("主动降噪", "published")]));
}
