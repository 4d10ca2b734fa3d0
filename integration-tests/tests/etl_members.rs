//! Several etl processes share the change topics' partitions among themselves, with no
//! consumer-group rebalance (README, "Architecture": Etl): each partition has exactly one
//! owner among the live members; a member killed leaves its partitions to the others;
//! a pipeline added while they run is taken by its owners while every partition already
//! held stays where it is. Writes go on throughout, and every index ends equal to MySQL.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use sluice_integration_tests::cluster::write_load;
use sluice_integration_tests::{eventually, ClusterSource, TestCtx};
use sluice_zk::layout::EtlRecord;

type Held = BTreeMap<String, BTreeSet<(String, i32)>>;

/// The partitions each live etl member says it consumes (its `etls/<member>` record).
async fn held(ctx: &TestCtx) -> Held {
    let zk = ctx.coordinator().await;
    let mut out = Held::new();
    for member in zk.children("etls").await.expect("etls") {
        let Some(node) = zk
            .get(&sluice_zk::layout::etl(&member))
            .await
            .expect("etl record")
        else {
            continue;
        };
        let record: EtlRecord = serde_json::from_slice(&node.data).expect("an etl record");
        let parts = record
            .partitions
            .into_iter()
            .flat_map(|(t, ps)| ps.into_iter().map(move |p| (t.clone(), p)))
            .collect();
        out.insert(member, parts);
    }
    out
}

/// `Ok` when exactly `members` are live and each holds the partitions of `all` the
/// sharing rule gives it: none twice, none left out.
fn shared_exactly(
    held: &Held,
    members: &[&str],
    all: &BTreeSet<(String, i32)>,
) -> Result<(), String> {
    let names: Vec<String> = members.iter().map(|m| (*m).to_owned()).collect();
    let mut expected = Held::new();
    for m in &names {
        expected.insert(m.clone(), BTreeSet::new());
    }
    for (topic, partition) in all {
        let owner = names
            .iter()
            .find(|m| sluice_etl::owns(&names, m, topic, *partition))
            .ok_or_else(|| format!("{topic}/{partition} has no owner among {names:?}"))?;
        expected
            .get_mut(owner)
            .expect("a member")
            .insert((topic.clone(), *partition));
    }
    if held == &expected {
        Ok(())
    } else {
        Err(format!("held {held:?}, expected {expected:?}"))
    }
}

