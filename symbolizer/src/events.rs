//! The symbolizer's own input types, shaped after the runtime manifest (`ClrEtwAll.man`) so that the
//! adapter from decoded nettrace events is a field-by-field copy. Plain data: no parsing happens here.

/// Where a method event came from. Only counted (see [`crate::CodeMapStats`]); a rundown event is
/// treated exactly like a live load, because both say "this code exists at this range now".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LoadSource {
    /// Runtime provider: `MethodLoadVerbose` (id 143, V1/V2) at JIT time.
    #[default]
    Live,
    /// Rundown provider: `MethodDCStartVerbose` (143) / `MethodDCEndVerbose` (144).
    Rundown,
}

/// A method's native code became known: `MethodLoadVerbose` (runtime provider, id 143) or
/// `MethodDCStartVerbose`/`MethodDCEndVerbose` (rundown provider, ids 143/144).
///
/// One event describes one *code version*: tier-0, tier-1, OSR and ReJIT code of the same method each
/// arrive as their own event with their own range and the same `method_id`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MethodLoad {
    /// `MethodID`: the runtime's `MethodDesc*`. Stable for the method's lifetime; may be reused after
    /// a collectible assembly unloads.
    pub method_id: u64,
    /// `ModuleID`: the runtime's `Module*`; matches [`ModuleLoad::module_id`]. 0 for JIT helpers.
    pub module_id: u64,
    /// `MethodStartAddress`: start of the hot code region.
    pub start_address: u64,
    /// `MethodSize`: size of the hot code region in bytes. 0 is accepted and treated as an entry
    /// point whose extent is inferred (like [`R2rEntryPoint`]).
    pub size: u32,
    /// `MethodToken`: the `MethodDef` token; 0 for dynamic methods and JIT helpers.
    pub method_token: u32,
    /// `MethodFlags`, raw, including the optimization tier (bits 7–9) and extent (bits 28–31).
    pub flags: u32,
    /// `MethodNamespace`: the declaring type's full name as `TypeString::AppendType(FormatNamespace)`
    /// prints it, e.g. ``System.Collections.Generic.Dictionary`2[System.__Canon,System.Int32]``;
    /// `dynamicClass` for LCG methods and IL stubs; empty for JIT helpers.
    pub namespace: String,
    /// `MethodName`, e.g. `TryGetValue`, `.ctor`, `<Main>b__0_0`, `IL_STUB_PInvoke`.
    pub name: String,
    /// `MethodSignature` in the runtime's legacy IL-like text, e.g. `instance bool  (!0,!1&)`.
    pub signature: String,
    /// `ReJITID` (V2 only, else 0). Despite its name the runtime puts the *native code version id*
    /// here; only used to tell code versions apart.
    pub rejit_id: u64,
    /// Event timestamp in any clock that is monotonic across all events fed to one map (QPC ticks or
    /// nanoseconds). Decides which code wins when ranges overlap, and when unloaded code may be pruned.
    pub timestamp: u64,
    /// Live or rundown.
    pub source: LoadSource,
}

/// A code version went away: `MethodUnloadVerbose` (runtime provider, id 144), fired when a
/// collectible assembly unloads. The fields identify the code version as in its [`MethodLoad`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MethodUnload {
    /// `MethodID`.
    pub method_id: u64,
    /// `MethodStartAddress` of the code version being unloaded.
    pub start_address: u64,
    /// `MethodSize`.
    pub size: u32,
    /// `ReJITID` / native code version id (V2), else 0.
    pub rejit_id: u64,
    /// Event timestamp (same clock as [`MethodLoad::timestamp`]).
    pub timestamp: u64,
}

/// A ReadyToRun method's entry point was bound: `R2RGetEntryPoint` (runtime provider, id 159, keyword
/// `CompilationDiagnostic` 0x2000000000). It carries no code size and no module id, so the extent
/// is inferred and the module is found through the method id or the image that holds the address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct R2rEntryPoint {
    /// `MethodID`.
    pub method_id: u64,
    /// `MethodNamespace`, same format as [`MethodLoad::namespace`].
    pub namespace: String,
    /// `MethodName`.
    pub name: String,
    /// `MethodSignature`, same format as [`MethodLoad::signature`].
    pub signature: String,
    /// `EntryPoint`: the address of the method's precompiled code.
    pub entry_point: u64,
    /// Event timestamp (same clock as [`MethodLoad::timestamp`]).
    pub timestamp: u64,
}

/// PDB identity from `ModuleLoad_V2`: enough to find symbols on a symbol server later.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PdbInfo {
    /// `ManagedPdbSignature` (GUID, as the 16 bytes of the event payload).
    pub signature: [u8; 16],
    /// `ManagedPdbAge`.
    pub age: u32,
    /// `ManagedPdbBuildPath`.
    pub path: String,
}

