//! Which DDL statements change the rows of a table without writing a row event: a column
//! added with a value for every existing row, a column dropped, converted or renamed, a
//! table truncated, dropped, replaced or renamed, partitions dropped or exchanged. The
//! binlog carries only the statement, so every document made before it may no longer be
//! what the table yields; only a rebuild makes them right again.
//!
//! The reading is conservative: a change that may convert values (`MODIFY`, `CHANGE`) is
//! counted as one, and a statement not understood is counted as none only when it cannot
//! touch rows (indexes, table options, `CREATE`).

/// What a statement did to one table's existing rows, without row events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    pub db: String,
    pub table: String,
    /// The columns whose values changed (empty: every row of the table is concerned).
    pub columns: Vec<String>,
    /// What happened, for an operator: names the table, the columns and the effect.
    pub reason: String,
}

/// The tables whose existing rows `sql` changed without row events; `default_db` is the
/// statement's default database (the binlog event's).
pub fn rewrites(default_db: &str, sql: &str) -> Vec<Rewrite> {
    let mut p = Parser {
        toks: tokenize(sql),
        at: 0,
        default_db,
    };
    match p.word().as_deref() {
        Some("ALTER") => p.alter(),
        Some("TRUNCATE") => {
            p.eat("TABLE");
            p.table()
                .map(|(db, t)| table_wide(db, t, "truncated: every row deleted without row events"))
                .into_iter()
                .collect()
        }
        Some("DROP") => p.drop_tables(),
        Some("RENAME") => p.rename_tables(),
        Some("CREATE") => {
            if !(p.eat("OR") && p.eat("REPLACE")) {
                return Vec::new();
            }
            if p.eat("TEMPORARY") || !p.eat("TABLE") {
                return Vec::new();
            }
            p.if_exists();
            p.table()
                .map(|(db, t)| {
                    table_wide(db, t, "replaced (CREATE OR REPLACE): the rows of the former table are gone without row events")
                })
                .into_iter()
                .collect()
        }
        _ => Vec::new(),
    }
}

fn table_wide(db: String, table: String, what: &str) -> Rewrite {
    Rewrite {
        reason: format!("table {db}.{table} {what}"),
        db,
        table,
        columns: Vec::new(),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// A keyword or an unquoted identifier, as written.
    Word(String),
    /// A back-quoted identifier.
    Ident(String),
    /// A string literal or a number.
    Literal(String),
    Punct(char),
}

fn tokenize(sql: &str) -> Vec<Tok> {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('*') {
            // `/*!50100 … */` and `/*M!… */` hold statement text the server runs.
            let executable = matches!(chars.get(i + 2), Some('!'))
                || (chars.get(i + 2) == Some(&'M') && chars.get(i + 3) == Some(&'!'));
            if executable {
                i += if chars[i + 2] == 'M' { 4 } else { 3 };
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            } else {
                i += 2;
                while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                    i += 1;
                }
                i += 2;
            }
        } else if c == '*' && next == Some('/') {
            // The end of an executable comment.
            i += 2;
        } else if c == '#' || (c == '-' && next == Some('-')) {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '`' || c == '\'' || c == '"' {
            let mut text = String::new();
            i += 1;
            while i < chars.len() {
                if chars[i] == c && chars.get(i + 1) == Some(&c) {
                    text.push(c);
                    i += 2;
                } else if chars[i] == c {
                    i += 1;
                    break;
                } else if chars[i] == '\\' && c != '`' && i + 1 < chars.len() {
                    text.push(chars[i + 1]);
                    i += 2;
                } else {
                    text.push(chars[i]);
                    i += 1;
                }
            }
            out.push(if c == '`' {
                Tok::Ident(text)
            } else {
                Tok::Literal(text)
            });
        } else if c.is_alphanumeric() || c == '_' || c == '$' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '$')
            {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            out.push(
                if c.is_ascii_digit() && text.chars().all(|c| c.is_ascii_digit()) {
                    Tok::Literal(text)
                } else {
                    Tok::Word(text)
                },
            );
        } else {
            out.push(Tok::Punct(c));
            i += 1;
        }
    }
    out
}

struct Parser<'a> {
    toks: Vec<Tok>,
    at: usize,
    default_db: &'a str,
}

