//! `sluice-center`: the control plane. Several replicas run; one leads (ZooKeeper
//! election, [`sluice_zk::Leadership`]). Every replica serves the gRPC API — reads from
//! ZooKeeper and the meta database, health and reflection — and takes workers' reports;
//! only the leader changes anything: metadata writes, the `mappings`/`pipelines` it
//! publishes to ZooKeeper, and task assignments.
//!
//! The leader keeps nothing that is not in ZooKeeper or the meta database: a new leader
//! reads both and carries on. Its writes carry its epoch (ZooKeeper records) or are
//! fenced by it (meta database transactions), so a deposed leader's late writes are
//! ignored or rejected.

pub mod access;
pub mod api;
pub mod balance;
mod build;
mod check;
mod chunked;
mod client_addr;
pub mod config;
pub mod credentials;
mod delayed;
pub mod dict;
pub mod dlq;
pub mod error;
pub mod history;
mod known;
mod leader;
mod listeners;
pub mod meta;
mod metrics;
mod probe;
mod rebuild;
mod reconcile;
mod resync;
mod retention;
mod rollback;
mod run;
mod search;
mod term;
mod tombstones;

use std::path::Path;
use std::sync::{Arc, RwLock};

use sluice_runtime::ConfigError;
use sluice_zk::Coordinator;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio_util::sync::CancellationToken;

pub use config::CenterConfig;
pub use error::CenterError;

use crate::error::{Context as _, Result};

/// Loads and validates the configuration; errors name the offending keys.
pub fn load(path: &Path) -> Result<CenterConfig, ConfigError> {
    let cfg: CenterConfig = sluice_runtime::load_config(Some(path), "SLUICE")?;
    cfg.validate().map_err(ConfigError::Problems)?;
    sluice_runtime::unreadable_tls(&cfg.mysql_tls())?;
    Ok(cfg)
}

/// What the API and the leader loop share.
pub struct Shared {
    pub cfg: CenterConfig,
    pub meta: meta::Meta,
    /// From `[elasticsearch]`, when set: builds and pipeline deletion need it.
    pub es: Option<sluice_elastic::EsClient>,
    /// The current ZooKeeper session (replaced after an expiry).
    coord: RwLock<Option<Coordinator>>,
    /// `Some(epoch)` while this replica leads and may act.
    leading: watch::Sender<Option<u64>>,
    /// Asks the leader loop to reconcile now (metadata changed).
    nudge: Notify,
    /// An operator's rebalance, answered with the moves made.
    rebalance: mpsc::Sender<oneshot::Sender<Vec<balance::Move>>>,
    /// `/readyz`: the same as the gRPC health.
    ready: sluice_runtime::telemetry::Readiness,
    /// Turns to read the dead-letter topics (each read holds its letters in memory).
    letter_reads: tokio::sync::Semaphore,
    /// The pipelines being rolled back (one rollback of each at a time).
    rollbacks: rollback::Rollbacks,
}