/// A module became known: `ModuleLoad` (runtime provider, id 152) or `ModuleDCStart`/`ModuleDCEnd`
/// (rundown provider, ids 153/154). There is no base address in the event: image ranges come from
/// [`crate::ImageRange`]s.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModuleLoad {
    /// `ModuleID`: the runtime's `Module*`.
    pub module_id: u64,
    /// `AssemblyID`.
    pub assembly_id: u64,
    /// `ModuleFlags` (see [`ModuleFlags`]).
    pub flags: u32,
    /// `ModuleILPath`: the file path, or the simple name for dynamic (Reflection.Emit) modules.
    pub il_path: String,
    /// `ModuleNativePath`: empty on .NET Core (R2R code lives in the IL file).
    pub native_path: String,
    /// The managed PDB identity (V2), when the image has one.
    pub managed_pdb: Option<PdbInfo>,
}

/// A module went away: `ModuleUnload` (runtime provider, id 153).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModuleUnload {
    /// `ModuleID`.
    pub module_id: u64,
}

/// `MethodFlags` with the tier and extent bits removed.
///
/// Bits verified in the runtime's `eventtrace.h` (`ETW::MethodLog::MethodStructs`) and PerfView's
/// `ClrTraceEventParser.MethodFlags`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MethodFlags(u32);

impl MethodFlags {
    /// LCG method or IL stub (`DynamicMethod`).
    pub const DYNAMIC: u32 = 0x1;
    /// The method or its type has an instantiation (`GenericMethod`).
    pub const GENERIC: u32 = 0x2;
    /// Code shared between instantiations (`__Canon`).
    pub const SHARED_GENERIC_CODE: u32 = 0x4;
    /// Produced by the JIT; clear for ReadyToRun (precompiled) code.
    pub const JITTED: u32 = 0x8;
    /// A JIT helper (`JitHelperMethod`); its method id is its start address.
    pub const JIT_HELPER: u32 = 0x10;
    /// A profiler rejected the precompiled code, so it was jitted.
    pub const PROFILER_REJECTED_PRECOMPILED_CODE: u32 = 0x20;
    /// The ReadyToRun code was rejected (e.g. a fixup failed), so it was jitted.
    pub const READY_TO_RUN_REJECTED_PRECOMPILED_CODE: u32 = 0x40;
    /// Bits 7–9: the JIT optimization tier (`MethodFlagsJitOptimizationTierShift` = 7, mask 0x7).
    pub const TIER_MASK: u32 = 0x7 << 7;
    /// Bits 28–31: the method extent (0 = hot section, 0x10000000 = cold section).
    pub const EXTENT_MASK: u32 = 0xf << 28;

    /// Keeps the flag bits of a raw `MethodFlags` value, dropping tier and extent.
    pub fn from_raw(raw: u32) -> Self {
        Self(raw & !(Self::TIER_MASK | Self::EXTENT_MASK))
    }

    /// The flag bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Whether all bits of `flag` (one of the constants) are set.
    pub fn contains(self, flag: u32) -> bool {
        self.0 & flag == flag
    }
}

/// `ModuleFlags` bits (runtime `ETW::LoaderLog::LoaderStructs`, PerfView `ModuleFlags`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ModuleFlags(u32);

impl ModuleFlags {
    /// Domain-neutral module (always clear on .NET Core).
    pub const DOMAIN_NEUTRAL: u32 = 0x1;
    /// Native (NGen) image.
    pub const NATIVE: u32 = 0x2;
    /// Dynamic (Reflection.Emit) module: no file.
    pub const DYNAMIC: u32 = 0x4;
    /// Manifest module (always set on .NET Core).
    pub const MANIFEST: u32 = 0x8;
    /// IBC-optimized image.
    pub const IBC_OPTIMIZED: u32 = 0x10;
    /// The image contains ReadyToRun code.
    pub const READY_TO_RUN: u32 = 0x20;
    /// Partial ReadyToRun image (only some methods precompiled).
    pub const PARTIAL_READY_TO_RUN: u32 = 0x40;

    /// Wraps a raw `ModuleFlags` value.
    pub fn from_raw(raw: u32) -> Self {
        Self(raw)
    }

    /// The raw bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Whether the image holds precompiled code that method events may not have covered yet.
    pub fn is_ready_to_run(self) -> bool {
        self.0 & (Self::READY_TO_RUN | Self::PARTIAL_READY_TO_RUN) != 0
    }
}

