//! `sluicectl`: the admin command line over the center's gRPC API. Readable tables by
//! default, `--output json` for scripts. Writes go to the leader: a follower's answer
//! names it, and sluicectl follows.

mod check;
mod delayed;
mod dict;
mod progress;

use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};
use sluice_core::PipelineSpec;
use sluice_proto::v1::admin_client::AdminClient;
use sluice_proto::v1::*;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};

use crate::progress::{Progress, Step};

#[derive(Parser)]
#[command(version, about = "Sluice admin command line")]
struct Cli {
    /// Center addresses (any replica; comma-separated), e.g. `http://127.0.0.1:7070`.
    #[arg(
        long,
        env = "SLUICECTL_CENTER",
        default_value = "http://127.0.0.1:7070",
        value_delimiter = ',',
        global = true
    )]
    center: Vec<String>,
    /// Bearer token (centers with `api.auth = "token"`).
    #[arg(long, env = "SLUICECTL_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// CA certificate (PEM) to verify the center's TLS certificate.
    #[arg(long, env = "SLUICECTL_CA", global = true)]
    ca: Option<std::path::PathBuf>,
    /// Client certificate and key (PEM) for mTLS.
    #[arg(long, env = "SLUICECTL_CERT", global = true, requires = "key")]
    cert: Option<std::path::PathBuf>,
    #[arg(long, env = "SLUICECTL_KEY", global = true, requires = "cert")]
    key: Option<std::path::PathBuf>,
    #[arg(long, short, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Who leads, at which epoch.
    Leader,
    /// MySQL instances (one binlog task each).
    #[command(subcommand)]
    Sources(SourceCmd),
    /// Table → index pipelines.
    #[command(subcommand)]
    Pipelines(PipelineCmd),
    /// Live workers and their tasks.
    Workers,
    /// Every task: assigned to, running on, position, lag.
    Tasks,
    /// Spread tasks evenly over the live workers now.
    Rebalance,
    /// Recent events, newest first.
    Events {
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Only events about this source, pipeline or worker.
        #[arg(long, default_value = "")]
        subject: String,
    },
    /// Dead letters: events the etl could not apply, rows a worker could not decode.
    #[command(subcommand)]
    Dlq(DlqCmd),
    /// The IK analyzer's dynamic dictionaries: extension words and stop words.
    #[command(subcommand)]
    Dict(dict::DictCmd),
    /// Changes of delayed relations: recorded as they stream in, applied by a job.
    #[command(subcommand)]
    Delayed(delayed::DelayedCmd),
}

#[derive(Subcommand)]
enum DlqCmd {
    /// Letters not replayed yet, newest first, each with its reason.
    List {
        /// Only this pipeline's.
        #[arg(long, default_value = "")]
        pipeline: String,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Letters already replayed too.
        #[arg(long)]
        include_replayed: bool,
    },
    /// Publishes letters' events again once their cause is fixed; their versions keep
    /// them from undoing newer changes. Each letter once, unless named by `--id`.
    Replay {
        /// Every letter of this pipeline not replayed yet.
        #[arg(long, default_value = "")]
        pipeline: String,
        /// This letter (`topic:partition:offset`, from `dlq list`), even if replayed before.
        #[arg(long = "id")]
        ids: Vec<String>,
        /// Every letter not replayed yet.
        #[arg(long, conflicts_with_all = ["pipeline", "ids"])]
        all: bool,
    },
}

