//! Scenario tests: event sequences as a .NET 8 process emits them, and hostile ones.

use symbolizer::{
    parse_proc_maps, CodeMap, EventError, Frame, FrameKind, FunctionId, FunctionKind, LoadSource,
    MethodFlags, MethodLoad, MethodUnload, ModuleLoad, ModuleUnload, OptimizationTier,
    R2rEntryPoint, RundownRefreshPolicy, MAX_INFERRED_EXTENT, MAX_METHOD_SIZE,
};

const LINQ: u64 = 0x7f10_2000_1000;
const APP: u64 = 0x7f10_2000_2000;
const JITTED: u32 = MethodFlags::JITTED;
const TIER0: u32 = JITTED | 0x180;
const TIER1: u32 = JITTED | 0x200;
const OSR: u32 = JITTED | 0x280;
const R2R: u32 = 0x100; // what a ReadyToRun rundown event carries: Jitted clear, tier "Optimized"

#[allow(clippy::too_many_arguments)]
fn load(
    method_id: u64,
    module_id: u64,
    start: u64,
    size: u32,
    flags: u32,
    namespace: &str,
    name: &str,
    signature: &str,
    rejit_id: u64,
    timestamp: u64,
) -> MethodLoad {
    MethodLoad {
        method_id,
        module_id,
        start_address: start,
        size,
        method_token: 0x0600_0001,
        flags,
        namespace: namespace.to_string(),
        name: name.to_string(),
        signature: signature.to_string(),
        rejit_id,
        timestamp,
        source: LoadSource::Live,
    }
}

fn app_method(
    method_id: u64,
    start: u64,
    size: u32,
    flags: u32,
    rejit_id: u64,
    ts: u64,
) -> MethodLoad {
    load(
        method_id,
        APP,
        start,
        size,
        flags,
        "MyApp.OrderService",
        "Process",
        "instance void  (class MyApp.Order)",
        rejit_id,
        ts,
    )
}

fn module(module_id: u64, flags: u32, path: &str) -> ModuleLoad {
    ModuleLoad {
        module_id,
        assembly_id: module_id + 0x100,
        flags,
        il_path: path.to_string(),
        native_path: String::new(),
        managed_pdb: None,
    }
}

fn managed(frame: Frame) -> (FunctionId, OptimizationTier, bool) {
    match frame.kind {
        FrameKind::Managed {
            tier,
            inferred_extent,
        } => (frame.function, tier, inferred_extent),
        other => panic!("expected a managed frame, got {other:?}"),
    }
}

#[test]
fn tier0_tier1_and_osr_versions_share_one_function() {
    let mut map = CodeMap::new();
    map.load_module(&module(APP, 0x8, "/app/MyApp.dll"));
    let f0 = map
        .load_method(&app_method(0xA0, 0x1000, 0x200, TIER0, 0, 1))
        .unwrap();
    let f_osr = map
        .load_method(&app_method(0xA0, 0x3000, 0x180, OSR, 2, 2))
        .unwrap();
    let f1 = map
        .load_method(&app_method(0xA0, 0x5000, 0x100, TIER1, 3, 3))
        .unwrap();
    assert_eq!(f0, f_osr);
    assert_eq!(f0, f1);

    // Samples taken before tier-up still point at tier-0 code: it stays resolvable.
    assert_eq!(
        managed(map.symbolize(0x1010)),
        (f0, OptimizationTier::QuickJitted, false)
    );
    assert_eq!(
        managed(map.symbolize(0x3000)),
        (f0, OptimizationTier::OptimizedTier1Osr, false)
    );
    assert_eq!(
        managed(map.symbolize(0x50ff)),
        (f0, OptimizationTier::OptimizedTier1, false)
    );
    assert_eq!(map.symbolize(0x5100).kind, FrameKind::Unresolved);

    let function = map.function(f0);
    assert_eq!(function.kind, FunctionKind::Method);
    assert_eq!(function.display_name(), "MyApp.OrderService.Process(Order)");
    assert_eq!(&*function.module, "MyApp.dll");
    assert_eq!(
        map.frame_label(map.symbolize(0x1010)),
        "MyApp.dll!MyApp.OrderService.Process(Order)"
    );
    assert_eq!(map.stats().code_versions, 3);
}

