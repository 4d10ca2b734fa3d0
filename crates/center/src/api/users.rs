//! Users, their API tokens and the audit log, as the admin API shows them. The role each
//! call needs is the gate's ([`crate::access`]); what is checked here is what the role
//! alone cannot say (a token of one's own, the last admin, a valid name).

use sluice_proto::v1::{self, *};
use tonic::{Request, Response, Status};

use super::common::*;
use super::guard::{about, Identity};
use crate::access::Role;
use crate::credentials;
use crate::meta::{Audited, StoredToken, StoredUser};

/// The caller the gate let in.
fn caller<T>(req: &Request<T>) -> Result<Identity, Status> {
    req.extensions()
        .get::<Identity>()
        .cloned()
        .ok_or_else(|| Status::internal("the call did not pass the gate"))
}

fn user_message(u: StoredUser) -> User {
    User {
        name: u.name,
        role: u.role.to_string(),
        created_at_ms: u.created_at_ms,
        has_password: u.has_password,
    }
}

fn token_message(t: StoredToken) -> Token {
    Token {
        id: t.id,
        user: t.user,
        name: t.name,
        created_at_ms: t.created_at_ms,
        last_used_at_ms: t.last_used_at_ms,
        expires_at_ms: t.expires_at_ms,
    }
}

fn audit_message(a: Audited) -> AuditEntry {
    AuditEntry {
        id: a.id,
        at_ms: a.at_ms,
        user: a.user,
        role: a.role,
        method: a.method,
        target: a.target,
        peer: a.peer,
        outcome: a.outcome,
        detail: a.detail,
    }
}

pub(super) async fn who_am_i(req: Request<WhoAmIRequest>) -> Result<Response<v1::Caller>, Status> {
    let c = caller(&req)?;
    Ok(Response::new(v1::Caller {
        user: c.user,
        role: c.role.to_string(),
        via: c.via.to_owned(),
    }))
}

pub(super) async fn list_users(
    api: &AdminApi,
    _: Request<ListUsersRequest>,
) -> Result<Response<ListUsersResponse>, Status> {
    let users = api.shared.meta.users().await.map_err(meta_err)?;
    Ok(Response::new(ListUsersResponse {
        users: users.into_iter().map(user_message).collect(),
    }))
}

pub(super) async fn put_user(
    api: &AdminApi,
    req: Request<PutUserRequest>,
) -> Result<Response<User>, Status> {
    about(&req, &req.get_ref().name);
    let r = req.into_inner();
    credentials::check_user_name(&r.name).map_err(Status::invalid_argument)?;
    let role: Role = r.role.parse().map_err(Status::invalid_argument)?;
    let hash = match r.password.as_str() {
        "" => None,
        p => Some(credentials::hash_password(p).map_err(Status::invalid_argument)?),
    };
    let user = api
        .shared
        .meta
        .put_user(&r.name, role, hash.as_deref())
        .await
        .map_err(meta_err)?;
    Ok(Response::new(user_message(user)))
}

pub(super) async fn delete_user(
    api: &AdminApi,
    req: Request<DeleteRequest>,
) -> Result<Response<DeleteResponse>, Status> {
    about(&req, &req.get_ref().name);
    let existed = api
        .shared
        .meta
        .delete_user(&req.get_ref().name)
        .await
        .map_err(meta_err)?;
    Ok(Response::new(DeleteResponse { existed }))
}

pub(super) async fn create_token(
    api: &AdminApi,
    req: Request<CreateTokenRequest>,
) -> Result<Response<CreatedToken>, Status> {
    let c = caller(&req)?;
    let r = req.get_ref();
    let user = if r.user.is_empty() { &c.user } else { &r.user };
    about(&req, user);
    if *user != c.user && c.role < Role::Admin {
        return Err(Status::permission_denied(
            "only an admin makes tokens for another user",
        ));
    }
    if r.name.trim().is_empty() || r.name.len() > 128 {
        return Err(Status::invalid_argument(
            "a token needs a name of 1 to 128 characters saying what it is for",
        ));
    }
    let longest = api.shared.cfg.api.token_lifetime;
    let lasts = match u64::try_from(r.expires_in_ms) {
        Ok(ms) if ms > 0 => std::time::Duration::from_millis(ms).min(longest),
        Ok(_) => longest,
        Err(_) => {
            return Err(Status::invalid_argument(
                "expires_in_ms: must not be negative",
            ))
        }
    };
    let (secret, digest) = credentials::new_token();
    let token = api
        .shared
        .meta
        .create_token(user, &r.name, &digest, lasts)
        .await
        .map_err(meta_err)?;
    Ok(Response::new(CreatedToken {
        token: Some(token_message(token)),
        secret,
    }))
}

pub(super) async fn list_tokens(
    api: &AdminApi,
    req: Request<ListTokensRequest>,
) -> Result<Response<ListTokensResponse>, Status> {
    let c = caller(&req)?;
    if req.get_ref().all && c.role < Role::Admin {
        return Err(Status::permission_denied(
            "only an admin lists everyone's tokens",
        ));
    }
    let whose = (!req.get_ref().all).then_some(c.user.as_str());
    let tokens = api.shared.meta.tokens(whose).await.map_err(meta_err)?;
    Ok(Response::new(ListTokensResponse {
        tokens: tokens.into_iter().map(token_message).collect(),
    }))
}

pub(super) async fn revoke_token(
    api: &AdminApi,
    req: Request<RevokeTokenRequest>,
) -> Result<Response<DeleteResponse>, Status> {
    let c = caller(&req)?;
    about(&req, &format!("token {}", req.get_ref().id));
    let whose = (c.role < Role::Admin).then_some(c.user.as_str());
    let existed = api
        .shared
        .meta
        .revoke_token(req.get_ref().id, whose)
        .await
        .map_err(meta_err)?;
    Ok(Response::new(DeleteResponse { existed }))
}

pub(super) async fn list_audit(
    api: &AdminApi,
    req: Request<ListAuditRequest>,
) -> Result<Response<ListAuditResponse>, Status> {
    let r = req.into_inner();
    let limit = if r.limit == 0 { 100 } else { r.limit };
    let entries = api
        .shared
        .meta
        .audit(limit, &r.user, &r.method)
        .await
        .map_err(meta_err)?;
    Ok(Response::new(ListAuditResponse {
        entries: entries.into_iter().map(audit_message).collect(),
        kept_ms: api.shared.cfg.retention.audit.as_millis() as i64,
    }))
}
