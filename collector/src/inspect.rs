//! What a nettrace file holds: header facts, providers and their events, stacks, time range,
//! dropped events — and, for a damaged file, how far it could be read and why it stopped.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;

use serde::Serialize;

use nettrace::{EventMetadata, NettraceReader, ParserOptions};
use profile::utc;

/// A summary of one nettrace stream. Reading never fails: damage is recorded in `damage`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inspection {
    /// Bytes the parser consumed.
    pub bytes: u64,
    pub trace: Option<TraceFacts>,
    pub events: u64,
    /// Events per provider, providers by name, events by id.
    pub providers: Vec<ProviderEvents>,
    pub stacks: StackFacts,
    /// UTC time of the first and last event, RFC 3339.
    pub first_event: Option<String>,
    pub last_event: Option<String>,
    pub duration_seconds: Option<f64>,
    /// Events the runtime dropped (gaps in per-thread sequence numbers).
    pub dropped_events: u64,
    /// The stream ended with its end-of-stream tag.
    pub complete: bool,
    pub damage: Option<Damage>,
}

/// The Trace object's facts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceFacts {
    pub sync_time: String,
    pub qpc_frequency: i64,
    pub pointer_size: u8,
    pub process_id: u32,
    pub processors: u32,
    /// The sampler interval when the trace began.
    pub sampling_interval_ns: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProviderEvents {
    pub name: String,
    pub events: u64,
    pub by_event: Vec<EventCount>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventCount {
    pub id: u32,
    pub name: String,
    pub count: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StackFacts {
    pub events_with_stack: u64,
    pub max_depth: usize,
    pub mean_depth: f64,
}

/// Where and why reading stopped early.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Damage {
    pub offset: Option<u64>,
    pub reason: String,
}

/// Reads the whole stream with a parser of the given limits and summarizes it.
pub fn inspect(input: impl Read, options: ParserOptions) -> Inspection {
    let mut reader = NettraceReader::with_options(input, options);
    let mut counts: HashMap<u32, u64> = HashMap::new();
    let mut events = 0u64;
    let mut stacks = StackFacts::default();
    let mut frames = 0u64;
    let mut first = None;
    let mut last = None;
    let damage = loop {
        match reader.next_event() {
            Ok(Some(event)) => {
                events += 1;
                *counts.entry(event.header.metadata_id).or_default() += 1;
                if let Some(stack) = event.stack().filter(|s| !s.is_empty()) {
                    stacks.events_with_stack += 1;
                    stacks.max_depth = stacks.max_depth.max(stack.len());
                    frames += stack.len() as u64;
                }
                let at = event.unix_nanos();
                first = Some(first.map_or(at, |f: i64| f.min(at)));
                last = Some(last.map_or(at, |l: i64| l.max(at)));
            }
            Ok(None) => break reader.parser().finish().err(),
            Err(e) => break Some(e),
        }
    };
    if stacks.events_with_stack > 0 {
        stacks.mean_depth = frames as f64 / stacks.events_with_stack as f64;
    }
    let parser = reader.parser();
    Inspection {
        bytes: parser.bytes_fed(),
        trace: parser.trace().map(|t| TraceFacts {
            sync_time: t
                .sync_time_utc
                .to_unix_nanos()
                .map(|n| utc::format(n, utc::Form::Micros))
                .unwrap_or_else(|| "invalid".into()),
            qpc_frequency: t.qpc_frequency,
            pointer_size: t.pointer_size,
            process_id: t.process_id,
            processors: t.number_of_processors,
            sampling_interval_ns: t.expected_cpu_sampling_rate,
        }),
        events,
        providers: group_by_provider(parser.metadata(), &counts),
        stacks,
        first_event: first.map(|n| utc::format(n, utc::Form::Micros)),
        last_event: last.map(|n| utc::format(n, utc::Form::Micros)),
        duration_seconds: first.zip(last).map(|(f, l)| (l - f) as f64 / 1e9),
        dropped_events: parser.dropped_events(),
        complete: damage.is_none() && parser.is_finished(),
        damage: damage.map(|e| Damage {
            offset: e.offset(),
            reason: e.to_string(),
        }),
    }
}

fn group_by_provider(
    metadata: &[EventMetadata],
    counts: &HashMap<u32, u64>,
) -> Vec<ProviderEvents> {
    let mut providers: BTreeMap<&str, BTreeMap<(u32, String), u64>> = BTreeMap::new();
    for record in metadata {
        let count = counts.get(&record.metadata_id).copied().unwrap_or(0);
        let name = event_name(record);
        *providers
            .entry(record.provider_name.as_str())
            .or_default()
            .entry((record.event_id, name))
            .or_default() += count;
    }
    providers
        .into_iter()
        .map(|(name, events)| ProviderEvents {
            name: name.to_string(),
            events: events.values().sum(),
            by_event: events
                .into_iter()
                .map(|((id, name), count)| EventCount { id, name, count })
                .collect(),
        })
        .collect()
}

/// The event's own name, else the runtime manifest's name for it, else `Event{id}`.
pub fn event_name(metadata: &EventMetadata) -> String {
    if !metadata.event_name.is_empty() {
        return metadata.event_name.clone();
    }
    manifest_name(&metadata.provider_name, metadata.event_id)
        .map(str::to_string)
        .unwrap_or_else(|| format!("Event{}", metadata.event_id))
}

/// Names from the runtime's event manifest (ClrEtwAll.man, as TraceEvent lists them) for the
/// providers whose events arrive with minimum metadata.
fn manifest_name(provider: &str, id: u32) -> Option<&'static str> {
    const RUNTIME: &str = nettrace::events::RUNTIME_PROVIDER;
    const RUNDOWN: &str = nettrace::events::RUNDOWN_PROVIDER;
    const SAMPLER: &str = nettrace::events::SAMPLE_PROFILER_PROVIDER;
    Some(match (provider, id) {
        (SAMPLER, 0) => "ThreadSample",
        (RUNDOWN, 10) => "GCSettingsRundown",
        (RUNDOWN, 141) => "MethodDCStart",
        (RUNDOWN, 142) => "MethodDCEnd",
        (RUNDOWN, 143) => "MethodDCStartVerbose",
        (RUNDOWN, 144) => "MethodDCEndVerbose",
        (RUNDOWN, 145) => "DCStartComplete",
        (RUNDOWN, 146) => "DCEndComplete",
        (RUNDOWN, 147) => "DCStartInit",
        (RUNDOWN, 148) => "DCEndInit",
        (RUNDOWN, 149) => "MethodDCStartILToNativeMap",
        (RUNDOWN, 150) => "MethodDCEndILToNativeMap",
        (RUNDOWN, 151) => "DomainModuleDCStart",
        (RUNDOWN, 152) => "DomainModuleDCEnd",
        (RUNDOWN, 153) => "ModuleDCStart",
        (RUNDOWN, 154) => "ModuleDCEnd",
        (RUNDOWN, 155) => "AssemblyDCStart",
        (RUNDOWN, 156) => "AssemblyDCEnd",
        (RUNDOWN, 157) => "AppDomainDCStart",
        (RUNDOWN, 158) => "AppDomainDCEnd",
        (RUNDOWN, 159) => "ThreadDC",
        (RUNDOWN, 187) => "RuntimeInformationDCStart",
        (RUNDOWN, 280) => "TieredCompilationSettingsDCStart",
        (RUNDOWN, 300) => "ExecutionCheckpointDCEnd",
        (RUNTIME, id) => return runtime_event_name(id),
        _ => return None,
    })
}

