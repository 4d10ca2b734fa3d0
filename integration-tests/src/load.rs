//! A write load on a test's database, in the background.

use std::time::Duration;

use mysql_async::prelude::*;

use crate::context::TestCtx;
use crate::eventually;

/// A write load on the test database in the background, until [`Load::stop`].
pub struct Load {
    running: std::sync::Arc<std::sync::atomic::AtomicBool>,
    done: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<u64>,
}

impl TestCtx {
    /// Runs `round(n)`'s statements, in order, for n = 1, 2, … with `pace` between rounds
    /// (a load's pace, not a synchronisation), on a connection of its own.
    pub fn load(
        &self,
        pace: Duration,
        round: impl Fn(u64) -> Vec<String> + Send + 'static,
    ) -> Load {
        use std::sync::atomic::Ordering;
        let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (pool, db, go) = (self.stack.mysql.clone(), self.db.clone(), running.clone());
        let counted = done.clone();
        let task = tokio::spawn(async move {
            let mut conn = pool.get_conn().await.expect("MySQL connection");
            conn.query_drop(format!("USE `{db}`"))
                .await
                .expect("use db");
            let mut n = 0;
            while go.load(Ordering::Relaxed) {
                n += 1;
                for statement in round(n) {
                    conn.query_drop(&statement)
                        .await
                        .unwrap_or_else(|e| panic!("{statement}: {e}"));
                }
                counted.store(n, Ordering::Relaxed);
                tokio::time::sleep(pace).await; // pacing a load
            }
            n
        });
        Load {
            running,
            done,
            task,
        }
    }
}

impl Load {
    /// The rounds done so far.
    pub fn rounds(&self) -> u64 {
        self.done.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits (at most `within`) until `more` rounds have run after this call.
    pub async fn wait_rounds(&self, more: u64, within: Duration) {
        let from = self.rounds();
        eventually(&format!("{more} more load rounds"), within, || async {
            match self.rounds() - from {
                n if n >= more => Ok(()),
                n => Err(format!("{n} of {more} rounds")),
            }
        })
        .await
    }

    /// Stops after the round under way; how many rounds ran.
    pub async fn stop(self) -> u64 {
        self.running
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.task.await.expect("the load panicked")
    }
}
