//! `sluicectl whoami`, `users`, `tokens` and `audit`: who may do what, their API tokens,
//! and the record of every change.

use clap::Subcommand;
use serde_json::{json, Value};
use sluice_proto::v1::*;

use crate::{ago, or_dash, print, Conn, Output};

#[derive(Subcommand)]
pub enum UserCmd {
    /// Every user with their role.
    List,
    /// Creates a user or changes their role; the password (for the console) is read from
    /// the environment variable `--password-env` names, never from the command line.
    Put {
        name: String,
        /// `viewer` (reads), `operator` (builds, checks, repairs, replays, rebalances, the
        /// dictionary) or `admin` (sources, pipelines, deletes, users).
        #[arg(long)]
        role: String,
        /// The environment variable holding the password to set.
        #[arg(long)]
        password_env: Option<String>,
    },
    /// Removes a user and their tokens (never the last admin).
    Delete { name: String },
}

#[derive(Subcommand)]
pub enum TokenCmd {
    /// A new API token; its secret is printed this once.
    Create {
        /// What it is for (e.g. `ci-deploys`).
        name: String,
        /// Whose (admins only); default: yours.
        #[arg(long, default_value = "")]
        user: String,
        /// How long it works (`30d`, `12h`); default, and at most: the center's
        /// `api.token_lifetime`.
        #[arg(long, value_parser = humantime::parse_duration)]
        expires_in: Option<std::time::Duration>,
    },
    /// Your tokens (with `--all`, an admin sees everyone's).
    List {
        #[arg(long)]
        all: bool,
    },
    /// Revokes a token by its id.
    Revoke { id: u64 },
}

/// `whoami`: the user and role the center sees this call as.
pub async fn whoami(conn: &mut Conn<'_>, out: Output) -> anyhow::Result<()> {
    let c = conn
        .call(|mut c| async move { c.who_am_i(WhoAmIRequest {}).await })
        .await?;
    print(
        out,
        &["user", "role", "via"],
        vec![vec![c.user.clone(), c.role.clone(), c.via.clone()]],
        json!({"user": c.user, "role": c.role, "via": c.via}),
    );
    Ok(())
}

pub async fn users(conn: &mut Conn<'_>, out: Output, cmd: &UserCmd) -> anyhow::Result<()> {
    let users = match cmd {
        UserCmd::List => {
            conn.call(|mut c| async move { c.list_users(ListUsersRequest {}).await })
                .await?
                .users
        }
        UserCmd::Put {
            name,
            role,
            password_env,
        } => {
            let password = match password_env {
                Some(var) => std::env::var(var)
                    .map_err(|_| anyhow::anyhow!("--password-env: ${var} is not set"))?,
                None => String::new(),
            };
            let req = PutUserRequest {
                name: name.clone(),
                role: role.clone(),
                password,
            };
            vec![
                conn.call_with(req, |mut c, req| async move { c.put_user(req).await })
                    .await?,
            ]
        }
        UserCmd::Delete { name } => {
            let req = DeleteRequest { name: name.clone() };
            let r = conn
                .call_with(req, |mut c, req| async move { c.delete_user(req).await })
                .await?;
            print(
                out,
                &["deleted", "existed"],
                vec![vec![name.clone(), r.existed.to_string()]],
                json!({"name": name, "existed": r.existed}),
            );
            return Ok(());
        }
    };
    print(
        out,
        &["user", "role", "password", "created"],
        users
            .iter()
            .map(|u| {
                let password = if u.has_password { "set" } else { "-" };
                vec![u.name.clone(), u.role.clone(), password.into(), ago(u.created_at_ms)]
            })
            .collect(),
        Value::Array(
            users
                .iter()
                .map(|u| json!({"name": u.name, "role": u.role, "has_password": u.has_password, "created_at_ms": u.created_at_ms}))
                .collect(),
        ),
    );
    Ok(())
}

