//! Heap snapshots of real .NET 8 processes: the library and `clrscope gcdump`.

mod support;

use collector::client::DiagnosticsClient;
use collector::gcdump::{self, SnapshotOptions};
use support::Target;

const KEPT: [(&str, u64); 3] = [
    ("Alloc.SmallNode", 100_000),
    ("Alloc.MediumRecord", 25_000),
    ("Alloc.LargeBlob", 1_000),
];

fn alloc_target() -> Target {
    Target::builder("Alloc")
        .args(["--keep", "100000,25000,1000", "--churn-per-second", "0"])
        .start()
}

fn instance_bytes(target: &Target, name: &str) -> u64 {
    target
        .ready_fact(&format!("/instance_bytes/{name}"))
        .and_then(|v| v.as_u64())
        .unwrap_or_else(|| panic!("no instance_bytes of {name} in {:?}", target.ready()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_counts_exactly_the_kept_objects() {
    let target = alloc_target();
    let client = DiagnosticsClient::for_pid(target.pid()).unwrap();
    let graph = gcdump::snapshot(&client, SnapshotOptions::default(), |_| {})
        .await
        .unwrap();
    let histogram = graph.histogram();
    for (name, count) in KEPT {
        let row = histogram
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing from {:?}", &histogram.types[..10]));
        assert_eq!(row.count, count, "{name}");
        assert_eq!(row.bytes, count * instance_bytes(&target, name), "{name}");
    }
    // Each LargeBlob owns one byte[4096]; the three holder arrays reference every kept object.
    let blobs = histogram.get("System.Byte[]").unwrap();
    assert!(blobs.count >= 1_000, "{blobs:?}");
    assert!(graph.edge_count() as u64 >= 100_000 + 25_000 + 1_000);
    assert!(!graph.roots().is_empty());
    eprintln!(
        "{} objects, {} references, {} roots, top: {:?}",
        graph.node_count(),
        graph.edge_count(),
        graph.roots().len(),
        &histogram.types[..5]
    );
}
