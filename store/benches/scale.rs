//! The store at the agent's scale, for issue 5's goals: query time for one hour of a busy service
//! (`profile` and `series` ≤ 1 s), a profile of 3M unique stacks (≤ 1 s), ingest samples per
//! CPU-second, and bytes on disk per sample (≤ 2) and per unique stack (≤ 8).
//!
//! Batches have the agent's shape (`symbolizer::profiles::process`): per process and sampler window one `cpu`
//! and one `wall` batch holding the window's distinct (thread, stack) pairs, each worth
//! `count × measured period` ns and labelled `thread_id`/`thread_name`, with the window's own
//! function table; per process every 10 s, `alloc_samples`/`alloc_size`, `exception` and
//! `lock_count`/`lock_time` batches labelled with the thread and the `type`. The store is flushed
//! after every 10 s of data and compacts each closed minute, as the agent's writer does.
//!
//! Its own harness rather than criterion: building an hour takes minutes and one query may take
//! seconds, so each query runs `--runs` times on one store and every time is printed, with the
//! load average (the machine may be shared) and the CPU time the query used.
//!
//! ```sh
//! cargo bench -p store --bench scale -- [hour] [boost] [unique] [week] [--runs 5] [--minutes 60]
//!     [--days 7] [--full-hours 1] [--keep] [--week-dir DIR] [--no-levels]
//! ```

mod common;

use std::collections::HashSet;
use std::fs;
use std::time::{Duration, Instant};

use common::{fresh_dir, options, query, Rng, SECOND, T0};
use profile::{Batch, BatchSample, CallTree, Function, LabelValue, Profile, ProfileType};
use store::tsdb::{Query, SampleLabels, Store, StoreOptions};

const SERVICE: &str = "shop-api";
const MODULE_CORELIB: &str = "System.Private.CoreLib.dll";

/// Frames every request runs under, root first: thread start, thread pool, Kestrel, hosting,
/// middleware and MVC, as in an ASP.NET Core 8 controller app.
const REQUEST_PREFIX: [(&str, &str); 17] = [
    ("System.Threading.Thread.StartCallback()", MODULE_CORELIB),
    ("System.Threading.PortableThreadPool+WorkerThread.WorkerThreadStart()", MODULE_CORELIB),
    ("System.Threading.ThreadPoolWorkQueue.Dispatch()", MODULE_CORELIB),
    ("System.Threading.ExecutionContext.RunFromThreadPoolDispatchLoop(System.Threading.Thread, System.Threading.ExecutionContext, System.Threading.ContextCallback, System.Object)", MODULE_CORELIB),
    ("System.Runtime.CompilerServices.AsyncTaskMethodBuilder`1+AsyncStateMachineBox`1[System.Threading.Tasks.VoidTaskResult,Microsoft.AspNetCore.Server.Kestrel.Core.Internal.Http.HttpProtocol+<ProcessRequests>d__238`1[System.__Canon]].MoveNext(System.Threading.Thread)", MODULE_CORELIB),
    ("Microsoft.AspNetCore.Server.Kestrel.Core.Internal.Http.HttpProtocol+<ProcessRequests>d__238`1[System.__Canon].MoveNext()", "Microsoft.AspNetCore.Server.Kestrel.Core.dll"),
    ("Microsoft.AspNetCore.Hosting.HostingApplication.ProcessRequestAsync(Microsoft.AspNetCore.Hosting.HostingApplication+Context)", "Microsoft.AspNetCore.Hosting.dll"),
    ("Microsoft.AspNetCore.HostFiltering.HostFilteringMiddleware.Invoke(Microsoft.AspNetCore.Http.HttpContext)", "Microsoft.AspNetCore.HostFiltering.dll"),
    ("Microsoft.AspNetCore.Routing.EndpointRoutingMiddleware.Invoke(Microsoft.AspNetCore.Http.HttpContext)", "Microsoft.AspNetCore.Routing.dll"),
    ("Microsoft.AspNetCore.Authentication.AuthenticationMiddleware+<Invoke>d__6.MoveNext()", "Microsoft.AspNetCore.Authentication.dll"),
    ("Microsoft.AspNetCore.Authorization.AuthorizationMiddleware+<Invoke>d__11.MoveNext()", "Microsoft.AspNetCore.Authorization.Policy.dll"),
    ("Microsoft.AspNetCore.Routing.EndpointMiddleware.Invoke(Microsoft.AspNetCore.Http.HttpContext)", "Microsoft.AspNetCore.Routing.dll"),
    ("Microsoft.AspNetCore.Mvc.Infrastructure.ResourceInvoker+<<InvokeAsync>g__Logged|17_1>d.MoveNext()", "Microsoft.AspNetCore.Mvc.Core.dll"),
    ("Microsoft.AspNetCore.Mvc.Infrastructure.ResourceInvoker+<<InvokeFilterPipelineAsync>g__Awaited|20_0>d.MoveNext()", "Microsoft.AspNetCore.Mvc.Core.dll"),
    ("Microsoft.AspNetCore.Mvc.Infrastructure.ControllerActionInvoker+<<InvokeInnerFilterAsync>g__Awaited|13_0>d.MoveNext()", "Microsoft.AspNetCore.Mvc.Core.dll"),
    ("Microsoft.AspNetCore.Mvc.Infrastructure.ControllerActionInvoker.Next(State&, Scope&, System.Object&, Boolean&)", "Microsoft.AspNetCore.Mvc.Core.dll"),
    ("Microsoft.AspNetCore.Mvc.Infrastructure.ActionMethodExecutor+TaskOfIActionResultExecutor.Execute(Microsoft.AspNetCore.Mvc.Infrastructure.ActionContext, Microsoft.AspNetCore.Mvc.Infrastructure.IActionResultTypeMapper, Microsoft.Extensions.Internal.ObjectMethodExecutor, System.Object, System.Object[])", "Microsoft.AspNetCore.Mvc.Core.dll"),
];

