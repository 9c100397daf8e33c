// Startup: a .NET test-bed target that, from its first instruction, does on several threads at once
// the first uses behind the known deadlocks of enabling an EventSource while a process starts
// (dotnet/runtime#105682, #93175, #119014, #126591): the thread pool (GetMaxThreads, work items,
// FrameworkEventSource), timers, ArrayPool<char> and ArrayPool<byte> (ArrayPoolEventSource), string
// interpolation, a Meter and its instruments (MetricsEventSource), an ActivitySource and its activities
// (DiagnosticSourceEventSource), tasks and awaits (TplEventSource), and a LoggerFactory with the
// EventSource logger (LoggingEventSource); then it beats from the thread pool. A process that deadlocks
// never prints its ready line, or stops beating.
//
// Arguments
//   --threads N            threads doing the first uses at once, besides the main thread (default 4)
//   --duration-seconds N   run N seconds, then exit 0 (default: until killed)
//
// Lines printed to stdout (one JSON object per line)
//   ready, once the startup work is done: {"ready":"Startup","pid":1234,"runtime":"8.0.31","startup_ms":41.2,
//     "main_unix_ns":1765000000000000000} (main_unix_ns: the wall clock when the app's first code ran, its
//     Program's static constructor)
//   every 50 ms, from a thread-pool continuation: {"beat":1,"ms":93.5}
using System;
using System.Buffers;
using System.Diagnostics;
using System.Diagnostics.Metrics;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.Extensions.Logging;
using Testbed;

namespace Startup
{
    public static class Program
    {
        static readonly Stopwatch Clock = Stopwatch.StartNew();
        static readonly long MainUnixNs = (DateTime.UtcNow - DateTime.UnixEpoch).Ticks * 100;

        public static int Main(string[] argv)
        {
            var args = new Args("Startup", "Startup [--threads N] [--duration-seconds N]", argv,
                new[] { "threads" }, new string[0]);
            int threads = args.Int("threads", 4, 1, 64);
            var workers = new Thread[threads];
            for (int i = 0; i < threads; i++)
            {
                int n = i;
                workers[i] = new Thread(() => FirstUses(n)) { Name = "Starter" + n };
                workers[i].Start();
            }
            var source = new ActivitySource("Startup");
            var meter = new Meter("Startup");
            var started = meter.CreateCounter<long>("startup.steps");
            using (var factory = LoggerFactory.Create(b => b.AddEventSourceLogger().SetMinimumLevel(LogLevel.Debug)))
            {
                var log = factory.CreateLogger("Startup");
                FirstUses(threads);
                foreach (var w in workers) w.Join();
                using (source.StartActivity("Startup.Ready"))
                {
                    started.Add(1);
                    log.LogInformation("started in {Ms} ms", Clock.Elapsed.TotalMilliseconds);
                }
                Out.Line(Out.Ready("Startup").Add("startup_ms", Clock.Elapsed.TotalMilliseconds)
                    .Add("main_unix_ns", MainUnixNs));
                Lifetime.Install();
                var beating = Beat(source, started, log);
                Lifetime.Run(args.DurationSeconds(), null);
                GC.KeepAlive(beating);
            }
            return 0;
        }

        /// The first uses of what the known deadlocks involve, in an order that varies by thread.
        static void FirstUses(int n)
        {
            int worker, io;
            if (n % 2 == 0) ThreadPool.GetMaxThreads(out worker, out io);
            char[] chars = ArrayPool<char>.Shared.Rent(64 + n);
            string text = $"starter {n} at {Clock.Elapsed.TotalMilliseconds} ms";
            ArrayPool<char>.Shared.Return(chars);
            byte[] bytes = ArrayPool<byte>.Shared.Rent(128 + text.Length);
            ArrayPool<byte>.Shared.Return(bytes);
            using (var done = new ManualResetEventSlim())
            {
                ThreadPool.QueueUserWorkItem(_ => done.Set());
                using (new Timer(_ => { }, null, 1, Timeout.Infinite)) done.Wait();
            }
            Task.Run(async () => { await Task.Yield(); }).Wait();
            if (n % 2 == 1) ThreadPool.GetMaxThreads(out worker, out io);
        }

        /// Beats every 50 ms from thread-pool continuations, each with the uses above.
        static async Task Beat(ActivitySource source, Counter<long> steps, ILogger log)
        {
            for (long beat = 1; !Lifetime.Stopping; beat++)
            {
                await Task.Delay(50).ConfigureAwait(false);
                using (source.StartActivity("Startup.Beat"))
                {
                    char[] chars = ArrayPool<char>.Shared.Rent(64);
                    ArrayPool<char>.Shared.Return(chars);
                    steps.Add(1);
                    log.LogDebug("beat {Beat}", beat);
                    Out.Line(new Json().Add("beat", beat).Add("ms", Clock.Elapsed.TotalMilliseconds));
                }
            }
        }
    }
}