#[test]
fn rejit_versions_are_distinct_code_of_the_same_function() {
    let mut map = CodeMap::new();
    let original = map
        .load_method(&app_method(0xA0, 0x1000, 0x100, TIER1, 0, 1))
        .unwrap();
    let rejit = map
        .load_method(&app_method(0xA0, 0x2000, 0x140, TIER1, 7, 2))
        .unwrap();
    assert_eq!(original, rejit);
    assert_eq!(map.symbolize(0x1000).function, original);
    assert_eq!(map.symbolize(0x2100).function, original);
    assert_eq!(map.stats().code_versions, 2);
}

#[test]
fn rundown_after_live_loads_does_not_duplicate_code_versions() {
    let mut map = CodeMap::new();
    map.load_method(&app_method(0xA0, 0x1000, 0x100, TIER0, 0, 1))
        .unwrap();
    map.load_method(&app_method(0xA0, 0x2000, 0x100, TIER1, 3, 2))
        .unwrap();
    for ts in [100, 200] {
        let mut event = app_method(0xA0, 0x1000, 0x100, TIER0, 0, ts);
        event.source = LoadSource::Rundown;
        map.load_method(&event).unwrap();
        let mut event = app_method(0xA0, 0x2000, 0x100, TIER1, 3, ts);
        event.source = LoadSource::Rundown;
        map.load_method(&event).unwrap();
    }
    let stats = map.stats();
    assert_eq!(stats.code_versions, 2);
    assert_eq!(stats.segments, 2);
    assert_eq!(stats.functions, 2, "the unresolved function and Process");
    assert_eq!(stats.live_loads, 2);
    assert_eq!(stats.rundown_loads, 4);
}

#[test]
fn unload_keeps_old_samples_resolvable_until_memory_is_reused() {
    let mut map = CodeMap::new();
    let plugin = 0x7f30_0000_0000;
    map.load_module(&module(plugin, 0x8, "/plugins/Plugin.dll"));
    let old = map
        .load_method(&load(
            0xB0,
            plugin,
            0x4000,
            0x400,
            TIER1,
            "Plugin.Worker",
            "Run",
            "instance void  ()",
            0,
            10,
        ))
        .unwrap();
    assert!(map.unload_method(&MethodUnload {
        method_id: 0xB0,
        start_address: 0x4000,
        size: 0x400,
        rejit_id: 0,
        timestamp: 20,
    }));
    map.unload_module(&ModuleUnload { module_id: plugin });
    // A sample taken before the unload, processed after it.
    assert_eq!(map.symbolize(0x4100).function, old);
    assert_eq!(map.stats().unloaded_code_versions, 1);

    // The code heap reuses the first half of the range for a new method.
    let new = map
        .load_method(&app_method(0xC0, 0x4000, 0x200, TIER0, 0, 30))
        .unwrap();
    assert_eq!(map.symbolize(0x4000).function, new);
    assert_eq!(map.symbolize(0x41ff).function, new);
    assert_eq!(
        map.symbolize(0x4200).function,
        old,
        "the tail is still the old method"
    );
    assert_eq!(
        &*map.function(old).module,
        "Plugin.dll",
        "unloaded modules keep their name"
    );

    assert_eq!(map.prune_unloaded(20), 0, "unloaded at 20, not before 20");
    assert_eq!(map.prune_unloaded(21), 1);
    assert_eq!(map.symbolize(0x4200).kind, FrameKind::Unresolved);
    assert_eq!(map.symbolize(0x4000).function, new);
}

#[test]
fn fully_reused_memory_frees_the_old_code_version() {
    let mut map = CodeMap::new();
    map.load_method(&app_method(0xA0, 0x1000, 0x100, TIER0, 0, 1))
        .unwrap();
    map.unload_method(&MethodUnload {
        method_id: 0xA0,
        start_address: 0x1000,
        size: 0x100,
        rejit_id: 0,
        timestamp: 2,
    });
    let new = map
        .load_method(&app_method(0xD0, 0x0f00, 0x300, TIER0, 0, 3))
        .unwrap();
    assert_eq!(map.symbolize(0x1080).function, new);
    let stats = map.stats();
    assert_eq!(stats.code_versions, 1);
    assert_eq!(stats.unloaded_code_versions, 0);
    assert_eq!(stats.segments, 1);
}

