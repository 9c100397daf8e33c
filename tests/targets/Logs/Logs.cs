// Logs: a .NET test-bed target logging through the real Microsoft.Extensions.Logging with its real
// EventSource provider (`AddEventSourceLogger()`, the `Microsoft-Extensions-Logging` EventSource of
// the Microsoft.Extensions.Logging.EventSource package: 8.0.1 on net8.0, 9.0.20 on net9.0, 10.0.12
// on net10.0, see Logs.csproj), inside real ActivitySource spans and logging scopes, and throwing
// nested exceptions, at known rates.
//
// The logger factory has the EventSource provider alone and no filters of its own (minimum level
// Trace), so a message reaches the EventSource when `ILogger.IsEnabled(level)` (the filters the
// sessions' process-wide FilterSpecs set) and the EventSource has a message keyword (0x2, 0x4 or
// 0x8) on: EventSourceLogger's own two checks. What both said just before each call is the ground
// truth this target reports ("enabled"); it cannot see what a session received.
//
// What it does
//   * thread "Logger" logs --messages-per-second messages, paced against a clock, cycling through the
//     levels Trace, Debug, Information x4, Warning x2, Error, Critical (sequence % 10 picks), with the
//     loggers of categories "Logs.Orders" (even sequences) and "Logs.Payments" (odd); message template
//     "Order {OrderId} for {Customer} costs {Amount}" with OrderId = sequence, Customer = "c" + sequence % 7,
//     Amount = (sequence % 100) + ".5"; EventId = 1000 + level, EventName "OrderLogged"; Error and
//     Critical messages carry an exception (Logs.Payments.PaymentDeclinedException, "declined #<seq>",
//     never thrown). Every --span-size consecutive messages are logged inside one span "Logs.Batch" of
//     ActivitySource "Logs" (W3C ids, recorded); each 4th span (by span number) also opens a logging
//     scope on the Logs.Orders logger around its messages: BeginScope("Batch {Batch}", "<span number>").
//   * thread "Thrower" --exceptions-per-second times a second, inside a span "Logs.Charge": calls
//     Logs.Payments.Gateway.Charge, which calls Logs.Payments.Gateway.Connect, which throws
//     System.TimeoutException("connect timed out #N"); Charge catches it and throws
//     Logs.Payments.PaymentDeclinedException("payment declined #N", inner: the timeout); the caller,
//     Logs.Program.ChargeOnce, catches that. So two first-chance exceptions per episode.
//
// Arguments
//   --messages-per-second N   log rate (default 100; 0: none)
//   --span-size N             messages per span (default 5)
//   --exceptions-per-second N exception episodes per second (default 10; 0: none)
//   --exceptions-after-seconds S  start throwing S seconds after the ready line (default 0)
//   --exceptions-total N      stop throwing after N episodes (default 0: never)
//   --no-span-lines           do not print a line per span (for benchmarks at high rates)
//   --duration-seconds N      run N seconds, then exit 0 (default: until killed)
//
// Lines printed to stdout (one JSON object per line)
//   ready: {"ready":"Logs","pid":1,"runtime":"10.0.12","provider":{"name":"Microsoft-Extensions-Logging",
//           "guid":"3ac73b97-...","version":"10.0.12"},"messages_per_second":100,"span_size":5,
//           "exceptions_per_second":10,"levels":["Trace",...],"categories":["Logs.Orders","Logs.Payments"],
//           "exceptions":{"inner":{"type":"System.TimeoutException","thrown_in":"Logs.Payments.Gateway.Connect"},
//                         "outer":{"type":"Logs.Payments.PaymentDeclinedException","thrown_in":"Logs.Payments.Gateway.Charge"}},
//           "tids":{"Logger":1234,"Thrower":1235}}
//     provider.version: the loaded Microsoft.Extensions.Logging.EventSource's informational version.
//   per span (unless --no-span-lines), after it stopped:
//     {"span":"Logs.Batch","trace_id":"32 hex","span_id":"16 hex","first":S,"last":S,"enabled":N}
//     {"span":"Logs.Charge","trace_id":..,"span_id":..,"episode":N}
//     first/last: the sequences logged inside; enabled: how many of them IsEnabled let through.
//   every second: {"progress":"Logs","elapsed_s":1,"logged":100,"enabled":{"Trace":0,...},
//                  "not_enabled":[[S1,S2],...],"episodes":10,"exceptions":20,
//                  "totals":{"logged":..,"enabled":{..},"episodes":..,"exceptions":..,"last_sequence":S}}
//     not_enabled: the sequences at Information or above logged since the last progress line while
//     IsEnabled said no, as inclusive ranges (e.g. while the runtime had the EventSource logger off).
//   at exit: {"exit":"Logs","elapsed_s":5.0,"totals":{...}}
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Reflection;
using System.Runtime.CompilerServices;
using System.Threading;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Logging.EventSource;
using Testbed;