/// Which code a frame ran: the JIT tier from `MethodFlags` bits 7–9, or precompiled.
///
/// Values 1–7 are the runtime's `PrepareCodeConfig::JitOptimizationTier` (prestub.cpp, method.hpp);
/// names follow PerfView's `OptimizationTier`, which is what .NET developers see in their tools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum OptimizationTier {
    /// Tier bits 0 (older runtimes), JIT helpers, or no method information.
    #[default]
    Unknown,
    /// 1 (0x080): optimizations disabled (debuggable code, or the JIT switched to MinOpts).
    MinOptJitted,
    /// 2 (0x100): fully optimized, not tiered (tiering off, loops with QuickJitForLoops off, ...).
    Optimized,
    /// 3 (0x180): tier 0.
    QuickJitted,
    /// 4 (0x200): tier 1.
    OptimizedTier1,
    /// 5 (0x280): tier-1 on-stack-replacement code entered from a tier-0 loop.
    OptimizedTier1Osr,
    /// 6 (0x300): tier 0 with instrumentation (dynamic PGO); runtime name `InstrumentedTier`.
    QuickJittedInstrumented,
    /// 7 (0x380): tier 1 with instrumentation; runtime name `InstrumentedTierOptimized`.
    OptimizedTier1Instrumented,
    /// Precompiled ReadyToRun code: the `Jitted` flag is clear (the runtime still puts `Optimized`
    /// in the tier bits of such events), or the code came from `R2RGetEntryPoint`.
    ReadyToRun,
}

impl OptimizationTier {
    /// Derives the tier of one code version from its raw `MethodFlags`.
    pub fn from_method_flags(raw: u32) -> Self {
        let flags = MethodFlags::from_raw(raw);
        if flags.contains(MethodFlags::JIT_HELPER) {
            return Self::Unknown;
        }
        if !flags.contains(MethodFlags::JITTED) {
            return Self::ReadyToRun;
        }
        match (raw & MethodFlags::TIER_MASK) >> 7 {
            1 => Self::MinOptJitted,
            2 => Self::Optimized,
            3 => Self::QuickJitted,
            4 => Self::OptimizedTier1,
            5 => Self::OptimizedTier1Osr,
            6 => Self::QuickJittedInstrumented,
            7 => Self::OptimizedTier1Instrumented,
            _ => Self::Unknown,
        }
    }

    /// A stable label for exporters (pprof/OTLP attribute values).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "Unknown",
            Self::MinOptJitted => "MinOptJitted",
            Self::Optimized => "Optimized",
            Self::QuickJitted => "QuickJitted",
            Self::OptimizedTier1 => "OptimizedTier1",
            Self::OptimizedTier1Osr => "OptimizedTier1OSR",
            Self::QuickJittedInstrumented => "QuickJittedInstrumented",
            Self::OptimizedTier1Instrumented => "OptimizedTier1Instrumented",
            Self::ReadyToRun => "ReadyToRun",
        }
    }
}

impl std::fmt::Display for OptimizationTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tier_bits_follow_the_runtime_enum() {
        let jitted = MethodFlags::JITTED;
        assert_eq!(
            OptimizationTier::from_method_flags(jitted),
            OptimizationTier::Unknown
        );
        let cases = [
            (0x080, OptimizationTier::MinOptJitted),
            (0x100, OptimizationTier::Optimized),
            (0x180, OptimizationTier::QuickJitted),
            (0x200, OptimizationTier::OptimizedTier1),
            (0x280, OptimizationTier::OptimizedTier1Osr),
            (0x300, OptimizationTier::QuickJittedInstrumented),
            (0x380, OptimizationTier::OptimizedTier1Instrumented),
        ];
        for (bits, tier) in cases {
            assert_eq!(
                OptimizationTier::from_method_flags(jitted | bits),
                tier,
                "{bits:#x}"
            );
        }
    }

    #[test]
    fn precompiled_code_is_ready_to_run_whatever_the_tier_bits_say() {
        // R2R rundown: Jitted clear, tier bits = Optimized (GetJitOptimizationTier with no config).
        assert_eq!(
            OptimizationTier::from_method_flags(0x100),
            OptimizationTier::ReadyToRun
        );
        assert_eq!(
            OptimizationTier::from_method_flags(0x100 | MethodFlags::GENERIC),
            OptimizationTier::ReadyToRun
        );
    }

    #[test]
    fn helpers_have_no_tier() {
        assert_eq!(
            OptimizationTier::from_method_flags(MethodFlags::JIT_HELPER),
            OptimizationTier::Unknown
        );
    }

    #[test]
    fn flags_drop_tier_and_extent() {
        let raw = 0x1000_0000 | 0x200 | MethodFlags::JITTED | MethodFlags::GENERIC;
        let flags = MethodFlags::from_raw(raw);
        assert_eq!(flags.bits(), MethodFlags::JITTED | MethodFlags::GENERIC);
        assert!(flags.contains(MethodFlags::GENERIC));
        assert!(!flags.contains(MethodFlags::DYNAMIC));
    }

    #[test]
    fn partial_r2r_counts_as_r2r() {
        assert!(ModuleFlags::from_raw(0x8 | 0x20).is_ready_to_run());
        assert!(ModuleFlags::from_raw(0x8 | 0x40).is_ready_to_run());
        assert!(!ModuleFlags::from_raw(0x8).is_ready_to_run());
    }
}