#[test]
fn a_late_event_cannot_hide_newer_code() {
    let mut map = CodeMap::new();
    // Live load at t=20 processed first; a rundown snapshot from t=10 (another session) arrives later.
    let newer = map
        .load_method(&app_method(0xE0, 0x8000, 0x100, TIER1, 0, 20))
        .unwrap();
    let mut stale = load(
        0xE1,
        APP,
        0x7f80,
        0x100,
        TIER0,
        "MyApp.Old",
        "Gone",
        "void  ()",
        0,
        10,
    );
    stale.source = LoadSource::Rundown;
    let older = map.load_method(&stale).unwrap();
    assert_eq!(map.symbolize(0x8000).function, newer);
    assert_eq!(map.symbolize(0x807f).function, newer);
    assert_eq!(
        map.symbolize(0x7f80).function,
        older,
        "where nothing newer is, it still counts"
    );
    // An unload older than the load it names is stale and ignored.
    assert!(!map.unload_method(&MethodUnload {
        method_id: 0xE0,
        start_address: 0x8000,
        size: 0x100,
        rejit_id: 0,
        timestamp: 5,
    }));
}

#[test]
fn dynamic_methods_and_il_stubs() {
    let mut map = CodeMap::new();
    let corelib = 0x7f10_0000_0000;
    map.load_module(&module(
        corelib,
        0x8 | 0x20,
        "/usr/share/dotnet/shared/Microsoft.NETCore.App/8.0.0/System.Private.CoreLib.dll",
    ));
    let mut stub = load(
        0x9000,
        corelib,
        0x6000,
        0x80,
        MethodFlags::DYNAMIC | JITTED | 0x100,
        "dynamicClass",
        "IL_STUB_PInvoke",
        "int32  (int,int32)",
        0,
        1,
    );
    stub.method_token = 0;
    let stub = map.load_method(&stub).unwrap();
    let mut lambda = load(
        0x9100,
        corelib,
        0x6100,
        0x40,
        MethodFlags::DYNAMIC | JITTED | 0x100,
        "dynamicClass",
        "lambda_method1",
        "class System.Object  (class System.Runtime.CompilerServices.Closure,class System.Object[])",
        0,
        2,
    );
    lambda.method_token = 0;
    let lambda = map.load_method(&lambda).unwrap();
    let stub_fn = map.function(stub);
    assert_eq!(stub_fn.kind, FunctionKind::DynamicMethod);
    assert_eq!(stub_fn.token, 0);
    assert_eq!(
        stub_fn.display_name(),
        "dynamicClass.IL_STUB_PInvoke(nint, int)"
    );
    assert_eq!(
        map.function(lambda).display_name(),
        "dynamicClass.lambda_method1(Closure, object[])"
    );
    assert_eq!(
        managed(map.symbolize(0x6010)).1,
        OptimizationTier::Optimized
    );
}

#[test]
fn jit_helpers_are_named_by_their_helper_name() {
    let mut map = CodeMap::new();
    // SendHelperEvent: MethodID = start address, ModuleID = 0, no namespace or signature.
    let helper = map
        .load_method(&load(
            0x7f00_1234_0000,
            0,
            0x7f00_1234_0000,
            0x60,
            MethodFlags::JIT_HELPER,
            "",
            "JIT_MemSet",
            "",
            0,
            1,
        ))
        .unwrap();
    let frame = map.symbolize(0x7f00_1234_0010);
    assert_eq!(managed(frame), (helper, OptimizationTier::Unknown, false));
    assert_eq!(map.function(helper).kind, FunctionKind::JitHelper);
    assert_eq!(map.frame_label(frame), "JIT_MemSet");
}

const MAPS: &str = "\
7f1000000000-7f1000010000 r--s 00000000 08:01 99 /usr/share/dotnet/shared/Microsoft.NETCore.App/8.0.0/System.Linq.dll
7f1000010000-7f10000a0000 r-xs 00010000 08:01 99 /usr/share/dotnet/shared/Microsoft.NETCore.App/8.0.0/System.Linq.dll
7f2000000000-7f2000400000 r-xp 00000000 08:01 12 /usr/share/dotnet/shared/Microsoft.NETCore.App/8.0.0/libcoreclr.so
";
const LINQ_PATH: &str = "/usr/share/dotnet/shared/Microsoft.NETCore.App/8.0.0/System.Linq.dll";
const IMAGE: u64 = 0x7f10_0000_0000;

