//! Users, their API tokens and the audit log. Not fenced by the leader's epoch: any
//! replica records the calls it answers, and users are not derived from the layout.

use mysql_async::prelude::*;

use super::{Meta, MetaError};
use crate::access::Role;

/// A user as the meta database holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredUser {
    pub name: String,
    pub role: Role,
    pub created_at_ms: i64,
    pub has_password: bool,
}

/// An API token, without its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredToken {
    pub id: u64,
    pub user: String,
    pub name: String,
    pub created_at_ms: i64,
    /// 0: never used.
    pub last_used_at_ms: i64,
    pub expires_at_ms: i64,
}

/// Tokens one user may hold at once.
pub const MOST_TOKENS_PER_USER: usize = 20;

/// One entry of the audit log: a mutating call, allowed or not, and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audited {
    /// 0 until recorded.
    pub id: u64,
    pub at_ms: i64,
    pub user: String,
    pub role: String,
    pub method: String,
    pub target: String,
    pub peer: String,
    /// `ok` or the gRPC code of the refusal or failure.
    pub outcome: String,
    pub detail: String,
}

fn role_of(s: &str) -> Result<Role, MetaError> {
    s.parse()
        .map_err(|e| MetaError::Corrupt(format!("users.role: {e}")))
}

const USER_COLUMNS: &str =
    "name, role, CAST(UNIX_TIMESTAMP(created_at) * 1000 AS SIGNED), password_hash IS NOT NULL";

type UserRow = (String, String, i64, bool);

fn user_of((name, role, created_at_ms, has_password): UserRow) -> Result<StoredUser, MetaError> {
    Ok(StoredUser {
        role: role_of(&role)?,
        name,
        created_at_ms,
        has_password,
    })
}

