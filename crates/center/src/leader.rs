//! The campaign and, once elected, the leader's loop: a reconcile pass (see
//! [`crate::reconcile`]) whenever something changed, again after a transient failure, and
//! until the term ends.

use std::sync::Arc;
use std::time::Duration;

use sluice_zk::layout::CenterRecord;
use sluice_zk::{Leadership, SessionEnd, Sessions, ZkError};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::balance::Move;
use crate::error::{CenterError, Context as _, Result};
use crate::known::Known;
use crate::reconcile::{reconcile, Pass};
use crate::term::Term;
use crate::Shared;

type RebalanceRequests = mpsc::Receiver<oneshot::Sender<Vec<Move>>>;

/// One reconcile pass may take this long before it is abandoned and retried.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(30);

/// Connects, campaigns and leads, again after every lost session or leadership, until
/// shutdown.
pub(crate) async fn campaign_forever(
    shared: Arc<Shared>,
    mut rebalance: RebalanceRequests,
    shutdown: CancellationToken,
) {
    let me = CenterRecord {
        id: shared.cfg.center.id.clone(),
        addr: shared.cfg.center.advertised(),
        console: format!(
            "{}://{}",
            if shared.cfg.api.tls_cert.is_some() {
                "https"
            } else {
                "http"
            },
            shared.cfg.center.console_advertised()
        ),
    };
    let info = serde_json::to_vec(&me).expect("center record serializes");
    let retry = shared.cfg.center.retry();
    let mut sessions = Sessions::new(
        shared.cfg.zookeeper.clone(),
        retry,
        "the campaign",
        shutdown.clone(),
    );
    while let Some(coord) = sessions.next().await {
        *shared.coord.write().unwrap_or_else(|e| e.into_inner()) = Some(coord.clone());
        let end = match coord.campaign(&info, &shutdown).await {
            Ok(leadership) => {
                let epoch = leadership.epoch();
                let term = Term::new(&coord, &leadership);
                let result = lead(&shared, &term, &leadership, &mut rebalance, &shutdown).await;
                shared.leading.send_replace(None);
                if shutdown.is_cancelled() {
                    // Hand over at once instead of after a session timeout.
                    leadership.resign().await;
                } else {
                    drop(leadership);
                }
                match result {
                    Ok(()) => SessionEnd::Ended,
                    Err(e) => {
                        // Each new leadership takes an epoch: do not churn through them
                        // while something (the meta database, a bad record) keeps failing.
                        tracing::warn!(epoch, error = %e, "stopped leading");
                        SessionEnd::Failed
                    }
                }
            }
            Err(ZkError::Cancelled) => SessionEnd::Ended,
            Err(e) => {
                tracing::warn!(error = %e, "campaign interrupted");
                SessionEnd::Failed
            }
        };
        sessions.ended(coord, end).await;
    }
}

/// Records the leadership at `epoch` (the meta database's fence, an event, the gauges);
/// the gauges stop saying so when the guard returned is dropped, however leading ends.
async fn take_leadership(shared: &Shared, epoch: u64) -> Result<NotLeading> {
    let me = &shared.cfg.center.id;
    shared
        .meta
        .take_leadership(epoch, me)
        .await
        .context("cannot record the leadership in the meta database")?;
    let led = format!("leads at epoch {epoch}");
    let _ = shared.meta.add_event(me, "leader", me, &led).await;
    shared.leading.send_replace(Some(epoch));
    crate::metrics::update(|g| {
        g.leader = true;
        g.epoch = epoch;
    });
    tracing::info!(epoch, "leading: reconciling");
    Ok(NotLeading)
}

/// Dropped when leading ends: the gauges stop saying this replica leads.
struct NotLeading;

impl Drop for NotLeading {
    fn drop(&mut self) {
        crate::metrics::update(|g| {
            g.leader = false;
            g.workers_live = None;
            g.tasks.clear();
            g.pipelines.clear();
            g.builds.clear();
            g.needs_rebuild.clear();
        });
    }
}

/// While the ZooKeeper connection is in doubt: acts on nothing (the API says so) until it
/// is back, the leadership is lost (`Err`), or shutdown (`false`). The lease can also
/// come back without a state change (a late heartbeat answer): it looks again shortly.
async fn in_doubt(
    shared: &Shared,
    term: &Term<'_>,
    leadership: &Leadership,
    shutdown: &CancellationToken,
) -> Result<bool> {
    shared.leading.send_replace(None);
    let mut session = term.coord.session();
    tokio::select! {
        why = leadership.lost() => return Err(lost(why)),
        _ = session.changed() => {}
        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        _ = shutdown.cancelled() => return Ok(false),
    }
    if leadership.is_acting() {
        shared.leading.send_replace(Some(term.epoch()));
    }
    Ok(true)
}