/// What follows `ADD` or `DROP` when the clause is not about a column.
const NOT_COLUMNS: &[&str] = &[
    "INDEX",
    "KEY",
    "UNIQUE",
    "FULLTEXT",
    "SPATIAL",
    "CONSTRAINT",
    "FOREIGN",
    "CHECK",
    "PERIOD",
    "SYSTEM",
    "VECTOR",
];

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }

    /// The next token as an upper-case keyword (consumed), if it is a word.
    fn word(&mut self) -> Option<String> {
        match self.peek() {
            Some(Tok::Word(w)) => {
                let w = w.to_ascii_uppercase();
                self.at += 1;
                Some(w)
            }
            _ => None,
        }
    }

    fn is(&self, keyword: &str) -> bool {
        matches!(self.peek(), Some(Tok::Word(w)) if w.eq_ignore_ascii_case(keyword))
    }

    fn eat(&mut self, keyword: &str) -> bool {
        let yes = self.is(keyword);
        if yes {
            self.at += 1;
        }
        yes
    }

    fn punct(&mut self, c: char) -> bool {
        let yes = self.peek() == Some(&Tok::Punct(c));
        if yes {
            self.at += 1;
        }
        yes
    }

    fn if_exists(&mut self) {
        let at = self.at;
        if !(self.eat("IF") && (self.eat("EXISTS") || (self.eat("NOT") && self.eat("EXISTS")))) {
            self.at = at;
        }
    }

    /// An identifier, quoted or not.
    fn name(&mut self) -> Option<String> {
        match self.peek()? {
            Tok::Word(w) | Tok::Ident(w) => {
                let w = w.clone();
                self.at += 1;
                Some(w)
            }
            _ => None,
        }
    }

    /// `[db.]table`.
    fn table(&mut self) -> Option<(String, String)> {
        let first = self.name()?;
        if self.punct('.') {
            let table = self.name()?;
            Some((first, table))
        } else {
            Some((self.default_db.to_owned(), first))
        }
    }

    /// Tokens up to the next comma outside parentheses (consumed), or the end. Inside
    /// `ADD ( … )` (`in_parens`), also up to the closing parenthesis (left for the caller).
    fn clause(&mut self, in_parens: bool) -> Vec<Tok> {
        let mut depth = 0usize;
        let mut out = Vec::new();
        while let Some(t) = self.peek().cloned() {
            match t {
                Tok::Punct('(') => depth += 1,
                Tok::Punct(')') if depth == 0 && in_parens => return out,
                Tok::Punct(')') => depth = depth.saturating_sub(1),
                Tok::Punct(',') | Tok::Punct(';') if depth == 0 => {
                    self.at += 1;
                    return out;
                }
                _ => {}
            }
            out.push(t);
            self.at += 1;
        }
        out
    }

    fn alter(&mut self) -> Vec<Rewrite> {
        while self.eat("ONLINE") || self.eat("OFFLINE") || self.eat("IGNORE") {}
        if !self.eat("TABLE") {
            return Vec::new();
        }
        self.if_exists();
        let Some((db, table)) = self.table() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while self.peek().is_some() {
            let clause = self.clause(false);
            let mut c = Parser {
                toks: clause,
                at: 0,
                default_db: self.default_db,
            };
            if let Some((columns, what)) = c.alter_clause() {
                out.push(Rewrite {
                    reason: format!("table {db}.{table}: {what}"),
                    db: db.clone(),
                    table: table.clone(),
                    columns,
                });
            }
        }
        out
    }

    /// What one clause of `ALTER TABLE` did to existing rows: the columns concerned
    /// (none: every row) and how; `None` when it leaves them as they were.
    fn alter_clause(&mut self) -> Option<(Vec<String>, String)> {
        match self.word()?.as_str() {
            "ADD" => self.alter_add(),
            "DROP" => self.alter_drop(),
            "MODIFY" => self.alter_modify(),
            "CHANGE" => self.alter_change(),
            "RENAME" => self.alter_rename(),
            "CONVERT" => Some((
                Vec::new(),
                "text columns converted to another character set; existing values changed".into(),
            )),
            "TRUNCATE" if self.eat("PARTITION") => Some((
                Vec::new(),
                "partitions truncated: their rows deleted without row events".into(),
            )),
            "EXCHANGE" if self.eat("PARTITION") => Some((
                Vec::new(),
                "a partition exchanged with another table: its rows replaced without row events"
                    .into(),
            )),
            _ => None,
        }
    }

    /// `ADD …` (after the word): the columns added with a value for every existing row.
    fn alter_add(&mut self) -> Option<(Vec<String>, String)> {
        let column = self.eat("COLUMN");
        self.if_exists();
        if !column && NOT_COLUMNS.iter().any(|k| self.is(k))
            || self.is("PRIMARY")
            || self.is("PARTITION")
        {
            return None;
        }
        let mut added = Vec::new();
        if self.punct('(') {
            // `ADD (a …, b …)`: each definition is a clause of its own.
            while self.peek().is_some() && !self.punct(')') {
                let def = self.clause(true);
                if let Some(a) = added_with_value(def) {
                    added.push(a);
                }
            }
        } else if let Some(a) = added_with_value(self.toks[self.at..].to_vec()) {
            added.push(a);
        }
        if added.is_empty() {
            return None;
        }
        let names: Vec<String> = added.iter().map(|(n, _)| n.clone()).collect();
        let how: Vec<String> = added
            .iter()
            .map(|(n, how)| format!("column `{n}` added {how}"))
            .collect();
        Some((
            names,
            format!("{}; documents made before lack it", how.join(", ")),
        ))
    }

    /// `DROP …` (after the word): a column, the primary key or partitions dropped.
    fn alter_drop(&mut self) -> Option<(Vec<String>, String)> {
        let column = self.eat("COLUMN");
        self.if_exists();
        if !column && NOT_COLUMNS.iter().any(|k| self.is(k)) {
            return None;
        }
        if self.eat("PRIMARY") {
            return Some((
                Vec::new(),
                "primary key dropped: document ids made from it may change".into(),
            ));
        }
        if self.eat("PARTITION") {
            return Some((
                Vec::new(),
                "partitions dropped: their rows deleted without row events".into(),
            ));
        }
        let name = self.name()?;
        Some((
            vec![name.clone()],
            format!("column `{name}` dropped; documents made before keep its values"),
        ))
    }

    /// `MODIFY …` (after the word): a column whose values may have been converted.
    fn alter_modify(&mut self) -> Option<(Vec<String>, String)> {
        self.eat("COLUMN");
        self.if_exists();
        let name = self.name()?;
        Some((
            vec![name.clone()],
            format!("column `{name}` modified; existing values may have been converted"),
        ))
    }

    /// `CHANGE …` (after the word): a column converted, or renamed.
    fn alter_change(&mut self) -> Option<(Vec<String>, String)> {
        self.eat("COLUMN");
        self.if_exists();
        let old = self.name()?;
        let new = self.name()?;
        if old.eq_ignore_ascii_case(&new) {
            Some((
                vec![old.clone()],
                format!("column `{old}` changed; existing values may have been converted"),
            ))
        } else {
            Some((
                vec![old.clone(), new.clone()],
                format!(
                    "column `{old}` renamed to `{new}`; documents made before still have `{old}`"
                ),
            ))
        }
    }

    /// `RENAME …` (after the word): a column renamed, or the table itself.
    fn alter_rename(&mut self) -> Option<(Vec<String>, String)> {
        if self.eat("COLUMN") {
            self.if_exists();
            let old = self.name()?;
            self.eat("TO");
            let new = self.name()?;
            return Some((
                vec![old.clone(), new.clone()],
                format!(
                    "column `{old}` renamed to `{new}`; documents made before still have `{old}`"
                ),
            ));
        }
        if self.is("INDEX") || self.is("KEY") {
            return None;
        }
        let _ = self.eat("TO") || self.eat("AS");
        let (db, table) = self.table()?;
        Some((
            Vec::new(),
            format!("renamed to {db}.{table}; the pipeline's table is gone, its documents remain"),
        ))
    }

    fn drop_tables(&mut self) -> Vec<Rewrite> {
        if self.eat("TEMPORARY") || !(self.eat("TABLE") || self.eat("TABLES")) {
            return Vec::new();
        }
        self.if_exists();
        let mut out = Vec::new();
        while let Some((db, t)) = self.table() {
            out.push(table_wide(
                db,
                t,
                "dropped: its documents remain until the pipeline is rebuilt or deleted",
            ));
            if !self.punct(',') {
                break;
            }
        }
        out
    }

    fn rename_tables(&mut self) -> Vec<Rewrite> {
        if !(self.eat("TABLE") || self.eat("TABLES")) {
            return Vec::new();
        }
        let mut out = Vec::new();
        loop {
            self.if_exists();
            let Some((from_db, from)) = self.table() else {
                break;
            };
            self.eat("WAIT");
            if !self.eat("TO") {
                break;
            }
            let Some((to_db, to)) = self.table() else {
                break;
            };
            out.push(table_wide(
                from_db.clone(),
                from.clone(),
                &format!("renamed to {to_db}.{to}; its documents remain"),
            ));
            out.push(table_wide(
                to_db,
                to,
                &format!("replaced by {from_db}.{from} (renamed in its place): documents made before come from the former table"),
            ));
            if !self.punct(',') {
                break;
            }
        }
        out
    }
}

