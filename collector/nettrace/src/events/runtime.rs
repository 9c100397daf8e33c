//! Native runtime events (minimal metadata; layouts from the runtime manifest, ClrEtwAll.man,
//! cross-checked with TraceEvent's ClrTraceEventParser). Trailing fields exist from the event
//! version noted on each; a payload shorter than its version promises is an error.

use super::PayloadReader;
use crate::error::NettraceError;
use profile::guid::Guid;

/// Which of the four method events it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodEventKind {
    /// MethodLoadVerbose: runtime provider id 143 (code was jitted or an R2R entry bound).
    Load,
    /// MethodUnloadVerbose: runtime provider id 144.
    Unload,
    /// MethodDCStartVerbose: rundown provider id 143.
    DcStart,
    /// MethodDCEndVerbose: rundown provider id 144 (what EventPipe rundown emits).
    DcEnd,
}

/// MethodLoadVerbose / MethodUnloadVerbose / MethodDCStartVerbose / MethodDCEndVerbose.
///
/// Layout: `u64 MethodID, u64 ModuleID, u64 MethodStartAddress, u32 MethodSize, u32 MethodToken,
/// u32 MethodFlags, UTF-16z MethodNamespace, UTF-16z MethodName, UTF-16z MethodSignature`,
/// V1+: `u16 ClrInstanceID`, V2+: `u64 ReJITID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodEvent {
    /// Which event.
    pub kind: MethodEventKind,
    /// MethodDesc pointer.
    pub method_id: u64,
    /// Module the method belongs to.
    pub module_id: u64,
    /// Start of the (hot) code.
    pub start_address: u64,
    /// Size of the (hot) code in bytes.
    pub size: u32,
    /// Metadata token.
    pub token: u32,
    /// MethodFlags bits (see the accessors).
    pub flags: u32,
    /// Declaring type, e.g. `System.Collections.Generic.List`1[System.Int32]`.
    pub namespace: String,
    /// Method name.
    pub name: String,
    /// Signature, e.g. `instance void  (int32)`.
    pub signature: String,
    /// CLR instance (V1+).
    pub clr_instance_id: Option<u16>,
    /// Native code version / ReJIT id (V2+).
    pub rejit_id: Option<u64>,
}

impl MethodEvent {
    pub(crate) fn decode(
        kind: MethodEventKind,
        mut r: PayloadReader<'_>,
    ) -> Result<Self, NettraceError> {
        Ok(MethodEvent {
            kind,
            method_id: r.u64()?,
            module_id: r.u64()?,
            start_address: r.u64()?,
            size: r.u32()?,
            token: r.u32()?,
            flags: r.u32()?,
            namespace: r.string()?,
            name: r.string()?,
            signature: r.string()?,
            clr_instance_id: if r.version >= 1 { Some(r.u16()?) } else { None },
            rejit_id: if r.version >= 2 { Some(r.u64()?) } else { None },
        })
    }

    /// Jitted (flag 0x8); clear for ReadyToRun code.
    pub fn is_jitted(&self) -> bool {
        self.flags & 0x8 != 0
    }
}

/// R2RGetEntryPoint: runtime provider id 159 (keyword CompilationDiagnostic, 0x2000000000),
/// fired whenever the runtime binds a ReadyToRun method's precompiled code, which no
/// MethodLoad announces.
///
/// Layout: `u64 MethodID, UTF-16z MethodNamespace, UTF-16z MethodName, UTF-16z MethodSignature,
/// u64 EntryPoint, u16 ClrInstanceID`. There is no code size (runtime issue #103421).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct R2rEntryPointEvent {
    /// MethodDesc pointer.
    pub method_id: u64,
    /// Declaring type, as in [`MethodEvent::namespace`].
    pub namespace: String,
    /// Method name.
    pub name: String,
    /// Signature, as in [`MethodEvent::signature`].
    pub signature: String,
    /// Address of the precompiled code.
    pub entry_point: u64,
}

impl R2rEntryPointEvent {
    pub(crate) fn decode(mut r: PayloadReader<'_>) -> Result<Self, NettraceError> {
        Ok(R2rEntryPointEvent {
            method_id: r.u64()?,
            namespace: r.string()?,
            name: r.string()?,
            signature: r.string()?,
            entry_point: r.u64()?,
        })
    }
}

/// Which of the four module events it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleEventKind {
    /// ModuleLoad: runtime provider id 152.
    Load,
    /// ModuleUnload: runtime provider id 153.
    Unload,
    /// ModuleDCStart: rundown provider id 153.
    DcStart,
    /// ModuleDCEnd ("ModuleDCStop"): rundown provider id 154.
    DcEnd,
}

