//! The load harness (`sparkd-load`) in small: its checks must all pass against the real
//! daemon, on the socket and through the OpenAI shim. Bounded by request counts, never
//! judged on speed.

use std::time::Duration;

use sparkd_e2e::load::shim::{run_shim_round, ShimLoadOptions};
use sparkd_e2e::load::{run_socket_load, LoadOptions};
use sparkd_e2e::{tiny_model, Daemon, Shim};

const REQUESTS: usize = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_load_accounts_for_every_request_and_returns_to_idle() {
    let keep = REQUESTS.to_string();
    let d = Daemon::start(&tiny_model(), &["--keep-jobs", &keep]);
    let opts = LoadOptions {
        clients: 8,
        requests: REQUESTS,
        seed: 11,
        frame_timeout: Duration::from_secs(30),
        ..LoadOptions::default()
    };
    let report = run_socket_load(&d.socket, &opts, |_| {})
        .await
        .expect("load run");
    println!("{report}");
    assert!(
        report.passed(),
        "failed: {:#?}\n{report}\ndaemon log:\n{}",
        report.failed_checks(),
        d.log_text()
    );
    let round = &report.rounds[0];
    assert_eq!(round.requests, REQUESTS);
    // The mix really contained hang-ups and cancels that reached the engine in time.
    // Whether a given cancel beats the end of its (short) answer is a race with the
    // engine's speed, so this looks at every round of the run (the warm-ups carry the
    // same mix of requests), not at one; the checks above hold for each round.
    let ending = |what: &str| -> usize {
        report
            .warmup
            .iter()
            .chain(&report.rounds)
            .flat_map(|r| &r.endings)
            .filter(|(w, _)| w == what)
            .map(|(_, n)| *n)
            .sum()
    };
    assert!(ending("hung up") > 0 && ending("cancelled") > 0, "{report}");
    // And the memory check really ran.
    assert!(round
        .checks
        .iter()
        .any(|c| c.name.contains("resident memory")));
    assert!(!d.log_text().contains("panicked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shim_load_with_hang_ups_accounts_for_every_request() {
    let keep = REQUESTS.to_string();
    let d = Daemon::start(&tiny_model(), &["--keep-jobs", &keep]);
    let shim = Shim::start(&d.socket, &[]);
    let control = d.client().await;
    let opts = ShimLoadOptions {
        clients: 8,
        requests: 40,
        drop_fraction: 0.25,
        seed: 5,
        max_tokens: 32,
        timeout: Duration::from_secs(30),
        shim_pid: shim.child.id(),
    };
    let round = run_shim_round(&shim.url(""), &control, &opts)
        .await
        .expect("shim round");
    println!("{round}");
    assert!(
        round.passed(),
        "{round}\nshim log:\n{}\ndaemon log:\n{}",
        shim.log_text(),
        d.log_text()
    );
    let hung_up = round
        .endings
        .iter()
        .find(|(w, _)| w == "hung up mid-stream")
        .map_or(0, |(_, n)| *n);
    assert!(hung_up > 0, "{round}");
}
