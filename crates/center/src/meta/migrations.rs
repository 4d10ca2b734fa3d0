//! The meta database's schema, as the migrations that build it: applied in order at
//! start, each once (the `schema_version` row says how far a database is).

/// Schema versions, applied in order; each entry's statements run once.
pub(super) const MIGRATIONS: &[(u32, &[&str])] = &[
    (
    1,
    &[
        "CREATE TABLE leader (
            id TINYINT UNSIGNED PRIMARY KEY,
            epoch BIGINT UNSIGNED NOT NULL,
            center VARCHAR(255) NOT NULL,
            since TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
        )",
        "INSERT INTO leader (id, epoch, center) VALUES (1, 0, '')",
        "CREATE TABLE sources (
            name VARCHAR(64) PRIMARY KEY,
            host VARCHAR(255) NOT NULL,
            port SMALLINT UNSIGNED NOT NULL,
            user VARCHAR(128) NOT NULL,
            password_ref VARCHAR(512) NOT NULL,
            server_id INT UNSIGNED NOT NULL,
            tables_json TEXT NOT NULL,
            updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
            UNIQUE KEY replica (host, port, server_id)
        )",
        "CREATE TABLE pipelines (
            name VARCHAR(128) PRIMARY KEY,
            source VARCHAR(64) NOT NULL,
            db_name VARCHAR(64) NOT NULL,
            table_name VARCHAR(64) NOT NULL,
            alias VARCHAR(255) NOT NULL,
            spec_json TEXT NOT NULL,
            updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
            UNIQUE KEY alias (alias)
        )",
        "CREATE TABLE assignments (
            id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
            task VARCHAR(64) NOT NULL,
            worker VARCHAR(255) NULL,
            from_worker VARCHAR(255) NULL,
            epoch BIGINT UNSIGNED NOT NULL,
            reason VARCHAR(255) NOT NULL,
            at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            KEY task (task, id)
        )",
        "CREATE TABLE events (
            id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
            at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            origin VARCHAR(255) NOT NULL,
            kind VARCHAR(64) NOT NULL,
            subject VARCHAR(255) NOT NULL,
            message TEXT NOT NULL,
            KEY subject (subject, id)
        )",
        "CREATE TABLE task_status (
            task VARCHAR(64) PRIMARY KEY,
            worker VARCHAR(255) NOT NULL,
            state VARCHAR(64) NOT NULL,
            position VARCHAR(255) NOT NULL,
            gtid TEXT NOT NULL,
            events_published BIGINT UNSIGNED NOT NULL,
            lag_seconds DOUBLE NOT NULL,
            reported_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)
        )",
    ],
    ),
    (
        2,
        &[
            "ALTER TABLE pipelines
               ADD COLUMN state VARCHAR(16) NOT NULL DEFAULT 'unavailable',
               ADD COLUMN live_version INT UNSIGNED NOT NULL DEFAULT 0,
               ADD COLUMN building_version INT UNSIGNED NOT NULL DEFAULT 0,
               ADD COLUMN next_version INT UNSIGNED NOT NULL DEFAULT 1,
               ADD COLUMN history_json TEXT NULL",
            "CREATE TABLE builds (
                id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
                pipeline VARCHAR(128) NOT NULL,
                version INT UNSIGNED NOT NULL,
                state VARCHAR(16) NOT NULL,
                chunk_rows BIGINT UNSIGNED NOT NULL,
                throttle_rows_per_sec BIGINT UNSIGNED NOT NULL,
                started_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                finished_at TIMESTAMP(3) NULL,
                KEY pipeline (pipeline, id)
            )",
            "CREATE TABLE doomed_indexes (
                index_name VARCHAR(255) PRIMARY KEY,
                pipeline VARCHAR(128) NOT NULL,
                version INT UNSIGNED NOT NULL,
                reason VARCHAR(64) NOT NULL,
                at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
            )",
        ],
    ),
    // A pipeline's state follows from its versions (`StoredPipeline::state`); a stored copy could
    // only disagree with them.
    (3, &["ALTER TABLE pipelines DROP COLUMN state"]),
    // `spec_json` holds the whole pipeline (one definition, `sluice_model::PipelineSpec`);
    // the key columns beside it stay for the unique constraints.
    (
        4,
        &["UPDATE pipelines SET spec_json = JSON_SET(spec_json, '$.name', name,
             '$.source', source, '$.database', db_name, '$.table', table_name, '$.alias', alias)"],
    ),
    // Each source's version epoch (`sluice_model::Coordinates`): kept when the source is
    // deleted, so a name added again never reuses an epoch.
    (
        5,
        &["CREATE TABLE source_epochs (
            name VARCHAR(64) PRIMARY KEY,
            epoch SMALLINT UNSIGNED NOT NULL,
            restart VARCHAR(8) NOT NULL,
            at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)
        )"],
    ),
    // Dead letters published again (`sluicectl dlq replay`), by letter id, and where the
    // replayed event went.
    (
        6,
        &["CREATE TABLE dead_letter_replays (
            letter VARCHAR(400) PRIMARY KEY,
            replayed_to VARCHAR(400) NOT NULL,
            epoch BIGINT UNSIGNED NOT NULL,
            at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)
        )"],
    ),
    // The IK dynamic dictionary (`dict`): its words, and when each dictionary's published
    // set last changed (its `Last-Modified`).
    (
        7,
        &[
            "CREATE TABLE dict_words (
                id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
                dictionary VARCHAR(8) NOT NULL,
                word VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                published TINYINT(1) NOT NULL DEFAULT 0,
                added_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                published_at TIMESTAMP(3) NULL,
                UNIQUE KEY dictionary_word (dictionary, word)
            )",
            "CREATE TABLE dict_changes (
                dictionary VARCHAR(8) PRIMARY KEY,
                changed_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
            )",
        ],
    ),
    // Which kept versions the etl keeps current (`crate::history`); versions kept before
    // are not.
    (
        8,
        &["ALTER TABLE pipelines ADD COLUMN current_history_json TEXT NULL"],
    ),
    // Why a build failed (state `failed`).
    (9, &["ALTER TABLE builds ADD COLUMN reason TEXT NULL"]),
    // Consistency checks: what each compared and found (`tally_json`, a `CheckTally`).
    (
        10,
        &["CREATE TABLE checks (
            id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
            pipeline VARCHAR(128) NOT NULL,
            version INT UNSIGNED NOT NULL,
            since VARCHAR(32) NOT NULL DEFAULT '',
            since_ms BIGINT NULL,
            repair BOOL NOT NULL,
            state VARCHAR(16) NOT NULL,
            started_by VARCHAR(16) NOT NULL,
            chunks INT UNSIGNED NOT NULL DEFAULT 0,
            chunks_done INT UNSIGNED NOT NULL DEFAULT 0,
            tally_json TEXT NULL,
            started_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            finished_at TIMESTAMP(3) NULL,
            KEY pipeline (pipeline, id),
            KEY state (state)
        )"],
    ),
    // Delayed changes (`crate::delayed`): recorded once per changed row (`digest` of its
    // relation and join values), claimed by a job (`job`, a `checks` row of kind
    // `delayed`); and where the leader is in the delayed topic, moved in the same
    // transaction as what it read.
    (
        11,
        &[
            "ALTER TABLE checks ADD COLUMN kind VARCHAR(16) NOT NULL DEFAULT 'check', ADD COLUMN changes BIGINT UNSIGNED NOT NULL DEFAULT 0",
            "CREATE TABLE delayed_changes (
                pipeline VARCHAR(128) NOT NULL,
                digest BINARY(32) NOT NULL,
                node VARCHAR(1024) NOT NULL,
                vals TEXT NOT NULL,
                version BIGINT UNSIGNED NOT NULL,
                changes BIGINT UNSIGNED NOT NULL DEFAULT 1,
                first_seen TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                last_seen TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                job BIGINT UNSIGNED NULL,
                PRIMARY KEY (pipeline, digest),
                KEY job (job)
            )",
            "CREATE TABLE delayed_offsets (
                topic VARCHAR(255) NOT NULL,
                part INT NOT NULL,
                next BIGINT NOT NULL,
                PRIMARY KEY (topic, part)
            )",
        ],
    ),
    // Verified builds (`pipelines build --verify`): held once caught up until `swap_by`
    // (a clean compare, or `force`) releases the swap.
    (
        12,
        &["ALTER TABLE builds ADD COLUMN verify BOOL NOT NULL DEFAULT FALSE, ADD COLUMN swap_by VARCHAR(64) NULL"],
    ),
    // Users and their roles (`crate::access`), their API tokens (a SHA-256 of each
    // secret, never the secret) and the audit log of every mutating call.
    (
        13,
        &[
            "CREATE TABLE users (
                name VARCHAR(64) PRIMARY KEY,
                role VARCHAR(16) NOT NULL,
                password_hash VARCHAR(255) NULL,
                created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
            )",
            "CREATE TABLE api_tokens (
                id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
                user VARCHAR(64) NOT NULL,
                name VARCHAR(128) NOT NULL,
                secret_sha256 BINARY(32) NOT NULL,
                created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                last_used_at TIMESTAMP(3) NULL,
                UNIQUE KEY secret (secret_sha256),
                KEY user (user)
            )",
            "CREATE TABLE audit (
                id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
                at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                user VARCHAR(255) NOT NULL,
                role VARCHAR(16) NOT NULL,
                method VARCHAR(64) NOT NULL,
                target VARCHAR(255) NOT NULL,
                peer VARCHAR(255) NOT NULL,
                outcome VARCHAR(32) NOT NULL,
                detail TEXT NOT NULL,
                KEY user (user, id),
                KEY method (method, id)
            )",
        ],
    ),
    // The console's sessions: a SHA-256 of each session's cookie, never the cookie, and
    // the CSRF token its page sends back with every change.
    (
        14,
        &["CREATE TABLE console_sessions (
            id_sha256 BINARY(32) PRIMARY KEY,
            user VARCHAR(64) NOT NULL,
            csrf VARCHAR(64) NOT NULL,
            created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            expires_at TIMESTAMP(3) NOT NULL,
            KEY user (user),
            KEY expires (expires_at)
        )"],
    ),
    // User names compare byte for byte: under the database's case-insensitive default,
    // `ADMIN` would be `admin` to MySQL but not to the last-admin rule.
    (
        15,
        &[
            "ALTER TABLE users MODIFY name VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL",
            "ALTER TABLE api_tokens MODIFY user VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL",
            "ALTER TABLE console_sessions MODIFY user VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL",
            "ALTER TABLE audit MODIFY user VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL",
        ],
    ),
    // What a resync rebuilds (a JSON `ResyncScope`: a condition or ids).
    (
        16,
        &["ALTER TABLE checks ADD COLUMN scope_json TEXT NULL"],
    ),
    // Tokens expire (those made before: 90 days after they were), sessions end when
    // unused, and the leader deletes history past its retention by time.
    (
        17,
        &[
            "ALTER TABLE api_tokens ADD COLUMN expires_at TIMESTAMP(3) NULL",
            "UPDATE api_tokens SET expires_at = created_at + INTERVAL 90 DAY WHERE expires_at IS NULL",
            "ALTER TABLE api_tokens MODIFY expires_at TIMESTAMP(3) NOT NULL",
            "ALTER TABLE console_sessions ADD COLUMN last_seen_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)",
            "ALTER TABLE events ADD KEY at (at)",
            "ALTER TABLE audit ADD KEY at (at)",
            "ALTER TABLE assignments ADD KEY at (at)",
            "ALTER TABLE checks ADD KEY finished (finished_at)",
        ],
    ),
    // Trees are written in parts unless a spec says otherwise; pipelines stored before keep
    // their whole writes (a switch while an older etl still writes them is not safe), and
    // `area_updates = true` turns it on. Specs are JSON objects: the key goes before the
    // closing brace (MariaDB's JSON_SET has no JSON `false`).
    (
        18,
        &[r#"UPDATE pipelines SET spec_json = CONCAT(LEFT(TRIM(spec_json), CHAR_LENGTH(TRIM(spec_json)) - 1), ',"area_updates":false}')
             WHERE spec_json NOT LIKE '%"area_updates"%' AND TRIM(spec_json) LIKE '{%"%}'"#],
    ),
];
