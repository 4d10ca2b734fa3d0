//! What the worker tells the center: each task's progress and the worker's events
//! (task started, stopped, failed), sent to the leader every `worker.report_interval`.
//! Reports are best effort: the center being away never slows the data path, and events
//! wait in a bounded queue (the oldest are dropped past it, with a count).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_model::TaskState;
use sluice_proto::v1::worker_reports_client::WorkerReportsClient;
use sluice_proto::v1::{TaskProgress, WorkerEvent, WorkerReport};
use sluice_zk::layout::CenterRecord;
use sluice_zk::Coordinator;
use tokio_util::sync::CancellationToken;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::WorkerConfig;
use crate::error::{Context as _, Result, WorkerError};

const MAX_QUEUED_EVENTS: usize = 1000;

/// One task's progress, updated by the data path without waiting.
#[derive(Default)]
pub(crate) struct Progress {
    state: Mutex<(TaskState, String, String)>,
    lag_ms: AtomicU64,
    /// Binlog bytes behind the server's end, plus one (0: not known).
    lag_bytes: AtomicU64,
    events: AtomicU64,
}

impl Progress {
    pub fn state(&self, state: TaskState) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0 = state;
    }

    pub fn confirmed(&self, position: String, gtid: String) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.1 = position;
        s.2 = gtid;
    }

    /// A transaction committed at `ts_ms` was read now.
    pub fn read_commit(&self, ts_ms: u64) {
        if ts_ms > 0 {
            let now = sluice_model::now_ms().max(0) as u64;
            self.lag_ms
                .store(now.saturating_sub(ts_ms), Ordering::Relaxed);
        }
    }

    /// `bytes` of binlog written past the confirmed position (`None`: not known).
    pub fn bytes_behind(&self, bytes: Option<u64>) {
        self.lag_bytes
            .store(bytes.map_or(0, |b| b + 1), Ordering::Relaxed);
    }

    pub fn lag_bytes(&self) -> Option<u64> {
        self.lag_bytes.load(Ordering::Relaxed).checked_sub(1)
    }

    pub fn lag_seconds(&self) -> f64 {
        self.lag_ms.load(Ordering::Relaxed) as f64 / 1000.0
    }

    pub fn task_state(&self) -> TaskState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// The confirmed position, as `file:offset` (empty before the first).
    pub fn position(&self) -> String {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    pub fn published(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self, source: &str) -> TaskProgress {
        let (state, position, gtid) = self.state.lock().unwrap_or_else(|e| e.into_inner()).clone();
        TaskProgress {
            source: source.to_owned(),
            state: state.as_str().into(),
            task_state: sluice_proto::v1::TaskState::from(state).into(),
            position,
            gtid,
            events_published: self.events.load(Ordering::Relaxed),
            lag_seconds: self.lag_seconds(),
        }
    }
}

/// Every task's progress and the queued events.
#[derive(Default)]
pub(crate) struct Reports {
    tasks: Mutex<BTreeMap<String, Arc<Progress>>>,
    events: Mutex<VecDeque<WorkerEvent>>,
    dropped: AtomicU64,
}

impl Reports {
    pub fn task(&self, name: &str) -> Arc<Progress> {
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    /// Every task's progress, by task name.
    pub fn all(&self) -> Vec<(String, Arc<Progress>)> {
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect()
    }

    /// Keeps the progress of the tasks `keep` says yes to.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|name, _| keep(name));
    }

