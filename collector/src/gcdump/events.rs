//! The runtime events a heap snapshot is made of, decoded from their manifest layouts
//! (`ClrEtwAll.man`, as TraceEvent's `ClrTraceEventParser` reads them). Counts read from a payload
//! are checked against the bytes left before anything is allocated, so a damaged event is an
//! error, never a huge allocation or a panic.

use nettrace::events::{PayloadReader, RUNTIME_PROVIDER};
use nettrace::{Event, NettraceError};

/// GCStart (id 1): `u32 Count, u32 Depth, u32 Reason, u32 Type` (V1+; V0 has Count and Reason).
pub(crate) const GC_START: u32 = 1;
/// GCEnd (id 2): `u32 Count, u32 Depth`.
pub(crate) const GC_END: u32 = 2;
/// GCBulkType (id 15).
pub(crate) const GC_BULK_TYPE: u32 = 15;
/// GCBulkRootEdge (id 16).
pub(crate) const GC_BULK_ROOT_EDGE: u32 = 16;
/// GCBulkNode (id 18).
pub(crate) const GC_BULK_NODE: u32 = 18;
/// GCBulkEdge (id 19).
pub(crate) const GC_BULK_EDGE: u32 = 19;
/// GCBulkRootStaticVar (id 38).
pub(crate) const GC_BULK_ROOT_STATIC_VAR: u32 = 38;

/// GCReason.Induced.
const REASON_INDUCED: u32 = 1;
/// GCType.BackgroundGC.
const TYPE_BACKGROUND: u32 = 1;

/// One event of the heap walk, decoded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum HeapEvent {
    GcStart(GcStart),
    /// GCEnd: the GC count it ends.
    GcEnd(u32),
    Types(Vec<BulkType>),
    Nodes(Vec<BulkNode>),
    /// GCBulkEdge: the target address of each edge, in node order.
    Edges(Vec<u64>),
    /// GCBulkRootEdge / GCBulkRootStaticVar: the addresses of rooted objects.
    Roots(Vec<u64>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GcStart {
    pub count: u32,
    pub depth: u32,
    pub reason: u32,
    pub kind: u32,
}

impl GcStart {
    /// The GC the GCHeapCollect keyword induces: a blocking gen-2 GC (as dotnet-gcdump tells it).
    pub fn is_induced_full_blocking(&self) -> bool {
        self.depth == 2 && self.kind != TYPE_BACKGROUND && self.reason == REASON_INDUCED
    }
}

/// One GCBulkType entry: `u64 TypeID, u64 ModuleID, u32 TypeNameID, u32 Flags, u8 CorElementType,
/// UTF-16z TypeName, u32 TypeParameterCount, u64 × TypeParameterCount`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BulkType {
    pub type_id: u64,
    pub module_id: u64,
    pub name: String,
}

/// One GCBulkNode entry: `ptr Address, ptr Size, ptr TypeID, u64 EdgeCount`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BulkNode {
    pub address: u64,
    pub size: u64,
    pub type_id: u64,
    pub edge_count: u64,
}

