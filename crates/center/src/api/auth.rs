//! Who may call: a bearer token per service (the admin token opens both, the workers'
//! token only the reports), compared in constant time. mTLS is the TLS layer's.

use std::sync::Arc;

use subtle::ConstantTimeEq as _;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::config::AuthMode;
use crate::error::{CenterError, Result as CenterResult};

/// Bearer-token check (mTLS is enforced by the TLS layer itself). The admin token opens
/// both services; the workers' token only the reports.
#[derive(Clone)]
pub(super) struct Auth {
    admin: Option<Arc<str>>,
    worker: Option<Arc<str>>,
    /// Whether this guards the reports service (else the admin service).
    reports: bool,
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
    /// The admin service's guard and the reports service's.
    pub(super) fn from_config(cfg: &crate::CenterConfig) -> CenterResult<(Self, Self)> {
        let api = &cfg.api;
        let (admin, worker) = match api.auth {
            AuthMode::Token => {
                let admin = token(&api.token, &api.token_file, "token")?.ok_or_else(|| {
                    CenterError::definite("api.token: required with auth = \"token\"")
                })?;
                let worker = token(&api.worker_token, &api.worker_token_file, "worker_token")?;
                if worker.as_deref() == Some(&*admin) {
                    return Err(CenterError::definite(
                        "api.worker_token: must differ from api.token, or workers could administer",
                    ));
                }
                (Some(admin), worker)
            }
            AuthMode::Mtls | AuthMode::None => (None, None),
        };
        let guard = |reports| Auth {
            admin: admin.clone(),
            worker: worker.clone(),
            reports,
        };
        Ok((guard(false), guard(true)))
    }
}

impl Interceptor for Auth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(admin) = &self.admin else {
            return Ok(req);
        };
        let given = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if constant_time_eq(given.as_bytes(), admin.as_bytes()) {
            return Ok(req);
        }
        match &self.worker {
            Some(w) if constant_time_eq(given.as_bytes(), w.as_bytes()) => {
                if self.reports {
                    Ok(req)
                } else {
                    Err(Status::permission_denied(
                        "this is the workers' token: it can only report, not administer",
                    ))
                }
            }
            _ => Err(Status::unauthenticated(
                "missing or wrong bearer token (header `authorization: Bearer <token>`)",
            )),
        }
    }
}

/// Whether a given token equals a configured one, in a time that does not depend on
/// where they differ.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    pub(super) fn tokens_match_only_when_equal_in_full() {
        assert!(constant_time_eq(b"s3cret-token", b"s3cret-token"));
        assert!(!constant_time_eq(b"s3cret-token", b"s3cret-tokeN"));
        assert!(
            !constant_time_eq(b"s3cret", b"s3cret-token"),
            "a prefix is not the token"
        );
        assert!(!constant_time_eq(b"", b"s3cret-token"));
    }
}
