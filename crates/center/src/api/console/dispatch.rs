//! The console's calls of the admin service: a method's request as JSON in, its answer as
//! JSON out, through the very methods gRPC callers reach (after the same gate).

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sluice_proto::v1::admin_server::Admin;
use tonic::{Request, Response, Status};

use crate::api::common::AdminApi;

/// Runs one method: `body` read as its request, the call made with `extensions` (the
/// caller and what the call is about), the answer written as JSON.
async fn run<Req, Resp, F, Fut>(
    api: &AdminApi,
    body: &[u8],
    extensions: tonic::Extensions,
    call: F,
) -> Result<Vec<u8>, Status>
where
    Req: DeserializeOwned,
    Resp: Serialize,
    F: FnOnce(AdminApi, Request<Req>) -> Fut,
    Fut: Future<Output = Result<Response<Resp>, Status>>,
{
    let body = if body.is_empty() {
        b"{}".as_slice()
    } else {
        body
    };
    let message: Req = serde_json::from_slice(body).map_err(|e| {
        Status::invalid_argument(format!("the request is not this method's JSON: {e}"))
    })?;
    let req = Request::from_parts(Default::default(), extensions, message);
    let answer = call(api.clone(), req).await?;
    serde_json::to_vec(answer.get_ref()).map_err(|e| Status::internal(e.to_string()))
}

macro_rules! methods {
    ($($name:literal => $call:ident,)*) => {
        /// Calls admin method `method` (`PutSource`) with `body`, its request as JSON.
        pub(super) async fn call(
            api: &AdminApi,
            method: &str,
            body: &[u8],
            extensions: tonic::Extensions,
        ) -> Result<Vec<u8>, Status> {
            match method {
                $($name => {
                    run(api, body, extensions, |api, req| async move {
                        Admin::$call(&api, req).await
                    })
                    .await
                })*
                _ => Err(Status::unimplemented(format!("no admin method {method}"))),
            }
        }

        /// Every method the console can call.
        pub(super) const METHODS: &[&str] = &[$($name),*];
    };
}

methods! {
    "GetLeader" => get_leader,
    "ListSources" => list_sources,
    "PutSource" => put_source,
    "TestSource" => test_source,
    "ListTables" => list_tables,
    "DeleteSource" => delete_source,
    "FailoverSource" => failover_source,
    "ResnapshotSource" => resnapshot_source,
    "ListPipelines" => list_pipelines,
    "PutPipeline" => put_pipeline,
    "PreviewPipeline" => preview_pipeline,
    "DeletePipeline" => delete_pipeline,
    "BuildPipeline" => build_pipeline,
    "StartCompare" => start_compare,
    "SwapPipeline" => swap_pipeline,
    "ResetPipeline" => reset_pipeline,
    "GetBuild" => get_build,
    "RollbackPipeline" => rollback_pipeline,
    "DropVersion" => drop_version,
    "StartCheck" => start_check,
    "ListChecks" => list_checks,
    "GetCheck" => get_check,
    "ListDelayed" => list_delayed,
    "ApplyDelayed" => apply_delayed,
    "ExplainDocument" => explain_document,
    "ResyncDocuments" => resync_documents,
    "ListWorkers" => list_workers,
    "ListTasks" => list_tasks,
    "Rebalance" => rebalance,
    "ListEvents" => list_events,
    "ListDeadLetters" => list_dead_letters,
    "ReplayDeadLetters" => replay_dead_letters,
    "ListWords" => list_words,
    "AddWords" => add_words,
    "EditWord" => edit_word,
    "PublishWords" => publish_words,
    "DeleteWords" => delete_words,
    "WhoAmI" => who_am_i,
    "ListUsers" => list_users,
    "PutUser" => put_user,
    "DeleteUser" => delete_user,
    "CreateToken" => create_token,
    "ListTokens" => list_tokens,
    "RevokeToken" => revoke_token,
    "ListAudit" => list_audit,
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_console_reaches_every_admin_method() {
        assert_eq!(super::METHODS, crate::access::admin_methods());
    }
}