impl Meta {
    pub async fn users(&self) -> Result<Vec<StoredUser>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<UserRow> = conn
            .query(format!("SELECT {USER_COLUMNS} FROM users ORDER BY name"))
            .await?;
        rows.into_iter().map(user_of).collect()
    }

    /// A user's role and password hash, for a login.
    pub async fn password_of(
        &self,
        name: &str,
    ) -> Result<Option<(Role, Option<String>)>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let row: Option<(String, Option<String>)> = conn
            .exec_first(
                "SELECT role, password_hash FROM users WHERE name = ?",
                (name,),
            )
            .await?;
        row.map(|(role, hash)| Ok((role_of(&role)?, hash)))
            .transpose()
    }

    /// Creates `name` or changes its role, and its password when `password_hash` is given.
    /// Refuses to leave no admin.
    pub async fn put_user(
        &self,
        name: &str,
        role: Role,
        password_hash: Option<&str>,
    ) -> Result<StoredUser, MetaError> {
        let mut tx = self.pool.start_transaction(Default::default()).await?;
        if role != Role::Admin {
            refuse_if_last_admin(&mut tx, name, "change the role of").await?;
        }
        tx.exec_drop(
            "INSERT INTO users (name, role, password_hash) VALUES (?, ?, ?)
             ON DUPLICATE KEY UPDATE role = VALUES(role),
               password_hash = COALESCE(VALUES(password_hash), password_hash)",
            (name, role.as_str(), password_hash),
        )
        .await?;
        if password_hash.is_some() {
            // A new password ends the sessions opened with the old one, and the tokens
            // made while it was the password (a thief of either keeps nothing).
            tx.exec_drop("DELETE FROM console_sessions WHERE user = ?", (name,))
                .await?;
            tx.exec_drop("DELETE FROM api_tokens WHERE user = ?", (name,))
                .await?;
        }
        let row: Option<UserRow> = tx
            .exec_first(
                format!("SELECT {USER_COLUMNS} FROM users WHERE name = ?"),
                (name,),
            )
            .await?;
        tx.commit().await?;
        user_of(row.ok_or_else(|| MetaError::Corrupt(format!("user {name} not there")))?)
    }

    /// Creates `name` as an admin while there is no admin at all (the first admin, from the
    /// center's configuration); says whether it did. Once admins manage the users, a
    /// restart recreates none they removed.
    pub async fn ensure_admin(
        &self,
        name: &str,
        password_hash: Option<&str>,
    ) -> Result<bool, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(
            "INSERT IGNORE INTO users (name, role, password_hash)
             SELECT ?, 'admin', ? FROM DUAL
             WHERE NOT EXISTS (SELECT 1 FROM users WHERE role = 'admin')",
            (name, password_hash),
        )
        .await?;
        Ok(conn.affected_rows() == 1)
    }

    /// Removes `name` and its tokens; says whether it existed. Refuses the last admin.
    pub async fn delete_user(&self, name: &str) -> Result<bool, MetaError> {
        let mut tx = self.pool.start_transaction(Default::default()).await?;
        refuse_if_last_admin(&mut tx, name, "remove").await?;
        tx.exec_drop("DELETE FROM api_tokens WHERE user = ?", (name,))
            .await?;
        tx.exec_drop("DELETE FROM console_sessions WHERE user = ?", (name,))
            .await?;
        tx.exec_drop("DELETE FROM users WHERE name = ?", (name,))
            .await?;
        let existed = tx.affected_rows() == 1;
        tx.commit().await?;
        Ok(existed)
    }

    /// Keeps a new token of `user` (who must exist), by its secret's digest, working for
    /// `lasts`. Refused when the user holds [`MOST_TOKENS_PER_USER`] live ones.
    pub async fn create_token(
        &self,
        user: &str,
        name: &str,
        digest: &[u8; 32],
        lasts: std::time::Duration,
    ) -> Result<StoredToken, MetaError> {
        let mut tx = self.pool.start_transaction(Default::default()).await?;
        let exists: Option<String> = tx
            .exec_first("SELECT name FROM users WHERE name = ? FOR UPDATE", (user,))
            .await?;
        if exists.is_none() {
            return Err(MetaError::NotFound(format!("no user {user}")));
        }
        tx.exec_drop(
            "DELETE FROM api_tokens WHERE user = ? AND expires_at < CURRENT_TIMESTAMP(3)",
            (user,),
        )
        .await?;
        let held: Option<u64> = tx
            .exec_first("SELECT COUNT(*) FROM api_tokens WHERE user = ?", (user,))
            .await?;
        if held.unwrap_or(0) as usize >= MOST_TOKENS_PER_USER {
            return Err(MetaError::Refused(format!(
                "{user} holds {MOST_TOKENS_PER_USER} tokens, the most one user may: revoke one first (sluicectl tokens revoke ID)"
            )));
        }
        tx.exec_drop(
            "INSERT INTO api_tokens (user, name, secret_sha256, expires_at)
             VALUES (?, ?, ?, CURRENT_TIMESTAMP(3) + INTERVAL ? MICROSECOND)",
            (user, name, digest.as_slice(), lasts.as_micros() as u64),
        )
        .await?;
        let id = tx.last_insert_id().unwrap_or(0);
        tx.commit().await?;
        let mine = self.tokens(Some(user)).await?;
        mine.into_iter()
            .find(|t| t.id == id)
            .ok_or_else(|| MetaError::Corrupt(format!("token {id} not there")))
    }

    /// The user a token's digest belongs to, with their role, noting the token's use.
    pub async fn token_user(&self, digest: &[u8; 32]) -> Result<Option<(String, Role)>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let row: Option<(u64, String, String)> = conn
            .exec_first(
                "SELECT t.id, u.name, u.role FROM api_tokens t JOIN users u ON u.name = t.user
                 WHERE t.secret_sha256 = ? AND t.expires_at > CURRENT_TIMESTAMP(3)",
                (digest.as_slice(),),
            )
            .await?;
        let Some((id, user, role)) = row else {
            return Ok(None);
        };
        // When it was last used, to the minute: at most one write a minute a token, and
        // a failure to note it does not fail the call.
        let noted = conn
            .exec_drop(
                "UPDATE api_tokens SET last_used_at = CURRENT_TIMESTAMP(3)
                 WHERE id = ? AND (last_used_at IS NULL
                   OR last_used_at < CURRENT_TIMESTAMP(3) - INTERVAL 60 SECOND)",
                (id,),
            )
            .await;
        if let Err(e) = noted {
            tracing::warn!(error = %e, token = id, "cannot note a token's use");
        }
        Ok(Some((user, role_of(&role)?)))
    }

    /// The tokens of `user`, or everyone's.
    pub async fn tokens(&self, user: Option<&str>) -> Result<Vec<StoredToken>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<(u64, String, String, i64, Option<i64>, i64)> = conn
            .exec(
                "SELECT id, user, name, CAST(UNIX_TIMESTAMP(created_at) * 1000 AS SIGNED),
                   CAST(UNIX_TIMESTAMP(last_used_at) * 1000 AS SIGNED),
                   CAST(UNIX_TIMESTAMP(expires_at) * 1000 AS SIGNED)
                 FROM api_tokens WHERE (? IS NULL OR user = ?) ORDER BY id",
                (user, user),
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, user, name, created_at_ms, used, expires_at_ms)| StoredToken {
                    id,
                    user,
                    name,
                    created_at_ms,
                    last_used_at_ms: used.unwrap_or(0),
                    expires_at_ms,
                },
            )
            .collect())
    }

    /// Revokes token `id` (of `user` only, when given); says whether there was one.
    pub async fn revoke_token(&self, id: u64, user: Option<&str>) -> Result<bool, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(
            "DELETE FROM api_tokens WHERE id = ? AND (? IS NULL OR user = ?)",
            (id, user, user),
        )
        .await?;
        Ok(conn.affected_rows() == 1)
    }

    /// Appends `entry`, each field cut to what its column holds (a caller's made-up name
    /// or path must not make the entry fail).
    pub async fn record_audit(&self, entry: &Audited) -> Result<(), MetaError> {
        let cut = |s: &str, chars: usize| s.chars().take(chars).collect::<String>();
        let entry = Audited {
            user: cut(&entry.user, 255),
            role: cut(&entry.role, 16),
            method: cut(&entry.method, 64),
            target: cut(&entry.target, 255),
            peer: cut(&entry.peer, 255),
            outcome: cut(&entry.outcome, 32),
            detail: cut(&entry.detail, 10_000),
            ..entry.clone()
        };
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(
            "INSERT INTO audit (user, role, method, target, peer, outcome, detail)
             VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                &entry.user,
                &entry.role,
                &entry.method,
                &entry.target,
                &entry.peer,
                &entry.outcome,
                &entry.detail,
            ),
        )
        .await?;
        Ok(())
    }

    /// The audit log, newest first: the last `limit` entries, of `user` and `method` when
    /// they are not empty.
    pub async fn audit(
        &self,
        limit: u32,
        user: &str,
        method: &str,
    ) -> Result<Vec<Audited>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<mysql_async::Row> = conn
            .exec(
                "SELECT id, CAST(UNIX_TIMESTAMP(at) * 1000 AS SIGNED), user, role, method,
                   target, peer, outcome, detail
                 FROM audit WHERE (? = '' OR user = ?) AND (? = '' OR method = ?)
                 ORDER BY id DESC LIMIT ?",
                (user, user, method, method, limit.clamp(1, 10_000)),
            )
            .await?;
        rows.into_iter()
            .map(|row| {
                let (id, at_ms, user, role, method, target, peer, outcome, detail) =
                    mysql_async::from_row_opt(row)
                        .map_err(|e| MetaError::Corrupt(format!("audit: {e}")))?;
                Ok(Audited {
                    id,
                    at_ms,
                    user,
                    role,
                    method,
                    target,
                    peer,
                    outcome,
                    detail,
                })
            })
            .collect()
    }
}