namespace Logs.Payments
{
    public sealed class PaymentDeclinedException : Exception
    {
        public PaymentDeclinedException(string message, Exception inner) : base(message, inner) { }
    }

    public static class Gateway
    {
        [MethodImpl(MethodImplOptions.NoInlining)]
        public static void Charge(long episode)
        {
            try
            {
                Connect(episode);
            }
            catch (TimeoutException e)
            {
                throw new PaymentDeclinedException("payment declined #" + episode, e);
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        public static void Connect(long episode)
        {
            throw new TimeoutException("connect timed out #" + episode);
        }
    }
}

namespace Logs
{
    static class Program
    {
        const string Usage =
            "usage: Logs [--messages-per-second 100] [--span-size 5] [--exceptions-per-second 10] [--no-span-lines]\n" +
            "            [--exceptions-after-seconds 0] [--exceptions-total 0]\n" +
            "            [--duration-seconds N]\n" +
            "  logs through Microsoft.Extensions.Logging's EventSource provider inside spans and throws nested\n" +
            "  exceptions at known rates; see the top of Logs.cs for the lines it prints";

        static readonly string[] LevelNames = { "Trace", "Debug", "Information", "Warning", "Error", "Critical" };
        static readonly LogLevel[] Cycle = {
            LogLevel.Trace, LogLevel.Debug, LogLevel.Information, LogLevel.Information, LogLevel.Information,
            LogLevel.Information, LogLevel.Warning, LogLevel.Warning, LogLevel.Error, LogLevel.Critical };
        const string Template = "Order {OrderId} for {Customer} costs {Amount}";

        static readonly ActivitySource Source = new ActivitySource("Logs");
        // The EventSource provider alone, no filters of the app's own: IsEnabled is the EventSource's say.
        static readonly ILoggerFactory Factory = LoggerFactory.Create(builder =>
            builder.SetMinimumLevel(LogLevel.Trace).AddEventSourceLogger());
        static readonly ILogger Orders = Factory.CreateLogger("Logs.Orders");
        static readonly ILogger Payments = Factory.CreateLogger("Logs.Payments");
        /// <summary>The provider's EventSource (made with the factory): EventSourceLogger writes an
        /// event only for a message keyword a session enabled, whatever its filters say.</summary>
        static readonly System.Diagnostics.Tracing.EventSource LoggingSource = FindLoggingSource();
        const System.Diagnostics.Tracing.EventKeywords MessageKeywords = (System.Diagnostics.Tracing.EventKeywords)(
            LoggingEventSource.Keywords.Message | LoggingEventSource.Keywords.FormattedMessage | LoggingEventSource.Keywords.JsonMessage);

        static readonly object CountGate = new object();
        static long logged, episodes, exceptions, lastSequence;
        static readonly long[] enabled = new long[6];
        /// <summary>Information-or-above sequences IsEnabled refused since the last progress line.</summary>
        static List<long[]> notEnabled = new List<long[]>();
        static bool spanLines;
        /// <summary>Set after the ready line: the work starts then.</summary>
        static readonly ManualResetEvent Go = new ManualResetEvent(false);

