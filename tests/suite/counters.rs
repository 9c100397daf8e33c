//! `collector::counters` against a real .NET 8 process: System.Runtime's EventCounters and the
//! AsyncWeb meter's histogram and counter arrive as typed values every interval.

use crate::support;

use std::time::Duration;

use collector::client::DiagnosticsClient;
use collector::counters::{self, CounterSessionConfig, CounterUpdate};
use collector::session::Reading;
use profile::counter::{CounterSample, CounterValue};
use support::Target;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_counters_and_meter_instruments_arrive_typed() {
    counters_arrive_typed(false).await;
}

/// The same, read as a node agent reads them: parked, on the timer grid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_read_on_the_timer_grid_arrive_typed() {
    counters_arrive_typed(true).await;
}

async fn counters_arrive_typed(on_timer_grid: bool) {
    let web = Target::builder("AsyncWeb")
        .args([
            "--self-load",
            "20",
            "--alpha-ms",
            "30",
            "--no-request-lines",
        ])
        .start();
    let client = DiagnosticsClient::for_pid(web.pid()).unwrap();
    let config = CounterSessionConfig::new(1)
        .with_event_counters("System.Runtime")
        .with_meter("AsyncWeb", &[]);
    let config = if on_timer_grid {
        config.read(Reading::OnTimerGrid)
    } else {
        config
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let stop_at = tokio::time::Instant::now() + Duration::from_secs(8);
    let session = tokio::spawn(async move {
        let stop = tokio::time::sleep_until(stop_at);
        let share = collector::signals::SignalShare::unlimited();
        counters::run(&client, &config, stop, tx, &share).await
    });
    let mut samples: Vec<CounterSample> = Vec::new();
    let mut first_at = None;
    while let Some(update) = rx.recv().await {
        first_at.get_or_insert_with(tokio::time::Instant::now);
        match update.into_inner() {
            CounterUpdate::Sample(s) => samples.push(*s),
            CounterUpdate::MetricsError { message } => panic!("metrics error: {message}"),
            CounterUpdate::IntervalStart { .. } => {}
        }
    }
    session.await.unwrap().unwrap();
    // Values are read while the session runs, not only in the drain after StopTracing.
    assert!(
        first_at.is_some_and(|at| at < stop_at),
        "no value arrived before the session was stopped"
    );
    let find = |provider: &str, name: &str| {
        samples
            .iter()
            .filter(|s| s.provider == provider && s.name == name)
            .collect::<Vec<_>>()
    };

    let cpu = find("System.Runtime", "cpu-usage");
    assert!(cpu.len() >= 2, "cpu-usage every second: {cpu:?}");
    assert!(
        matches!(cpu[0].value, CounterValue::Mean { .. }),
        "{:?}",
        cpu[0]
    );
    assert!(cpu
        .iter()
        .all(|s| s.interval_seconds.is_some_and(|i| (0.5..2.0).contains(&i))));
    let working_set = find("System.Runtime", "working-set");
    assert!(working_set
        .iter()
        .any(|s| s.value.value().is_some_and(|v| v > 1.0)));
    let gen0 = find("System.Runtime", "gen-0-gc-count");
    assert!(
        gen0.iter()
            .all(|s| matches!(s.value, CounterValue::Increment { .. })),
        "{gen0:?}"
    );

    let durations = find("AsyncWeb", "asyncweb.request.duration");
    let alpha = durations
        .iter()
        .find(|s| s.tags.iter().any(|(k, v)| k == "kind" && v == "alpha"))
        .unwrap_or_else(|| panic!("no alpha histogram: {durations:?}"));
    assert_eq!(alpha.unit, "ms");
    let p95 = alpha.value.percentile(95.0).expect("a p95");
    assert!(p95 >= 30.0, "alpha requests take at least 30 ms: p95 {p95}");
    for p in [50.0, 99.0] {
        assert!(alpha.value.percentile(p).is_some(), "p{p}: {alpha:?}");
    }
    let requests = find("AsyncWeb", "asyncweb.requests");
    assert!(
        requests
            .iter()
            .any(|s| matches!(s.value, CounterValue::Counter { rate, .. } if rate > 0.0)),
        "{requests:?}"
    );
}
