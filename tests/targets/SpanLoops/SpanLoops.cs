// SpanLoops: a .NET test-bed target whose long-running async loops run spans back to back, each
// with an await in the middle, and report which thread ran which span when.
//
// What it does
//   --loops N async loops (started with Task.Run, so on thread-pool threads) each repeat, until the
//   target stops:
//     1. start span "SpanLoops.Work" of ActivitySource "SpanLoops" (W3C ids, recorded: an
//        ActivityListener samples the source AllDataAndRecorded, as OpenTelemetry tracing would);
//     2. run SpanLoops.Work.Before for --before-ms;
//     3. `await Task.Delay(1)`: the rest runs on whatever thread-pool thread the timer resumes it on;
//     4. run SpanLoops.Work.After for --after-ms;
//     5. stop the span and print its line (below);
//     6. run SpanLoops.Work.Between for --between-ms, outside any span;
//     7. with --idle-ms, `await Task.Delay(idle-ms)`: the loop sleeps, using no CPU.
//   So a sample in Before or After belongs to the span its loop was running on that thread at that
//   moment, and a sample in Between to no span at all.
//
// Arguments
//   --loops N              concurrent async loops (default 3)
//   --before-ms MS         busy time before the await (default 3)
//   --after-ms MS          busy time after the await (default 3)
//   --between-ms MS        busy time between two spans, outside any span (default 1)
//   --idle-ms MS           idle time after that, before the next span (default 0): a loop that
//                          stands for a quiet service rather than a busy one
//   --no-span-lines        do not print a line per span
//   --duration-seconds N   run N seconds, then exit 0 (default: until killed; Ctrl-C exits cleanly)
//
// Lines printed to stdout (one JSON object per line)
//   ready, once every loop has run a span:
//     {"ready":"SpanLoops","pid":1234,"runtime":"8.0.4","activity_source":"SpanLoops",
//      "span_name":"SpanLoops.Work","in_span":["SpanLoops.Work.Before","SpanLoops.Work.After"],
//      "outside_span":"SpanLoops.Work.Between","loops":3,"before_ms":3,"after_ms":3,"between_ms":1,"idle_ms":0}
//   one per span stopped after the ready line (unless --no-span-lines), right after it stopped:
//     {"span":17,"loop":0,"trace_id":"<32 hex>","span_id":"<16 hex>","tid_before":1250,
//      "tid_after":1252,"start_ms":1733300000123.4,"resumed_ms":1733300000126.9,
//      "stop_ms":1733300000130.2}
//     tid_before: the OS thread that ran Before (and started the span); tid_after: the one that ran
//     After (and stopped it); *_ms: Unix time in ms when the span started, when the await resumed,
//     when the span stopped.
//   every second: {"progress":"SpanLoops","elapsed_s":1,"spans":1234}   (spans stopped so far)
//   at exit: {"exit":"SpanLoops","elapsed_s":5.001,"spans":6170}
using System;
using System.Diagnostics;
using System.Runtime.CompilerServices;
using System.Threading;
using System.Threading.Tasks;
using Testbed;

namespace SpanLoops
{
    public static class Work
    {
        public static double Sink;

        [MethodImpl(MethodImplOptions.NoInlining)]
        public static void Before(double ms) { Sink = Spin(ms); }

        [MethodImpl(MethodImplOptions.NoInlining)]
        public static void After(double ms) { Sink = Spin(ms); }

        [MethodImpl(MethodImplOptions.NoInlining)]
        public static void Between(double ms) { Sink = Spin(ms); }

        // Inlined into each caller, so the caller is the leaf frame of its samples.
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        static double Spin(double ms)
        {
            long until = Stopwatch.GetTimestamp() + (long)(ms * Stopwatch.Frequency / 1000.0);
            double acc = 1.0;
            do
            {
                for (int k = 0; k < 1000; k++) acc = acc * 0.9999991 + 1e-7;
            } while (Stopwatch.GetTimestamp() < until);
            return acc;
        }
    }

    static class Program
    {
        const string Usage =
            "usage: SpanLoops [--loops 3] [--before-ms 3] [--after-ms 3] [--between-ms 1] [--idle-ms 0] [--no-span-lines]\n" +
            "                 [--duration-seconds N]\n" +
            "  async loops running spans back to back, an await in each; see the top of SpanLoops.cs";