/// Decodes the heap-walk events of the runtime provider; `Ok(None)` for every other event.
pub(crate) fn decode(ev: &Event<'_>) -> Result<Option<HeapEvent>, NettraceError> {
    if ev.metadata.provider_name != RUNTIME_PROVIDER {
        return Ok(None);
    }
    let mut r = PayloadReader::new(ev);
    let ptr = usize::from(r.pointer_size);
    Ok(Some(match ev.metadata.event_id {
        GC_START => {
            let count = r.u32()?;
            // V0 payloads are 8 bytes: Count, Reason; depth and type are unknown (not a match).
            if r.remaining() < 12 {
                HeapEvent::GcStart(GcStart {
                    count,
                    depth: 0,
                    reason: r.u32()?,
                    kind: 0,
                })
            } else {
                HeapEvent::GcStart(GcStart {
                    count,
                    depth: r.u32()?,
                    reason: r.u32()?,
                    kind: r.u32()?,
                })
            }
        }
        GC_END => HeapEvent::GcEnd(r.u32()?),
        GC_BULK_TYPE => {
            let count = r.u32()?;
            r.u16()?; // ClrInstanceID
                      // Each entry is at least 8+8+4+4+1+2+4 bytes.
            let mut types = Vec::with_capacity(bounded(count, r.remaining(), 31));
            for _ in 0..count {
                let type_id = r.u64()?;
                let module_id = r.u64()?;
                r.u32()?; // TypeNameID
                r.u32()?; // Flags
                r.u8()?; // CorElementType
                let name = r.string()?;
                let parameters = r.u32()?;
                for _ in 0..parameters {
                    r.u64()?;
                }
                types.push(BulkType {
                    type_id,
                    module_id,
                    name,
                });
            }
            HeapEvent::Types(types)
        }
        GC_BULK_NODE => {
            r.u32()?; // Index
            let count = r.u32()?;
            r.u16()?; // ClrInstanceID
            let mut nodes = Vec::with_capacity(bounded(count, r.remaining(), 3 * ptr + 8));
            for _ in 0..count {
                nodes.push(BulkNode {
                    address: r.pointer()?,
                    size: r.pointer()?,
                    type_id: r.pointer()?,
                    edge_count: r.u64()?,
                });
            }
            HeapEvent::Nodes(nodes)
        }
        GC_BULK_EDGE => {
            r.u32()?; // Index
            let count = r.u32()?;
            r.u16()?; // ClrInstanceID
            let mut targets = Vec::with_capacity(bounded(count, r.remaining(), ptr + 4));
            for _ in 0..count {
                targets.push(r.pointer()?);
                r.u32()?; // ReferencingField
            }
            HeapEvent::Edges(targets)
        }
        GC_BULK_ROOT_EDGE => {
            r.u32()?; // Index
            let count = r.u32()?;
            r.u16()?; // ClrInstanceID
            let mut roots = Vec::with_capacity(bounded(count, r.remaining(), 2 * ptr + 5));
            for _ in 0..count {
                roots.push(r.pointer()?); // RootedNodeAddress
                r.u8()?; // GCRootKind
                r.u32()?; // GCRootFlags
                r.pointer()?; // GCRootID
            }
            HeapEvent::Roots(roots)
        }
        GC_BULK_ROOT_STATIC_VAR => {
            let count = r.u32()?;
            r.u64()?; // AppDomainID
            r.u16()?; // ClrInstanceID
                      // u64 GCRootID, u64 ObjectID, u64 TypeID, u32 Flags, UTF-16z FieldName.
            let mut roots = Vec::with_capacity(bounded(count, r.remaining(), 30));
            for _ in 0..count {
                r.u64()?;
                roots.push(r.u64()?);
                r.u64()?;
                r.u32()?;
                r.string()?;
            }
            HeapEvent::Roots(roots)
        }
        _ => return Ok(None),
    }))
}

