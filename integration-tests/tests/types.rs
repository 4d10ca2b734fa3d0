//! Every common MySQL type, with its edge values, arrives typed and exact.

use std::time::Duration;

use sluice_integration_tests::TestCtx;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_common_type_round_trips_exactly() {
    let ctx = TestCtx::new("types").await;
    ctx.exec(
        "CREATE TABLE t (
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
        ) DEFAULT CHARSET = utf8mb4",
    )
    .await;
    let pipeline = ctx.pipeline("t");
    let run = ctx.start(std::slice::from_ref(&pipeline)).await;

    ctx.exec(
        "INSERT INTO t VALUES
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
         NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    )
    .await;
    ctx.exec("UPDATE t SET vc = 'ŝanĝita', f = -1.5e-7, d = 1e308, st = 'green,blue,red', js = '\"just a string\"' WHERE id = 0").await;

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