fn runtime_event_name(id: u32) -> Option<&'static str> {
    Some(match id {
        1 => "GCStart",
        2 => "GCEnd",
        3 => "GCRestartEEEnd",
        4 => "GCHeapStats",
        5 => "GCCreateSegment",
        6 => "GCFreeSegment",
        7 => "GCRestartEEBegin",
        8 => "GCSuspendEEEnd",
        9 => "GCSuspendEEBegin",
        10 => "GCAllocationTick",
        11 => "GCCreateConcurrentThread",
        12 => "GCTerminateConcurrentThread",
        13 => "GCFinalizersEnd",
        14 => "GCFinalizersBegin",
        15 => "BulkType",
        16 => "GCBulkRootEdge",
        17 => "GCBulkRootConditionalWeakTableElementEdge",
        18 => "GCBulkNode",
        19 => "GCBulkEdge",
        20 => "GCSampledObjectAllocationHigh",
        21 => "GCBulkSurvivingObjectRanges",
        22 => "GCBulkMovedObjectRanges",
        23 => "GCGenerationRange",
        25 => "GCMarkStackRoots",
        26 => "GCMarkFinalizeQueueRoots",
        27 => "GCMarkHandles",
        28 => "GCMarkOlderGenerationRoots",
        29 => "FinalizeObject",
        30 => "SetGCHandle",
        31 => "DestroyGCHandle",
        32 => "GCSampledObjectAllocationLow",
        33 => "PinObjectAtGCTime",
        35 => "GCTriggered",
        36 => "GCBulkRootCCW",
        37 => "GCBulkRCW",
        38 => "GCBulkRootStaticVar",
        39 => "GCDynamicEvent",
        40 => "WorkerThreadCreate",
        41 => "WorkerThreadTerminate",
        42 => "WorkerThreadRetire",
        43 => "WorkerThreadUnretire",
        44 => "IOThreadCreate",
        45 => "IOThreadTerminate",
        46 => "IOThreadRetire",
        47 => "IOThreadUnretire",
        48 => "ThreadpoolSuspensionSuspendThread",
        49 => "ThreadpoolSuspensionResumeThread",
        50 => "ThreadPoolWorkerThreadStart",
        51 => "ThreadPoolWorkerThreadStop",
        52 => "ThreadPoolWorkerThreadRetirementStart",
        53 => "ThreadPoolWorkerThreadRetirementStop",
        54 => "ThreadPoolWorkerThreadAdjustmentSample",
        55 => "ThreadPoolWorkerThreadAdjustmentAdjustment",
        56 => "ThreadPoolWorkerThreadAdjustmentStats",
        57 => "ThreadPoolWorkerThreadWait",
        58 => "YieldProcessorMeasurement",
        59 => "ThreadPoolMinMaxThreads",
        60 => "ThreadPoolWorkingThreadCount",
        61 => "ThreadPoolEnqueue",
        62 => "ThreadPoolDequeue",
        63 => "ThreadPoolIOEnqueue",
        64 => "ThreadPoolIODequeue",
        65 => "ThreadPoolIOPack",
        70 => "ThreadCreating",
        71 => "ThreadRunning",
        80 => "ExceptionThrown",
        81 => "ContentionStart",
        82 => "CLRStackWalk",
        83 => "AppDomainMemAllocated",
        84 => "AppDomainMemSurvived",
        85 => "ThreadCreated",
        86 => "ThreadTerminated",
        87 => "ThreadDomainEnter",
        88 => "ILStubGenerated",
        89 => "ILStubCacheHit",
        90 => "LockCreated",
        91 => "ContentionStop",
        135 => "DCStartCompleteV2",
        136 => "DCEndCompleteV2",
        137 => "MethodDCStartV2",
        138 => "MethodDCEndV2",
        139 => "MethodDCStartVerboseV2",
        140 => "MethodDCEndVerboseV2",
        141 => "MethodLoad",
        142 => "MethodUnload",
        143 => "MethodLoadVerbose",
        144 => "MethodUnloadVerbose",
        145 => "MethodJittingStarted",
        149 => "ModuleDCStartV2",
        150 => "ModuleDCEndV2",
        151 => "DomainModuleLoad",
        152 => "ModuleLoad",
        153 => "ModuleUnload",
        154 => "AssemblyLoad",
        155 => "AssemblyUnload",
        156 => "AppDomainLoad",
        157 => "AppDomainUnload",
        158 => "ModuleRangeLoad",
        181 => "StrongNameVerificationStart",
        182 => "StrongNameVerificationStop",
        183 => "AuthenticodeVerificationStart",
        184 => "AuthenticodeVerificationStop",
        185 => "MethodJitInliningSucceeded",
        186 => "MethodJitInliningFailed",
        187 => "RuntimeInformationStart",
        188 => "MethodJitTailCallSucceeded",
        189 => "MethodJitTailCallFailed",
        190 => "MethodILToNativeMap",
        200 => "IncreaseMemoryPressure",
        201 => "DecreaseMemoryPressure",
        202 => "GCMarkWithType",
        203 => "GCJoin",
        204 => "GCPerHeapHistory",
        205 => "GCGlobalHeapHistory",
        240 => "DebugIPCEventStart",
        241 => "DebugIPCEventEnd",
        242 => "DebugExceptionProcessingStart",
        243 => "DebugExceptionProcessingEnd",
        250 => "ExceptionCatchStart",
        251 => "ExceptionCatchStop",
        252 => "ExceptionFinallyStart",
        253 => "ExceptionFinallyStop",
        254 => "ExceptionFilterStart",
        255 => "ExceptionFilterStop",
        256 => "ExceptionThrownStop",
        260 => "CodeSymbols",
        270 => "EventSource",
        280 => "TieredCompilationSettings",
        281 => "TieredCompilationPause",
        282 => "TieredCompilationResume",
        283 => "TieredCompilationBackgroundJitStart",
        284 => "TieredCompilationBackgroundJitStop",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_damage_not_a_panic() {
        let summary = inspect(&b"Nettrace\x00\x00garbage"[..], ParserOptions::default());
        assert!(!summary.complete);
        assert!(summary.damage.is_some());
        let summary = inspect(&b"PK\x03\x04"[..], ParserOptions::default());
        assert_eq!(summary.events, 0);
        assert!(summary.damage.unwrap().reason.contains("not a nettrace"));
    }
}