/// A console session as the meta database holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSession {
    pub user: String,
    pub role: Role,
    pub csrf: String,
}

impl Meta {
    /// Keeps a new session of `user` for `lasts` (expired ones are dropped meanwhile).
    pub async fn open_session(
        &self,
        id_digest: &[u8; 32],
        user: &str,
        csrf: &str,
        lasts: std::time::Duration,
    ) -> Result<(), MetaError> {
        let mut conn = self.pool.get_conn().await?;
        conn.query_drop("DELETE FROM console_sessions WHERE expires_at < CURRENT_TIMESTAMP(3)")
            .await?;
        conn.exec_drop(
            "INSERT INTO console_sessions (id_sha256, user, csrf, expires_at)
             VALUES (?, ?, ?, CURRENT_TIMESTAMP(3) + INTERVAL ? SECOND)",
            (id_digest.as_slice(), user, csrf, lasts.as_secs()),
        )
        .await?;
        Ok(())
    }

    /// The live session of a cookie's digest — not expired, used within `idle` — with
    /// its user's role now (a user removed or demoted since the login is seen at once).
    /// Its use is noted, to the minute (or a quarter of `idle`, if that is less).
    pub async fn session(
        &self,
        id_digest: &[u8; 32],
        idle: std::time::Duration,
    ) -> Result<Option<StoredSession>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let idle_us = idle.as_micros() as u64;
        let row: Option<(String, String, String)> = conn
            .exec_first(
                "SELECT s.user, u.role, s.csrf FROM console_sessions s JOIN users u ON u.name = s.user
                 WHERE s.id_sha256 = ? AND s.expires_at > CURRENT_TIMESTAMP(3)
                   AND s.last_seen_at > CURRENT_TIMESTAMP(3) - INTERVAL ? MICROSECOND",
                (id_digest.as_slice(), idle_us),
            )
            .await?;
        if row.is_some() {
            let every_us = (idle / 4)
                .min(std::time::Duration::from_secs(60))
                .as_micros() as u64;
            conn.exec_drop(
                "UPDATE console_sessions SET last_seen_at = CURRENT_TIMESTAMP(3)
                 WHERE id_sha256 = ? AND last_seen_at < CURRENT_TIMESTAMP(3) - INTERVAL ? MICROSECOND",
                (id_digest.as_slice(), every_us),
            )
            .await?;
        }
        row.map(|(user, role, csrf)| {
            Ok(StoredSession {
                user,
                role: role_of(&role)?,
                csrf,
            })
        })
        .transpose()
    }

    pub async fn close_session(&self, id_digest: &[u8; 32]) -> Result<(), MetaError> {
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(
            "DELETE FROM console_sessions WHERE id_sha256 = ?",
            (id_digest.as_slice(),),
        )
        .await?;
        Ok(())
    }
}

/// Refuses (`what` says to do what) when `name` is the only admin left.
async fn refuse_if_last_admin(
    tx: &mut mysql_async::Transaction<'_>,
    name: &str,
    what: &str,
) -> Result<(), MetaError> {
    let admins: Vec<String> = tx
        .query("SELECT name FROM users WHERE role = 'admin' FOR UPDATE")
        .await?;
    if admins == [name] {
        return Err(MetaError::Refused(format!(
            "cannot {what} {name}: it is the last admin (make another admin first)"
        )));
    }
    Ok(())
}