#[test]
fn ready_to_run_code_and_unknown_addresses_in_images() {
    let mut map = CodeMap::new();
    map.load_module(&module(LINQ, 0x8 | 0x20, LINQ_PATH));
    map.set_images(parse_proc_maps(MAPS));
    let mut select = load(
        0xF0,
        LINQ,
        IMAGE + 0x2_0000,
        0x300,
        R2R | MethodFlags::GENERIC,
        "System.Linq.Enumerable+SelectArrayIterator`2[System.__Canon,System.Int32]",
        "MoveNext",
        "instance bool  ()",
        0,
        5,
    );
    select.source = LoadSource::Rundown;
    let select = map.load_method(&select).unwrap();
    assert_eq!(
        managed(map.symbolize(IMAGE + 0x2_0100)),
        (select, OptimizationTier::ReadyToRun, false)
    );
    assert_eq!(
        map.frame_label(map.symbolize(IMAGE + 0x2_0100)),
        "System.Linq.dll!System.Linq.Enumerable.SelectArrayIterator<System.__Canon, int>.MoveNext()"
    );

    // R2R code whose entry point was not bound at rundown time: module+offset, and worth a refresh.
    let miss = map.symbolize(IMAGE + 0x3_1234);
    assert_eq!(
        miss.kind,
        FrameKind::Unknown {
            offset: 0x3_1234,
            in_r2r_image: true
        }
    );
    assert_eq!(map.frame_label(miss), "System.Linq.dll!+0x31234");
    assert_eq!(map.function(miss.function).kind, FunctionKind::Image);

    // Native runtime code: an image, but not an R2R module.
    let native = map.symbolize(0x7f20_0000_1000);
    assert_eq!(
        native.kind,
        FrameKind::Unknown {
            offset: 0x1000,
            in_r2r_image: false
        }
    );
    assert_eq!(map.frame_label(native), "libcoreclr.so!+0x1000");

    // Nowhere: never dropped, one shared function.
    let nowhere = map.symbolize(0x1234);
    assert_eq!(
        nowhere,
        Frame {
            function: FunctionId::UNRESOLVED,
            kind: FrameKind::Unresolved
        }
    );
    assert_eq!(map.frame_label(nowhere), "[unknown]");

    // After the module unloads, misses there no longer ask for rundowns.
    map.unload_module(&ModuleUnload { module_id: LINQ });
    assert_eq!(
        map.symbolize(IMAGE + 0x3_1234).kind,
        FrameKind::Unknown {
            offset: 0x3_1234,
            in_r2r_image: false
        }
    );
}

#[test]
fn r2r_entry_points_get_an_inferred_extent() {
    let mut map = CodeMap::new();
    map.set_images(parse_proc_maps(MAPS));
    map.load_module(&module(LINQ, 0x8 | 0x20, LINQ_PATH));
    let entry = |method_id, name: &str, entry_point| R2rEntryPoint {
        method_id,
        namespace: "System.Linq.Enumerable".to_string(),
        name: name.to_string(),
        signature: "generic bool  (class System.Collections.Generic.IEnumerable`1<!!0>)"
            .to_string(),
        entry_point,
        timestamp: 1,
    };
    let any = map
        .add_r2r_entry_point(&entry(0x11, "Any", IMAGE + 0x1_0000))
        .unwrap();
    let count = map
        .add_r2r_entry_point(&entry(0x12, "Count", IMAGE + 0x1_0400))
        .unwrap();
    let any_fn = map.function(any);
    assert_eq!(
        &*any_fn.module, "System.Linq.dll",
        "module found through the image"
    );
    assert_eq!(any_fn.module_id, LINQ);
    assert_eq!(
        any_fn.display_name(),
        "System.Linq.Enumerable.Any(IEnumerable<!!0>)"
    );

    assert_eq!(
        managed(map.symbolize(IMAGE + 0x1_0000)),
        (any, OptimizationTier::ReadyToRun, true)
    );
    assert_eq!(
        managed(map.symbolize(IMAGE + 0x1_03ff)).0,
        any,
        "up to the next entry point"
    );
    assert_eq!(managed(map.symbolize(IMAGE + 0x1_0400)).0, count);
    let far = IMAGE + 0x1_0400 + MAX_INFERRED_EXTENT;
    assert!(matches!(
        map.symbolize(far).kind,
        FrameKind::Unknown {
            in_r2r_image: true,
            ..
        }
    ));

    // A sized method between entry points bounds the guess.
    let sized = map
        .load_method(&load(
            0x13,
            LINQ,
            IMAGE + 0x1_0200,
            0x40,
            R2R,
            "System.Linq.Enumerable",
            "First",
            "void  ()",
            0,
            2,
        ))
        .unwrap();
    assert_eq!(managed(map.symbolize(IMAGE + 0x1_0210)).0, sized);
    assert_eq!(
        map.symbolize(IMAGE + 0x1_0300).kind,
        FrameKind::Unknown {
            offset: 0x1_0300,
            in_r2r_image: true
        },
        "past the sized method the entry point of Any no longer applies"
    );

    // Entry points end at the image end.
    let last = map
        .add_r2r_entry_point(&entry(0x14, "Last", 0x7f10_0009_ff00))
        .unwrap();
    assert_eq!(managed(map.symbolize(0x7f10_0009_ffff)).0, last);
    assert_eq!(map.symbolize(0x7f10_000a_0000).kind, FrameKind::Unresolved);
}

