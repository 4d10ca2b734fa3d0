//! The sample shop of the relations tests and the tree bench: `products` (the root,
//! filter `deleted = 0`) → one-to-one `brands` → one-to-many `skus` (nested, `code` a
//! keyword) → one-to-many `sku_prices` (not in currency `XXX`); `product_tags` twice: an
//! object array of the 5 newest by `created_at`, and the distinct tag names; and
//! `promotions`, joined on the product and its brand (a composite key: a promotion of
//! another brand's product does not apply).

use serde_json::{json, Value};

use crate::TestCtx;

/// The shop's tables in the test database.
pub async fn schema(ctx: &TestCtx) {
    for ddl in [
        "CREATE TABLE brands (id INT PRIMARY KEY, name VARCHAR(64) NOT NULL, country CHAR(2))",
        "CREATE TABLE products (id BIGINT PRIMARY KEY, title VARCHAR(128) NOT NULL, brand_id INT NULL,
            price DECIMAL(10,2), deleted TINYINT NOT NULL DEFAULT 0, KEY (brand_id))",
        "CREATE TABLE skus (id BIGINT PRIMARY KEY, product_id BIGINT NULL, code VARCHAR(32) NOT NULL,
            stock INT NOT NULL DEFAULT 0, KEY (product_id))",
        "CREATE TABLE sku_prices (id BIGINT PRIMARY KEY AUTO_INCREMENT, sku_id BIGINT NOT NULL,
            currency CHAR(3) NOT NULL, amount DECIMAL(10,2) NOT NULL, KEY (sku_id))",
        "CREATE TABLE product_tags (id BIGINT PRIMARY KEY AUTO_INCREMENT, product_id BIGINT NOT NULL,
            tag VARCHAR(32) NOT NULL, created_at DATETIME(6) NOT NULL, KEY (product_id))",
        "CREATE TABLE promotions (id BIGINT PRIMARY KEY AUTO_INCREMENT, product_id BIGINT NOT NULL,
            brand_id INT NOT NULL, pct INT NOT NULL, KEY (product_id, brand_id))",
    ] {
        ctx.exec(ddl).await;
    }
}

/// The shop's pipeline spec, over the test's source (see [`TestCtx::spec`]).
pub fn spec(ctx: &TestCtx) -> Value {
    ctx.spec(json!({
        "table": "products",
        "filter": "deleted = 0",
        // Written in parts where the sink runs scripts (OpenSearch of the local stack), whole
        // where it does not (its Elasticsearch 7.17). Said, for an etl's own pipelines are
        // written whole unless they say so.
        "area_updates": true,
        "relations": [
            {"name": "brand", "kind": "one_to_one", "table": "brands", "on": {"brand_id": "id"}},
            {"name": "skus", "kind": "one_to_many", "table": "skus", "on": {"id": "product_id"},
             "fields": {"code": {"type": "keyword"}},
             "relations": [
                {"name": "prices", "kind": "one_to_many", "table": "sku_prices", "on": {"id": "sku_id"},
                 "columns": ["currency", "amount"], "filter": "currency <> 'XXX'"}
             ]},
            {"name": "tags", "kind": "one_to_many", "table": "product_tags", "on": {"id": "product_id"},
             "nested": false, "order_by": ["created_at desc"], "limit": 5, "columns": ["tag", "created_at"]},
            {"name": "tag_names", "kind": "one_to_many", "table": "product_tags", "on": {"id": "product_id"},
             "nested": false, "distinct": true, "columns": ["tag"]},
            {"name": "promotions", "kind": "one_to_many", "table": "promotions",
             "on": {"id": "product_id", "brand_id": "brand_id"}, "columns": ["pct"]}
        ]
    }))
}

/// Rows in multi-row INSERTs of 500.
pub async fn insert(ctx: &TestCtx, table: &str, rows: impl Iterator<Item = String>) {
    let rows: Vec<String> = rows.collect();
    for chunk in rows.chunks(500) {
        ctx.exec(&format!("INSERT INTO {table} VALUES {}", chunk.join(", ")))
            .await;
    }
}

/// Three brands; `products` products, the first `brand_one` of brand 1 and the rest of
/// brand 2; two SKUs per product with a EUR and a USD price each; seven tags per product
/// (so the 5-newest limit cuts); and for every tenth product a promotion of its brand and
/// one of brand 3 (which must not join). Rows: about 14 per product.
pub async fn data(ctx: &TestCtx, products: u64, brand_one: u64) {
    insert(
        ctx,
        "brands",
        [1, 2, 3]
            .into_iter()
            .map(|b| format!("({b}, 'brand {b}', 'DE')")),
    )
    .await;
    insert(
        ctx,
        "products",
        (1..=products).map(|p| {
            let brand = if p <= brand_one { 1 } else { 2 };
            format!(
                "({p}, 'product {p}', {brand}, {}.{:02}, 0)",
                p % 500,
                p % 100
            )
        }),
    )
    .await;
    insert(
        ctx,
        "skus",
        (1..=products).flat_map(|p| {
            (0..2).map(move |k| format!("({}, {p}, 'sku-{p}-{k}', {})", p * 10 + k, k * 7))
        }),
    )
    .await;
    insert(
        ctx,
        "sku_prices",
        (1..=products).flat_map(|p| {
            (0..2).flat_map(move |k| {
                ["'EUR'", "'USD'"].map(|c| format!("(NULL, {}, {c}, {}.99)", p * 10 + k, p % 90))
            })
        }),
    )
    .await;
    insert(
        ctx,
        "product_tags",
        (1..=products).flat_map(|p| {
            (0..7).map(move |t| {
                format!(
                    "(NULL, {p}, 'tag-{t}', TIMESTAMP('2024-01-01') + INTERVAL {} SECOND)",
                    (p * 7 + t) % 1000
                )
            })
        }),
    )
    .await;
    insert(
        ctx,
        "promotions",
        (10..=products).step_by(10).flat_map(|p| {
            let brand = if p <= brand_one { 1 } else { 2 };
            [
                format!("(NULL, {p}, {brand}, {})", p % 30),
                format!("(NULL, {p}, 3, 99)"),
            ]
        }),
    )
    .await;
}

/// Rows per table for `products` products (as [`data`] writes them), for reading the
/// change topics back.
pub fn rows(products: u64) -> [(&'static str, u64); 6] {
    [
        ("brands", 3),
        ("products", products),
        ("skus", 2 * products),
        ("sku_prices", 4 * products),
        ("product_tags", 7 * products),
        ("promotions", 2 * (products / 10)),
    ]
}