/// Stacks of threads that wait (wall only), leaf first; the empty one is a thread with no managed
/// frame (finalizer, tiered compilation).
const IDLE_STACKS: [&[&str]; 6] = [
    &[
        "System.Threading.LowLevelLifoSemaphore.WaitForSignal(System.Int32)",
        "System.Threading.LowLevelLifoSemaphore.Wait(System.Int32, System.Boolean)",
        "System.Threading.PortableThreadPool+WorkerThread.WorkerDoWork(System.Threading.PortableThreadPool, Boolean&)",
        "System.Threading.PortableThreadPool+WorkerThread.WorkerThreadStart()",
        "System.Threading.Thread.StartCallback()",
    ],
    &[
        "System.Threading.ManualResetEventSlim.Wait(System.Int32, System.Threading.CancellationToken)",
        "System.Threading.Tasks.Task.SpinThenBlockingWait(System.Int32, System.Threading.CancellationToken)",
        "System.Threading.Tasks.Task.InternalWaitCore(System.Int32, System.Threading.CancellationToken)",
        "System.Runtime.CompilerServices.TaskAwaiter.HandleNonSuccessAndDebuggerNotification(System.Threading.Tasks.Task, System.Threading.Tasks.ConfigureAwaitOptions)",
        "Microsoft.Extensions.Hosting.HostingAbstractionsHostExtensions.Run(Microsoft.Extensions.Hosting.IHost)",
        "Contoso.Shop.Api.Program.Main(System.String[])",
    ],
    &[],
    &[
        "System.Threading.WaitHandle.WaitOneNoCheck(System.Int32)",
        "System.Threading.TimerQueue.TimerThread()",
        "System.Threading.Thread.StartCallback()",
    ],
    &[
        "Interop+Sys.WaitForSocketEvents(IntPtr, SocketEvent*, Int32*)",
        "System.Net.Sockets.SocketAsyncEngine.EventLoop()",
        "System.Net.Sockets.SocketAsyncEngine+<>c.<.ctor>b__14_0(System.Object)",
        "System.Threading.Thread.StartCallback()",
    ],
    &[
        "System.Threading.SemaphoreSlim.WaitUntilCountOrTimeout(System.Int32, UInt32, System.Threading.CancellationToken)",
        "System.Threading.SemaphoreSlim.Wait(System.Int32, System.Threading.CancellationToken)",
        "Contoso.Shop.Worker.OutboxPublisher.Run(System.Threading.CancellationToken)",
        "System.Threading.Thread.StartCallback()",
    ],
];

const WORKER_IDLE: usize = 0;

/// The sampled threads of one process, as `/proc/PID/task/*/comm` names them, and what they do.
fn threads() -> Vec<(&'static str, Role)> {
    let mut out = vec![
        ("Contoso.Shop.Ap", Role::Idle(1)),
        (".NET Finalizer", Role::Idle(2)),
        (".NET Tiered Com", Role::Idle(2)),
        (".NET Timer", Role::Idle(3)),
        (".NET Sockets", Role::Idle(4)),
        (".NET Sockets", Role::Idle(4)),
        (".NET Long Runni", Role::Idle(5)),
    ];
    out.extend((0..BUSY_THREADS).map(|_| (".NET TP Worker", Role::Busy)));
    out.extend((out.len()..THREADS).map(|_| (".NET TP Worker", Role::Idle(WORKER_IDLE))));
    out
}

const THREADS: usize = 50;
/// Thread-pool workers running requests; the other threads wait.
const BUSY_THREADS: usize = 16;
/// Share of a busy worker's ticks spent in requests (the rest it waits for work), in percent.
const BUSY_PERCENT: usize = 85;
/// Distinct request stacks of the service.
const REQUEST_STACKS: usize = 20_000;
const ENDPOINTS: usize = 40;

#[derive(Clone, Copy)]
enum Role {
    Busy,
    Idle(usize),
}