/// When a time still to come is, from now (`in 89d`), or how long ago it passed.
fn until(ms: i64) -> String {
    let left = ms - sluice_model::now_ms();
    if left <= 0 {
        return format!("expired {}", ago(ms));
    }
    match left / 1000 {
        s @ 0..=7199 => format!("in {}m", s / 60),
        s @ 7200..=172_799 => format!("in {}h", s / 3600),
        s => format!("in {}d", s / 86_400),
    }
}

fn token_json(t: &Token) -> Value {
    json!({"id": t.id, "user": t.user, "name": t.name, "created_at_ms": t.created_at_ms,
           "last_used_at_ms": t.last_used_at_ms, "expires_at_ms": t.expires_at_ms})
}

pub async fn tokens(conn: &mut Conn<'_>, out: Output, cmd: &TokenCmd) -> anyhow::Result<()> {
    match cmd {
        TokenCmd::Create {
            name,
            user,
            expires_in,
        } => {
            let req = CreateTokenRequest {
                name: name.clone(),
                user: user.clone(),
                expires_in_ms: expires_in.map_or(0, |d| d.as_millis() as i64),
            };
            let r = conn
                .call_with(req, |mut c, req| async move { c.create_token(req).await })
                .await?;
            let t = r.token.unwrap_or_default();
            print(
                out,
                &["id", "user", "name", "secret (shown once)"],
                vec![vec![
                    t.id.to_string(),
                    t.user.clone(),
                    t.name.clone(),
                    r.secret.clone(),
                ]],
                json!({"token": token_json(&t), "secret": r.secret}),
            );
        }
        TokenCmd::List { all } => {
            let req = ListTokensRequest { all: *all };
            let r = conn
                .call_with(req, |mut c, req| async move { c.list_tokens(req).await })
                .await?;
            print(
                out,
                &["id", "user", "name", "created", "last used", "expires"],
                r.tokens
                    .iter()
                    .map(|t| {
                        vec![
                            t.id.to_string(),
                            t.user.clone(),
                            t.name.clone(),
                            ago(t.created_at_ms),
                            ago(t.last_used_at_ms),
                            until(t.expires_at_ms),
                        ]
                    })
                    .collect(),
                Value::Array(r.tokens.iter().map(token_json).collect()),
            );
        }
        TokenCmd::Revoke { id } => {
            let req = RevokeTokenRequest { id: *id };
            let r = conn
                .call_with(req, |mut c, req| async move { c.revoke_token(req).await })
                .await?;
            print(
                out,
                &["revoked", "existed"],
                vec![vec![id.to_string(), r.existed.to_string()]],
                json!({"id": id, "existed": r.existed}),
            );
        }
    }
    Ok(())
}

/// `audit`: the newest entries of the audit log.
pub async fn audit(
    conn: &mut Conn<'_>,
    out: Output,
    limit: u32,
    user: &str,
    method: &str,
) -> anyhow::Result<()> {
    let req = ListAuditRequest {
        limit,
        user: user.to_owned(),
        method: method.to_owned(),
    };
    let r = conn
        .call_with(req, |mut c, req| async move { c.list_audit(req).await })
        .await?;
    print(
        out,
        &[
            "id", "at", "user", "role", "method", "target", "from", "outcome", "detail",
        ],
        r.entries
            .iter()
            .map(|e| {
                vec![
                    e.id.to_string(),
                    ago(e.at_ms),
                    e.user.clone(),
                    or_dash(&e.role),
                    e.method.clone(),
                    or_dash(&e.target),
                    or_dash(&e.peer),
                    e.outcome.clone(),
                    or_dash(&e.detail),
                ]
            })
            .collect(),
        Value::Array(
            r.entries
                .iter()
                .map(|e| {
                    json!({"id": e.id, "at_ms": e.at_ms, "user": e.user, "role": e.role,
                    "method": e.method, "target": e.target, "peer": e.peer,
                    "outcome": e.outcome, "detail": e.detail})
                })
                .collect(),
        ),
    );
    Ok(())
}
