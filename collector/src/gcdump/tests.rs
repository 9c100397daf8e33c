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

/// A FastSerialization string as .NET writes an ASCII one.
fn fs_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as i32).to_le_bytes());
    out.extend(s.as_bytes());
}

#[test]
fn reads_past_a_dotnet_heap_info_with_a_type_back_reference() {
    // What PerfView and dotnet-gcdump write where clrscope writes null: a DotNetHeapInfo with
    // two segments, the second naming its type by a back reference to the first's.
    let graph = sample_graph();
    let ours = written(&graph);
    let info = info();
    let log = format!(
        "{} objects, {} references, {} roots",
        graph.node_count(),
        graph.edge_count(),
        graph.roots().len()
    );
    // Everything after the DotNetHeapInfo null, up to the end of the file.
    let tail = 4
        + log.len()
        + 8
        + 4
        + info.machine_name.len()
        + 4
        + info.process_name.len()
        + 4
        + 16
        + 4
        + 6
        + 5
        + info.creation_tool.len()
        + 2
        + 16;
    let at = ours.len() - tail - 1;
    assert_eq!(ours[at], 1, "the DotNetHeapInfo null");

    let mut heap_info = vec![4, 4, 1];
    heap_info.extend([0; 8]); // version 0, minimum reader version 0
    fs_string(&mut heap_info, "DotNetHeapInfo");
    heap_info.push(6);
    heap_info.extend(1_000_000i64.to_le_bytes());
    heap_info.extend(2i32.to_le_bytes());
    heap_info.push(4);
    let segment_type = (at + heap_info.len()) as i32;
    heap_info.extend([4, 1]);
    heap_info.extend(1i32.to_le_bytes());
    heap_info.extend(1i32.to_le_bytes());
    fs_string(&mut heap_info, "GCHeapDumpSegment");
    heap_info.push(6);
    heap_info.extend([0x11; 56]);
    heap_info.push(6);
    heap_info.extend([4, 2]);
    heap_info.extend(segment_type.to_le_bytes());
    heap_info.extend([0x22; 56]);
    heap_info.push(6);
    heap_info.push(6);

    let mut theirs = ours[..at].to_vec();
    theirs.extend(&heap_info);
    theirs.extend(&ours[at + 1..]);
    // The forward reference, the table and the trailer moved by the inserted bytes.
    let shift = heap_info.len() as u32 - 1;
    let end = theirs.len();
    for field in [end - 12, end - 8, end - 4] {
        let v = u32::from_le_bytes(theirs[field..field + 4].try_into().unwrap()) + shift;
        theirs[field..field + 4].copy_from_slice(&v.to_le_bytes());
    }
    let file = read_gcdump(&theirs).unwrap();
    assert_eq!(file.info, info);
    assert_eq!(file.graph.histogram(), graph.histogram());

    // A back reference to something that is not a type is an error, not a guess.
    let bad_at = at + heap_info.len() - 2 - 56 - 4;
    theirs[bad_at..bad_at + 4].copy_from_slice(&7i32.to_le_bytes());
    assert!(matches!(
        read_gcdump(&theirs),
        Err(GcDumpError::Malformed { .. })
    ));
}
