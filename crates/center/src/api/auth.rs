//! Who may call: a bearer token per service (the admin token opens the admin service,
//! the workers' token the reports alone), compared in constant time. mTLS is the TLS
//! layer's.

use std::sync::Arc;

use tonic::service::Interceptor;
use tonic::{Request, Status};

use super::guard::Gate;
use crate::config::AuthMode;
use crate::credentials::constant_time_eq;
use crate::error::{CenterError, Result as CenterResult};

/// The reports service's bearer-token check (mTLS is enforced by the TLS layer itself):
/// the workers' token, never the admin's (workers need no admin credential, so none is
/// handed to them). The admin service has its own gate ([`super::guard::Gate`]), which
/// knows users and roles.
#[derive(Clone)]
pub(super) struct Auth {
    worker: Option<Arc<str>>,
}

/// A token from its value or its file, named by `key` in errors; `None` when neither is set.
pub(super) fn token(
    value: &Option<sluice_model::Secret>,
    file: &Option<std::path::PathBuf>,
    key: &str,
) -> CenterResult<Option<Arc<str>>> {
    let token = match (value, file) {
        (Some(t), _) => t.expose().to_owned(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .map_err(|e| CenterError::definite(format!("api.{key}_file: {}: {e}", f.display())))?
            .trim()
            .to_owned(),
        (None, None) => return Ok(None),
    };
    if token.is_empty() {
        return Err(CenterError::definite(format!(
            "api.{key}: must not be empty"
        )));
    }
    Ok(Some(token.into()))
}

impl Auth {
    /// The admin service's gate and the reports service's guard.
    pub(super) fn from_config(
        cfg: &crate::CenterConfig,
        meta: crate::meta::Meta,
    ) -> CenterResult<(Gate, Self)> {
        let api = &cfg.api;
        let (admin, worker) = match api.auth {
            AuthMode::Token => {
                let admin = token(&api.token, &api.token_file, "token")?.ok_or_else(|| {
                    CenterError::definite("api.token: required with auth = \"token\"")
                })?;
                let worker = token(&api.worker_token, &api.worker_token_file, "worker_token")?
                    .ok_or_else(|| {
                        CenterError::definite(
                            "api.worker_token: required with auth = \"token\": workers report with a token of their own, which may do nothing else",
                        )
                    })?;
                if *worker == *admin {
                    return Err(CenterError::definite(
                        "api.worker_token: must differ from api.token, or workers could administer",
                    ));
                }
                (Some(admin), Some(worker))
            }
            AuthMode::Mtls | AuthMode::None => (None, None),
        };
        let gate = Gate {
            mode: api.auth,
            admin: admin.clone(),
            worker: worker.clone(),
            admin_user: api.admin_user.clone(),
            meta,
            refusals: Default::default(),
            unknown_tokens: Default::default(),
            known_tokens: Default::default(),
        };
        Ok((gate, Auth { worker }))
    }
}

impl Interceptor for Auth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(worker) = &self.worker else {
            return Ok(req);
        };
        let given = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if constant_time_eq(given.as_bytes(), worker.as_bytes()) {
            Ok(req)
        } else {
            Err(Status::unauthenticated(
                "missing or wrong bearer token: reports take the workers' token (api.worker_token)",
            ))
        }
    }
}

/// Creates the first admin from the configuration while there is no admin:
/// `api.admin_user`, with `api.admin_password` when one is set; in mTLS mode without one
/// (a client certificate whose subject CN is that name acts as it).
/// Centers starting together on a fresh meta database race to insert it (InnoDB may
/// end the race with a deadlock): a transient failure is tried again under the center's
/// retry policy.
pub async fn first_admin(
    cfg: &crate::CenterConfig,
    meta: &crate::meta::Meta,
    shutdown: &tokio_util::sync::CancellationToken,
) -> CenterResult<()> {
    let api = &cfg.api;
    let password = token(
        &api.admin_password,
        &api.admin_password_file,
        "admin_password",
    )?;
    let hash = match password {
        Some(password) => Some(
            crate::credentials::hash_password(&password)
                .map_err(|e| CenterError::definite(format!("api.admin_password: {e}")))?,
        ),
        None if api.auth == AuthMode::Mtls => None,
        None => return Ok(()),
    };
    let mut backoff = cfg.center.retry().backoff();
    loop {
        match meta.ensure_admin(&api.admin_user, hash.as_deref()).await {
            Ok(created) => {
                if created {
                    tracing::info!(user = %api.admin_user, "created the first admin from the configuration");
                }
                return Ok(());
            }
            Err(e) => match CenterError::from(e) {
                CenterError::Transient(why) => {
                    tracing::warn!(error = %why, "cannot create the first admin yet; retrying");
                    if !sluice_runtime::shutdown::pause(backoff.next_pause(), shutdown).await {
                        return Err(CenterError::transient(why));
                    }
                }
                other => return Err(other),
            },
        }
    }
}