#[derive(Subcommand)]
enum SourceCmd {
    List,
    /// Create or replace a source.
    Put(SourceArgs),
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
struct SourceArgs {
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

#[derive(Subcommand)]
enum PipelineCmd {
    List,
    /// Create or replace a pipeline (`--spec FILE` for one with relations).
    Put(Box<PipelineArgs>),
    /// One pipeline: its tables as a tree (`-o json`: its whole spec and state).
    Get {
        name: String,
    },
    /// Delete a pipeline and (once no etl writes to them) its indexes.
    Delete {
        name: String,
    },
    /// Build the next version of the index from a snapshot; the alias moves when done.
    Build {
        name: String,
        /// Rows per chunk (default 10000).
        #[arg(long, default_value_t = 0)]
        chunk_rows: u64,
        /// Rows per second per chunk reader (0: no limit).
        #[arg(long, default_value_t = 0)]
        throttle: u64,
        /// Follow the build with a progress bar until the alias moved (with --verify:
        /// until the build is held).
        #[arg(long)]
        wait: bool,
        /// Hold the new version once it caught up, beside the live one and taking live
        /// changes too, until `pipelines swap` (after a clean `pipelines compare`).
        #[arg(long)]
        verify: bool,
    },
    /// Compare a build held by --verify with MySQL (the alias may move only when they
    /// are equal) and with the live version (what the rebuild changes).
    Compare {
        name: String,
        /// Put right what differs from MySQL in the held version (then compare again).
        #[arg(long)]
        repair: bool,
        /// Follow it with a progress bar; exit 1 when it failed or found drift it did not
        /// repair.
        #[arg(long)]
        wait: bool,
    },
    /// Move the alias to a build held by --verify: refused unless its newest compare
    /// found it equal to MySQL, or with --force.
    Swap {
        name: String,
        #[arg(long)]
        force: bool,
        /// Wait until the alias moved.
        #[arg(long)]
        wait: bool,
    },
    /// Abandon a build in progress (the live alias is untouched).
    Reset {
        name: String,
    },
    /// Move the alias back to a kept version that was kept current (default: the newest).
    Rollback {
        name: String,
        /// The version to go back to.
        #[arg(long)]
        to: Option<u32>,
    },
    /// Drop a kept version (no longer a rollback target; its index is deleted).
    DropVersion {
        name: String,
        version: u32,
    },
    /// A build's progress (`--wait` follows it to the end).
    Status {
        name: String,
        #[arg(long)]
        wait: bool,
    },
    /// Compare the live index with MySQL (through the document builder), chunk by chunk
    /// on the workers: documents missing, extra (orphans) or different, with examples.
    Check {
        name: String,
        /// Only roots changed this recently by the spec's `check.updated_column` (`24h`);
        /// orphans are found by a full check only.
        #[arg(long, conflicts_with = "full")]
        since: Option<String>,
        /// Every row (the default).
        #[arg(long)]
        full: bool,
        /// Put right what differs: rewrite documents, delete orphans (through the etl,
        /// at the version of the read, so a newer change always wins).
        #[arg(long)]
        repair: bool,
        /// Follow it with a progress bar; exit 1 when it failed or found drift it did not
        /// repair.
        #[arg(long)]
        wait: bool,
    },
    /// A pipeline's checks, newest first, with examples of what they found.
    Checks {
        name: String,
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Only `check`, `compare` or `delayed` runs.
        #[arg(long, default_value = "")]
        kind: String,
    },
}

#[derive(Args)]
struct PipelineArgs {
    name: String,
    /// The whole pipeline from a TOML or JSON file (relations, filters, join mode; see
    /// the README's pipeline spec); the flags below describe a single table instead.
    #[arg(long, conflicts_with_all = ["source", "database", "table", "alias", "columns", "fields", "filter", "id"])]
    spec: Option<std::path::PathBuf>,
    #[arg(long, required_unless_present = "spec")]
    source: Option<String>,
    #[arg(long, required_unless_present = "spec")]
    database: Option<String>,
    #[arg(long, required_unless_present = "spec")]
    table: Option<String>,
    /// Default: the name, lowercased.
    #[arg(long)]
    alias: Option<String>,
    /// Columns to index (comma-separated); none indexes every column.
    #[arg(long, value_delimiter = ',')]
    columns: Vec<String>,
    /// Only rows matching this SQL condition are documents (e.g. `deleted = 0`).
    #[arg(long)]
    filter: Option<String>,
    /// Columns whose values make the document `_id` (comma-separated); default: the primary key.
    #[arg(long, value_delimiter = ',')]
    id: Vec<String>,
    #[arg(long)]
    shards: Option<u32>,
    #[arg(long)]
    replicas: Option<u32>,
    #[arg(long)]
    tombstone_retention: Option<String>,
    /// Earlier versions kept current for rollback (default 1; 0: none).
    #[arg(long)]
    keep_history: Option<u32>,
    /// The index's refresh_interval (`1s`, `30s`, `-1`: off); default: the server's.
    #[arg(long)]
    refresh_interval: Option<String>,
    /// Build by itself when DDL changes rows without row events (ADD COLUMN with a
    /// default, DROP/MODIFY/RENAME COLUMN, TRUNCATE...); otherwise it is only marked.
    #[arg(long)]
    auto_rebuild: bool,
    /// A column's mapping override, `COLUMN:KEY=VALUE[,KEY=VALUE...]`, repeatable. Keys:
    /// type, analyzer, search_analyzer, keyword (true/false), copy_to (targets joined
    /// by `+`), index (true/false). E.g. `--field title:analyzer=english,copy_to=all`.
    #[arg(long = "field", value_parser = parse_field)]
    fields: Vec<(String, FieldMapping)>,
}

impl PipelineArgs {
    /// The pipeline these arguments describe: the spec file's, or a single table's; the
    /// settings flags apply to either.
    fn spec(&self) -> anyhow::Result<PipelineSpec> {
        let mut spec = match &self.spec {
            Some(path) => {
                let spec = read_spec(path)?;
                if !spec.name.is_empty() && spec.name != self.name {
                    bail!(
                        "{}: names the pipeline `{}`, the command line `{}`",
                        path.display(),
                        spec.name,
                        self.name
                    );
                }
                PipelineSpec {
                    name: self.name.clone(),
                    ..spec
                }
            }
            None => {
                let required = |v: &Option<String>| v.clone().unwrap_or_default();
                let mut spec = PipelineSpec::table(
                    &self.name,
                    &required(&self.source),
                    &required(&self.database),
                    &required(&self.table),
                );
                spec.alias = self.alias.clone().unwrap_or_default();
                spec.columns = self.columns.clone();
                spec.filter = self.filter.clone().unwrap_or_default();
                spec.id = self.id.clone();
                let fields = self.fields.iter().cloned().collect();
                spec.fields = sluice_proto::convert::overrides(&fields);
                spec
            }
        };
        if let Some(n) = self.shards {
            spec.shards = n;
        }
        if let Some(n) = self.replicas {
            spec.replicas = n;
        }
        if let Some(t) = &self.tombstone_retention {
            spec.tombstone_retention = t.clone();
        }
        if let Some(r) = &self.refresh_interval {
            spec.refresh_interval = r.clone();
        }
        if let Some(n) = self.keep_history {
            spec.keep_history = n;
        }
        spec.auto_rebuild |= self.auto_rebuild;
        Ok(spec)
    }
}

/// A pipeline spec file: JSON when it says so (`.json`, or it starts with `{`), TOML
/// otherwise. Errors name the key.
fn read_spec(path: &std::path::Path) -> anyhow::Result<PipelineSpec> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--spec {}", path.display()))?;
    let json = path.extension().is_some_and(|e| e == "json") || text.trim_start().starts_with('{');
    let value: Value = if json {
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?
    } else {
        let table: toml::Table =
            toml::from_str(&text).with_context(|| format!("{}: not TOML", path.display()))?;
        serde_json::to_value(table)?
    };
    serde_path_to_error::deserialize(value).map_err(|e| {
        let key = e.path().to_string();
        anyhow::anyhow!("{}: `{key}`: {}", path.display(), e.into_inner())
    })
}

/// `COLUMN:KEY=VALUE[,KEY=VALUE...]` as a column's field mapping override.
fn parse_field(arg: &str) -> Result<(String, FieldMapping), String> {
    let (column, spec) = arg
        .split_once(':')
        .ok_or("expected COLUMN:KEY=VALUE[,KEY=VALUE...]")?;
    let mut f = FieldMapping::default();
    let flag = |key: &str, v: &str| match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{key}: `{v}` is not true or false")),
    };
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        let (key, v) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}`: expected KEY=VALUE"))?;
        match key {
            "type" => f.r#type = v.into(),
            "analyzer" => f.analyzer = v.into(),
            "search_analyzer" => f.search_analyzer = v.into(),
            "keyword" => f.keyword = Some(flag(key, v)?),
            "index" => f.index = Some(flag(key, v)?),
            "copy_to" => f.copy_to.extend(v.split('+').map(String::from)),
            _ => {
                return Err(format!(
                    "`{key}`: not a field key (type, analyzer, search_analyzer, keyword, copy_to, index)"
                ))
            }
        }
    }
    Ok((column.to_owned(), f))
}

type Client = AdminClient<InterceptedService<Channel, Bearer>>;

#[derive(Clone)]
struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

struct Conn<'a> {
    cli: &'a Cli,
    client: Client,
}

impl<'a> Conn<'a> {
    async fn open(cli: &'a Cli) -> anyhow::Result<Self> {
        let mut last = None;
        for addr in &cli.center {
            match connect(cli, addr).await {
                Ok(client) => return Ok(Self { cli, client }),
                Err(e) => last = Some(e.context(format!("center {addr}"))),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no --center given")))
    }

    /// Runs a call; when a follower refused a write, repeats it at the leader it named.
    async fn call<T, F, Fut>(&mut self, call: F) -> anyhow::Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        match call(self.client.clone()).await {
            Ok(r) => Ok(r.into_inner()),
            Err(s) if s.code() == Code::FailedPrecondition => {
                let Some(leader) = s
                    .metadata()
                    .get("sluice-leader")
                    .and_then(|v| v.to_str().ok())
                else {
                    bail!(status(s));
                };
                let leader = with_scheme(self.cli, leader);
                let client = connect(self.cli, &leader).await?;
                self.client = client.clone();
                call(client)
                    .await
                    .map(|r| r.into_inner())
                    .map_err(|s| anyhow::anyhow!(status(s)))
            }
            Err(s) => bail!(status(s)),
        }
    }
}

fn with_scheme(cli: &Cli, addr: &str) -> String {
    if addr.contains("://") {
        addr.to_owned()
    } else if cli.ca.is_some() {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    }
}

fn status(s: Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

async fn connect(cli: &Cli, addr: &str) -> anyhow::Result<Client> {
    let addr = with_scheme(cli, addr);
    let mut endpoint = Endpoint::from_shared(addr.clone())
        .with_context(|| format!("`{addr}` is not a URL"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(60));
    if cli.ca.is_some() || cli.cert.is_some() {
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = &cli.ca {
            tls = tls.ca_certificate(Certificate::from_pem(
                std::fs::read(ca).with_context(|| format!("--ca {}", ca.display()))?,
            ));
        }
        if let (Some(cert), Some(key)) = (&cli.cert, &cli.key) {
            tls = tls.identity(Identity::from_pem(
                std::fs::read(cert).with_context(|| format!("--cert {}", cert.display()))?,
                std::fs::read(key).with_context(|| format!("--key {}", key.display()))?,
            ));
        }
        endpoint = endpoint.tls_config(tls)?;
    }
    let channel = endpoint.connect().await?;
    let bearer = match &cli.token {
        Some(t) => Some(
            MetadataValue::try_from(format!("Bearer {t}"))
                .context("--token: not a valid header value")?,
        ),
        None => None,
    };
    Ok(AdminClient::with_interceptor(channel, Bearer(bearer)))
}

/// Prints rows as an aligned table, or the JSON value.
fn print(output: Output, headers: &[&str], rows: Vec<Vec<String>>, as_json: Value) {
    if output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&as_json).expect("JSON"));
        return;
    }
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", text.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_uppercase()).collect());
    for row in rows {
        line(row);
    }
}

fn ago(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let s = (now - ms).max(0) / 1000;
    match s {
        0..=119 => format!("{s}s ago"),
        120..=7199 => format!("{}m ago", s / 60),
        _ => format!("{}h ago", s / 3600),
    }
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_owned()
    }
}

fn version(v: u32) -> String {
    if v == 0 {
        "-".into()
    } else {
        format!("v{v}")
    }
}

fn build_json(b: &BuildStatus) -> Value {
    json!({"pipeline": b.pipeline, "version": b.version, "phase": b.phase, "chunks": b.chunks,
           "chunks_done": b.chunks_done, "rows_done": b.rows_done, "rows_estimated": b.rows_estimated,
           "rows_per_sec": b.rows_per_sec, "started_at_ms": b.started_at_ms, "message": b.message,
           "needs_rebuild": b.needs_rebuild})
}

fn print_build(out: Output, b: &BuildStatus) {
    print(
        out,
        &[
            "pipeline", "version", "phase", "chunks", "rows", "rows/s", "note",
        ],
        vec![vec![
            b.pipeline.clone(),
            version(b.version),
            b.phase.clone(),
            format!("{}/{}", b.chunks_done, b.chunks),
            format!("{}/~{}", b.rows_done, b.rows_estimated),
            format!("{:.0}", b.rows_per_sec),
            or_dash(&b.message),
        ]],
        build_json(b),
    );
    if out == Output::Table && !b.needs_rebuild.is_empty() {
        println!(
            "\n{} needs a rebuild (sluicectl pipelines build {}): {}",
            b.pipeline, b.pipeline, b.needs_rebuild
        );
    }
}

/// Follows a build with a progress bar until it ends, or until it is held for
/// verification unless `through_held` (a swap was just released).
async fn follow_build(
    conn: &mut Conn<'_>,
    name: &str,
    out: Output,
    through_held: bool,
) -> anyhow::Result<()> {
    let req = GetBuildRequest {
        name: name.to_owned(),
    };
    let mut progress: Option<Progress> = None;
    loop {
        let b = conn
            .call(|mut c| {
                let req = req.clone();
                async move { c.get_build(req).await }
            })
            .await?;
        if b.phase == "failed" {
            if let Some(p) = progress {
                p.finish();
            }
            print_build(out, &b);
            bail!("the build of version {} failed: {}", b.version, b.message);
        }
        if out == Output::Table {
            progress
                .get_or_insert_with(|| Progress::stderr(format!("{} v{}", b.pipeline, b.version)))
                .show(build_step(&b));
        }
        if matches!(b.phase.as_str(), "done" | "none") || (b.phase == "held" && !through_held) {
            if let Some(p) = progress {
                p.finish();
            }
            print_build(out, &b);
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn build_step(b: &BuildStatus) -> Step {
    let eta = if b.rows_per_sec > 0.0 && b.rows_done < b.rows_estimated {
        format!(
            ", ETA {:.0}s",
            (b.rows_estimated - b.rows_done) as f64 / b.rows_per_sec
        )
    } else {
        String::new()
    };
    Step {
        done: b.rows_done,
        total: b.rows_estimated,
        stage: b.phase.clone(),
        detail: format!(
            "{}/~{} rows, {}/{} chunks, {:.0} rows/s{eta}",
            b.rows_done, b.rows_estimated, b.chunks_done, b.chunks, b.rows_per_sec
        ),
    }
}

fn count_relations(relations: &[Relation]) -> usize {
    relations
        .iter()
        .map(|r| 1 + count_relations(&r.relations))
        .sum()
}

fn source_json(s: &Source) -> Value {
    json!({"name": s.name, "host": s.host, "port": s.port, "user": s.user,
           "password_ref": s.password_ref, "server_id": s.server_id, "tables": s.tables,
           "epoch": s.epoch})
}

/// A pipeline as JSON: its spec as a spec file would say it, and the center's state.
/// Where a pipeline's versions stand: live, kept (`*`: kept current, a rollback target).
fn print_versions(out: Output, p: &Pipeline) {
    let kept: Vec<String> = p
        .history
        .iter()
        .map(|v| {
            let current = if p.current_history.contains(v) {
                "*"
            } else {
                ""
            };
            format!("{v}{current}")
        })
        .collect();
    print(
        out,
        &["pipeline", "state", "live version", "kept (* current)"],
        vec![vec![
            p.name.clone(),
            p.state.clone(),
            p.live_version.to_string(),
            or_dash(&kept.join(",")),
        ]],
        pipeline_json(p),
    );
}

fn pipeline_json(p: &Pipeline) -> Value {
    let mut v = match sluice_proto::convert::pipeline_spec(p.clone()) {
        Ok(spec) => serde_json::to_value(spec).expect("a spec serializes"),
        Err(e) => json!({ "name": p.name, "unreadable": e }),
    };
    for (key, value) in [
        ("state", json!(p.state)),
        ("live_version", json!(p.live_version)),
        ("building_version", json!(p.building_version)),
        ("history", json!(p.history)),
        ("current_history", json!(p.current_history)),
        ("needs_rebuild", json!(p.needs_rebuild)),
    ] {
        v[key] = value;
    }
    v
}

/// The pipeline's relations as an indented tree, one line each.
fn relation_lines(relations: &[Relation], depth: usize, out: &mut Vec<String>) {
    for r in relations {
        let kind = RelationKind::try_from(r.kind)
            .map(|k| k.as_str_name().to_ascii_lowercase())
            .unwrap_or_else(|_| "?".into());
        let on: Vec<String> = r.on.iter().map(|(p, c)| format!("{p} = {c}")).collect();
        let mut line = format!(
            "{}{} {kind}{} {} on {}",
            "  ".repeat(depth),
            r.name,
            match r.nested {
                Some(true) => " nested",
                Some(false) => " object",
                None => "",
            },
            if r.database.is_empty() {
                r.table.clone()
            } else {
                format!("{}.{}", r.database, r.table)
            },
            on.join(", ")
        );
        if !r.filter.is_empty() {
            line.push_str(&format!(" where {}", r.filter));
        }
        if r.distinct {
            line.push_str(" distinct");
        }
        if !r.order_by.is_empty() {
            line.push_str(&format!(" order by {}", r.order_by.join(", ")));
        }
        if r.limit > 0 {
            line.push_str(&format!(" limit {}", r.limit));
        }
        out.push(line);
        relation_lines(&r.relations, depth + 1, out);
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(&cli).await {
        eprintln!("sluicectl: {e:#}");
        std::process::exit(1);
    }
}

async fn run(cli: &Cli) -> anyhow::Result<()> {
    let mut conn = Conn::open(cli).await?;
    let out = cli.output;
    match &cli.command {
        Command::Leader => {
            let l = conn
                .call(|mut c| async move { c.get_leader(GetLeaderRequest {}).await })
                .await?;
            print(
                out,
                &["leader", "address", "epoch", "answered by"],
                vec![vec![
                    or_dash(&l.leader_id),
                    or_dash(&l.leader_addr),
                    l.epoch.to_string(),
                    l.answered_by.clone(),
                ]],
                json!({"leader_id": l.leader_id, "leader_addr": l.leader_addr, "epoch": l.epoch,
                       "answered_by": l.answered_by, "answered_by_leader": l.answered_by_leader}),
            );
        }
        Command::Sources(SourceCmd::List) => {
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
        }
        Command::Sources(SourceCmd::Put(a)) => {
            let s = Source {
                name: a.name.clone(),
                host: a.host.clone(),
                port: a.port,
                user: a.user.clone(),
                password_ref: a.password_ref.clone(),
                server_id: a.server_id,
                tables: a.tables.clone(),
                epoch: 0,
            };
            let s = conn
                .call(|mut c| {
                    let s = s.clone();
                    async move { c.put_source(s).await }
                })
                .await?;
            print(
                out,
                &["source", "stored"],
                vec![vec![s.name.clone(), "yes".into()]],
                source_json(&s),
            );
        }
        Command::Sources(SourceCmd::Failover { name, host, port }) => {
            let req = FailoverRequest {
                name: name.clone(),
                host: host.clone(),
                port: *port,
            };
            let s = conn
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.failover_source(req).await }
                })
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
        }
        Command::Sources(SourceCmd::Resnapshot { name }) => {
            let req = ResnapshotRequest { name: name.clone() };
            let r = conn
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.resnapshot_source(req).await }
                })
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
                    name.clone(),
                    epoch.to_string(),
                    list(&r.builds_started),
                    list(&r.already_building),
                ]],
                json!({"source": r.source.as_ref().map(source_json), "builds_started": r.builds_started,
                       "already_building": r.already_building}),
            );
        }
        Command::Sources(SourceCmd::Delete { name })
        | Command::Pipelines(PipelineCmd::Delete { name }) => {
            let is_source = matches!(cli.command, Command::Sources(_));
            let req = DeleteRequest { name: name.clone() };
            let r = conn
                .call(|mut c| {
                    let req = req.clone();
                    async move {
                        if is_source {
                            c.delete_source(req).await
                        } else {
                            c.delete_pipeline(req).await
                        }
                    }
                })
                .await?;
            print(
                out,
                &["deleted", "existed"],
                vec![vec![name.clone(), r.existed.to_string()]],
                json!({"name": name, "existed": r.existed}),
            );
        }
        Command::Pipelines(PipelineCmd::Build {
            name,
            chunk_rows,
            throttle,
            wait,
            verify,
        }) => {
            let req = BuildRequest {
                name: name.clone(),
                chunk_rows: *chunk_rows,
                throttle_rows_per_sec: *throttle,
                verify: *verify,
            };
            let b = conn
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.build_pipeline(req).await }
                })
                .await?;
            if *wait {
                follow_build(&mut conn, name, out, false).await?;
            } else {
                print_build(out, &b);
            }
        }
        Command::Pipelines(PipelineCmd::Status { name, wait }) => {
            if *wait {
                follow_build(&mut conn, name, out, false).await?;
            } else {
                let req = GetBuildRequest { name: name.clone() };
                let b = conn
                    .call(|mut c| {
                        let req = req.clone();
                        async move { c.get_build(req).await }
                    })
                    .await?;
                print_build(out, &b);
            }
        }
        Command::Pipelines(PipelineCmd::Check {
            name,
            since,
            full: _,
            repair,
            wait,
        }) => {
            let req = CheckRequest {
                pipeline: name.clone(),
                since: since.clone().unwrap_or_default(),
                repair: *repair,
            };
            let c = conn
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.start_check(req).await }
                })
                .await?;
            check::started(&mut conn, out, c, *wait).await?;
        }
        Command::Pipelines(PipelineCmd::Compare { name, repair, wait }) => {
            let req = CompareRequest {
                pipeline: name.clone(),
                repair: *repair,
            };
            let c = conn
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.start_compare(req).await }
                })
                .await?;
            check::started(&mut conn, out, c, *wait).await?;
        }
        Command::Pipelines(PipelineCmd::Swap { name, force, wait }) => {
            let req = SwapRequest {
                name: name.clone(),
                force: *force,
            };
            let b = conn
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.swap_pipeline(req).await }
                })
                .await?;
            if *wait {
                follow_build(&mut conn, name, out, true).await?;
            } else {
                print_build(out, &b);
            }
        }
        Command::Pipelines(PipelineCmd::Checks { name, limit, kind }) => {
            check::list(&mut conn, out, name, kind, *limit).await?;
        }
        Command::Pipelines(PipelineCmd::Reset { name }) => {
            let req = ResetRequest { name: name.clone() };
            let p = conn
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.reset_pipeline(req).await }
                })
                .await?;
            print_versions(out, &p);
        }
        Command::Pipelines(PipelineCmd::Rollback { name, to }) => {
            let req = RollbackRequest {
                name: name.clone(),
                to_version: to.unwrap_or(0),
            };
            let p = conn
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.rollback_pipeline(req).await }
                })
                .await?;
            print_versions(out, &p);
        }
        Command::Pipelines(PipelineCmd::DropVersion { name, version }) => {
            let req = DropVersionRequest {
                name: name.clone(),
                version: *version,
            };
            let p = conn
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.drop_version(req).await }
                })
                .await?;
            print_versions(out, &p);
        }
        Command::Pipelines(PipelineCmd::List) => {
            let r = conn
                .call(|mut c| async move { c.list_pipelines(ListPipelinesRequest {}).await })
                .await?;
            print(
                out,
                &[
                    "name",
                    "source",
                    "table",
                    "alias",
                    "state",
                    "live",
                    "building",
                    "columns",
                    "relations",
                    "shards",
                    "replicas",
                    "rebuild",
                ],
                r.pipelines
                    .iter()
                    .map(|p| {
                        vec![
                            p.name.clone(),
                            p.source.clone(),
                            format!("{}.{}", p.database, p.table),
                            p.alias.clone(),
                            or_dash(&p.state),
                            version(p.live_version),
                            version(p.building_version),
                            if p.columns.is_empty() {
                                "*".into()
                            } else {
                                p.columns.join(",")
                            },
                            count_relations(&p.relations).to_string(),
                            p.shards.to_string(),
                            p.replicas.to_string(),
                            if p.needs_rebuild.is_empty() {
                                "-"
                            } else {
                                "needed"
                            }
                            .into(),
                        ]
                    })
                    .collect(),
                Value::Array(r.pipelines.iter().map(pipeline_json).collect()),
            );
            if out == Output::Table {
                for p in r.pipelines.iter().filter(|p| !p.needs_rebuild.is_empty()) {
                    println!(
                        "\n{} needs a rebuild (sluicectl pipelines build {}): {}",
                        p.name, p.name, p.needs_rebuild
                    );
                }
            }
        }
        Command::Pipelines(PipelineCmd::Put(a)) => {
            let spec = a.spec()?;
            let p = sluice_proto::convert::pipeline(&spec, &Default::default());
            let p = conn
                .call(|mut c| {
                    let p = p.clone();
                    async move { c.put_pipeline(p).await }
                })
                .await?;
            print(
                out,
                &["pipeline", "alias", "tables"],
                vec![vec![
                    p.name.clone(),
                    p.alias.clone(),
                    (1 + count_relations(&p.relations)).to_string(),
                ]],
                pipeline_json(&p),
            );
        }
        Command::Pipelines(PipelineCmd::Get { name }) => {
            let r = conn
                .call(|mut c| async move { c.list_pipelines(ListPipelinesRequest {}).await })
                .await?;
            let p = r
                .pipelines
                .iter()
                .find(|p| &p.name == name)
                .with_context(|| format!("no pipeline `{name}`"))?;
            if out == Output::Json {
                println!("{}", serde_json::to_string_pretty(&pipeline_json(p))?);
            } else {
                println!(
                    "{} {}.{}{} -> {} ({}, live {}, building {})",
                    p.name,
                    p.database,
                    p.table,
                    if p.filter.is_empty() {
                        String::new()
                    } else {
                        format!(" where {}", p.filter)
                    },
                    p.alias,
                    p.state,
                    version(p.live_version),
                    version(p.building_version)
                );
                let mut lines = Vec::new();
                relation_lines(&p.relations, 1, &mut lines);
                for line in lines {
                    println!("{line}");
                }
            }
        }
        Command::Workers => {
            let r = conn
                .call(|mut c| async move { c.list_workers(ListWorkersRequest {}).await })
                .await?;
            print(
                out,
                &["worker", "address", "version", "started", "capacity", "tasks"],
                r.workers
                    .iter()
                    .map(|w| vec![w.id.clone(), or_dash(&w.addr), w.version.clone(), ago(w.started_at_ms), w.capacity.to_string(), if w.tasks.is_empty() { "-".into() } else { w.tasks.join(",") }])
                    .collect(),
                Value::Array(r.workers.iter().map(|w| json!({"id": w.id, "addr": w.addr, "version": w.version, "started_at_ms": w.started_at_ms, "capacity": w.capacity, "tasks": w.tasks})).collect()),
            );
        }
        Command::Tasks => {
            let r = conn
                .call(|mut c| async move { c.list_tasks(ListTasksRequest {}).await })
                .await?;
            print(
                out,
                &["task", "assigned to", "running on", "position", "gtid", "state", "events", "lag", "reported"],
                r.tasks
                    .iter()
                    .map(|t| vec![t.source.clone(), or_dash(&t.assigned_to), or_dash(&t.running_on), or_dash(&t.position), or_dash(&t.gtid), or_dash(&t.state), t.events_published.to_string(), format!("{:.1}s", t.lag_seconds), ago(t.reported_at_ms)])
                    .collect(),
                Value::Array(r.tasks.iter().map(|t| json!({"source": t.source, "assigned_to": t.assigned_to, "running_on": t.running_on, "position": t.position, "gtid": t.gtid, "state": t.state, "events_published": t.events_published, "lag_seconds": t.lag_seconds, "reported_at_ms": t.reported_at_ms, "generation": t.generation})).collect()),
            );
        }
        Command::Rebalance => {
            let r = conn
                .call(|mut c| async move { c.rebalance(RebalanceRequest {}).await })
                .await?;
            print(
                out,
                &["task", "from", "to"],
                r.moves
                    .iter()
                    .map(|m| vec![m.task.clone(), or_dash(&m.from), m.to.clone()])
                    .collect(),
                Value::Array(
                    r.moves
                        .iter()
                        .map(|m| json!({"task": m.task, "from": m.from, "to": m.to}))
                        .collect(),
                ),
            );
        }
        Command::Events { limit, subject } => {
            let req = ListEventsRequest {
                limit: *limit,
                subject: subject.clone(),
            };
            let r = conn
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.list_events(req).await }
                })
                .await?;
            print(
                out,
                &["id", "when", "origin", "kind", "subject", "message"],
                r.events.iter().map(|e| vec![e.id.to_string(), ago(e.at_ms), e.origin.clone(), e.kind.clone(), e.subject.clone(), e.message.clone()]).collect(),
                Value::Array(r.events.iter().map(|e| json!({"id": e.id, "at_ms": e.at_ms, "origin": e.origin, "kind": e.kind, "subject": e.subject, "message": e.message})).collect()),
            );
        }
        Command::Dlq(cmd) => dlq(&mut conn, out, cmd).await?,
        Command::Dict(cmd) => dict::run(&mut conn, out, cmd).await?,
        Command::Delayed(cmd) => delayed::run(&mut conn, out, cmd).await?,
    }
    Ok(())
}

async fn dlq(conn: &mut Conn<'_>, out: Output, cmd: &DlqCmd) -> anyhow::Result<()> {
    match cmd {
        DlqCmd::List {
            pipeline,
            limit,
            include_replayed,
        } => {
            let req = ListDeadLettersRequest {
                pipeline: pipeline.clone(),
                limit: *limit,
                include_replayed: *include_replayed,
            };
            let r = conn
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.list_dead_letters(req).await }
                })
                .await?;
            let letter_json = |l: &DeadLetter| {
                json!({"id": l.id, "at_ms": l.at_ms, "reason": l.reason, "pipeline": l.pipeline,
                       "source": l.source, "table": l.table, "key": l.key, "origin": l.origin,
                       "not_replayable": l.not_replayable, "replayed_at_ms": l.replayed_at_ms})
            };
            print(
                out,
                &["id", "when", "pipeline", "table", "key", "reason", "replay"],
                r.letters
                    .iter()
                    .map(|l| {
                        let replay = match (l.replayed_at_ms, l.not_replayable.is_empty()) {
                            (0, true) => "yes".to_owned(),
                            (0, false) => format!("no: {}", l.not_replayable),
                            (at, _) => format!("replayed {}", ago(at)),
                        };
                        vec![
                            l.id.clone(),
                            ago(l.at_ms),
                            or_dash(&l.pipeline),
                            or_dash(&l.table),
                            or_dash(&l.key),
                            l.reason.clone(),
                            replay,
                        ]
                    })
                    .collect(),
                json!({"letters": r.letters.iter().map(letter_json).collect::<Vec<_>>(),
                       "matched": r.matched, "truncated": r.truncated}),
            );
            if out == Output::Table && (r.truncated || r.matched > r.letters.len() as u64) {
                eprintln!(
                    "{} of {} matching letters shown{}",
                    r.letters.len(),
                    r.matched,
                    if r.truncated {
                        "; the topics were not read to their end"
                    } else {
                        ""
                    }
                );
            }
        }
        DlqCmd::Replay { pipeline, ids, all } => {
            let req = ReplayDeadLettersRequest {
                pipeline: pipeline.clone(),
                ids: ids.clone(),
                all: *all,
            };
            let r = conn
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.replay_dead_letters(req).await }
                })
                .await?;
            print(
                out,
                &["letter", "outcome"],
                r.replayed
                    .iter()
                    .map(|id| vec![id.clone(), "replayed".to_owned()])
                    .chain(r.refused.iter().map(|why| {
                        let (id, why) = why.split_once(": ").unwrap_or((why, ""));
                        vec![id.to_owned(), format!("refused: {why}")]
                    }))
                    .collect(),
                json!({"replayed": r.replayed, "refused": r.refused}),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("sluicectl-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_spec_reads_alike_from_toml_and_json_and_names_an_unknown_key() {
        let toml = file(
            "shop.toml",
            r#"
source = "shop"
database = "shop"
table = "products"
filter = "deleted = 0"

[[relations]]
name = "skus"
kind = "one_to_many"
table = "skus"
on = { id = "product_id" }
limit = 5
"#,
        );
        let json = file(
            "shop.json",
            r#"{"source": "shop", "database": "shop", "table": "products", "filter": "deleted = 0",
                "relations": [{"name": "skus", "kind": "one_to_many", "table": "skus",
                               "on": {"id": "product_id"}, "limit": 5}]}"#,
        );
        let from_toml = read_spec(&toml).unwrap();
        assert_eq!(from_toml, read_spec(&json).unwrap());
        assert_eq!(from_toml.relations[0].limit, Some(5));
        let typo = file(
            "typo.toml",
            "source = \"s\"\ndatabase = \"d\"\ntable = \"t\"\n[[relations]]\nname = \"r\"\nkind = \"one_to_one\"\ntable = \"x\"\non = { a = \"b\" }\nordr_by = [\"a\"]\n",
        );
        let e = read_spec(&typo).unwrap_err().to_string();
        assert!(e.contains("`relations[0].ordr_by`"), "{e}");
        for p in [toml, json, typo] {
            let _ = std::fs::remove_file(p);
        }
    }
}
