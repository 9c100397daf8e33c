//! The adapter from the collector's decoded nettrace events to the [`CodeMap`]: a field-by-field
//! copy, kept apart from the pure core so the core can be tested without a parser.

use nettrace::events::{KnownEvent, MethodEventKind, ModuleEventKind};

use crate::events::{
    LoadSource, MethodLoad, MethodUnload, ModuleLoad, ModuleUnload, PdbInfo, R2rEntryPoint,
};
use crate::{CodeMap, EventError};

/// Applies a method or module event to `map`; other events are ignored. Returns whether the
/// event was one the map uses. `timestamp` must be monotonic across the events fed to one map.
pub fn apply(map: &mut CodeMap, event: &KnownEvent, timestamp: u64) -> Result<bool, EventError> {
    match event {
        KnownEvent::Method(m) => {
            match m.kind {
                MethodEventKind::Unload => {
                    map.unload_method(&MethodUnload {
                        method_id: m.method_id,
                        start_address: m.start_address,
                        size: m.size,
                        rejit_id: m.rejit_id.unwrap_or(0),
                        timestamp,
                    });
                }
                MethodEventKind::Load | MethodEventKind::DcStart | MethodEventKind::DcEnd => {
                    let source = if m.kind == MethodEventKind::Load {
                        LoadSource::Live
                    } else {
                        LoadSource::Rundown
                    };
                    map.load_method(&MethodLoad {
                        method_id: m.method_id,
                        module_id: m.module_id,
                        start_address: m.start_address,
                        size: m.size,
                        method_token: m.token,
                        flags: m.flags,
                        namespace: m.namespace.clone(),
                        name: m.name.clone(),
                        signature: m.signature.clone(),
                        rejit_id: m.rejit_id.unwrap_or(0),
                        timestamp,
                        source,
                    })?;
                }
            }
            Ok(true)
        }
        KnownEvent::R2rEntryPoint(e) => {
            map.add_r2r_entry_point(&R2rEntryPoint {
                method_id: e.method_id,
                namespace: e.namespace.clone(),
                name: e.name.clone(),
                signature: e.signature.clone(),
                entry_point: e.entry_point,
                timestamp,
            })?;
            Ok(true)
        }
        KnownEvent::Module(m) => {
            match m.kind {
                ModuleEventKind::Unload => map.unload_module(&ModuleUnload {
                    module_id: m.module_id,
                }),
                ModuleEventKind::Load | ModuleEventKind::DcStart | ModuleEventKind::DcEnd => map
                    .load_module(&ModuleLoad {
                        module_id: m.module_id,
                        assembly_id: m.assembly_id,
                        flags: m.flags,
                        il_path: m.il_path.clone(),
                        native_path: m.native_path.clone(),
                        managed_pdb: m.managed_pdb.as_ref().map(|pdb| PdbInfo {
                            signature: pdb.signature.to_bytes_le(),
                            age: pdb.age,
                            path: pdb.build_path.clone(),
                        }),
                    }),
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FunctionKind;
    use nettrace::NettraceReader;

    /// The recorded CpuHot trace with JIT/Loader events and rundown: every managed frame of its
    /// samples resolves, and the hot method has its real name.
    #[test]
    fn recorded_trace_resolves_its_samples() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../collector/tests/fixtures/cpuhot-jit-rundown.nettrace"
        );
        let mut reader = NettraceReader::new(std::fs::File::open(path).unwrap());
        let mut map = CodeMap::new();
        let mut stacks = Vec::new();
        while let Some(event) = reader.next_event().unwrap() {
            let Some(known) = event.known().unwrap() else {
                continue;
            };
            if let KnownEvent::ThreadSample(_) = known {
                if let Some(stack) = event.stack() {
                    stacks.push(stack.ips().collect::<Vec<_>>());
                }
            } else {
                apply(&mut map, &known, event.header.timestamp as u64).unwrap();
            }
        }
        let (mut frames, mut resolved, mut hot) = (0, 0, 0);
        for stack in &stacks {
            for frame in map.symbolize_stack(stack) {
                frames += 1;
                let function = map.function(frame.function);
                if function.kind != FunctionKind::Unresolved {
                    resolved += 1;
                }
                if function.display_name() == "CpuHot.Program.SpinAlpha(Spinner)" {
                    hot += 1;
                }
            }
        }
        assert!(frames > 1000);
        assert!(
            resolved * 100 >= frames * 99,
            "{resolved} of {frames} frames resolved"
        );
        assert!(hot > 100, "{hot} frames in SpinAlpha");
    }
}
