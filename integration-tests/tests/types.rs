//! Every common MySQL type, with its edge values, arrives typed and exact.

use std::time::Duration;

use sluice_mysql::docs::Reader;

use sluice_integration_tests::{on_sources, TestCtx};

/// A column of every common type.
const TABLE: &str = "CREATE TABLE t (
            id BIGINT UNSIGNED PRIMARY KEY,
            i8 TINYINT, u8 TINYINT UNSIGNED, i16 SMALLINT, u16 SMALLINT UNSIGNED,
            i24 MEDIUMINT, u24 MEDIUMINT UNSIGNED, i32 INT, u32 INT UNSIGNED,
            i64 BIGINT, u64 BIGINT UNSIGNED,
            dec_money DECIMAL(10,2), dec_wide DECIMAL(40,12), dec_int DECIMAL(5,0),
            f FLOAT, d DOUBLE,
            c CHAR(10), vc VARCHAR(255), tx TEXT, mtx MEDIUMTEXT,
            bin BINARY(4), vbin VARBINARY(16), bl BLOB,
            dt DATE, tm TIME, tm3 TIME(3), dtm DATETIME, dtm6 DATETIME(6), ts TIMESTAMP(3) NULL, yr YEAR,
            en ENUM('small','medium','large'), st SET('red','green','blue'),
            b1 BIT(1), b12 BIT(12), b64 BIT(64),
            js JSON,
            nothing VARCHAR(10)
        ) DEFAULT CHARSET = utf8mb4";

/// Edge values of each type: extremes, zeros and empties, NULLs.
const ROWS: &str = "INSERT INTO t VALUES
        (18446744073709551615, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295,
         -9223372036854775808, 18446744073709551615,
         -12345678.99, 1234567890123456789012345678.123456789012, 99999,
         3.14159, 2.718281828459045,
         'abc', 'héllo wörld 🚀 漢字', 'long text\nwith lines', 'medium',
         X'00FF1000', X'DEADBEEF', X'0001020304FF',
         '2024-02-29', '-838:59:59', '12:34:56.789', '1999-12-31 23:59:59', '2038-01-19 03:14:07.999999',
         '2021-06-30 12:00:00.123', 2155,
         'medium', 'red,blue', b'1', b'101010101010', b'1111111111111111111111111111111111111111111111111111111111111111',
         '{\"a\": [1, 2.5, \"x\"], \"b\": {\"c\": null}, \"d\": true}',
         NULL),
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.00, 0.000000000001, 0, 0, 0,
         '', '', '', '', X'', X'', X'',
         '1000-01-01', '00:00:00', '00:00:00.000', '1000-01-01 00:00:00', '9999-12-31 23:59:59.999999',
         '1970-01-01 00:00:01.000', 1901,
         'small', '', b'0', b'0', b'0', '[]', ''),
        (42, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
         NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
         NULL, NULL, NULL, NULL, NULL, NULL, NULL)";

const UPDATE: &str = "UPDATE t SET vc = 'ŝanĝita', f = -1.5e-7, d = 1e308, st = 'green,blue,red', js = '\"just a string\"' WHERE id = 0";

on_sources!(every_common_type_round_trips_exactly: mariadb, mysql);
async fn every_common_type_round_trips_exactly() {
    let ctx = TestCtx::new("types").await;
    ctx.exec(TABLE).await;
    let pipeline = ctx.pipeline("t");
    let run = ctx.start(std::slice::from_ref(&pipeline)).await;

    ctx.exec(ROWS).await;
    ctx.exec(UPDATE).await;

    ctx.converges(&run, &pipeline, Duration::from_secs(60))
        .await;

    // The envelope's typing, seen from the document: BIGINT UNSIGNED max as a number,
    // DECIMAL as an exact string, SET as an array.
    let doc = ctx
        .stack
        .es
        .mget(&pipeline.alias, &["18446744073709551615".to_owned()])
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(doc["u64"], serde_json::json!(18446744073709551615u64));
    assert_eq!(doc["dec_wide"], "1234567890123456789012345678.123456789012");
    assert_eq!(doc["st"], serde_json::json!(["red", "blue"]));
    assert_eq!(doc["dtm6"], "2038-01-19T03:14:07.999999");
    assert_eq!(doc["ts"], "2021-06-30T12:00:00.123Z");
}