impl Shared {
    pub fn coord(&self) -> Option<Coordinator> {
        self.coord.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The epoch this replica leads at, if it leads right now.
    pub fn leading_epoch(&self) -> Option<u64> {
        *self.leading.borrow()
    }
}

/// Runs the center until `shutdown`: serves the API, campaigns, and leads when elected.
pub async fn run(
    cfg: CenterConfig,
    ready: sluice_runtime::telemetry::Readiness,
    shutdown: CancellationToken,
) -> Result<()> {
    metrics::observe();
    let meta = connect_meta(&cfg, &shutdown).await?;
    let (rebalance_tx, rebalance_rx) = mpsc::channel(4);
    let es = match &cfg.elasticsearch {
        Some(section) => Some(section.client().context("elasticsearch")?),
        None => None,
    };
    check_access(&cfg, es.as_ref()).await?;
    let shared = Arc::new(Shared {
        cfg,
        meta,
        es,
        coord: RwLock::new(None),
        leading: watch::channel(None).0,
        nudge: Notify::new(),
        rebalance: rebalance_tx,
        ready,
        letter_reads: tokio::sync::Semaphore::new(api::LETTER_READS_AT_ONCE),
        rollbacks: rollback::Rollbacks::default(),
    });
    let dictionaries = dict::bind(shared.cfg.center.dictionary_listen).await?;
    let searches = search::bind(&shared).await?;
    let mut server = tokio::spawn(serve(
        shared.clone(),
        dictionaries,
        searches,
        shutdown.clone(),
    ));
    // The API failing (a port in use, an unreadable certificate) ends the center: a
    // leader nobody can reach must not go on leading.
    let campaign = leader::campaign_forever(shared.clone(), rebalance_rx, shutdown.clone());
    tokio::pin!(campaign);
    let (led, served) = tokio::select! {
        () = &mut campaign => {
            shutdown.cancel();
            (Ok(()), server.await.context("the API server task failed")?)
        }
        served = &mut server => {
            let served = served.context("the API server task failed")?;
            let graceful = shutdown.is_cancelled();
            shutdown.cancel();
            campaign.await;
            if graceful {
                (Ok(()), served)
            } else {
                let stopped = CenterError::definite("the gRPC API stopped unexpectedly");
                (Ok(()), served.and(Err(stopped)))
            }
        }
    };
    if let Some(coord) = shared.coord() {
        coord.close().await;
    }
    shared.meta.clone().close().await;
    tracing::info!("center stopped");
    led.and(served)
}

/// Serves the API, the dictionaries and the search API until `shutdown`; any of them
/// failing ends the center, and at shutdown the API drains last.
async fn serve(
    shared: Arc<Shared>,
    dictionaries: tokio::net::TcpListener,
    searches: Option<tokio::net::TcpListener>,
    shutdown: CancellationToken,
) -> Result<()> {
    let dictionaries = dict::serve(
        shared.meta.clone(),
        dictionaries,
        shared.cfg.limits,
        shutdown.clone(),
    );
    let searches = async {
        match searches {
            Some(l) => search::serve(shared.clone(), l, shutdown.clone()).await,
            None => Ok(()),
        }
    };
    let api = api::serve(shared.clone(), shutdown.clone());
    tokio::pin!(api, dictionaries, searches);
    let others = async {
        tokio::try_join!(&mut dictionaries, &mut searches)?;
        Ok(())
    };
    tokio::select! {
        served = &mut api => served,
        served = others => match served {
            Ok(()) => api.await,
            Err(e) => Err(e),
        },
    }
}

/// Credentials and certificates the sink or the brokers refuse stop the center at start,
/// naming the setting.
async fn check_access(cfg: &CenterConfig, es: Option<&sluice_elastic::EsClient>) -> Result<()> {
    if let Some(es) = es {
        sluice_elastic::EsSection::check_access(es, "elasticsearch")
            .await
            .map_err(CenterError::definite)?;
    }
    if let Some(kafka) = &cfg.kafka {
        sluice_kafka::check_access(kafka, std::time::Duration::from_secs(10))
            .await
            .map_err(CenterError::definite)?;
    }
    Ok(())
}

async fn connect_meta(cfg: &CenterConfig, shutdown: &CancellationToken) -> Result<meta::Meta> {
    let mut backoff = cfg.center.retry().backoff();
    loop {
        match meta::Meta::connect(&cfg.meta, &cfg.center.id).await {
            Ok(m) => return Ok(m),
            Err(e @ (meta::MetaError::Corrupt(_) | meta::MetaError::Refused(_))) => {
                return Err(e.into())
            }
            Err(e) => {
                tracing::error!(error = %e, host = %cfg.meta.host, port = cfg.meta.port, "cannot reach the meta database; retrying");
            }
        }
        if !sluice_runtime::shutdown::pause(backoff.next_pause(), shutdown).await {
            return Err(CenterError::transient(
                "shutdown before the meta database was reachable",
            ));
        }
    }
}
