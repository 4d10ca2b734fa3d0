//! A second tree, of another shape than the shop: `articles` (the root) → one-to-one
//! `authors`; one-to-many `comments` (nested), each with its commenter (one-to-one
//! `users`); and tags many-to-many through the link table `article_tags` (one-to-many,
//! each with its one-to-one `tags` row). A tag renamed reaches its articles two levels
//! down, through the link table.

use serde_json::{json, Value};

use crate::{shop, TestCtx};

/// The blog's tables in the test database.
pub async fn schema(ctx: &TestCtx) {
    for ddl in [
        "CREATE TABLE authors (id INT PRIMARY KEY, name VARCHAR(64) NOT NULL)",
        "CREATE TABLE users (id INT PRIMARY KEY, name VARCHAR(64) NOT NULL)",
        "CREATE TABLE articles (id BIGINT PRIMARY KEY, title VARCHAR(128) NOT NULL,
            author_id INT NULL, body TEXT, KEY (author_id))",
        "CREATE TABLE comments (id BIGINT PRIMARY KEY, article_id BIGINT NOT NULL,
            user_id INT NOT NULL, text VARCHAR(255) NOT NULL, KEY (article_id))",
        "CREATE TABLE tags (id INT PRIMARY KEY, name VARCHAR(64) NOT NULL)",
        "CREATE TABLE article_tags (article_id BIGINT NOT NULL, tag_id INT NOT NULL,
            PRIMARY KEY (article_id, tag_id), KEY (tag_id))",
    ] {
        ctx.exec(ddl).await;
    }
}

/// The blog's pipeline spec, over the test's source (see [`TestCtx::spec`]).
pub fn spec(ctx: &TestCtx) -> Value {
    ctx.spec(json!({
        "table": "articles",
        // In parts where the sink runs scripts, as the shop (see `shop::spec`).
        "area_updates": true,
        "relations": [
            {"name": "author", "kind": "one_to_one", "table": "authors", "on": {"author_id": "id"}},
            {"name": "comments", "kind": "one_to_many", "table": "comments", "on": {"id": "article_id"},
             "columns": ["text", "user_id"],
             "relations": [
                {"name": "by", "kind": "one_to_one", "table": "users", "on": {"user_id": "id"},
                 "columns": ["name"]}
             ]},
            {"name": "tags", "kind": "one_to_many", "table": "article_tags", "on": {"id": "article_id"},
             "nested": false, "columns": ["tag_id"],
             "relations": [
                {"name": "tag", "kind": "one_to_one", "table": "tags", "on": {"tag_id": "id"},
                 "columns": ["name"]}
             ]}
        ]
    }))
}

/// Tags per article, commenters and comments per article, and the lookup tables' sizes.
const TAGS_PER_ARTICLE: u64 = 3;
const COMMENTS_PER_ARTICLE: u64 = 3;
const AUTHORS: u64 = 50;
const USERS: u64 = 200;
const TAGS: u64 = 100;

/// `articles` articles, each with an author, three comments by users and three tags; the
/// first `tag_one` articles carry tag 1 (the rest tags from 2 on). Rows: 7 an article.
pub async fn data(ctx: &TestCtx, articles: u64, tag_one: u64) {
    let named = |prefix: &'static str| move |i: u64| format!("({i}, '{prefix} {i}')");
    shop::insert(ctx, "authors", (1..=AUTHORS).map(named("author"))).await;
    shop::insert(ctx, "users", (1..=USERS).map(named("user"))).await;
    shop::insert(ctx, "tags", (1..=TAGS).map(named("tag"))).await;
    shop::insert(
        ctx,
        "articles",
        (1..=articles).map(|a| {
            format!(
                "({a}, 'article {a}', {}, 'the text of article {a}')",
                1 + a % AUTHORS
            )
        }),
    )
    .await;
    shop::insert(
        ctx,
        "comments",
        (1..=articles).flat_map(|a| {
            (0..COMMENTS_PER_ARTICLE).map(move |c| {
                let id = a * 10 + c;
                format!("({id}, {a}, {}, 'comment {c} on {a}')", 1 + id % USERS)
            })
        }),
    )
    .await;
    shop::insert(
        ctx,
        "article_tags",
        (1..=articles).flat_map(|a| {
            let first = if a <= tag_one { 1 } else { 2 + a % (TAGS - 1) };
            (0..TAGS_PER_ARTICLE).map(move |t| {
                let tag = if t == 0 {
                    first
                } else {
                    2 + (a + t) % (TAGS - 1)
                };
                format!("({a}, {tag})")
            })
        }),
    )
    .await;
}

/// Rows per table for `articles` articles (as [`data`] writes them), for reading the
/// change topics back.
pub fn rows(articles: u64) -> [(&'static str, u64); 6] {
    [
        ("authors", AUTHORS),
        ("users", USERS),
        ("tags", TAGS),
        ("articles", articles),
        ("comments", COMMENTS_PER_ARTICLE * articles),
        ("article_tags", TAGS_PER_ARTICLE * articles),
    ]
}