const NAMESPACES: [(&str, &str); 24] = [
    ("Contoso.Shop.Api.Controllers", "Contoso.Shop.Api.dll"),
    (
        "Contoso.Shop.Application.Orders",
        "Contoso.Shop.Application.dll",
    ),
    (
        "Contoso.Shop.Application.Catalog",
        "Contoso.Shop.Application.dll",
    ),
    ("Contoso.Shop.Domain.Pricing", "Contoso.Shop.Domain.dll"),
    (
        "Contoso.Shop.Infrastructure.Persistence",
        "Contoso.Shop.Infrastructure.dll",
    ),
    (
        "Microsoft.EntityFrameworkCore.Query.Internal",
        "Microsoft.EntityFrameworkCore.dll",
    ),
    (
        "Microsoft.EntityFrameworkCore.Storage",
        "Microsoft.EntityFrameworkCore.Relational.dll",
    ),
    (
        "Microsoft.EntityFrameworkCore.ChangeTracking.Internal",
        "Microsoft.EntityFrameworkCore.dll",
    ),
    ("Npgsql.Internal", "Npgsql.dll"),
    ("Npgsql", "Npgsql.dll"),
    (
        "System.Text.Json.Serialization.Converters",
        "System.Text.Json.dll",
    ),
    ("System.Text.Json", "System.Text.Json.dll"),
    ("System.Linq", "System.Linq.dll"),
    ("System.Collections.Generic", MODULE_CORELIB),
    ("System.Threading.Tasks", MODULE_CORELIB),
    ("System.Runtime.CompilerServices", MODULE_CORELIB),
    ("System.Net.Http", "System.Net.Http.dll"),
    ("System.Net.Sockets", "System.Net.Sockets.dll"),
    (
        "Microsoft.Extensions.Logging",
        "Microsoft.Extensions.Logging.dll",
    ),
    (
        "Microsoft.Extensions.DependencyInjection.ServiceLookup",
        "Microsoft.Extensions.DependencyInjection.dll",
    ),
    ("Microsoft.AspNetCore.Http", "Microsoft.AspNetCore.Http.dll"),
    ("StackExchange.Redis", "StackExchange.Redis.dll"),
    (
        "System.Security.Cryptography",
        "System.Security.Cryptography.dll",
    ),
    (
        "System.Text.RegularExpressions",
        "System.Text.RegularExpressions.dll",
    ),
];
/// Namespaces before this index are the application's own code.
const APP_NAMESPACES: usize = 5;
const TYPES: [&str; 24] = [
    "OrderService",
    "OrdersController",
    "ProductRepository",
    "PriceCalculator",
    "CartValidator",
    "SingleQueryingEnumerable`1+AsyncEnumerator[System.__Canon]",
    "RelationalCommand",
    "StateManager",
    "NpgsqlDataReader",
    "NpgsqlConnector",
    "ObjectDefaultConverter`1[System.__Canon]",
    "Utf8JsonWriter",
    "Enumerable",
    "Dictionary`2[System.__Canon,System.__Canon]",
    "Task`1[System.__Canon]",
    "AsyncTaskMethodBuilder`1",
    "HttpConnectionPool",
    "SocketAsyncContext",
    "Logger",
    "CallSiteRuntimeResolver",
    "DefaultHttpResponse",
    "ConnectionMultiplexer",
    "HashProviderDispenser+HashProvider",
    "RegexInterpreter",
];
const METHODS: [&str; 24] = [
    "GetOrderAsync",
    "MoveNext",
    "ExecuteReaderAsync",
    "ReadAsync",
    "Write",
    "TryGetValue",
    "Select",
    "ToListAsync",
    "Compute",
    "Validate",
    "Serialize",
    "OnTryWrite",
    "FindEntry",
    "SendAsync",
    "ReceiveAsync",
    "Log",
    "Resolve",
    "WriteAsync",
    "ExecuteAsync",
    "HashData",
    "Scan",
    "Deserialize",
    "DetectChanges",
    "Materialize",
];
const ARGS: [&str; 8] = [
    "()",
    "(System.Threading.CancellationToken)",
    "(System.__Canon, System.Threading.CancellationToken)",
    "(System.ReadOnlySpan`1<Byte>, Int32)",
    "(System.Text.Json.Utf8JsonWriter, System.__Canon, System.Text.Json.JsonSerializerOptions, System.Text.Json.Serialization.WriteStack&)",
    "(System.Int32, System.Boolean)",
    "(Microsoft.EntityFrameworkCore.Storage.RelationalCommandParameterObject, System.Threading.CancellationToken)",
    "(System.Collections.Generic.IEnumerable`1<System.__Canon>, System.Func`2<System.__Canon,System.__Canon>)",
];
const LIBRARY_FUNCTIONS: usize = 6_000;
const ALLOC_TYPES: [&str; 8] = [
    "System.String",
    "System.Byte[]",
    "System.Char[]",
    "Contoso.Shop.Domain.Orders.OrderLine",
    "System.Collections.Generic.List`1[Contoso.Shop.Domain.Orders.OrderLine]",
    "Npgsql.Internal.NpgsqlReadBuffer",
    "System.Text.Json.Utf8JsonWriter",
    "System.Threading.Tasks.Task`1[System.Int32]",
];
const EXCEPTION_TYPES: [&str; 3] = [
    "System.OperationCanceledException",
    "Npgsql.PostgresException",
    "System.Collections.Generic.KeyNotFoundException",
];

/// The code and the stacks of one service, shared by its processes.
struct WebApp {
    functions: Vec<Function>,
    /// Hottest first, root first.
    requests: Vec<Vec<u32>>,
    /// [`IDLE_STACKS`] as function ids, root first.
    idle: Vec<Vec<u32>>,
}

/// A stable hash of two numbers, for a call graph that is the same on every run.
fn mix(a: u64, b: u64) -> u64 {
    let mut x = a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.wrapping_add(0x632b_e59b_d9b4_e019);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 29)
}