/// A PDB reference of a module (V2+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdbInfo {
    /// PDB signature GUID.
    pub signature: Guid,
    /// PDB age.
    pub age: u32,
    /// Build path of the PDB.
    pub build_path: String,
}

/// ModuleLoad / ModuleUnload / ModuleDCStart / ModuleDCEnd.
///
/// Layout: `u64 ModuleID, u64 AssemblyID, u32 ModuleFlags, u32 Reserved1, UTF-16z ModuleILPath,
/// UTF-16z ModuleNativePath`, V1+: `u16 ClrInstanceID`, V2+: `Guid ManagedPdbSignature,
/// u32 ManagedPdbAge, UTF-16z ManagedPdbBuildPath, Guid NativePdbSignature, u32 NativePdbAge,
/// UTF-16z NativePdbBuildPath`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleEvent {
    /// Which event.
    pub kind: ModuleEventKind,
    /// Module id (matches MethodEvent::module_id).
    pub module_id: u64,
    /// Assembly id.
    pub assembly_id: u64,
    /// ModuleFlags (0x20 = ReadyToRun module).
    pub flags: u32,
    /// Path of the IL image.
    pub il_path: String,
    /// Path of the native image, if any.
    pub native_path: String,
    /// CLR instance (V1+).
    pub clr_instance_id: Option<u16>,
    /// Managed PDB (V2+).
    pub managed_pdb: Option<PdbInfo>,
    /// Native PDB (V2+).
    pub native_pdb: Option<PdbInfo>,
}

impl ModuleEvent {
    pub(crate) fn decode(
        kind: ModuleEventKind,
        mut r: PayloadReader<'_>,
    ) -> Result<Self, NettraceError> {
        let module_id = r.u64()?;
        let assembly_id = r.u64()?;
        let flags = r.u32()?;
        let _reserved = r.u32()?;
        let il_path = r.string()?;
        let native_path = r.string()?;
        let clr_instance_id = if r.version >= 1 { Some(r.u16()?) } else { None };
        let (managed_pdb, native_pdb) = if r.version >= 2 {
            let mut pdb = || -> Result<PdbInfo, NettraceError> {
                Ok(PdbInfo {
                    signature: r.guid()?,
                    age: r.u32()?,
                    build_path: r.string()?,
                })
            };
            let managed = pdb()?;
            (Some(managed), Some(pdb()?))
        } else {
            (None, None)
        };
        Ok(ModuleEvent {
            kind,
            module_id,
            assembly_id,
            flags,
            il_path,
            native_path,
            clr_instance_id,
            managed_pdb,
            native_pdb,
        })
    }

    /// The module contains ReadyToRun code (flag 0x20).
    pub fn is_ready_to_run(&self) -> bool {
        self.flags & 0x20 != 0
    }
}

/// Which heap an allocation tick was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocationKind {
    /// Small object heap (0).
    Small,
    /// Large object heap (1).
    Large,
    /// Pinned object heap (2).
    Pinned,
    /// A value this decoder does not know.
    Other(u32),
}

/// GCAllocationTick, runtime provider id 10: fired about every 100 KB allocated per heap
/// (GC keyword 0x1, Verbose).
///
/// Layout: `u32 AllocationAmount, u32 AllocationKind`, V1+: `u16 ClrInstanceID`, V2+:
/// `u64 AllocationAmount64, ptr TypeID, UTF-16z TypeName, u32 HeapIndex`, V3+: `ptr Address`,
/// V4+: `u64 ObjectSize`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcAllocationTick {
    /// Bytes allocated since the previous tick (32-bit, saturated by older runtimes).
    pub allocation_amount: u32,
    /// Which heap.
    pub kind: AllocationKind,
    /// CLR instance (V1+).
    pub clr_instance_id: Option<u16>,
    /// Bytes allocated since the previous tick, 64-bit (V2+).
    pub allocation_amount64: Option<u64>,
    /// MethodTable of the object that crossed the threshold (V2+).
    pub type_id: Option<u64>,
    /// Its type name (V2+).
    pub type_name: Option<String>,
    /// GC heap index (V2+).
    pub heap_index: Option<u32>,
    /// Address of the object (V3+).
    pub address: Option<u64>,
    /// Size of that object (V4+).
    pub object_size: Option<u64>,
}