#[test]
fn methods_before_their_module_get_its_name_later() {
    let mut map = CodeMap::new();
    // Rundown order: MethodDCEndVerbose for every method, then ModuleDCEnd.
    let f = map
        .load_method(&app_method(0xA0, 0x1000, 0x10, TIER1, 0, 1))
        .unwrap();
    assert_eq!(&*map.function(f).module, "");
    assert_eq!(
        map.frame_label(map.symbolize(0x1000)),
        "MyApp.OrderService.Process(Order)"
    );
    map.load_module(&module(APP, 0x8, "/app/MyApp.dll"));
    assert_eq!(&*map.function(f).module, "MyApp.dll");
    assert_eq!(map.module(APP).map(|m| m.assembly_id), Some(APP + 0x100));
}

#[test]
fn same_name_in_another_module_is_another_function_with_the_same_key() {
    let mut map = CodeMap::new();
    let a = map
        .load_method(&app_method(0xA0, 0x1000, 0x10, TIER1, 0, 1))
        .unwrap();
    let mut other = app_method(0xA1, 0x2000, 0x10, TIER1, 0, 2);
    other.module_id = APP + 1;
    let b = map.load_method(&other).unwrap();
    assert_ne!(a, b);
    assert_eq!(map.function(a).key, map.function(b).key);
}

#[test]
fn method_id_reused_for_another_method_is_another_function() {
    let mut map = CodeMap::new();
    let first = map
        .load_method(&app_method(0xA0, 0x1000, 0x100, TIER1, 0, 1))
        .unwrap();
    let reused = map
        .load_method(&load(
            0xA0,
            APP,
            0x1000,
            0x100,
            TIER1,
            "MyApp.Other",
            "Run",
            "void  ()",
            0,
            2,
        ))
        .unwrap();
    assert_ne!(first, reused);
    assert_eq!(map.symbolize(0x1000).function, reused);
    assert_eq!(map.stats().code_versions, 1);
}

#[test]
fn stacks_look_up_return_addresses_inside_the_call() {
    let mut map = CodeMap::new();
    let caller = map
        .load_method(&app_method(0xA0, 0x1000, 0x100, TIER1, 0, 1))
        .unwrap();
    let callee = map
        .load_method(&load(
            0xA1,
            APP,
            0x1100,
            0x100,
            TIER1,
            "MyApp.Repo",
            "Save",
            "void  ()",
            0,
            1,
        ))
        .unwrap();
    // Leaf at 0x1150 (exact IP); the caller's return address is 0x1100, just past its last call.
    let frames = map.symbolize_stack(&[0x1150, 0x1100, 0]);
    assert_eq!(frames[0].function, callee);
    assert_eq!(frames[1].function, caller);
    assert_eq!(frames[2].kind, FrameKind::Unresolved);
    let mut reused = Vec::with_capacity(1);
    map.symbolize_stack_into(&[0x1010], &mut reused);
    assert_eq!(reused.len(), 1);
    assert!(map.symbolize_stack(&[]).is_empty());
}