impl WebApp {
    fn new() -> WebApp {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut functions = Vec::new();
        let add = |name: String, module: &str, functions: &mut Vec<Function>| {
            functions.push(Function {
                name,
                module: module.to_string(),
            });
            functions.len() as u32 - 1
        };
        let prefix: Vec<u32> = REQUEST_PREFIX
            .iter()
            .map(|(name, module)| add(name.to_string(), module, &mut functions))
            .collect();
        let idle: Vec<Vec<u32>> = IDLE_STACKS
            .iter()
            .map(|stack| {
                stack
                    .iter()
                    .rev()
                    .map(|name| {
                        let at = functions.iter().position(|f| f.name == *name);
                        at.map_or_else(
                            || add(name.to_string(), MODULE_CORELIB, &mut functions),
                            |i| i as u32,
                        )
                    })
                    .collect()
            })
            .collect();
        // Library and application code: names as the runtime's method events spell them.
        let first_library = functions.len() as u32;
        let mut names: HashSet<String> = functions.iter().map(|f| f.name.clone()).collect();
        while functions.len() < first_library as usize + LIBRARY_FUNCTIONS {
            let (namespace, module) = NAMESPACES[rng.below(NAMESPACES.len())];
            let name = format!(
                "{namespace}.{}.{}{}",
                TYPES[rng.below(TYPES.len())],
                METHODS[rng.below(METHODS.len())],
                ARGS[rng.below(ARGS.len())]
            );
            if names.insert(name.clone()) {
                add(name, module, &mut functions);
            }
        }
        let library = first_library..functions.len() as u32;
        let app: Vec<u32> = library
            .clone()
            .filter(|&f| {
                NAMESPACES[..APP_NAMESPACES]
                    .iter()
                    .any(|(ns, _)| functions[f as usize].name.starts_with(ns))
            })
            .collect();
        // Each function calls a few others, always the same ones: a call graph.
        let callees = |f: u32| 1 + mix(u64::from(f), 0) % 5;
        let callee = |f: u32, k: u64| {
            library.start + (mix(u64::from(f), k + 1) % (library.end - library.start) as u64) as u32
        };
        // Each endpoint: the request prefix, then 8–19 frames of application code (each async
        // call through controller, service and repository layers adds a few frames).
        let mut requests: Vec<Vec<u32>> = (0..ENDPOINTS)
            .map(|_| {
                let mut stack = prefix.clone();
                stack.extend((0..8 + rng.below(12)).map(|_| app[rng.below(app.len())]));
                stack
            })
            .collect();
        let mut seen: HashSet<Vec<u32>> = requests.iter().cloned().collect();
        // A new stack is a hot one with up to 3 leaf frames cut and extended along the call
        // graph by 1–8 frames, so stacks share callers as a real call tree does and deepen as
        // requests go through layers (async state machines, ORM, driver, serializer).
        while requests.len() < REQUEST_STACKS {
            let base = &requests[rng.zipf(requests.len())];
            let keep = base.len() - rng.below((base.len() - prefix.len()).min(4));
            let mut stack = base[..keep].to_vec();
            for _ in 0..1 + rng.below(8) {
                let last = *stack.last().expect("below the prefix");
                stack.push(callee(last, rng.next() % callees(last)));
            }
            if stack.len() <= 120 && seen.insert(stack.clone()) {
                requests.push(stack);
            }
        }
        let app = WebApp {
            functions,
            requests,
            idle,
        };
        app.describe();
        app
    }

    fn describe(&self) {
        let depth = |s: &Vec<u32>| s.len();
        println!(
            "service: {} functions, {} request stacks (mean depth {:.1} frames, max {})",
            self.functions.len(),
            self.requests.len(),
            self.requests.iter().map(depth).sum::<usize>() as f64 / self.requests.len() as f64,
            self.requests.iter().map(depth).max().unwrap_or(0),
        );
    }
}

/// A batch's function table: functions in first-use order, as the agent's `FunctionTable`.
struct FunctionTable<'a> {
    app: &'a WebApp,
    /// Global id → local id + 1; 0 for not yet used.
    local: Vec<u32>,
    functions: Vec<Function>,
}

impl<'a> FunctionTable<'a> {
    fn new(app: &'a WebApp) -> Self {
        FunctionTable {
            app,
            local: vec![0; app.functions.len()],
            functions: Vec::new(),
        }
    }

    /// Local ids, leaf first, of a global stack given root first.
    fn stack(&mut self, root_first: &[u32]) -> Vec<u32> {
        root_first
            .iter()
            .rev()
            .map(|&f| {
                let slot = &mut self.local[f as usize];
                if *slot == 0 {
                    self.functions.push(self.app.functions[f as usize].clone());
                    *slot = self.functions.len() as u32;
                }
                *slot - 1
            })
            .collect()
    }
}

fn labels(tid: i64, name: &str) -> Vec<(String, LabelValue)> {
    vec![
        ("thread_id".to_string(), LabelValue::Num(tid)),
        ("thread_name".to_string(), LabelValue::Str(name.to_string())),
    ]
}

/// One process of the service.
struct Process {
    pid: u32,
    threads: Vec<(i64, &'static str, Role)>,
    /// Samples per request stack in the current window, reused.
    counts: Vec<u32>,
}

impl Process {
    fn new(pid: u32, app: &WebApp) -> Self {
        let threads = threads()
            .into_iter()
            .enumerate()
            .map(|(i, (name, role))| (i64::from(pid) + i as i64, name, role))
            .collect();
        Process {
            pid,
            threads,
            counts: vec![0; app.requests.len()],
        }
    }

    fn batch(
        &self,
        profile_type: &str,
        time: i64,
        functions: Vec<Function>,
        samples: Vec<BatchSample>,
    ) -> Batch {
        Batch {
            series: vec![
                ("service_name".into(), SERVICE.into()),
                ("process_id".into(), self.pid.to_string()),
                ("host_name".into(), "node-1".into()),
            ],
            profile_type: ProfileType::known(profile_type).expect("a known profile type"),
            timestamp_unix_nanos: time,
            functions,
            samples,
        }
    }

    /// The `cpu` and `wall` batches of one sampler window of `ticks` ticks, each worth
    /// `weight` ticks (1 but in the older hours of the `week` case).
    fn window(
        &mut self,
        app: &WebApp,
        rng: &mut Rng,
        time: i64,
        ticks: usize,
        weight: i64,
    ) -> [Batch; 2] {
        // The measured period of a 1 ms sampler is a little over 1 ms, different each window.
        let period = (1_000_000 + rng.below(100_000) as i64) * weight;
        let mut table = FunctionTable::new(app);
        let (mut cpu, mut wall) = (Vec::new(), Vec::new());
        for &(tid, name, role) in &self.threads {
            let idle = |stack: usize,
                        count: usize,
                        table: &mut FunctionTable,
                        wall: &mut Vec<BatchSample>| {
                wall.push(BatchSample {
                    stack: table.stack(&app.idle[stack]),
                    value: count as i64 * period,
                    labels: labels(tid, name),
                });
            };
            match role {
                Role::Idle(stack) => idle(stack, ticks, &mut table, &mut wall),
                Role::Busy => {
                    let mut touched = Vec::new();
                    let mut waiting = 0;
                    for _ in 0..ticks {
                        if rng.below(100) >= BUSY_PERCENT {
                            waiting += 1;
                            continue;
                        }
                        let s = rng.zipf(app.requests.len());
                        if self.counts[s] == 0 {
                            touched.push(s);
                        }
                        self.counts[s] += 1;
                    }
                    touched.sort_unstable();
                    for s in touched {
                        let sample = BatchSample {
                            stack: table.stack(&app.requests[s]),
                            value: i64::from(self.counts[s]) * period,
                            labels: labels(tid, name),
                        };
                        self.counts[s] = 0;
                        cpu.push(sample.clone());
                        wall.push(sample);
                    }
                    if waiting > 0 {
                        idle(WORKER_IDLE, waiting, &mut table, &mut wall);
                    }
                }
            }
        }
        [
            self.batch("cpu", time, table.functions.clone(), cpu),
            self.batch("wall", time, table.functions, wall),
        ]
    }