impl GcAllocationTick {
    pub(crate) fn decode(mut r: PayloadReader<'_>) -> Result<Self, NettraceError> {
        let v = r.version;
        let allocation_amount = r.u32()?;
        let kind = match r.u32()? {
            0 => AllocationKind::Small,
            1 => AllocationKind::Large,
            2 => AllocationKind::Pinned,
            other => AllocationKind::Other(other),
        };
        let clr_instance_id = if v >= 1 { Some(r.u16()?) } else { None };
        let mut tick = GcAllocationTick {
            allocation_amount,
            kind,
            clr_instance_id,
            allocation_amount64: None,
            type_id: None,
            type_name: None,
            heap_index: None,
            address: None,
            object_size: None,
        };
        if v >= 2 {
            tick.allocation_amount64 = Some(r.u64()?);
            tick.type_id = Some(r.pointer()?);
            tick.type_name = Some(r.string()?);
            tick.heap_index = Some(r.u32()?);
        }
        if v >= 3 {
            tick.address = Some(r.pointer()?);
        }
        if v >= 4 {
            tick.object_size = Some(r.u64()?);
        }
        Ok(tick)
    }

    /// Bytes this tick stands for: the 64-bit amount where present.
    pub fn bytes(&self) -> u64 {
        self.allocation_amount64
            .unwrap_or(u64::from(self.allocation_amount))
    }
}

/// ExceptionThrown_V1, runtime provider id 80 (Exception keyword 0x8000).
///
/// Layout: `UTF-16z ExceptionType, UTF-16z ExceptionMessage, ptr ExceptionEIP,
/// u32 ExceptionHRESULT, u16 ExceptionFlags, u16 ClrInstanceID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExceptionThrown {
    /// Exception type name.
    pub exception_type: String,
    /// Message.
    pub message: String,
    /// Faulting IP.
    pub eip: u64,
    /// HRESULT.
    pub hresult: u32,
    /// Flags (0x1 has inner exception, 0x2 nested, 0x4 rethrown, 0x8 corrupted state,
    /// 0x10 CLS compliant).
    pub flags: u16,
    /// CLR instance.
    pub clr_instance_id: u16,
}

impl ExceptionThrown {
    /// Type name and message are cut as log text is ([`super::MAX_TEXT_BYTES`]).
    pub(crate) fn decode(mut r: PayloadReader<'_>) -> Result<Self, NettraceError> {
        Ok(ExceptionThrown {
            exception_type: super::bounded(&r.string()?),
            message: super::bounded(&r.string()?),
            eip: r.pointer()?,
            hresult: r.u32()?,
            flags: r.u16()?,
            clr_instance_id: r.u16()?,
        })
    }
}

/// ContentionStart, runtime provider id 81 (Contention keyword 0x4000).
///
/// Layout: `u8 ContentionFlags, u16 ClrInstanceID`, V2+: `ptr LockID, ptr AssociatedObjectID,
/// u64 LockOwnerThreadID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentionStart {
    /// 0 managed, 1 native.
    pub flags: u8,
    /// CLR instance.
    pub clr_instance_id: u16,
    /// The lock (V2+).
    pub lock_id: Option<u64>,
    /// The object locked on (V2+).
    pub associated_object_id: Option<u64>,
    /// Thread id of the owner at the time (V2+).
    pub lock_owner_thread_id: Option<u64>,
}

impl ContentionStart {
    pub(crate) fn decode(mut r: PayloadReader<'_>) -> Result<Self, NettraceError> {
        let flags = r.u8()?;
        let clr_instance_id = r.u16()?;
        let (lock_id, associated_object_id, lock_owner_thread_id) = if r.version >= 2 {
            (Some(r.pointer()?), Some(r.pointer()?), Some(r.u64()?))
        } else {
            (None, None, None)
        };
        Ok(ContentionStart {
            flags,
            clr_instance_id,
            lock_id,
            associated_object_id,
            lock_owner_thread_id,
        })
    }
}

/// ContentionStop, runtime provider id 91.
///
/// Layout: `u8 ContentionFlags, u16 ClrInstanceID`, V1+: `f64 DurationNs`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ContentionStop {
    /// 0 managed, 1 native.
    pub flags: u8,
    /// CLR instance.
    pub clr_instance_id: u16,
    /// Time spent waiting (V1+).
    pub duration_ns: Option<f64>,
}

impl ContentionStop {
    pub(crate) fn decode(mut r: PayloadReader<'_>) -> Result<Self, NettraceError> {
        let flags = r.u8()?;
        let clr_instance_id = r.u16()?;
        let duration_ns = if r.version >= 1 { Some(r.f64()?) } else { None };
        Ok(ContentionStop {
            flags,
            clr_instance_id,
            duration_ns,
        })
    }
}
