//! Row filters: SQL conditions on one table's columns (`deleted = 0 AND status IN (1, 2)`),
//! placed into Sluice's own queries as `WHERE … AND (<filter>)`.
//!
//! A filter is checked before it is stored: it may name only columns of its own table
//! (unqualified), literals, operators and a short list of deterministic functions. Anything
//! that could reach beyond the condition (`;`, comments, subqueries, variables) is refused,
//! and so is anything that depends on the clock or chance (`NOW()`, `RAND()`): a row would
//! leave or enter such a filter with no change event to say so, and its document would
//! stay wrong.

/// Words a filter may use besides column names.
const KEYWORDS: &[&str] = &[
    "AND", "OR", "NOT", "XOR", "IN", "IS", "NULL", "LIKE", "BETWEEN", "TRUE", "FALSE", "UNKNOWN",
    "REGEXP", "RLIKE", "ESCAPE", "DIV", "MOD", "CASE", "WHEN", "THEN", "ELSE", "END",
];

/// Functions a filter may call: deterministic, on the row's own values.
const FUNCTIONS: &[&str] = &[
    "ABS",
    "CEIL",
    "CEILING",
    "FLOOR",
    "ROUND",
    "TRUNCATE",
    "SIGN",
    "MOD",
    "LOWER",
    "LCASE",
    "UPPER",
    "UCASE",
    "LENGTH",
    "CHAR_LENGTH",
    "CHARACTER_LENGTH",
    "TRIM",
    "LTRIM",
    "RTRIM",
    "SUBSTRING",
    "SUBSTR",
    "LEFT",
    "RIGHT",
    "CONCAT",
    "CONCAT_WS",
    "LOCATE",
    "INSTR",
    "REPLACE",
    "COALESCE",
    "IFNULL",
    "NULLIF",
    "IF",
    "ISNULL",
    "GREATEST",
    "LEAST",
    "FIND_IN_SET",
    "JSON_EXTRACT",
    "JSON_UNQUOTE",
    "JSON_CONTAINS",
    "JSON_LENGTH",
    "DATE",
    "YEAR",
    "MONTH",
    "DAY",
    "DAYOFWEEK",
    "HOUR",
];

/// Words that make a filter depend on when or where it runs.
const UNSTABLE: &[&str] = &[
    "NOW",
    "CURDATE",
    "CURTIME",
    "CURRENT_DATE",
    "CURRENT_TIME",
    "CURRENT_TIMESTAMP",
    "LOCALTIME",
    "LOCALTIMESTAMP",
    "SYSDATE",
    "UNIX_TIMESTAMP",
    "UTC_DATE",
    "UTC_TIME",
    "UTC_TIMESTAMP",
    "RAND",
    "UUID",
    "UUID_SHORT",
    "CONNECTION_ID",
    "CURRENT_USER",
    "USER",
    "DATABASE",
    "SCHEMA",
    "LAST_INSERT_ID",
    "SLEEP",
    "BENCHMARK",
];

#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    /// A `backticked` identifier: always a column.
    Quoted(String),
    Literal,
    Open,
    Close,
    Operator,
}

/// Checks `filter` and returns the columns it names (in order of first use). The error
/// says what is wrong, without a key (the caller knows which filter it checked).
pub fn check(filter: &str) -> Result<Vec<String>, String> {
    let tokens = tokenize(filter)?;
    if tokens.is_empty() {
        return Err("is empty".into());
    }
    let mut depth = 0i32;
    let mut columns: Vec<String> = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let called = tokens.get(i + 1) == Some(&Token::Open);
        match t {
            Token::Open => depth += 1,
            Token::Close => {
                depth -= 1;
                if depth < 0 {
                    return Err("has a `)` without its `(`".into());
                }
            }
            Token::Quoted(name) => {
                if called {
                    return Err(format!("calls `{name}`, which is not a function"));
                }
                if !columns.contains(name) {
                    columns.push(name.clone());
                }
            }
            Token::Word(word) => {
                let upper = word.to_ascii_uppercase();
                if UNSTABLE.contains(&upper.as_str()) {
                    return Err(format!(
                        "uses `{word}`, which depends on the clock or the session: a row would enter or leave the filter with no change event, so its document would go stale"
                    ));
                }
                if KEYWORDS.contains(&upper.as_str()) {
                    // `IN (…)`, `NOT (…)`: a keyword before a parenthesis is no call.
                } else if called {
                    if !FUNCTIONS.contains(&upper.as_str()) {
                        return Err(format!(
                            "calls `{word}`, which a filter may not (allowed: {})",
                            FUNCTIONS.join(", ")
                        ));
                    }
                } else if is_reserved(&upper) {
                    return Err(format!(
                        "uses `{word}`: a filter is a condition on its own table's columns (no subqueries or other statements)"
                    ));
                } else if !columns.contains(word) {
                    columns.push(word.clone());
                }
            }
            Token::Literal | Token::Operator => {}
        }
    }
    if depth != 0 {
        return Err("has a `(` without its `)`".into());
    }
    Ok(columns)
}