    /// The event profiles of one 10 s period: allocation ticks (one per ~100 KB), exceptions,
    /// lock contention, at request stacks of busy threads.
    fn events(&self, app: &WebApp, rng: &mut Rng, time: i64) -> Vec<Batch> {
        let mut table = FunctionTable::new(app);
        let busy: Vec<_> = self
            .threads
            .iter()
            .filter(|(_, _, role)| matches!(role, Role::Busy))
            .collect();
        let sample = |table: &mut FunctionTable, rng: &mut Rng, kind: Option<&str>| {
            let &&(tid, name, _) = &busy[rng.below(busy.len())];
            let mut labels = labels(tid, name);
            if let Some(kind) = kind {
                labels.push(("type".to_string(), LabelValue::Str(kind.to_string())));
            }
            (
                table.stack(&app.requests[rng.zipf(app.requests.len())]),
                labels,
            )
        };
        let (mut alloc_samples, mut alloc_size) = (Vec::new(), Vec::new());
        for _ in 0..150 {
            let kind = ALLOC_TYPES[rng.below(ALLOC_TYPES.len())];
            let (stack, labels) = sample(&mut table, rng, Some(kind));
            let count = 1 + rng.below(4) as i64;
            alloc_samples.push(BatchSample {
                stack: stack.clone(),
                value: count,
                labels: labels.clone(),
            });
            alloc_size.push(BatchSample {
                stack,
                value: count * (100_000 + rng.below(8_000) as i64),
                labels,
            });
        }
        let exceptions = (0..4)
            .map(|_| {
                let kind = EXCEPTION_TYPES[rng.below(EXCEPTION_TYPES.len())];
                let (stack, labels) = sample(&mut table, rng, Some(kind));
                BatchSample {
                    stack,
                    value: 1 + rng.below(3) as i64,
                    labels,
                }
            })
            .collect();
        let (mut lock_count, mut lock_time) = (Vec::new(), Vec::new());
        for _ in 0..10 {
            let (stack, labels) = sample(&mut table, rng, None);
            let count = 1 + rng.below(5) as i64;
            lock_count.push(BatchSample {
                stack: stack.clone(),
                value: count,
                labels: labels.clone(),
            });
            lock_time.push(BatchSample {
                stack,
                value: count * rng.below(2_000_000) as i64,
                labels,
            });
        }
        let functions = table.functions;
        vec![
            self.batch("alloc_samples", time, functions.clone(), alloc_samples),
            self.batch("alloc_size", time, functions.clone(), alloc_size),
            self.batch("exception", time, functions.clone(), exceptions),
            self.batch("lock_count", time, functions.clone(), lock_count),
            self.batch("lock_time", time, functions, lock_time),
        ]
    }
}

/// CPU time of this process (all threads), for costs that do not depend on how busy the
/// machine is.
fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given and nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Peak resident memory of this process so far, MiB.
fn peak_rss_mib() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

/// Store calls timed in CPU time, and the samples they took.
#[derive(Default)]
struct Ingest {
    cpu: Duration,
    samples: u64,
    /// The flush that took longest: the agent's writer holds the store for its length.
    longest_flush: Duration,
}

impl Ingest {
    fn append(&mut self, store: &mut Store, batch: &Batch) {
        let start = cpu_time();
        store.append(batch).expect("append");
        self.cpu += cpu_time() - start;
        self.samples += batch.samples.len() as u64;
    }

    fn flush(&mut self, store: &mut Store) {
        let start = cpu_time();
        store.flush().expect("flush");
        let took = cpu_time() - start;
        self.cpu += took;
        self.longest_flush = self.longest_flush.max(took);
    }
}

fn print_ingest(ingest: &Ingest, ticks_sampled: u64) {
    println!(
        "ingest: {} batch samples ({} sampler ticks × threads) in {:.2} CPU-s = {:.0} batch samples/s per core, {:.0} ticks/s per core",
        ingest.samples,
        ticks_sampled,
        ingest.cpu.as_secs_f64(),
        ingest.samples as f64 / ingest.cpu.as_secs_f64(),
        ticks_sampled as f64 / ingest.cpu.as_secs_f64(),
    );
    println!(
        "longest flush (compaction and levels included): {:.0} CPU-ms",
        ingest.longest_flush.as_secs_f64() * 1000.0
    );
}

/// Runs a query `runs` times on a store opened afresh, so the first run is cold (nothing in
/// the store's query cache; the files are in the page cache, as recently written blocks are)
/// and the others warm: wall and CPU time of each, and what it returned. The answer is dropped
/// after the clock stops: freeing it is the caller's cost, not the query's.
fn measure<T>(
    label: &str,
    dir: &std::path::Path,
    runs: usize,
    run: impl Fn(&Store) -> T,
    describe: impl Fn(&T) -> String,
) {
    let store = Store::open(dir, options()).expect("open");
    let mut walls = Vec::new();
    let mut cpus = Vec::new();
    let mut what = String::new();
    let load = load_average();
    for _ in 0..runs {
        let (start, cpu) = (Instant::now(), cpu_time());
        let answer = run(&store);
        walls.push(start.elapsed().as_secs_f64() * 1000.0);
        cpus.push((cpu_time() - cpu).as_secs_f64() * 1000.0);
        what = describe(&answer);
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let warm = if runs > 1 {
        let (wall, min, max) = median(&walls[1..]);
        let (cpu, _, _) = median(&cpus[1..]);
        format!(
            "; warm median {wall:.0} ms (min {min:.0}, max {max:.0}), CPU {cpu:.0} ms, over {} runs",
            runs - 1
        )
    } else {
        String::new()
    };
    println!(
        "{label}: cold {:.0} ms, CPU {:.0} ms{warm}; load {load} → {} {what}",
        walls[0],
        cpus[0],
        load_average(),
    );
}

/// A query's profile, for [`measure`].
fn profile(query: &Query) -> impl Fn(&Store) -> Profile + '_ {
    move |store| store.profile(query).expect("profile")
}

/// The flame-graph query: the call tree cut to `max_nodes`, as the UI and Grafana ask for it.
fn flame(query: &Query, max_nodes: usize) -> impl Fn(&Store) -> CallTree + '_ {
    move |store| store.call_tree(query, max_nodes).expect("call tree")
}