#[test]
fn the_gc_poll_at_the_leaf_is_left_out_of_stacks() {
    // .NET 9+ loops call the managed GC poll; a thread the sampler stops there ran its caller.
    let mut map = CodeMap::new();
    let spin = map
        .load_method(&app_method(0xA0, 0x1000, 0x100, TIER1, 0, 1))
        .unwrap();
    let poll = |id, start, name: &str| {
        load(
            id,
            APP,
            start,
            0x40,
            TIER1,
            "System.Threading.Thread",
            name,
            "void  ()",
            0,
            1,
        )
    };
    let worker = map
        .load_method(&poll(0xA1, 0x2000, "<PollGC>g__PollGCWorker|67_0"))
        .unwrap();
    map.load_method(&poll(0xA2, 0x3000, "PollGC")).unwrap();
    let frames = map.symbolize_stack(&[0x2010, 0x3010, 0x1050]);
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0].function, spin);
    // Only at the leaf: the same method called further up is a frame like any other.
    let frames = map.symbolize_stack(&[0x1050, 0x2010, 0x1060]);
    assert_eq!(
        frames.iter().map(|f| f.function).collect::<Vec<_>>(),
        [spin, worker, spin]
    );
}

#[test]
fn a_throw_site_starts_at_the_method_that_threw() {
    // .NET 9+ dispatch exceptions in managed code: the event's stack starts in System.Runtime.EH.
    let mut map = CodeMap::new();
    let thrower = map
        .load_method(&app_method(0xA0, 0x1000, 0x100, TIER1, 0, 1))
        .unwrap();
    let eh = |id, start, name: &str| {
        load(
            id,
            APP,
            start,
            0x40,
            TIER1,
            "System.Runtime.EH",
            name,
            "void  ()",
            0,
            1,
        )
    };
    map.load_method(&eh(0xA1, 0x2000, "DispatchEx")).unwrap();
    map.load_method(&eh(0xA2, 0x3000, "RhThrowEx")).unwrap();
    // The thrower's return address is just past its call, at the end of the method.
    let site = map.throw_site(&[0x2010, 0x3010, 0x1100]);
    assert_eq!(site, [0x10FF]);
    assert_eq!(map.symbolize_stack(&site)[0].function, thrower);
    // A stack without the dispatch (.NET 8) is kept whole.
    assert_eq!(map.throw_site(&[0x1050, 0x1060]), [0x1050, 0x1060]);
}

#[test]
fn hostile_events_are_refused_or_absorbed_without_panicking() {
    let mut map = CodeMap::new();
    assert_eq!(
        map.load_method(&app_method(0xA0, 0, 0x10, TIER1, 0, 1)),
        Err(EventError::ZeroStartAddress { method_id: 0xA0 })
    );
    assert_eq!(
        map.load_method(&app_method(0xA0, u64::MAX - 4, 0x10, TIER1, 0, 1)),
        Err(EventError::RangeOverflow {
            method_id: 0xA0,
            start: u64::MAX - 4,
            size: 0x10
        })
    );
    assert_eq!(
        map.load_method(&app_method(0xA0, 0x1000, u32::MAX, TIER1, 0, 1)),
        Err(EventError::ImplausibleSize {
            method_id: 0xA0,
            size: u32::MAX,
            max: MAX_METHOD_SIZE
        })
    );
    assert!(map.add_r2r_entry_point(&R2rEntryPoint::default()).is_err());
    assert_eq!(map.stats().refused, 4);
    assert!(map
        .load_method(&app_method(0xA0, u64::MAX - 0x10, 0x10, TIER1, 0, 1))
        .is_ok());
    assert_eq!(
        map.symbolize(u64::MAX - 1).function,
        map.symbolize(u64::MAX - 0x10).function
    );
    assert_eq!(map.symbolize(u64::MAX).kind, FrameKind::Unresolved);
    let error = EventError::ZeroStartAddress { method_id: 1 }.to_string();
    assert!(error.contains("wrong field layout"), "{error}");

    // Size 0: an entry point, attributed by inference.
    let zero = map
        .load_method(&app_method(0xA1, 0x9000, 0, TIER1, 0, 1))
        .unwrap();
    assert_eq!(
        managed(map.symbolize(0x9010)),
        (zero, OptimizationTier::OptimizedTier1, true)
    );

    // Garbage strings, unnamed methods, and unknown flag bits.
    let garbage = map
        .load_method(&load(
            0xA2,
            7,
            0xA000,
            0x10,
            u32::MAX,
            "\u{0}[[[",
            "\\",
            "(((",
            0,
            1,
        ))
        .unwrap();
    assert!(!map.function(garbage).display_name().is_empty());
    let unnamed = map
        .load_method(&load(0xA3, 7, 0xB000, 0x10, TIER1, "", "", "", 0, 1))
        .unwrap();
    let unnamed2 = map
        .load_method(&load(0xA4, 7, 0xC000, 0x10, TIER1, "", "", "", 0, 1))
        .unwrap();
    assert_ne!(unnamed, unnamed2);
    assert_eq!(map.function(unnamed).display_name(), "[method 0xa3]");

    // Unloads of things never loaded, foreign ids, odd images.
    assert!(!map.unload_method(&MethodUnload::default()));
    map.unload_module(&ModuleUnload { module_id: 42 });
    let mut other = CodeMap::new();
    let mut foreign = FunctionId::UNRESOLVED;
    for i in 1..100u64 {
        let name = format!("M{i}");
        foreign = other
            .load_method(&load(
                i,
                1,
                i * 0x100,
                0x10,
                TIER1,
                "X",
                &name,
                "void  ()",
                0,
                i,
            ))
            .unwrap();
    }
    assert_eq!(map.function(foreign).kind, FunctionKind::Unresolved);
    assert_eq!(map.function(foreign).display_name(), "[unknown]");
    map.set_images(vec![
        symbolizer::ImageRange {
            start: 10,
            end: 5,
            path: "/bad".into(),
            ..Default::default()
        },
        symbolizer::ImageRange {
            start: 0x100,
            end: 0x200,
            path: "/a".into(),
            ..Default::default()
        },
        symbolizer::ImageRange {
            start: 0x150,
            end: 0x300,
            path: "/b".into(),
            ..Default::default()
        },
    ]);
    assert_eq!(map.stats().images, 1);
}

