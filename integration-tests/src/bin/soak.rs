//! `make soak`: the chaos soak (`sluice_integration_tests::soak`) for `SOAK_MINUTES`
//! (default 10) on the source `SOAK_SOURCE` names (`mariadb`, the default, or `mysql`):
//! prints the faults injected, the load, the worst lag and the verdict, writes them as
//! JSON under `target/soak/`, and exits non-zero on a failing verdict.

use std::process::ExitCode;

use sluice_integration_tests::lane::Lane;
use sluice_integration_tests::paths::target_dir;
use sluice_integration_tests::soak::{self, SoakOptions};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let lane = match Lane::enter_from_env("SOAK_SOURCE") {
        Ok(lane) => lane,
        Err(e) => {
            eprintln!("soak: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = match SoakOptions::from_env(10.0) {
        Ok(opts) => opts,
        Err(e) => {
            eprintln!("soak: {e}");
            return ExitCode::from(2);
        }
    };
    eprintln!("{opts:?}");
    let report = soak::run(&opts).await;
    println!("{report}");
    let dir = target_dir().join("soak");
    let file = dir.join(format!("soak-{}-{}.json", lane.name(), report.seed));
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::write(
            &file,
            serde_json::to_vec_pretty(&report.to_json()).unwrap_or_default(),
        )
    });
    match written {
        Ok(()) => println!("figures: {}", file.display()),
        Err(e) => eprintln!("cannot write {}: {e}", file.display()),
    }
    if report.verdict.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
