//! The search API for applications (README, "Searching from applications"), served by
//! every center on `search.listen`: what it needs of the cluster — each alias's pipeline
//! from the meta database, how far each pipeline is applied from ZooKeeper (watched, so
//! a waiting read answers as soon as the etl publishes), a source's position from MySQL.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_search::{AliasTarget, Cluster, SearchApi, View};
use sluice_zk::layout::{self, AppliedRecord};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{CenterError, Result};
use crate::Shared;

/// How often the pipelines' aliases are read again from the meta database.
const ALIASES_EVERY: Duration = Duration::from_secs(1);

/// How long a source's record is trusted before the meta database is asked again.
const SOURCE_FOR: Duration = Duration::from_secs(5);

struct CenterCluster {
    shared: Arc<Shared>,
    view: watch::Receiver<Arc<View>>,
    /// Per source: how its position is read.
    points: tokio::sync::Mutex<HashMap<String, KnownSource>>,
}

/// A source's record, when it was read, and the pooled connections its position is read
/// over.
type KnownSource = (
    sluice_model::SourceSpec,
    Instant,
    Arc<sluice_mysql::preflight::Points>,
);

impl Cluster for CenterCluster {
    fn view(&self) -> watch::Receiver<Arc<View>> {
        self.view.clone()
    }

    async fn position_of(
        &self,
        source: &str,
    ) -> std::result::Result<sluice_model::SourcePoint, String> {
        let points = self.points_of(source).await?;
        points.current().await.map_err(|e| e.to_string())
    }
}

impl CenterCluster {
    /// The pooled reader of `source`'s position, made again when its record changed.
    async fn points_of(
        &self,
        source: &str,
    ) -> std::result::Result<Arc<sluice_mysql::preflight::Points>, String> {
        let mut known = self.points.lock().await;
        if let Some((_, read_at, points)) = known.get(source) {
            if read_at.elapsed() < SOURCE_FOR {
                return Ok(points.clone());
            }
        }
        let sources = self
            .shared
            .meta
            .sources()
            .await
            .map_err(|e| e.to_string())?;
        let Some(spec) = sources.into_iter().find(|s| s.name == source) else {
            known.remove(source);
            return Err(format!("no source `{source}`"));
        };
        if let Some((kept, read_at, points)) = known.get_mut(source) {
            if *kept == spec {
                *read_at = Instant::now();
                return Ok(points.clone());
            }
        }
        let cfg = sluice_mysql::SourceConfig::from_spec(&spec, &self.shared.cfg.source_access())
            .map_err(|e| format!("{e} (the centers need the source's password too)"))?;
        let points = Arc::new(sluice_mysql::preflight::Points::new(cfg));
        known.insert(source.to_owned(), (spec, Instant::now(), points.clone()));
        Ok(points)
    }
}

/// Binds `search.listen`, when set: a port in use ends the center at start.
pub(crate) async fn bind(shared: &Shared) -> Result<Option<TcpListener>> {
    let Some(addr) = shared.cfg.search.listen else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| CenterError::definite(format!("search.listen: {addr}: {e}")))?;
    tracing::info!(%addr, apps = shared.cfg.search.apps.len(), "serving the search API");
    Ok(Some(listener))
}

/// Serves the search API on `listener` until `shutdown`, keeping its view of the cluster.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<()> {
    let es = shared.es.clone().ok_or_else(|| {
        CenterError::definite("search.listen: the search API needs an [elasticsearch] section")
    })?;
    let (tx, view) = watch::channel(Arc::new(View::default()));
    let cluster = CenterCluster {
        shared: shared.clone(),
        view,
        points: Default::default(),
    };
    let api = Arc::new(SearchApi::new(shared.cfg.search.clone(), es, cluster));
    let tls = crate::listeners::http_tls(&shared.cfg.api)?;
    let limits = shared.cfg.limits;
    let proxies = crate::client_addr::ClientAddr::new(
        &shared.cfg.api.trusted_proxies,
        &shared.cfg.api.client_address_header,
    )
    .shared_peers();
    tokio::join!(
        keep_view(shared, tx, shutdown.clone()),
        sluice_runtime::listen::serve_http(
            listener,
            api.router(),
            tls,
            limits,
            proxies,
            "search",
            shutdown
        )
    );
    Ok(())
}

/// Keeps `tx` equal to the aliases in the meta database and the applied positions in
/// ZooKeeper, until `shutdown`.
async fn keep_view(shared: Arc<Shared>, tx: watch::Sender<Arc<View>>, shutdown: CancellationToken) {
    let mut backoff = shared.cfg.center.retry().backoff();
    let mut aliases: Option<(Instant, HashMap<String, AliasTarget>)> = None;
    while !shutdown.is_cancelled() {
        if aliases
            .as_ref()
            .is_none_or(|(at, _)| at.elapsed() >= ALIASES_EVERY)
        {
            match aliases_of(&shared).await {
                Ok(a) => aliases = Some((Instant::now(), a)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the pipelines' aliases; retrying")
                }
            }
        }
        let Some((_, known)) = &aliases else {
            sluice_runtime::shutdown::pause(backoff.next_pause(), &shutdown).await;
            continue;
        };
        let Some(coord) = shared.coord() else {
            tx.send_if_modified(|v| replace(v, known.clone(), HashMap::new()));
            sluice_runtime::shutdown::pause(backoff.next_pause(), &shutdown).await;
            continue;
        };
        let mut applied = HashMap::new();
        let mut watches = Vec::new();
        let mut failed = None;
        for target in known.values() {
            match coord.get_watched(&layout::applied(&target.pipeline)).await {
                Ok((node, w)) => {
                    watches.push(w);
                    if let Some(r) =
                        node.and_then(|n| serde_json::from_slice::<AppliedRecord>(&n.data).ok())
                    {
                        applied.insert(target.pipeline.clone(), r);
                    }
                }
                Err(e) => failed = Some(e),
            }
        }
        tx.send_if_modified(|v| replace(v, known.clone(), applied));
        if let Some(e) = failed {
            tracing::warn!(error = %e, "cannot read how far the pipelines are applied; retrying");
            sluice_runtime::shutdown::pause(backoff.next_pause(), &shutdown).await;
            continue;
        }
        backoff.reset();
        tokio::select! {
            () = coord.wait_any(watches, &shutdown) => {}
            () = tokio::time::sleep(ALIASES_EVERY) => {}
        }
    }
}

/// Replaces `view` when it differs; whether it did.
fn replace(
    view: &mut Arc<View>,
    aliases: HashMap<String, AliasTarget>,
    applied: HashMap<String, AppliedRecord>,
) -> bool {
    let next = View { aliases, applied };
    if **view == next {
        return false;
    }
    *view = Arc::new(next);
    true
}

async fn aliases_of(shared: &Shared) -> Result<HashMap<String, AliasTarget>> {
    Ok(shared
        .meta
        .pipelines()
        .await?
        .into_iter()
        .map(|p| {
            (
                p.spec.alias.clone(),
                AliasTarget {
                    pipeline: p.spec.name,
                    source: p.spec.source,
                },
            )
        })
        .collect())
}
