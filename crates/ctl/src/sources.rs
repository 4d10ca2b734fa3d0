//! `sluicectl sources`: the MySQL servers whose binlogs Sluice streams.

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use sluice_proto::v1::*;

use crate::{print, Conn, Output};

#[derive(Subcommand)]
pub enum SourceCmd {
    List,
    /// Create or replace a source.
    Put(SourceArgs),
    /// Connect to a source as the workers would, without saving it: the server, what the
    /// preflight finds in the way, and the tables it would capture (exit 1 on a problem).
    Test(SourceArgs),
    /// The tables a source captures, with their columns (`*` marks the primary key).
    Tables {
        name: String,
        /// Every table of its server, not only those it captures.
        #[arg(long)]
        all: bool,
    },
    Delete {
        name: String,
    },
    /// Move a source to a new primary: its task resumes there from the confirmed GTID
    /// state under a new version epoch (nothing skipped, nothing refused as stale).
    Failover {
        name: String,
        /// The new primary.
        #[arg(long)]
        host: String,
        /// Default: keep the port.
        #[arg(long, default_value_t = 0)]
        port: u32,
    },
    /// Start a source's task again at its server's current end under a new version epoch
    /// and build each of its pipelines anew (e.g. after its resume position was purged).
    Resnapshot {
        name: String,
    },
}

#[derive(Args)]
pub struct SourceArgs {
    name: String,
    #[arg(long)]
    host: String,
    #[arg(long, default_value_t = 3306)]
    port: u32,
    #[arg(long)]
    user: String,
    /// `env:NAME` (a variable of the workers' environment) or `file:/path`.
    #[arg(long)]
    password_ref: String,
    #[arg(long)]
    server_id: u32,
    /// `db.table` or `db.*` patterns (comma-separated); none captures every table.
    #[arg(long, value_delimiter = ',')]
    tables: Vec<String>,
}

pub async fn run(conn: &mut Conn<'_>, out: Output, cmd: &SourceCmd) -> anyhow::Result<()> {
    match cmd {
        SourceCmd::List => list(conn, out).await?,
        SourceCmd::Put(a) => put(conn, out, a).await?,
        SourceCmd::Test(a) => test(conn, out, a).await?,
        SourceCmd::Tables { name, all } => {
            let req = ListTablesRequest {
                source: name.clone(),
                all: *all,
            };
            let r = conn
                .call_with(req, |mut c, req| async move { c.list_tables(req).await })
                .await?;
            print_tables(out, &r.tables);
        }
        SourceCmd::Failover { name, host, port } => failover(conn, out, name, host, *port).await?,
        SourceCmd::Resnapshot { name } => resnapshot(conn, out, name).await?,
        SourceCmd::Delete { name } => {
            crate::delete(conn, out, name, crate::Deleting::Source).await?;
        }
    }
    Ok(())
}

/// `sources list`: every source with its password reference, never a password.
async fn list(conn: &mut Conn<'_>, out: Output) -> anyhow::Result<()> {
    let r = conn
        .call(|mut c| async move { c.list_sources(ListSourcesRequest {}).await })
        .await?;
    print(
        out,
        &[
            "name",
            "host",
            "port",
            "user",
            "password",
            "server id",
            "tables",
            "epoch",
        ],
        r.sources
            .iter()
            .map(|s| {
                vec![
                    s.name.clone(),
                    s.host.clone(),
                    s.port.to_string(),
                    s.user.clone(),
                    s.password_ref.clone(),
                    s.server_id.to_string(),
                    if s.tables.is_empty() {
                        "*".into()
                    } else {
                        s.tables.join(",")
                    },
                    s.epoch.to_string(),
                ]
            })
            .collect(),
        Value::Array(r.sources.iter().map(source_json).collect()),
    );
    Ok(())
}

/// `sources put`: creates or replaces a source.
impl SourceArgs {
    fn message(&self) -> Source {
        Source {
            name: self.name.clone(),
            host: self.host.clone(),
            port: self.port,
            user: self.user.clone(),
            password_ref: self.password_ref.clone(),
            server_id: self.server_id,
            tables: self.tables.clone(),
            epoch: 0,
        }
    }
}