fn lost(why: String) -> CenterError {
    CenterError::Deposed(format!("leadership lost: {why}"))
}

/// One reconcile pass, given up after [`RECONCILE_TIMEOUT`], its duration recorded
/// (`sluice_center_reconcile_seconds`) whatever its outcome.
async fn timed_pass(
    shared: &Shared,
    term: &Term<'_>,
    known: &mut Known,
    operator: bool,
) -> Result<Pass> {
    let started = std::time::Instant::now();
    let pass = reconcile(shared, term, known, operator);
    let pass = tokio::time::timeout(RECONCILE_TIMEOUT, pass);
    let pass = pass.await.unwrap_or_else(|_| {
        Err(CenterError::transient(format!(
            "reconcile took longer than {RECONCILE_TIMEOUT:?} (meta database or ZooKeeper not answering)"
        )))
    });
    crate::metrics::RECONCILE.record(started.elapsed().as_secs_f64(), &[]);
    pass
}

/// Leads until the leadership is lost, a deposition is detected, or shutdown.
async fn lead(
    shared: &Shared,
    term: &Term<'_>,
    leadership: &Leadership,
    rebalance: &mut RebalanceRequests,
    shutdown: &CancellationToken,
) -> Result<()> {
    let epoch = term.epoch();
    let me = &shared.cfg.center.id;
    let _not_leading = take_leadership(shared, epoch).await?;
    let main = async {
        let mut pending: Option<oneshot::Sender<Vec<Move>>> = None;
        // What this term's passes read of ZooKeeper, kept current by watches.
        let mut known = Known::new();
        let mut backoff = shared.cfg.center.retry().backoff();
        loop {
            if !leadership.is_acting() {
                if !in_doubt(shared, term, leadership, shutdown).await? {
                    return Ok(());
                }
                continue;
            }
            let operator = pending.is_some();
            tracing::debug!("reconcile pass");
            let Pass { moves, wake, watch } = match timed_pass(shared, term, &mut known, operator)
                .await
            {
                Ok(pass) => {
                    backoff.reset();
                    pass
                }
                Err(e) if e.ends_the_term() => return Err(e),
                Err(e @ CenterError::Transient(_)) => {
                    let pause = backoff.next_pause();
                    tracing::warn!(error = %e, retry_in = ?pause, "reconcile failed; retrying");
                    if !sluice_runtime::shutdown::pause(pause, shutdown).await {
                        return Ok(());
                    }
                    continue;
                }
                Err(e) => {
                    // Retrying cannot mend it: say so once, and pass again only when
                    // something changes (metadata, an operator's call) or at the resync.
                    tracing::error!(error = %e, "reconcile failed, and will until the cause is fixed");
                    let why = format!("reconcile failed: {e}");
                    let _ = shared.meta.add_event_once(me, "leader", me, &why).await;
                    tokio::select! {
                        why = leadership.lost() => return Err(lost(why)),
                        _ = shutdown.cancelled() => return Ok(()),
                        _ = shared.nudge.notified() => {}
                        req = rebalance.recv() => pending = req,
                        _ = tokio::time::sleep(shared.cfg.balance.resync) => {}
                    }
                    continue;
                }
            };
            if let Some(reply) = pending.take() {
                let _ = reply.send(moves);
            }
            let resync = shared.cfg.balance.resync;
            let wake = wake.map_or(resync, |w| w.min(resync));
            tokio::select! {
                why = leadership.lost() => return Err(lost(why)),
                _ = shutdown.cancelled() => return Ok(()),
                _ = watch.changed(term.coord, shutdown) => {}
                _ = shared.nudge.notified() => {}
                req = rebalance.recv() => pending = req,
                _ = tokio::time::sleep(wake) => {}
            }
        }
    };
    // Delayed changes are recorded, and history and tombstones past their retention
    // deleted, for as long as this replica leads.
    tokio::select! {
        r = main => r,
        r = crate::delayed::record_changes(shared, epoch, shutdown) => r,
        r = crate::retention::keep(shared, shutdown) => r,
        r = crate::tombstones::keep(shared, shutdown) => r,
    }
}