    pub fn event(&self, kind: &str, subject: &str, message: impl Into<String>) {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= MAX_QUEUED_EVENTS {
            q.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        q.push_back(WorkerEvent {
            at_ms: sluice_model::now_ms(),
            kind: kind.to_owned(),
            subject: subject.to_owned(),
            message: message.into(),
        });
    }

    fn take(&self, worker: &str) -> WorkerReport {
        let tasks = self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(name, p)| p.snapshot(name))
            .collect();
        let mut events: Vec<WorkerEvent> = self
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            events.insert(
                0,
                WorkerEvent {
                    at_ms: sluice_model::now_ms(),
                    kind: "events_dropped".into(),
                    subject: worker.to_owned(),
                    message: format!(
                        "{dropped} events were dropped while the center was unreachable"
                    ),
                },
            );
        }
        WorkerReport {
            worker: worker.to_owned(),
            tasks,
            events,
        }
    }

    fn give_back(&self, events: Vec<WorkerEvent>) {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        for e in events.into_iter().rev() {
            if q.len() >= MAX_QUEUED_EVENTS {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            q.push_front(e);
        }
    }
}

/// Sends reports to the current leader until `stop`.
pub(crate) async fn report_loop(
    cfg: Arc<WorkerConfig>,
    coord: Coordinator,
    reports: Arc<Reports>,
    report_key: String,
    stop: CancellationToken,
) {
    let key = MetadataValue::try_from(report_key).expect("a hex key is a header value");
    let mut client: Option<(String, WorkerReportsClient<Channel>)> = None;
    let token = match bearer(&cfg) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "center reports disabled");
            return;
        }
    };
    let mut warned = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(cfg.worker.report_interval) => {}
            _ = stop.cancelled() => return,
        }
        let report = reports.take(&cfg.worker.id);
        let sent = async {
            let leader: CenterRecord = coord
                .leader()
                .await?
                .and_then(|l| serde_json::from_slice(&l.info).ok())
                .context("no center leads")?;
            if client.as_ref().is_none_or(|(addr, _)| *addr != leader.addr) {
                let channel = channel(&cfg, &leader.addr)?;
                client = Some((leader.addr.clone(), WorkerReportsClient::new(channel)));
            }
            let (_, c) = client.as_mut().expect("client set above");
            let mut req = tonic::Request::new(report.clone());
            req.set_timeout(Duration::from_secs(5));
            if let Some(t) = &token {
                req.metadata_mut().insert("authorization", t.clone());
            }
            req.metadata_mut()
                .insert(sluice_proto::REPORT_KEY_HEADER, key.clone());
            c.report(req).await.map_err(WorkerError::transient)?;
            Ok::<_, WorkerError>(())
        }
        .await;
        match sent {
            Ok(()) => warned = false,
            Err(e) => {
                client = None;
                reports.give_back(report.events);
                if !warned {
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "cannot report to the center (the data path is not affected); will retry"
                    );
                    warned = true;
                }
            }
        }
    }
}

fn bearer(cfg: &WorkerConfig) -> Result<Option<MetadataValue<Ascii>>> {
    let token = match (&cfg.center.token, &cfg.center.token_file) {
        (Some(t), _) => t.expose().to_owned(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("center.token_file: {}", f.display()))?
            .trim()
            .to_owned(),
        (None, None) => return Ok(None),
    };
    Ok(Some(
        MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| WorkerError::definite("center.token: not a valid header value"))?,
    ))
}

fn channel(cfg: &WorkerConfig, addr: &str) -> Result<Channel> {
    let c = &cfg.center;
    let scheme = if c.tls_ca.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(WorkerError::definite)?
        .connect_timeout(Duration::from_secs(3));
    if let Some(ca) = &c.tls_ca {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(
            std::fs::read(ca).with_context(|| format!("center.tls_ca: {}", ca.display()))?,
        ));
        if let (Some(cert), Some(key)) = (&c.tls_cert, &c.tls_key) {
            tls = tls.identity(Identity::from_pem(
                std::fs::read(cert)
                    .with_context(|| format!("center.tls_cert: {}", cert.display()))?,
                std::fs::read(key).with_context(|| format!("center.tls_key: {}", key.display()))?,
            ));
        }
        endpoint = endpoint.tls_config(tls).map_err(WorkerError::definite)?;
    }
    Ok(endpoint.connect_lazy())
}