/// A column definition of `ADD`: its name, and how every existing row got a value
/// (`None` when existing rows hold NULL, as documents without the field say).
fn added_with_value(def: Vec<Tok>) -> Option<(String, String)> {
    let mut p = Parser {
        toks: def,
        at: 0,
        default_db: "",
    };
    let name = p.name()?;
    let words: Vec<String> = p.toks[p.at..]
        .iter()
        .map(|t| match t {
            Tok::Word(w) => w.to_ascii_uppercase(),
            Tok::Ident(w) | Tok::Literal(w) => w.clone(),
            Tok::Punct(c) => c.to_string(),
        })
        .collect();
    let has = |w: &str| words.iter().any(|x| x == w);
    let default = words
        .iter()
        .position(|w| w == "DEFAULT")
        .and_then(|i| words.get(i + 1));
    let how = match default {
        Some(v) if v != "NULL" => format!("with DEFAULT {v}"),
        Some(_) => return None,
        None if has("AS") || has("GENERATED") => "as a generated column".to_owned(),
        None if has("AUTO_INCREMENT") => "with AUTO_INCREMENT values".to_owned(),
        None if words.windows(2).any(|w| w[0] == "NOT" && w[1] == "NULL") => {
            "NOT NULL (existing rows hold the type's zero value)".to_owned()
        }
        None => return None,
    };
    Some((name, how))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reasons(sql: &str) -> Vec<String> {
        rewrites("shop", sql)
            .into_iter()
            .map(|r| r.reason)
            .collect()
    }

    fn one(sql: &str) -> Rewrite {
        let mut all = rewrites("shop", sql);
        assert_eq!(all.len(), 1, "{sql}: {all:?}");
        all.remove(0)
    }

    #[test]
    fn added_columns_count_only_when_existing_rows_get_a_value() {
        let r = one("ALTER TABLE items ADD COLUMN c VARCHAR(8) NOT NULL DEFAULT 'x'");
        assert_eq!((r.db.as_str(), r.table.as_str()), ("shop", "items"));
        assert_eq!(r.columns, ["c"]);
        assert!(
            r.reason.contains("column `c` added with DEFAULT x"),
            "{}",
            r.reason
        );
        assert!(one("alter table `other`.`items` add `n` int not null")
            .reason
            .contains("NOT NULL"));
        assert_eq!(one("ALTER TABLE items ADD n INT NOT NULL").db, "shop");
        assert!(
            one("ALTER TABLE items ADD COLUMN g INT AS (id * 2) VIRTUAL")
                .reason
                .contains("generated")
        );
        let both = one("ALTER TABLE items ADD (a INT DEFAULT 1, b INT NULL, c INT DEFAULT 3)");
        assert_eq!(both.columns, ["a", "c"]);
        // Existing rows hold NULL: documents without the field say the same.
        assert!(reasons("ALTER TABLE items ADD COLUMN note VARCHAR(64) NULL").is_empty());
        assert!(reasons("ALTER TABLE items ADD COLUMN note TEXT DEFAULT NULL AFTER id").is_empty());
        assert!(reasons("ALTER TABLE items ADD COLUMN IF NOT EXISTS note TEXT").is_empty());
    }

    #[test]
    fn dropped_modified_and_renamed_columns_count() {
        assert_eq!(
            one("ALTER TABLE items DROP COLUMN legacy").columns,
            ["legacy"]
        );
        assert_eq!(one("ALTER TABLE items DROP legacy").columns, ["legacy"]);
        assert!(one("ALTER TABLE items MODIFY price VARCHAR(20)")
            .reason
            .contains("`price` modified"));
        let r = one("ALTER TABLE items CHANGE COLUMN title name VARCHAR(64)");
        assert_eq!(r.columns, ["title", "name"]);
        assert!(r.reason.contains("renamed to `name`"), "{}", r.reason);
        assert_eq!(
            one("ALTER TABLE items RENAME COLUMN title TO name").columns,
            ["title", "name"]
        );
        assert!(one("ALTER TABLE items CONVERT TO CHARACTER SET utf8mb4")
            .columns
            .is_empty());
        // Several clauses: each that counts.
        let all = rewrites(
            "shop",
            "ALTER TABLE items DROP COLUMN a, ADD INDEX (b), MODIFY c BIGINT, ALGORITHM=INPLACE",
        );
        assert_eq!(all.len(), 2, "{all:?}");
    }

    #[test]
    fn indexes_options_and_defaults_do_not_count() {
        for sql in [
            "ALTER TABLE items ADD INDEX by_name (name)",
            "ALTER TABLE items ADD UNIQUE KEY u (a, b), DROP INDEX old",
            "ALTER TABLE items DROP FOREIGN KEY fk_1, ADD CONSTRAINT c CHECK (a > 0)",
            "ALTER TABLE items ALTER COLUMN price SET DEFAULT 3",
            "ALTER TABLE items ENGINE=InnoDB, COMMENT 'x, y'",
            "ALTER TABLE items RENAME INDEX a TO b",
            "ALTER TABLE items ADD PRIMARY KEY (id)",
            "ALTER TABLE items DEFAULT CHARACTER SET utf8mb4",
            "CREATE TABLE items (id INT PRIMARY KEY)",
            "CREATE INDEX i ON items (a)",
            "DROP TEMPORARY TABLE t",
            "DROP INDEX i ON items",
            "GRANT SELECT ON shop.* TO u",
        ] {
            assert!(reasons(sql).is_empty(), "{sql}: {:?}", reasons(sql));
        }
    }

    #[test]
    fn tables_truncated_dropped_replaced_or_renamed_count() {
        assert!(one("TRUNCATE TABLE items").reason.contains("truncated"));
        assert!(one("truncate items").reason.contains("shop.items"));
        // As MariaDB writes a DROP in the binlog.
        let dropped = rewrites(
            "shop",
            "DROP TABLE IF EXISTS `items`,`x`.`y` /* generated by server */",
        );
        assert_eq!(
            dropped
                .iter()
                .map(|r| format!("{}.{}", r.db, r.table))
                .collect::<Vec<_>>(),
            ["shop.items", "x.y"]
        );
        assert!(one("CREATE OR REPLACE TABLE items (id INT)")
            .reason
            .contains("replaced"));
        // An online schema change's swap: both tables.
        let swap = rewrites(
            "shop",
            "RENAME TABLE `items` TO `_items_old`, `_items_gho` TO `items`",
        );
        let names: Vec<String> = swap.iter().map(|r| r.table.clone()).collect();
        assert_eq!(names, ["items", "_items_old", "_items_gho", "items"]);
        assert!(
            swap[3].reason.contains("replaced by shop._items_gho"),
            "{}",
            swap[3].reason
        );
        assert!(one("ALTER TABLE items RENAME TO goods")
            .reason
            .contains("renamed to shop.goods"));
        assert!(one("ALTER TABLE items DROP PARTITION p1")
            .columns
            .is_empty());
    }

    #[test]
    fn comments_and_quoting() {
        // Executable comments run; others do not.
        assert_eq!(
            one("ALTER TABLE items /*!50100 DROP COLUMN a */").columns,
            ["a"]
        );
        assert!(reasons("ALTER TABLE items /* DROP COLUMN a */ ADD INDEX (b)").is_empty());
        assert_eq!(
            one("ALTER TABLE `it``ems` DROP COLUMN `we,ird`").columns,
            ["we,ird"]
        );
        assert_eq!(one("ALTER TABLE `it``ems` DROP COLUMN x").table, "it`ems");
        assert!(
            one("ALTER TABLE items ADD c VARCHAR(8) DEFAULT 'a,b' COMMENT 'x'")
                .reason
                .contains("DEFAULT a,b")
        );
    }
}
