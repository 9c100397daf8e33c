use super::*;

fn sample_graph() -> HeapGraph {
    // Node 3 is large and far from its children, so sizes and deltas need several bytes and
    // negative deltas; type 1's nodes differ in size (an explicit size in the record).
    let n = 300usize;
    let addresses = (0..n as u64).map(|i| 0x7f00_0000_1000 + i * 64).collect();
    let mut sizes = vec![24u64; n];
    sizes[3] = 3_000_000;
    sizes[7] = 70;
    let types = (0..n as u32).map(|i| i % 3).collect();
    let mut edge_counts = vec![0u32; n];
    edge_counts[3] = 3;
    edge_counts[250] = 2;
    let edges = vec![0, 299, 150, 3, 1];
    HeapGraph::new(
        8,
        vec![
            "System.String".into(),
            "Généric`1[Ünï]".into(),
            "A.B".into(),
        ],
        addresses,
        sizes,
        types,
        &edge_counts,
        edges,
        vec![3, 250],
    )
    .unwrap()
}

fn info() -> DumpInfo {
    DumpInfo {
        process_id: 4242,
        process_name: "Alloc".into(),
        machine_name: "host-1".into(),
        collected_unix_nanos: 1_764_504_000_123_456_700,
        creation_tool: "clrscope test".into(),
    }
}

fn written(graph: &HeapGraph) -> Vec<u8> {
    let mut out = Vec::new();
    write_gcdump(graph, &info(), &mut out).unwrap();
    out
}

#[test]
fn round_trips_through_the_reader() {
    let graph = sample_graph();
    let file = read_gcdump(&written(&graph)).unwrap();
    assert_eq!(file.info, info());
    // The reader keeps the root node's type name in its table, unused by any object.
    assert_eq!(file.graph.type_names[..3], graph.type_names[..]);
    assert_eq!(file.graph.type_names[3], "[.NET Roots]");
    assert_eq!(file.graph.node_count(), graph.node_count());
    for i in 0..graph.node_count() {
        assert_eq!(file.graph.address(i), graph.address(i));
        assert_eq!(file.graph.size(i), graph.size(i));
        assert_eq!(file.graph.node_type(i), graph.node_type(i));
        assert_eq!(file.graph.references(i), graph.references(i));
    }
    assert_eq!(file.graph.roots(), graph.roots());
    assert_eq!(file.graph.histogram(), graph.histogram());
}

#[test]
fn starts_as_perfview_expects() {
    let bytes = written(&sample_graph());
    assert_eq!(&bytes[..4], &20i32.to_le_bytes());
    assert_eq!(&bytes[4..24], b"!FastSerialization.1");
    // BeginObject, then the type: BeginObject, NullReference, version 10, min reader 8, name.
    assert_eq!(&bytes[24..27], &[4, 4, 1]);
    assert_eq!(&bytes[27..31], &10i32.to_le_bytes());
    assert_eq!(&bytes[31..35], &8i32.to_le_bytes());
    assert_eq!(&bytes[35..39], &10i32.to_le_bytes());
    assert_eq!(&bytes[39..49], b"GCHeapDump");
    assert_eq!(bytes[49], 6);
}

#[test]
fn every_truncation_is_a_clean_error() {
    let bytes = written(&sample_graph());
    for len in 0..bytes.len() {
        assert!(read_gcdump(&bytes[..len]).is_err(), "{len} bytes accepted");
    }
}

#[test]
fn garbage_is_a_clean_error() {
    assert!(matches!(
        read_gcdump(b"this is not a heap dump, just some text........"),
        Err(GcDumpError::NotGcDump | GcDumpError::Malformed { .. })
    ));
    // Flipping any single byte must never panic.
    let bytes = written(&sample_graph());
    for i in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[i] ^= 0xa5;
        let _ = read_gcdump(&damaged);
    }
}