        const string SpanName = "SpanLoops.Work";
        static readonly ActivitySource Source = new ActivitySource("SpanLoops");

        static double beforeMs, afterMs, betweenMs, idleMs;
        static bool spanLines;
        static long spans;
        // Span lines start after the ready line, which is always the first.
        static volatile bool ready;

        static int Main(string[] argv)
        {
            var args = new Args("SpanLoops", Usage, argv,
                new[] { "loops", "before-ms", "after-ms", "between-ms", "idle-ms" },
                new[] { "no-span-lines" });
            int loops = args.Int("loops", 3, 1, 64);
            beforeMs = args.Double("before-ms", 3, 0, 10000);
            afterMs = args.Double("after-ms", 3, 0, 10000);
            betweenMs = args.Double("between-ms", 1, 0, 10000);
            idleMs = args.Double("idle-ms", 0, 0, 600000);
            spanLines = !args.Has("no-span-lines");
            double? duration = args.DurationSeconds();
            Lifetime.Install();

            Activity.DefaultIdFormat = ActivityIdFormat.W3C;
            Activity.ForceDefaultIdFormat = true;
            ActivitySource.AddActivityListener(new ActivityListener
            {
                ShouldListenTo = s => s.Name == "SpanLoops",
                Sample = SampleAll,
            });

            int workers, ports;
            ThreadPool.GetMinThreads(out workers, out ports);
            ThreadPool.SetMinThreads(Math.Max(workers, loops + 4), ports);

            var tasks = new Task[loops];
            for (int i = 0; i < loops; i++)
            {
                int loop = i;
                tasks[i] = Task.Run(() => LoopAsync(loop));
            }
            while (Interlocked.Read(ref spans) < loops && !Lifetime.Stopping) Thread.Sleep(10);

            Out.Line(Out.Ready("SpanLoops")
                .Add("activity_source", "SpanLoops")
                .Add("span_name", SpanName)
                .Add("in_span", new[] { "SpanLoops.Work.Before", "SpanLoops.Work.After" })
                .Add("outside_span", "SpanLoops.Work.Between")
                .Add("loops", loops)
                .Add("before_ms", beforeMs)
                .Add("after_ms", afterMs)
                .Add("between_ms", betweenMs)
                .Add("idle_ms", idleMs));
            ready = true;

            double elapsed = Lifetime.Run(duration, second => Out.Line(new Json()
                .Add("progress", "SpanLoops").Add("elapsed_s", second).Add("spans", Interlocked.Read(ref spans))));
            Task.WaitAll(tasks, 2000);
            Out.Line(new Json().Add("exit", "SpanLoops").Add("elapsed_s", Math.Round(elapsed, 3))
                .Add("spans", Interlocked.Read(ref spans)));
            return 0;
        }

        static ActivitySamplingResult SampleAll(ref ActivityCreationOptions<ActivityContext> options)
        {
            return ActivitySamplingResult.AllDataAndRecorded;
        }

        static double UnixMs()
        {
            return (DateTime.UtcNow - new DateTime(1970, 1, 1, 0, 0, 0, DateTimeKind.Utc)).TotalMilliseconds;
        }

        static async Task LoopAsync(int loop)
        {
            while (!Lifetime.Stopping)
            {
                Activity span = Source.StartActivity(SpanName, ActivityKind.Internal);
                double startMs = UnixMs();
                int tidBefore = Native.CurrentTid();
                Work.Before(beforeMs);
                await Task.Delay(1).ConfigureAwait(false);
                double resumedMs = UnixMs();
                int tidAfter = Native.CurrentTid();
                Work.After(afterMs);
                string traceId = span.TraceId.ToHexString(), spanId = span.SpanId.ToHexString();
                span.Dispose();
                double stopMs = UnixMs();
                long n = Interlocked.Increment(ref spans);
                if (spanLines && ready)
                    Out.Line(new Json().Add("span", n).Add("loop", loop).Add("trace_id", traceId)
                        .Add("span_id", spanId).Add("tid_before", tidBefore).Add("tid_after", tidAfter)
                        .Add("start_ms", Math.Round(startMs, 1)).Add("resumed_ms", Math.Round(resumedMs, 1))
                        .Add("stop_ms", Math.Round(stopMs, 1)));
                Work.Between(betweenMs);
                if (idleMs > 0) await Task.Delay(TimeSpan.FromMilliseconds(idleMs)).ConfigureAwait(false);
            }
        }
    }
}