/// SQL words that are neither allowed keywords nor plausible column names.
fn is_reserved(upper: &str) -> bool {
    const RESERVED: &[&str] = &[
        "SELECT", "FROM", "WHERE", "UNION", "INTO", "EXISTS", "ANY", "ALL", "SOME", "JOIN",
        "GROUP", "HAVING", "ORDER", "LIMIT", "INSERT", "UPDATE", "DELETE", "DROP", "ALTER",
        "CREATE", "GRANT", "SET", "CALL", "DO", "HANDLER", "LOAD", "OUTFILE", "DUMPFILE", "FOR",
        "LOCK", "SHARE", "WINDOW", "OVER", "WITH", "AS", "INTERVAL", "BINARY", "COLLATE", "CAST",
        "CONVERT",
    ];
    RESERVED.contains(&upper)
}

fn tokenize(s: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '\'' => {
                i = skip_string(&chars, i)?;
                out.push(Token::Literal);
            }
            '"' => return Err("quotes a string with `\"`: use single quotes ('text')".into()),
            '`' => {
                let end = chars[i + 1..]
                    .iter()
                    .position(|&c| c == '`')
                    .ok_or("has a ` without its closing `")?;
                let name: String = chars[i + 1..i + 1 + end].iter().collect();
                if name.is_empty() {
                    return Err("has an empty `` identifier".into());
                }
                out.push(Token::Quoted(name));
                i += end + 2;
            }
            c if c.is_ascii_digit() => {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
                out.push(Token::Literal);
            }
            c if c.is_alphabetic() || c == '_' || c == '$' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '$')
                {
                    i += 1;
                }
                if chars.get(i) == Some(&'.') {
                    return Err(
                        "names a qualified column (`table.column`): a filter names its own table's columns only"
                            .into(),
                    );
                }
                out.push(Token::Word(chars[start..i].iter().collect()));
            }
            '(' => {
                out.push(Token::Open);
                i += 1;
            }
            ')' => {
                out.push(Token::Close);
                i += 1;
            }
            '-' if chars.get(i + 1) == Some(&'-') => {
                return Err("contains a comment (`--`)".into())
            }
            '/' if chars.get(i + 1) == Some(&'*') => {
                return Err("contains a comment (`/*`)".into())
            }
            '=' | '<' | '>' | '!' | '+' | '-' | '*' | '/' | '%' | '&' | '|' | '^' | '~' | ',' => {
                out.push(Token::Operator);
                i += 1;
            }
            ';' => return Err("contains `;`: a filter is one condition".into()),
            '#' => return Err("contains a comment (`#`)".into()),
            '@' => return Err("uses a variable (`@`)".into()),
            '?' => return Err("contains a placeholder (`?`)".into()),
            '.' => {
                return Err("names a qualified column (`table.column`): a filter names its own table's columns only".into())
            }
            other => return Err(format!("contains `{other}`, which a filter may not")),
        }
    }
    Ok(out)
}

/// The index after the string literal that starts at `start` (a `'`). A backslash is
/// refused: whether it escapes depends on the server's `sql_mode`
/// (`NO_BACKSLASH_ESCAPES`), so this reading and the server's could differ.
fn skip_string(chars: &[char], start: usize) -> Result<usize, String> {
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => {
                return Err(
                    "has a backslash in a string: write a quote inside a string as '' (two quotes)"
                        .into(),
                )
            }
            '\'' if chars.get(i + 1) == Some(&'\'') => i += 2,
            '\'' => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err("has a string without its closing `'`".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_on_own_columns_pass_and_name_them() {
        assert_eq!(check("deleted = 0").unwrap(), ["deleted"]);
        assert_eq!(
            check("status IN (1, 2) AND `name` LIKE 'a''b%' AND NOT deleted").unwrap(),
            ["status", "name", "deleted"]
        );
        assert_eq!(
            check("COALESCE(price, 0) > 10.5 AND lower(kind) <> 'x;--'").unwrap(),
            ["price", "kind"]
        );
        assert_eq!(
            check("created_at BETWEEN '2020-01-01' AND '2021-01-01' OR x IS NULL").unwrap(),
            ["created_at", "x"]
        );
    }

    #[test]
    fn escapes_and_unstable_filters_are_refused_with_why() {
        for (bad, why) in [
            ("", "empty"),
            ("a = 1; DROP TABLE t", "`;`"),
            ("a = 1 -- x", "comment"),
            ("a = 1 /* x */", "comment"),
            ("a = 1 # x", "comment"),
            ("a IN (SELECT id FROM t)", "subqueries"),
            ("created_at > NOW()", "clock"),
            ("created_at > CURRENT_DATE", "clock"),
            ("RAND() < 0.5", "clock"),
            ("SLEEP(1) = 0", "clock"),
            ("t.a = 1", "qualified"),
            ("a = @x", "variable"),
            ("a = ?", "placeholder"),
            ("(a = 1", "without its `)`"),
            ("a = 1)", "without its `(`"),
            ("a = 'x", "closing"),
            ("a = \"x\"", "single quotes"),
            ("LOAD_FILE('/etc/passwd') = 1", "may not"),
            ("a = '\\' OR b IN (SELECT x FROM t) #'", "backslash"),
        ] {
            let e = check(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