/// A capacity no larger than what the remaining bytes can hold, so a garbage count cannot make
/// us allocate more than the payload's own size.
fn bounded(count: u32, remaining: usize, entry_size: usize) -> usize {
    (count as usize).min(remaining / entry_size.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nettrace::testutil::{utf16z, EventSpec, MetadataRecord, StreamBuilder};
    use nettrace::Parser;

    /// Decodes one runtime event with a payload laid out by hand from the manifest.
    fn decode_one(id: u32, payload: Vec<u8>) -> Result<Option<HeapEvent>, NettraceError> {
        let mut b = StreamBuilder::new(8);
        let m = MetadataRecord::new(1, RUNTIME_PROVIDER, id, "").no_field_list();
        b.metadata_block(&[m.encode()], true);
        b.event_block(&[EventSpec::new(1, 1, 1, 10, payload)], true);
        let mut p = Parser::new();
        p.feed(&b.finish()).unwrap();
        let ev = p.next_event().unwrap().unwrap();
        decode(&ev)
    }

    fn bulk_header(count: u32) -> Vec<u8> {
        let mut p = 7u32.to_le_bytes().to_vec(); // Index
        p.extend(count.to_le_bytes());
        p.extend(1u16.to_le_bytes()); // ClrInstanceID
        p
    }

    #[test]
    fn gc_start_and_end() {
        let mut p = Vec::new();
        for v in [12u32, 2, 1, 0] {
            p.extend(v.to_le_bytes()); // Count, Depth, Reason (Induced), Type (NonConcurrent)
        }
        p.extend(1u16.to_le_bytes());
        let Some(HeapEvent::GcStart(start)) = decode_one(GC_START, p).unwrap() else {
            panic!()
        };
        assert_eq!(start.count, 12);
        assert!(start.is_induced_full_blocking());
        let background = GcStart { kind: 1, ..start };
        assert!(!background.is_induced_full_blocking());
        let gen0 = GcStart { depth: 0, ..start };
        assert!(!gen0.is_induced_full_blocking());
        let p = [12u32, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(decode_one(GC_END, p).unwrap(), Some(HeapEvent::GcEnd(12)));
    }

    #[test]
    fn bulk_nodes_edges_types_and_roots() {
        let mut p = bulk_header(2);
        for v in [0x1000u64, 40, 0xaa, 2, 0x2000, 24, 0xbb, 0] {
            p.extend(v.to_le_bytes());
        }
        assert_eq!(
            decode_one(GC_BULK_NODE, p).unwrap(),
            Some(HeapEvent::Nodes(vec![
                BulkNode {
                    address: 0x1000,
                    size: 40,
                    type_id: 0xaa,
                    edge_count: 2
                },
                BulkNode {
                    address: 0x2000,
                    size: 24,
                    type_id: 0xbb,
                    edge_count: 0
                },
            ]))
        );

        let mut p = bulk_header(2);
        for (target, field) in [(0x2000u64, 0u32), (0x3000, 1)] {
            p.extend(target.to_le_bytes());
            p.extend(field.to_le_bytes());
        }
        assert_eq!(
            decode_one(GC_BULK_EDGE, p).unwrap(),
            Some(HeapEvent::Edges(vec![0x2000, 0x3000]))
        );

        let mut p = 1u32.to_le_bytes().to_vec();
        p.extend(1u16.to_le_bytes());
        p.extend(0xaau64.to_le_bytes()); // TypeID
        p.extend(0x77u64.to_le_bytes()); // ModuleID
        p.extend(0x0200_0001u32.to_le_bytes()); // TypeNameID
        p.extend(0u32.to_le_bytes()); // Flags
        p.push(0x12); // CorElementType
        p.extend(utf16z("System.Collections.Generic.List`1[System.Int32]"));
        p.extend(1u32.to_le_bytes()); // one type parameter
        p.extend(0xccu64.to_le_bytes());
        assert_eq!(
            decode_one(GC_BULK_TYPE, p).unwrap(),
            Some(HeapEvent::Types(vec![BulkType {
                type_id: 0xaa,
                module_id: 0x77,
                name: "System.Collections.Generic.List`1[System.Int32]".into(),
            }]))
        );

        let mut p = bulk_header(1);
        p.extend(0x1000u64.to_le_bytes());
        p.push(1); // GCRootKind
        p.extend(0u32.to_le_bytes());
        p.extend(0x5555u64.to_le_bytes());
        assert_eq!(
            decode_one(GC_BULK_ROOT_EDGE, p).unwrap(),
            Some(HeapEvent::Roots(vec![0x1000]))
        );

        let mut p = 1u32.to_le_bytes().to_vec();
        p.extend(0x1u64.to_le_bytes()); // AppDomainID
        p.extend(1u16.to_le_bytes());
        for v in [0x9u64, 0x2000, 0xbb] {
            p.extend(v.to_le_bytes()); // GCRootID, ObjectID, TypeID
        }
        p.extend(0u32.to_le_bytes());
        p.extend(utf16z("s_cache"));
        assert_eq!(
            decode_one(GC_BULK_ROOT_STATIC_VAR, p).unwrap(),
            Some(HeapEvent::Roots(vec![0x2000]))
        );
    }

    #[test]
    fn short_payloads_and_huge_counts_are_errors() {
        // A count far beyond the payload: an error naming the event, not an allocation.
        let mut p = bulk_header(u32::MAX);
        p.extend([0; 32]);
        assert!(decode_one(GC_BULK_NODE, p).is_err());
        let mut p = bulk_header(3);
        p.extend([0; 12 * 2 + 5]);
        assert!(decode_one(GC_BULK_EDGE, p).is_err());
        assert!(decode_one(GC_BULK_TYPE, vec![1, 0, 0, 0, 1, 0, 0xaa]).is_err());
        assert!(decode_one(GC_END, vec![1, 2]).is_err());
        assert_eq!(decode_one(999, vec![]).unwrap(), None);
    }
}
