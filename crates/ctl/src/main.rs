//! `sluicectl`: the admin command line over the center's gRPC API. Readable tables by
//! default, `--output json` for scripts. Writes go to the leader: a follower's answer
//! names it, and sluicectl follows.

mod check;
mod cluster;
mod delayed;
mod dict;
mod dlq;
mod explain;
mod pipelines;
mod progress;
mod sources;
mod users;

use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};
use sluice_proto::v1::admin_client::AdminClient;
use sluice_proto::v1::*;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};

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
    Sources(sources::SourceCmd),
    /// Table → index pipelines.
    #[command(subcommand)]
    Pipelines(pipelines::PipelineCmd),
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
        /// Only events of this kind (`pipeline`, `build`, `task_failed`, …).
        #[arg(long, default_value = "")]
        kind: String,
        /// Only events this recent (`1h`, `2d`).
        #[arg(long, value_parser = humantime::parse_duration)]
        since: Option<std::time::Duration>,
    },
    /// Dead letters: events the etl could not apply, rows a worker could not decode.
    #[command(subcommand)]
    Dlq(dlq::DlqCmd),
    /// The IK analyzer's dynamic dictionaries: extension words and stop words.
    #[command(subcommand)]
    Dict(dict::DictCmd),
    /// Changes of delayed relations: recorded as they stream in, applied by a job.
    #[command(subcommand)]
    Delayed(delayed::DelayedCmd),
    /// The user and role the center sees these calls as.
    Whoami,
    /// Users and their roles (admins).
    #[command(subcommand)]
    Users(users::UserCmd),
    /// API tokens: each user's credentials for sluicectl and gRPC clients.
    #[command(subcommand)]
    Tokens(users::TokenCmd),
    /// A new token for an application of the search API and the `[[search.apps]]` entry
    /// that admits it (made here, sent nowhere: the centers' config holds only its digest).
    AppToken {
        /// The application's name.
        name: String,
    },
    /// The audit log: every change, allowed or refused, with who, when and from where.
    Audit {
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Only this user's calls.
        #[arg(long, default_value = "")]
        user: String,
        /// Only calls of this method (e.g. `PutSource`).
        #[arg(long, default_value = "")]
        method: String,
    },
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

    /// [`Conn::call`] of a request, cloned for each try.
    async fn call_with<R, T, F, Fut>(&mut self, req: R, call: F) -> anyhow::Result<T>
    where
        R: Clone,
        F: Fn(Client, R) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call(|c| call(c, req.clone())).await
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

/// `app-token NAME`: a random token (256 bits, hex) and its SHA-256.
fn app_token(name: &str, out: Output) {
    use sha2::Digest as _;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source answers");
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let token = hex(&bytes);
    let digest = hex(&sha2::Sha256::digest(token.as_bytes()));
    match out {
        Output::Json => println!(
            "{}",
            serde_json::json!({"name": name, "token": token, "token_sha256": digest})
        ),
        Output::Table => println!(
            "token for {name} (give it to the application; it is not kept anywhere):\n{token}\n\n\
             for the centers' config:\n[[search.apps]]\nname = {}\ntoken_sha256 = \"{digest}\"\n\
             aliases = []\ntemplates = []",
            serde_json::Value::String(name.to_owned())
        ),
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
    if let Command::AppToken { name } = &cli.command {
        app_token(name, cli.output);
        return Ok(());
    }
    let mut conn = Conn::open(cli).await?;
    let out = cli.output;
    match &cli.command {
        Command::Leader => cluster::leader(&mut conn, out).await?,
        Command::Workers => cluster::workers(&mut conn, out).await?,
        Command::Tasks => cluster::tasks(&mut conn, out).await?,
        Command::Rebalance => cluster::rebalance(&mut conn, out).await?,
        Command::Events {
            limit,
            subject,
            kind,
            since,
        } => {
            let req = ListEventsRequest {
                limit: *limit,
                subject: subject.clone(),
                kind: kind.clone(),
                since_ms: since.map_or(0, |d| sluice_model::now_ms() - d.as_millis() as i64),
                until_ms: 0,
            };
            cluster::events(&mut conn, out, req).await?
        }
        Command::Sources(cmd) => sources::run(&mut conn, out, cmd).await?,
        Command::Pipelines(cmd) => pipelines::run(&mut conn, out, cmd).await?,
        Command::Dlq(cmd) => dlq::run(&mut conn, out, cmd).await?,
        Command::Dict(cmd) => dict::run(&mut conn, out, cmd).await?,
        Command::Delayed(cmd) => delayed::run(&mut conn, out, cmd).await?,
        Command::Whoami => users::whoami(&mut conn, out).await?,
        Command::Users(cmd) => users::users(&mut conn, out, cmd).await?,
        Command::Tokens(cmd) => users::tokens(&mut conn, out, cmd).await?,
        Command::Audit {
            limit,
            user,
            method,
        } => users::audit(&mut conn, out, *limit, user, method).await?,
        Command::AppToken { .. } => unreachable!("answered without a center"),
    }
    Ok(())
}

/// What `sources delete` and `pipelines delete` remove.
#[derive(Clone, Copy)]
enum Deleting {
    Source,
    Pipeline,
}

/// Deletes a source or a pipeline, and says whether it existed.
async fn delete(
    conn: &mut Conn<'_>,
    out: Output,
    name: &str,
    what: Deleting,
) -> anyhow::Result<()> {
    let req = DeleteRequest {
        name: name.to_owned(),
    };
    let r = conn
        .call_with(req, |mut c, req| async move {
            match what {
                Deleting::Source => c.delete_source(req).await,
                Deleting::Pipeline => c.delete_pipeline(req).await,
            }
        })
        .await?;
    print(
        out,
        &["deleted", "existed"],
        vec![vec![name.to_owned(), r.existed.to_string()]],
        json!({"name": name, "existed": r.existed}),
    );
    Ok(())
}
