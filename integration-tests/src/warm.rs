//! A warm-up before a benchmark times anything: on a stack just started, the JVMs of
//! OpenSearch and Kafka compile their hot paths during the first seconds of load, so
//! whatever ran first was measured against a slower server than the ceilings that ran
//! after it (a fresh stack's first flat etl run spent 17 s of OpenSearch CPU on 50,000
//! documents; a warm one, 5 s).

use std::time::Instant;

use serde_json::json;
use sluice_elastic::BulkOp;

use crate::kafka::Record;
use crate::TestCtx;

/// Documents indexed, and messages produced, to warm the servers.
const DOCUMENTS: u64 = 60_000;
const MESSAGES: usize = 300_000;

impl TestCtx {
    /// Indexes [`DOCUMENTS`] small documents into a scratch index of OpenSearch and
    /// produces [`MESSAGES`] into a scratch topic (both deleted), printing how long each
    /// took: a second run on a warm stack is fast.
    pub async fn warm_up(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        let index = format!("warm_up_{}", self.suffix).to_ascii_lowercase();
        self.stack
            .es
            .create_index(
                &index,
                &json!({"settings": {"number_of_shards": 1, "number_of_replicas": 0}}),
            )
            .await?;
        let ops: Vec<BulkOp> = (1..=DOCUMENTS)
            .map(|id| BulkOp::Index {
                index: index.clone(),
                id: id.to_string(),
                version: id,
                routing: None,
                doc: json!({"id": id, "k": id % 1000, "c": format!("warm {id}")}),
            })
            .collect();
        crate::ceiling::bulk_ceiling(&self.stack.es, &index, &ops).await?;
        let sink = started.elapsed();
        let records: Vec<Record> = (0..MESSAGES)
            .map(|i| Record {
                partition: (i % 3) as i32,
                offset: 0,
                key: i.to_string().into_bytes(),
                payload: vec![b'w'; 400],
                ts_ms: None,
            })
            .collect();
        let broker = self
            .producer_ceiling(&records, &format!("sluice.warm_up.{}", self.suffix), 3)
            .await?;
        println!(
            "warm-up: {DOCUMENTS} documents into the sink in {:.1} s, {MESSAGES} messages into Kafka in {:.1} s",
            sink.as_secs_f64(),
            broker.as_secs_f64()
        );
        Ok(())
    }
}
