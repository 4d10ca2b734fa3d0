//! One shutdown primitive: a cancellation token. The first SIGTERM/SIGINT cancels it and
//! the service drains within its bound; a second signal exits the process at once.

use tokio_util::sync::CancellationToken;

/// Returns a token cancelled by the first SIGTERM or SIGINT, calling `first` (readiness
/// turning false) before it is cancelled, so nothing drains while the service still looks
/// ready. Must be called inside a Tokio runtime.
pub fn on_signals(first: impl FnOnce() + Send + 'static) -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        first();
        tracing::info!("shutdown requested: not ready any more; draining (send the signal again to exit at once)");
        t.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal: exiting without draining");
        std::process::exit(130);
    });
    token
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Waits `d` unless `shutdown` comes first — a retry pace, never a synchronisation.
/// Returns `false` when interrupted by shutdown.
pub async fn pause(d: std::time::Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = shutdown.cancelled() => false,
    }
}