/// Nodes a flame graph shows: Pyroscope's `max_nodes` default, and what clrscope's web UI asks
/// for (ui/web/api.js `MAX_NODES`).
const FLAME_NODES: [usize; 2] = [8_192, 65_536];

fn tree_summary(t: &CallTree) -> String {
    format!("[{} nodes]", t.len())
}

fn profile_summary(p: &Profile) -> String {
    format!(
        "[{} samples, {} functions]",
        p.samples.len(),
        p.functions.len()
    )
}

/// What the command line sets.
struct Settings {
    /// How often each query runs.
    runs: usize,
    /// Length of the `hour` and `boost` cases (shorter ones for quick experiments).
    minutes: i64,
    /// Leave the data directory behind, for inspection.
    keep: bool,
    /// Length of the `week` case.
    days: i64,
    /// Hours at the end of the `week` case ingested at full detail.
    full_hours: i64,
    /// A week a `week --keep` run left, to query rather than build.
    week_dir: Option<std::path::PathBuf>,
    /// Build the `hour` and `boost` cases without coarser levels, as the store was before them.
    no_levels: bool,
}

impl Settings {
    fn done_with(&self, dir: &std::path::Path) {
        if self.keep {
            println!("data kept in {}", dir.display());
        } else {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// An hour of a busy service: `processes` processes, sampler windows of `ticks` ticks every
/// 10 s (1,000 at the default duty cycle, 10,000 when boosted), event profiles every 10 s.
fn hour(name: &str, processes: u32, ticks: usize, settings: &Settings) {
    let (runs, minutes) = (settings.runs, settings.minutes);
    let levels = if settings.no_levels {
        "no levels"
    } else {
        "default levels"
    };
    println!("\n== {name}: {minutes} minutes, {processes} processes × {THREADS} threads ({BUSY_THREADS} busy), {ticks} ticks per 10 s window, {levels} ==");
    let app = WebApp::new();
    let dir = fresh_dir(name);
    let mut build_options = options();
    if settings.no_levels {
        build_options.levels.clear();
    }
    let mut store = Store::open(&dir, build_options).expect("open");
    let mut rng = Rng(7);
    let mut procs: Vec<Process> = (0..processes)
        .map(|i| Process::new(4000 + 1000 * i, &app))
        .collect();
    let mut ingest = Ingest::default();
    let (mut cpu_rows, mut wall_rows, mut windows) = (0u64, 0u64, 0u64);
    let built = Instant::now();
    for w in 0..minutes * 6 {
        for (i, p) in procs.iter_mut().enumerate() {
            // Processes started at different times, so their windows are not aligned.
            let time =
                T0 + w * 10 * SECOND + i as i64 * 3_300_000_000 + rng.below(1_000_000) as i64;
            let [cpu, wall] = p.window(&app, &mut rng, time, ticks, 1);
            cpu_rows += cpu.samples.len() as u64;
            wall_rows += wall.samples.len() as u64;
            windows += 1;
            ingest.append(&mut store, &cpu);
            ingest.append(&mut store, &wall);
            for batch in p.events(&app, &mut rng, time + 5 * SECOND) {
                ingest.append(&mut store, &batch);
            }
        }
        ingest.flush(&mut store);
    }
    // Data from the next minute closes the last one, which the flush then compacts.
    let end = T0 + minutes * 60 * SECOND;
    let closing = procs[0].events(&app, &mut rng, end + 30 * SECOND);
    for batch in &closing {
        ingest.append(&mut store, batch);
    }
    ingest.flush(&mut store);
    println!(
        "built in {:.0} s; per window and process: {:.0} cpu + {:.0} wall batch samples (distinct thread × stack) from {} ticks × {THREADS} threads",
        built.elapsed().as_secs_f64(),
        cpu_rows as f64 / windows as f64,
        wall_rows as f64 / windows as f64,
        ticks,
    );
    print_ingest(&ingest, windows * (ticks * THREADS) as u64);
    common::print_sizes(&store);
    println!(
        "peak RSS so far: {} MiB; load average {}",
        peak_rss_mib(),
        load_average()
    );
    drop(store);
    let all_cpu = query(SERVICE, "cpu", T0, end);
    let flame_graph = Query {
        sample_labels: SampleLabels::Only(Vec::new()),
        ..all_cpu.clone()
    };
    let all_wall = query(SERVICE, "wall", T0, end);
    let middle = T0 + minutes / 2 * 60 * SECOND;
    let minute = query(SERVICE, "cpu", middle, middle + 60 * SECOND);
    measure(
        &format!("profile cpu, {minutes} min"),
        &dir,
        runs,
        profile(&all_cpu),
        profile_summary,
    );
    measure(
        &format!("profile cpu, {minutes} min, no sample labels"),
        &dir,
        runs,
        profile(&flame_graph),
        profile_summary,
    );
    for nodes in FLAME_NODES {
        measure(
            &format!("flame graph cpu, {minutes} min, {nodes} nodes"),
            &dir,
            runs,
            flame(&all_cpu, nodes),
            tree_summary,
        );
    }
    measure(
        &format!("profile wall, {minutes} min"),
        &dir,
        runs,
        profile(&all_wall),
        profile_summary,
    );
    measure(
        &format!("series cpu, {minutes} min, 10 s step"),
        &dir,
        runs,
        |store| {
            store
                .series(&all_cpu, Duration::from_secs(10))
                .expect("series")
        },
        |points| format!("[{} points]", points.len()),
    );
    measure(
        "profile cpu, 1 minute",
        &dir,
        runs,
        profile(&minute),
        profile_summary,
    );
    println!("peak RSS: {} MiB", peak_rss_mib());
    settings.done_with(&dir);
}

/// Ticks of the one sampler window each process has in an older hour of the `week` case, each
/// worth [`WEEK_TICK_WEIGHT`] ticks: an hour at the default duty cycle has 360 windows of 1,000.
const WEEK_TICKS: usize = 10_000;
const WEEK_TICK_WEIGHT: i64 = 36;

/// A week of the busy service as the store holds it at the week's end, with the default levels
/// and ages: the last `--full-hours` hours ingested as the `hour` case does (a window of 1,000
/// ticks every 10 s per process), each older hour from one window of [`WEEK_TICKS`] ticks per
/// process at :30 (each tick worth [`WEEK_TICK_WEIGHT`], so an hour's totals are as large)
/// and one set of event batches, through the same append, flush, compaction and downsampling;
/// then retention at the week's end, which leaves a day of full detail, three days of 10-minute
/// blocks and the week in hour and day blocks. With `--week-dir`, the queries of a week an
/// earlier `week --keep` run built (the same `--days`).
fn week(settings: &Settings) {
    let (runs, days) = (settings.runs, settings.days);
    let end = T0 + days * 24 * 3600 * SECOND;
    let dir = match &settings.week_dir {
        Some(dir) => {
            println!("\n== week: {days} days kept in {} ==", dir.display());
            dir.clone()
        }
        None => build_week(settings),
    };
    let cpu = |from, until| query(SERVICE, "cpu", from, until);
    let (day, hour, skew) = (86_400 * SECOND, 3600 * SECOND, 23 * 60 * SECOND);
    let nodes = 65_536;
    for (label, q) in [
        (
            "flame graph cpu, last 24 h (hour-aligned)",
            cpu(end - day, end),
        ),
        (
            "flame graph cpu, 24 h to 23 min before the end",
            cpu(end - day - skew, end - skew),
        ),
        ("flame graph cpu, 7 days", cpu(end - days * day, end)),
        (
            "flame graph cpu, 7 days to 23 min before the end",
            cpu(end - days * day - skew, end - skew),
        ),
        ("flame graph cpu, the last hour", cpu(end - hour, end)),
    ] {
        measure(label, &dir, runs, flame(&q, nodes), tree_summary);
    }
    for (label, q) in [
        (
            "profile cpu with labels, the last hour",
            cpu(end - hour, end),
        ),
        (
            "profile cpu with labels, 1 h to 23 min before the end",
            cpu(end - hour - skew, end - skew),
        ),
    ] {
        measure(label, &dir, runs, profile(&q), profile_summary);
    }
    let all = cpu(end - days * day, end);
    measure(
        "series cpu, 7 days, 1 h step",
        &dir,
        runs,
        |store| {
            store
                .series(&all, Duration::from_secs(3600))
                .expect("series")
        },
        |points| format!("[{} points]", points.len()),
    );
    println!("peak RSS: {} MiB", peak_rss_mib());
    if settings.week_dir.is_none() {
        settings.done_with(&dir);
    }
}

/// Builds the week of [`week`] and returns its directory.
fn build_week(settings: &Settings) -> std::path::PathBuf {
    let (days, full) = (settings.days, settings.full_hours);
    let hours = days * 24;
    println!("\n== week: {days} days, the last {full} hours at full detail, 3 processes × {THREADS} threads ==");
    let app = WebApp::new();
    let dir = fresh_dir("week");
    let mut store = Store::open(&dir, options()).expect("open");
    let mut rng = Rng(7);
    let mut procs: Vec<Process> = (0..3)
        .map(|i| Process::new(4000 + 1000 * i, &app))
        .collect();
    let mut ingest = Ingest::default();
    let mut ticks_sampled = 0u64;
    let built = Instant::now();
    for h in 0..hours {
        let start = T0 + h * 3600 * SECOND;
        let windows = if h < hours - full { 1 } else { 360 };
        for w in 0..windows {
            for (i, p) in procs.iter_mut().enumerate() {
                let offset = i as i64 * 3_300_000_000 + rng.below(1_000_000) as i64;
                let (time, ticks, weight) = match windows {
                    1 => (
                        start + 30 * 60 * SECOND + offset,
                        WEEK_TICKS,
                        WEEK_TICK_WEIGHT,
                    ),
                    _ => (start + w * 10 * SECOND + offset, 1_000, 1),
                };
                ticks_sampled += (ticks * THREADS) as u64;
                for batch in p.window(&app, &mut rng, time, ticks, weight) {
                    ingest.append(&mut store, &batch);
                }
                for batch in p.events(&app, &mut rng, time + 5 * SECOND) {
                    ingest.append(&mut store, &batch);
                }
            }
            ingest.flush(&mut store);
        }
    }
    let end = T0 + hours * 3600 * SECOND;
    for batch in procs[0].events(&app, &mut rng, end + 30 * SECOND) {
        ingest.append(&mut store, &batch);
    }
    ingest.flush(&mut store);
    println!("built in {:.0} s", built.elapsed().as_secs_f64());
    print_ingest(&ingest, ticks_sampled);
    drop(store);
    // The store as it is at the week's end: default ages, a week and a bit kept.
    let at_end = StoreOptions {
        retention_age: Duration::from_secs(days as u64 * 86_400 + 3600),
        ..StoreOptions::default()
    };
    let mut store = Store::open(&dir, at_end).expect("open");
    let deleted = store.apply_retention(end + 31 * SECOND).expect("retention");
    println!(
        "retention at the week's end deleted {} blocks",
        deleted.len()
    );
    for r in [0, 600 * SECOND, 3600 * SECOND, 86_400 * SECOND] {
        let level: Vec<_> = store
            .blocks()
            .iter()
            .filter(|b| b.meta.resolution == r)
            .collect();
        println!(
            "level of {} s: {} blocks, {} bytes, {} rows",
            r / SECOND,
            level.len(),
            level.iter().map(|b| b.bytes).sum::<u64>(),
            level.iter().map(|b| b.meta.rows.samples).sum::<u64>(),
        );
    }
    common::print_sizes(&store);
    dir
}

/// 3,000,000 distinct stacks over ten minutes of one process: 60 batches of 50,000 samples, each
/// a request stack of the web app extended by three frames of its own, so each adds three stack
/// nodes (Pyroscope's benchmark: 3.2M stacks, 10M nodes).
fn unique(settings: &Settings) {
    let runs = settings.runs;
    const BATCHES: usize = 60;
    const PER_BATCH: usize = 50_000;
    const BASES: usize = 2_000;
    println!(
        "\n== unique: {} distinct stacks over 10 minutes ==",
        BATCHES * PER_BATCH
    );
    let app = WebApp::new();
    let dir = fresh_dir("unique");
    let mut store = Store::open(&dir, options()).expect("open");
    let process = Process::new(4000, &app);
    let library = app.functions.len() as u32 - LIBRARY_FUNCTIONS as u32;
    let mut ingest = Ingest::default();
    let built = Instant::now();
    for b in 0..BATCHES {
        let mut table = FunctionTable::new(&app);
        let samples = (0..PER_BATCH)
            .map(|j| {
                let i = b * PER_BATCH + j;
                let (base, q) = (i % BASES, (i / BASES) as u64);
                let mut stack = app.requests[base].clone();
                // The first frame spells q (distinct per base), the next two vary at random.
                stack.push(library + q as u32);
                stack.push(library + (mix(q, base as u64) % LIBRARY_FUNCTIONS as u64) as u32);
                stack.push(library + (mix(base as u64, q) % LIBRARY_FUNCTIONS as u64) as u32);
                let tid = 4000 + 7 + (i % BUSY_THREADS) as i64;
                BatchSample {
                    stack: table.stack(&stack),
                    value: 1_000_000,
                    labels: labels(tid, ".NET TP Worker"),
                }
            })
            .collect();
        let batch = process.batch("cpu", T0 + b as i64 * 10 * SECOND, table.functions, samples);
        ingest.append(&mut store, &batch);
        ingest.flush(&mut store);
    }
    let closing = process.events(&app, &mut Rng(7), T0 + 11 * 60 * SECOND);
    for batch in &closing {
        ingest.append(&mut store, batch);
    }
    ingest.flush(&mut store);
    println!("built in {:.0} s", built.elapsed().as_secs_f64());
    print_ingest(&ingest, ingest.samples);
    common::print_sizes(&store);
    drop(store);
    let q = query(SERVICE, "cpu", T0, T0 + 10 * 60 * SECOND);
    measure(
        "profile cpu, 3M unique stacks",
        &dir,
        runs,
        profile(&q),
        profile_summary,
    );
    for nodes in FLAME_NODES {
        measure(
            &format!("flame graph of 3M unique stacks, {nodes} nodes"),
            &dir,
            runs,
            flame(&q, nodes),
            tree_summary,
        );
    }
    println!("peak RSS: {} MiB", peak_rss_mib());
    settings.done_with(&dir);
}

fn main() {
    // `cargo bench` passes --bench; anything else unknown is a mistake worth stopping on.
    let mut cases = Vec::new();
    let mut settings = Settings {
        runs: 5,
        minutes: 60,
        keep: false,
        days: 7,
        full_hours: 1,
        week_dir: None,
        no_levels: false,
    };
    let mut args = std::env::args().skip(1);
    let number = |args: &mut dyn Iterator<Item = String>, what: &str| {
        args.next()
            .and_then(|n| n.parse::<i64>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("{what} takes a positive number"))
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--bench" => {}
            "--runs" => settings.runs = number(&mut args, "--runs") as usize,
            "--minutes" => settings.minutes = number(&mut args, "--minutes"),
            "--keep" => settings.keep = true,
            "--no-levels" => settings.no_levels = true,
            "--days" => settings.days = number(&mut args, "--days"),
            "--full-hours" => settings.full_hours = number(&mut args, "--full-hours"),
            "--week-dir" => {
                settings.week_dir = Some(args.next().expect("--week-dir takes a directory").into())
            }
            "hour" | "boost" | "unique" | "week" => cases.push(arg),
            other => panic!(
                "unknown argument {other:?}: expected hour, boost, unique, week, --runs N, --minutes N, --days N, --full-hours N, --keep, --week-dir DIR, --no-levels"
            ),
        }
    }
    if cases.is_empty() {
        cases = vec!["hour".into(), "boost".into(), "unique".into()];
    }
    println!("load average at start: {}", load_average());
    for case in cases {
        match case.as_str() {
            "hour" => hour("hour", 3, 1_000, &settings),
            "boost" => hour("boost", 3, 10_000, &settings),
            "week" => week(&settings),
            _ => unique(&settings),
        }
    }
}