        static int Main(string[] argv)
        {
            var args = new Args("Logs", Usage, argv,
                new[] { "messages-per-second", "span-size", "exceptions-per-second", "exceptions-after-seconds", "exceptions-total" }, new[] { "no-span-lines" });
            double rate = args.Double("messages-per-second", 100, 0, 1000000);
            int spanSize = args.Int("span-size", 5, 1, 10000);
            double exceptionRate = args.Double("exceptions-per-second", 10, 0, 100000);
            double exceptionsAfter = args.Double("exceptions-after-seconds", 0, 0, 3600);
            int exceptionsTotal = args.Int("exceptions-total", 0, 0, int.MaxValue);
            spanLines = !args.Has("no-span-lines");
            double? duration = args.DurationSeconds();
            Lifetime.Install();

            Activity.DefaultIdFormat = ActivityIdFormat.W3C;
            Activity.ForceDefaultIdFormat = true;
            ActivitySource.AddActivityListener(new ActivityListener
            {
                ShouldListenTo = s => s.Name == "Logs",
                Sample = SampleAll,
                SampleUsingParentId = SampleAllByParentId,
            });
            Type provider = typeof(LoggingEventSource);
            string providerVersion = provider.Assembly.GetCustomAttribute<AssemblyInformationalVersionAttribute>()
                .InformationalVersion.Split('+')[0];

            var tids = new Testbed.Json();
            var threads = new List<Thread>();
            if (rate > 0) tids.Add("Logger", StartThread(threads, "Logger", () => LogLoop(rate, spanSize)));
            if (exceptionRate > 0) tids.Add("Thrower", StartThread(threads, "Thrower", () =>
            {
                if (exceptionsAfter > 0 && Lifetime.StopHandle.WaitOne(TimeSpan.FromSeconds(exceptionsAfter))) return;
                Paced(exceptionRate, n => { if (exceptionsTotal == 0 || n < exceptionsTotal) ChargeOnce(n); });
            }));

            Out.Line(Out.Ready("Logs")
                .Add("provider", new Testbed.Json().Add("name", System.Diagnostics.Tracing.EventSource.GetName(provider))
                    .Add("guid", System.Diagnostics.Tracing.EventSource.GetGuid(provider).ToString())
                    .Add("version", providerVersion))
                .Add("messages_per_second", rate)
                .Add("span_size", spanSize)
                .Add("exceptions_per_second", exceptionRate)
                .Add("exceptions_after_seconds", exceptionsAfter)
                .Add("exceptions_total", exceptionsTotal)
                .Add("levels", LevelNames)
                .Add("categories", new[] { "Logs.Orders", "Logs.Payments" })
                .Add("exceptions", new Testbed.Json()
                    .Add("inner", new Testbed.Json().Add("type", "System.TimeoutException").Add("thrown_in", "Logs.Payments.Gateway.Connect"))
                    .Add("outer", new Testbed.Json().Add("type", "Logs.Payments.PaymentDeclinedException").Add("thrown_in", "Logs.Payments.Gateway.Charge")))
                .Add("tids", tids));

            Go.Set();
            var before = Totals();
            double elapsed = Lifetime.Run(duration, second =>
            {
                var now = Totals();
                Out.Line(new Testbed.Json().Add("progress", "Logs").Add("elapsed_s", second)
                    .Add("logged", now.Logged - before.Logged)
                    .Add("enabled", EnabledJson(now.Enabled, before.Enabled))
                    .Add("not_enabled", now.NotEnabled)
                    .Add("episodes", now.Episodes - before.Episodes)
                    .Add("exceptions", now.Exceptions - before.Exceptions)
                    .Add("totals", TotalsJson(now)));
                before = now;
            });
            foreach (Thread t in threads) t.Join();
            Factory.Dispose();
            Out.Line(new Testbed.Json().Add("exit", "Logs").Add("elapsed_s", Math.Round(elapsed, 3)).Add("totals", TotalsJson(Totals())));
            return 0;
        }

        static System.Diagnostics.Tracing.EventSource FindLoggingSource()
        {
            foreach (var source in System.Diagnostics.Tracing.EventSource.GetSources())
                if (source.Name == "Microsoft-Extensions-Logging") return source;
            throw new InvalidOperationException("AddEventSourceLogger made no Microsoft-Extensions-Logging EventSource");
        }

        sealed class Snapshot { public long Logged, Episodes, Exceptions, Last; public long[] Enabled; public List<long[]> NotEnabled; }

        /// <summary>The counts so far; takes the refused ranges gathered since the last call.</summary>
        static Snapshot Totals()
        {
            lock (CountGate)
            {
                var s = new Snapshot { Logged = logged, Episodes = episodes, Exceptions = exceptions, Last = lastSequence, Enabled = (long[])enabled.Clone(), NotEnabled = notEnabled };
                notEnabled = new List<long[]>();
                return s;
            }
        }

        static Testbed.Json EnabledJson(long[] now, long[] before)
        {
            var j = new Testbed.Json();
            for (int i = 0; i < LevelNames.Length; i++) j.Add(LevelNames[i], now[i] - (before == null ? 0 : before[i]));
            return j;
        }

        static Testbed.Json TotalsJson(Snapshot s)
        {
            return new Testbed.Json().Add("logged", s.Logged).Add("enabled", EnabledJson(s.Enabled, null))
                .Add("episodes", s.Episodes).Add("exceptions", s.Exceptions).Add("last_sequence", s.Last);
        }

        static ActivitySamplingResult SampleAll(ref ActivityCreationOptions<ActivityContext> options)
        {
            return ActivitySamplingResult.AllDataAndRecorded;
        }