/// The change topic of a cluster source's table.
fn topic(ctx: &TestCtx, source: &ClusterSource, table: &str) -> String {
    sluice_kafka::TopicConfig::default().rows_topic(&source.name, &ctx.db, table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etl_members_share_the_partitions_take_over_a_dead_ones_and_add_a_pipeline_in_place() {
    let ctx = TestCtx::new("etlshare").await;
    for t in ["a", "b"] {
        ctx.exec(&format!(
            "CREATE TABLE {t} (id BIGINT PRIMARY KEY, v BIGINT)"
        ))
        .await;
    }
    let mut cluster = ctx.start_cluster(1, 1).await;
    let a = ctx.add_source(&cluster, "a", 1).await;
    cluster.wait_running(&[&a], Duration::from_secs(60)).await;
    let (one, two) = (format!("{}-1", ctx.group), format!("{}-2", ctx.group));

    // Alone, the first member holds every partition of the pipeline's topics.
    let all_a = eventually(
        "the first etl holds a's partitions",
        Duration::from_secs(30),
        || async {
            let held = held(&ctx).await;
            match held.get(&one) {
                Some(parts) if parts.iter().any(|(t, _)| *t == topic(&ctx, &a, "a")) => {
                    Ok(parts.clone())
                }
                _ => Err(format!("{held:?}")),
            }
        },
    )
    .await;

    // A second member: the two split them, each partition to one of them.
    let (stop, load) = write_load(&ctx, &["a"]);
    let mut second = ctx.another_etl(2);
    second.start();
    let split = eventually(
        "the two members share a's partitions",
        Duration::from_secs(30),
        || async {
            let held = held(&ctx).await;
            shared_exactly(&held, &[&one, &two], &all_a)?;
            Ok(held)
        },
    )
    .await;
    eprintln!("shared: {split:?}");

    // The first one killed: the second takes its partitions; nothing is lost.
    cluster.etl.kill9();
    eventually(
        "the second member holds every partition",
        Duration::from_secs(30),
        || async { shared_exactly(&held(&ctx).await, &[&two], &all_a) },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    assert!(load.await.expect("load") > 10, "the load ran");
    cluster
        .converges(&ctx, &a.pipeline, Duration::from_secs(60))
        .await;

    // A pipeline added: its partitions are taken, and none of a's was given up on the way.
    let kept_a = held(&ctx).await[&two].clone();
    let mark = second.log_mark();
    let b = ctx.add_source(&cluster, "b", 2).await;
    cluster.wait_running(&[&b], Duration::from_secs(60)).await;
    ctx.exec("INSERT INTO b VALUES (1, 1), (2, 2)").await;
    ctx.exec("INSERT INTO a VALUES (1000000, 1)").await;
    let with_b = eventually(
        "the second member holds b's partitions too",
        Duration::from_secs(30),
        || async {
            let parts = held(&ctx).await.remove(&two).unwrap_or_default();
            if parts.iter().any(|(t, _)| *t == topic(&ctx, &b, "b")) {
                Ok(parts)
            } else {
                Err(format!("{parts:?}"))
            }
        },
    )
    .await;
    assert!(
        kept_a.is_subset(&with_b),
        "a partition of a was given up when b was added: before {kept_a:?}, after {with_b:?}"
    );
    assert!(
        second.logged_since(mark, &["partitions given up"]).is_err(),
        "the second member gave partitions up when a pipeline was added:\n{}",
        second.log_tail()
    );
    cluster
        .converges(&ctx, &a.pipeline, Duration::from_secs(60))
        .await;
    cluster
        .converges(&ctx, &b.pipeline, Duration::from_secs(60))
        .await;
    drop(second);
    drop(cluster);
    ctx.cleanup().await;
}

/// A feed takes the partitions of the topics the cluster's metadata shows and names those
/// it does not show yet: a topic created as the etl subscribes (a build's topic) reaches
/// the metadata a moment later, and the etl then looks again at once instead of at its
/// next regular look, 10 s on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_not_in_the_metadata_yet_is_named_and_taken_once_it_is() {
    let ctx = TestCtx::new("feedmissing").await;
    let cfg = ctx.kafka_config();
    let (here, later) = (
        format!("sluice.it.{}.here", ctx.instance),
        format!("sluice.it.{}.later", ctx.instance),
    );
    ctx.clean_up_topic(here.clone());
    ctx.clean_up_topic(later.clone());
    sluice_kafka::ensure_topics(&cfg, std::slice::from_ref(&here))
        .await
        .unwrap();
    let feed = sluice_kafka::Feed::new(&cfg, &format!("it-{}", ctx.instance)).unwrap();
    let topics = BTreeSet::from([here.clone(), later.clone()]);
    let topics_of = |feed: &sluice_kafka::Feed| -> BTreeSet<String> {
        feed.held().into_iter().map(|(t, _)| t).collect()
    };

    eventually(
        "the existing topic taken, the other named",
        Duration::from_secs(10),
        || async {
            let missing = feed
                .share(&topics, |_, _| true)
                .map_err(|e| e.to_string())?;
            match (missing == [later.clone()], topics_of(&feed)) {
                (true, held) if held == BTreeSet::from([here.clone()]) => Ok(()),
                (_, held) => Err(format!("missing {missing:?}, holding {held:?}")),
            }
        },
    )
    .await;

    sluice_kafka::ensure_topics(&cfg, std::slice::from_ref(&later))
        .await
        .unwrap();
    eventually(
        "both topics taken once both exist",
        Duration::from_secs(10),
        || async {
            let missing = feed
                .share(&topics, |_, _| true)
                .map_err(|e| e.to_string())?;
            match (missing.is_empty(), topics_of(&feed)) {
                (true, held) if held == topics => Ok(()),
                (_, held) => Err(format!("missing {missing:?}, holding {held:?}")),
            }
        },
    )
    .await;
    drop(feed);
    ctx.cleanup().await;
}