#[test]
fn overlapping_ranges_newest_wins_piecewise() {
    let mut map = CodeMap::new();
    let a = map
        .load_method(&load(
            1, APP, 0x1000, 0x300, TIER1, "A", "M", "void  ()", 0, 1,
        ))
        .unwrap();
    let b = map
        .load_method(&load(
            2, APP, 0x1100, 0x100, TIER1, "B", "M", "void  ()", 0, 2,
        ))
        .unwrap();
    let c = map
        .load_method(&load(
            3, APP, 0x0f00, 0x180, TIER1, "C", "M", "void  ()", 0, 3,
        ))
        .unwrap();
    let owner = |ip| map.symbolize(ip).function;
    assert_eq!(owner(0x0f00), c);
    assert_eq!(owner(0x107f), c);
    assert_eq!(owner(0x1080), a);
    assert_eq!(owner(0x1100), b);
    assert_eq!(owner(0x11ff), b);
    assert_eq!(owner(0x1200), a);
    assert_eq!(owner(0x12ff), a);
    assert_eq!(owner(0x1300), FunctionId::UNRESOLVED);
}

#[test]
fn r2r_misses_drive_the_refresh_policy() {
    let mut map = CodeMap::new();
    map.load_module(&module(LINQ, 0x8 | 0x20, LINQ_PATH));
    map.set_images(parse_proc_maps(MAPS));
    let mut policy = RundownRefreshPolicy::new(30_000_000_000, 3);
    let stack = [
        IMAGE + 0x2_0000,
        IMAGE + 0x2_0100,
        0x7f20_0000_1000,
        IMAGE + 0x4_0000,
    ];
    let frames = map.symbolize_stack(&stack);
    let misses = frames
        .iter()
        .filter(|f| {
            matches!(
                f.kind,
                FrameKind::Unknown {
                    in_r2r_image: true,
                    ..
                }
            )
        })
        .count() as u64;
    assert_eq!(misses, 3);
    policy.record_misses(misses);
    assert!(policy.should_refresh(1));
    assert!(!policy.should_refresh(2));
}

#[test]
fn maps_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<CodeMap>();
    let mut map = CodeMap::new();
    let f = map
        .load_method(&app_method(0xA0, 0x1000, 0x100, TIER1, 0, 1))
        .unwrap();
    let map = &map;
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(move || {
                for ip in 0x1000..0x1100 {
                    assert_eq!(map.symbolize(ip).function, f);
                }
            });
        }
    });
}