        static ActivitySamplingResult SampleAllByParentId(ref ActivityCreationOptions<string> options)
        {
            return ActivitySamplingResult.AllDataAndRecorded;
        }

        static int StartThread(List<Thread> threads, string name, Action body)
        {
            int tid = 0;
            var started = new ManualResetEvent(false);
            var t = new Thread(() => { tid = Native.CurrentTid(); started.Set(); Go.WaitOne(); body(); }) { Name = name, IsBackground = true };
            t.Start();
            started.WaitOne();
            threads.Add(t);
            return tid;
        }

        static void Paced(double rate, Action<long> body)
        {
            var sw = Stopwatch.StartNew();
            long done = 0;
            while (!Lifetime.Stopping)
            {
                long due = (long)(sw.Elapsed.TotalSeconds * rate) + 1;
                if (due - done > rate + 1) done = due - (long)rate - 1;
                while (done < due && !Lifetime.Stopping) body(done++);
                double waitMs = (done / rate - sw.Elapsed.TotalSeconds) * 1000.0;
                if (waitMs > 0) Lifetime.StopHandle.WaitOne(Math.Max(1, (int)Math.Ceiling(waitMs)));
            }
        }

        /// <summary>Batches of SPANSIZE messages, each batch inside one span; paced per message.</summary>
        static void LogLoop(double rate, int spanSize)
        {
            long sequence = 0;
            long spanNumber = 0;
            Activity span = null;
            long first = 0, spanEnabled = 0;
            IDisposable scope = null;
            Paced(rate, n =>
            {
                sequence = n + 1;
                if (span == null)
                {
                    spanNumber++;
                    span = Source.StartActivity("Logs.Batch", ActivityKind.Internal);
                    first = sequence;
                    spanEnabled = 0;
                    if (spanNumber % 4 == 0) scope = Orders.BeginScope("Batch {Batch}", spanNumber.ToString());
                }
                if (LogOne(sequence)) spanEnabled++;
                if (sequence - first + 1 == spanSize || Lifetime.Stopping)
                {
                    if (scope != null) { scope.Dispose(); scope = null; }
                    string traceId = span.TraceId.ToHexString(), spanId = span.SpanId.ToHexString();
                    span.Dispose();
                    span = null;
                    if (spanLines)
                        Out.Line(new Testbed.Json().Add("span", "Logs.Batch").Add("trace_id", traceId).Add("span_id", spanId)
                            .Add("first", first).Add("last", sequence).Add("enabled", spanEnabled));
                }
            });
            if (scope != null) scope.Dispose();
            if (span != null) span.Dispose();
        }

        /// <summary>One ILogger.Log call; whether IsEnabled let it through just before.</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        static bool LogOne(long sequence)
        {
            LogLevel level = Cycle[sequence % Cycle.Length];
            ILogger logger = sequence % 2 == 0 ? Orders : Payments;
            // EventSourceLogger's own two checks: the filters (FilterSpecs) and a message keyword.
            bool isEnabled = logger.IsEnabled(level)
                && LoggingSource.IsEnabled(System.Diagnostics.Tracing.EventLevel.Critical, MessageKeywords);
            Exception declined = level >= LogLevel.Error
                ? new Logs.Payments.PaymentDeclinedException("declined #" + sequence, null)
                : null;
            logger.Log(level, new EventId(1000 + (int)level, "OrderLogged"), declined, Template,
                sequence, "c" + (sequence % 7), (sequence % 100) + ".5");
            lock (CountGate)
            {
                logged++;
                lastSequence = sequence;
                if (isEnabled) enabled[(int)level]++;
                else if (level >= LogLevel.Information)
                {
                    long[] last = notEnabled.Count > 0 ? notEnabled[notEnabled.Count - 1] : null;
                    if (last != null && last[1] + 1 == sequence) last[1] = sequence;
                    else notEnabled.Add(new[] { sequence, sequence });
                }
            }
            return isEnabled;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void ChargeOnce(long n)
        {
            long episode = n + 1;
            using (Activity span = Source.StartActivity("Logs.Charge", ActivityKind.Internal))
            {
                try
                {
                    Logs.Payments.Gateway.Charge(episode);
                }
                catch (Logs.Payments.PaymentDeclinedException)
                {
                    lock (CountGate) { episodes++; exceptions += 2; }
                }
                if (spanLines && span != null)
                    Out.Line(new Testbed.Json().Add("span", "Logs.Charge").Add("trace_id", span.TraceId.ToHexString())
                        .Add("span_id", span.SpanId.ToHexString()).Add("episode", episode));
            }
        }
    }
}