/// `sources test`: fails (exit 1) when the preflight found a problem.
async fn test(conn: &mut Conn<'_>, out: Output, a: &SourceArgs) -> anyhow::Result<()> {
    let t = conn
        .call_with(
            a.message(),
            |mut c, s| async move { c.test_source(s).await },
        )
        .await?;
    if out == Output::Json {
        let tables = tables_json(&t.tables);
        let v = json!({"server": t.server, "problems": t.problems, "tables": tables});
        println!("{v}");
    } else {
        println!(
            "server: {}",
            if t.server.is_empty() { "-" } else { &t.server }
        );
        for p in &t.problems {
            println!("problem: {p}");
        }
        print_tables(out, &t.tables);
    }
    if !t.problems.is_empty() {
        anyhow::bail!(
            "source {} cannot stream as given: {}",
            a.name,
            t.problems.join("; ")
        );
    }
    Ok(())
}

fn print_tables(out: Output, tables: &[Table]) {
    print(
        out,
        &["table", "rows (est.)", "columns"],
        tables
            .iter()
            .map(|t| {
                let columns: Vec<String> = t
                    .columns
                    .iter()
                    .map(|c| format!("{}{} {}", c.name, if c.key { "*" } else { "" }, c.r#type))
                    .collect();
                vec![
                    format!("{}.{}", t.database, t.table),
                    t.rows_estimated.to_string(),
                    columns.join(", "),
                ]
            })
            .collect(),
        Value::Array(tables_json(tables)),
    );
}

fn tables_json(tables: &[Table]) -> Vec<Value> {
    tables
        .iter()
        .map(|t| {
            json!({
                "database": t.database, "table": t.table, "rows_estimated": t.rows_estimated,
                "columns": t.columns.iter().map(|c| json!({
                    "name": c.name, "type": c.r#type, "key": c.key, "nullable": c.nullable,
                })).collect::<Vec<_>>(),
            })
        })
        .collect()
}

async fn put(conn: &mut Conn<'_>, out: Output, a: &SourceArgs) -> anyhow::Result<()> {
    let s = a.message();
    let s = conn
        .call_with(s, |mut c, s| async move { c.put_source(s).await })
        .await?;
    print(
        out,
        &["source", "stored"],
        vec![vec![s.name.clone(), "yes".into()]],
        source_json(&s),
    );
    Ok(())
}

/// `sources failover`: the source's task resumes at a new primary from its confirmed GTID
/// state.
async fn failover(
    conn: &mut Conn<'_>,
    out: Output,
    name: &str,
    host: &str,
    port: u32,
) -> anyhow::Result<()> {
    let req = FailoverRequest {
        name: name.to_owned(),
        host: host.to_owned(),
        port,
    };
    let s = conn
        .call_with(
            req,
            |mut c, req| async move { c.failover_source(req).await },
        )
        .await?;
    print(
        out,
        &["source", "now at", "version epoch"],
        vec![vec![
            s.name.clone(),
            format!("{}:{}", s.host, s.port),
            s.epoch.to_string(),
        ]],
        source_json(&s),
    );
    Ok(())
}

/// `sources resnapshot`: the task starts again at the server's end and each pipeline of
/// the source is built anew.
async fn resnapshot(conn: &mut Conn<'_>, out: Output, name: &str) -> anyhow::Result<()> {
    let req = ResnapshotRequest {
        name: name.to_owned(),
    };
    let r = conn
        .call_with(
            req,
            |mut c, req| async move { c.resnapshot_source(req).await },
        )
        .await?;
    let epoch = r.source.as_ref().map_or(0, |s| s.epoch);
    let list = |v: &[String]| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.join(",")
        }
    };
    print(
        out,
        &[
            "source",
            "version epoch",
            "builds started",
            "already building",
        ],
        vec![vec![
            name.to_owned(),
            epoch.to_string(),
            list(&r.builds_started),
            list(&r.already_building),
        ]],
        json!({"source": r.source.as_ref().map(source_json), "builds_started": r.builds_started,
               "already_building": r.already_building}),
    );
    Ok(())
}

fn source_json(s: &Source) -> Value {
    json!({"name": s.name, "host": s.host, "port": s.port, "user": s.user,
           "password_ref": s.password_ref, "server_id": s.server_id, "tables": s.tables,
           "epoch": s.epoch})
}
