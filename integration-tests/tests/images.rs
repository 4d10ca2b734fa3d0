//! The images run: a center, a worker and an etl as podman containers on the host's
//! network, from the images `make test` builds of the debug binaries
//! (`deploy/images.sh target/debug it`, the Dockerfile that `make images` builds the
//! shipped ones with), stream a table into its index.

use std::time::Duration;

use sluice_integration_tests::container::{self, TEST_TAG};
use sluice_integration_tests::TestCtx;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_center_a_worker_and_an_etl_in_containers_stream_a_table_into_its_index() {
    let bins = ["sluice-center", "sluice-worker", "sluice-etl"];
    container::check_built(&bins, TEST_TAG);
    let ctx = TestCtx::new("images").await;
    ctx.run_from_images(TEST_TAG);
    ctx.exec("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40))")
        .await;
    let cluster = ctx.start_cluster(1, 1).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    cluster
        .wait_running(&[&items], Duration::from_secs(60))
        .await;
    ctx.exec("INSERT INTO items VALUES (1, 'one'), (2, 'two')")
        .await;
    ctx.exec("UPDATE items SET name = 'TWO' WHERE id = 2").await;
    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(60))
        .await;
    // The services that did it ran as containers, and still do.
    for bin in bins {
        let image = container::image_of(bin, TEST_TAG);
        let names = container::running(&image);
        assert!(
            names.iter().any(|n| n.contains(&ctx.suffix)),
            "no container of this test runs {image}: {names:?}"
        );
    }
}