/// The source as the worker reads it (the test's source user).
fn source(ctx: &TestCtx) -> sluice_mysql::SourceConfig {
    sluice_mysql::SourceConfig {
        name: ctx.instance.clone(),
        host: ctx.stack.mysql_host.clone(),
        port: ctx.stack.mysql_port,
        user: ctx.stack.source_user.clone(),
        password: sluice_model::Secret::new(ctx.stack.source_password.clone()),
        server_id: ctx.server_id,
        tables: vec![],
        shards: Vec::new(),
        tls: None,
        allow_plaintext: true,
    }
}

on_sources!(a_snapshot_reads_every_type_as_the_binlog_decodes_it: mariadb, mariadb_watermarks, mysql);
async fn a_snapshot_reads_every_type_as_the_binlog_decodes_it() {
    let ctx = TestCtx::new("snaptypes").await;
    ctx.exec(TABLE).await;
    let mut worker = ctx.worker();
    worker.start();
    ctx.wait_worker_ready(&worker).await;
    ctx.exec(ROWS).await;
    ctx.exec(UPDATE).await;
    let records = ctx
        .read_topic(&ctx.topic("t"), 4, Duration::from_secs(60))
        .await;
    let mut streamed = std::collections::BTreeMap::new();
    let mut columns = None;
    for r in records {
        let e: sluice_model::ChangeEvent = serde_json::from_slice(&r.payload).unwrap();
        columns = Some(e.columns.clone());
        streamed.insert(e.document_id().unwrap(), e.after.unwrap());
    }

    // Read as a build reads it: the table's document plan, in a consistent snapshot.
    let src = source(&ctx);
    let spec = sluice_model::PipelineSpec::table("t", &src.name, &ctx.db, "t");
    let plan = &sluice_mysql::docs::load(&src, &spec)
        .await
        .unwrap()
        .unwrap()[0];
    assert_eq!(
        plan.root.table.infos,
        columns.unwrap(),
        "snapshot and stream name the columns' types alike"
    );
    let mut reader = Reader::connect(&src).await.unwrap();
    let marks = reader.begin_snapshot().await.unwrap();
    let read = plan.read_range(&mut reader, None, None, 100).await.unwrap();
    reader.end().await.unwrap();
    assert!(!marks.low.file.is_empty() && marks.low.pos > 0 && marks.low <= marks.high);
    assert_eq!(read.docs.len(), 3);
    for built in &read.docs {
        let row = built.doc.as_ref().unwrap();
        let from_stream = &streamed[&built.id];
        for (column, value) in from_stream {
            assert_eq!(
                row.get(column),
                Some(value),
                "row {} column {column}: snapshot {:?} vs stream {value}",
                built.id,
                row.get(column)
            );
        }
        assert_eq!(row.len(), from_stream.len());
    }
    drop(worker);
    ctx.cleanup().await;
}

on_sources!(composite_text_keys_chunk_and_resume_exactly: mariadb, mariadb_watermarks);
async fn composite_text_keys_chunk_and_resume_exactly() {
    let ctx = TestCtx::new("snapkeys").await;
    ctx.exec(
        "CREATE TABLE k (region VARCHAR(20), seq INT, born DATETIME(3), note VARCHAR(20),
         PRIMARY KEY (region, seq, born)) DEFAULT CHARSET = utf8mb4",
    )
    .await;
    let mut values = Vec::new();
    for (i, region) in ["ålesund", "Berlin", "berlin2", "東京", "zürich"]
        .iter()
        .enumerate()
    {
        for seq in [-5, 0, 7] {
            values.push(format!(
                "('{region}', {seq}, '2024-01-0{} 10:00:00.{i}{i}{i}', 'n{i}{seq}')",
                i + 1
            ));
        }
    }
    ctx.exec(&format!("INSERT INTO k VALUES {}", values.join(", ")))
        .await;

    let src = source(&ctx);
    let spec = sluice_model::PipelineSpec::table("k", &src.name, &ctx.db, "k");
    let plan = &sluice_mysql::docs::load(&src, &spec)
        .await
        .unwrap()
        .unwrap()[0];
    let table = &plan.root.table;
    let mut conn = mysql_async::Conn::new(src.opts()).await.unwrap();
    let bounds = table.chunk_bounds(&src, &mut conn, 4).await.unwrap();
    assert_eq!(
        bounds.len(),
        3,
        "15 rows in chunks of 4: bounds after rows 4, 8, 12"
    );
    // Read every chunk in batches of 3 (resuming from the last key each time), as a
    // build does.
    let mut reader = Reader::connect(&src).await.unwrap();
    let mut seen = Vec::new();
    let mut lower: Option<sluice_mysql::Key> = None;
    for upper in bounds.iter().map(Some).chain([None]) {
        let mut cursor = lower.clone();
        loop {
            reader.begin_snapshot().await.unwrap();
            let read = plan
                .read_range(&mut reader, cursor.as_ref(), upper, 3)
                .await
                .unwrap();
            reader.end().await.unwrap();
            if read.rows == 0 {
                break;
            }
            seen.extend(
                read.docs
                    .iter()
                    .map(|b| b.doc.as_ref().unwrap()["note"].as_str().unwrap().to_owned()),
            );
            // A cursor survives being persisted.
            let persisted = serde_json::to_string(&read.last).unwrap();
            cursor = serde_json::from_str(&persisted).unwrap();
        }
        lower = upper.cloned();
    }
    assert_eq!(seen.len(), 15, "{seen:?}");
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 15, "a row was read twice: {seen:?}");
    ctx.cleanup().await;
}

on_sources!(mysql_types_round_trip_exactly: mysql);
/// MySQL's own types: its binary JSON with edge values (the largest unsigned integer, a
/// double near the limit, unicode, nesting, empty containers, a bare scalar), VECTOR
/// (9.0+: an array of numbers) and spatial values (their bytes), through the stream and a
/// snapshot alike.
async fn mysql_types_round_trip_exactly() {
    let ctx = TestCtx::new("mytypes").await;
    ctx.exec("CREATE TABLE m (id INT PRIMARY KEY, j JSON, v VECTOR(3), p POINT, g GEOMETRY)")
        .await;
    let pipeline = ctx.pipeline("m");
    let run = ctx.start(std::slice::from_ref(&pipeline)).await;
    ctx.exec(
        "INSERT INTO m VALUES
         (1, '{\"u\": 18446744073709551615, \"d\": -1.5e300, \"s\": \"ü 漢字 🚀\", \"n\": [true, null, {\"x\": []}], \"e\": {}}',
          STRING_TO_VECTOR('[1.5, -2, 3.25]'), ST_GeomFromText('POINT(1 2)'), ST_GeomFromText('LINESTRING(0 0, 1 1)')),
         (2, '\"just a string\"', STRING_TO_VECTOR('[0.1, 0, 1e-7]'), NULL, NULL),
         (3, NULL, NULL, NULL, NULL)",
    )
    .await;
    ctx.converges(&run, &pipeline, Duration::from_secs(60))
        .await;
    let ids = ["1".to_owned(), "2".to_owned(), "3".to_owned()];
    let docs: Vec<serde_json::Value> = ctx
        .stack
        .es
        .mget(&pipeline.alias, &ids)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.expect("a document"))
        .collect();
    assert_eq!(docs[0]["v"], serde_json::json!([1.5, -2.0, 3.25]));
    assert_eq!(docs[1]["v"], serde_json::json!([0.1, 0.0, 1e-7]));
    assert_eq!(
        docs[0]["j"]["u"],
        serde_json::json!(18446744073709551615u64)
    );
    assert_eq!(docs[0]["j"]["d"], serde_json::json!(-1.5e300));
    assert_eq!(docs[0]["j"]["s"], "ü 漢字 🚀");
    assert_eq!(docs[0]["j"]["e"], serde_json::json!({}));
    assert_eq!(docs[1]["j"], "just a string");
    assert!(
        docs[0]["p"].is_string() && docs[2]["v"].is_null(),
        "{docs:?}"
    );

    // A snapshot reads the same documents.
    let src = source(&ctx);
    let spec = sluice_model::PipelineSpec::table("m", &src.name, &ctx.db, "m");
    let plan = &sluice_mysql::docs::load(&src, &spec)
        .await
        .unwrap()
        .unwrap()[0];
    let mut reader = Reader::connect(&src).await.unwrap();
    reader.begin_snapshot().await.unwrap();
    let read = plan.read_range(&mut reader, None, None, 10).await.unwrap();
    reader.end().await.unwrap();
    assert_eq!(read.docs.len(), docs.len(), "the snapshot reads every row");
    for (built, streamed) in read.docs.iter().zip(&docs) {
        assert_eq!(
            &serde_json::Value::Object(built.doc.clone().unwrap()),
            streamed,
            "row {}: snapshot and stream",
            built.id
        );
    }
}
