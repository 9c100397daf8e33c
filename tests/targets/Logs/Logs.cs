// Logs: a .NET test-bed target logging through a STAND-IN for Microsoft.Extensions.Logging's
// EventSourceLogger, inside spans, and throwing nested exceptions, at known rates.
//
// Microsoft.Extensions.Logging cannot be installed here, so this target defines an EventSource with
// the real provider's name ("Microsoft-Extensions-Logging", hence its GUID
// 3ac73b97-af73-50e9-0822-5da4367920d0), self-describing format, and the event ids, names, keywords,
// field names, field types and field order of dotnet/runtime's
// src/libraries/Microsoft.Extensions.Logging.EventSource/src/LoggingEventSource.cs as .NET 8 ships it
// (.NET 9 appends ActivityTraceId, ActivitySpanId, ActivityTraceFlags to events 1, 2 and 5; .NET 8
// sends none, which is what this target mirrors):
//   1 FormattedMessage  keyword 0x4  Level(LogLevel:int) FactoryID(int) LoggerName EventId(int) EventName FormattedMessage
//   5 MessageJson       keyword 0x8  Level FactoryID LoggerName EventId EventName ExceptionJson ArgumentsJson FormattedMessage
//   6 ActivityJsonStart keyword 0xC  ID(int) FactoryID LoggerName ArgumentsJson
//   7 ActivityJsonStop  keyword 0xC  ID FactoryID LoggerName
// (events 2-4, Message/ActivityStart/ActivityStop, carry struct and array fields and are not written:
// clrscope enables 0x8 only). A self-describing EventSource writes TraceLogging events, so on
// EventPipe these ids are not the [Event] ids but ones assigned in order of first write, and the
// Version is 0: readers match events by name, as the real provider's readers must too. ArgumentsJson is a flat JSON object of strings including
// "{OriginalFormat}"; ExceptionJson is "{}" or {TypeName, Message, HResult (a string), VerboseMessage},
// as EventSourceLogger writes them. Its "FilterSpecs" argument is honoured as LoggingEventSource
// parses it: ';'-separated "Name", "Name*" or "Name:Level" (Trace..Critical or 0..6), first match wins;
// unless the first rule is "UseAppFilters", everything else is off; a rule without a level, and an
// empty spec, take the session's level (Verbose->Debug, Informational->Information, Warning, Error,
// else Critical). This app has no filters of its own (UseAppFilters keeps everything).
//
// What it does
//   * thread "Logger" logs --messages-per-second messages, paced against a clock, cycling through the
//     levels Trace, Debug, Information x4, Warning x2, Error, Critical (sequence % 10 picks), in
//     categories "Logs.Orders" (even sequences) and "Logs.Payments" (odd); message template
//     "Order {OrderId} for {Customer} costs {Amount}" with OrderId = sequence, Customer = "c" + sequence % 7,
//     Amount = (sequence % 100) + ".5"; EventId = 1000 + level, EventName "OrderLogged"; Error and
//     Critical messages carry an exception (Logs.Payments.PaymentDeclinedException, "declined #<seq>").
//     Every --span-size consecutive messages are logged inside one span "Logs.Batch" of ActivitySource
//     "Logs" (W3C ids, recorded); each 4th span (by span number) also opens a logging scope
//     ({"Batch": "<span number>"}) around its messages.
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
//   ready: {"ready":"Logs","pid":1,"runtime":"8.0.4","provider":{"name":"Microsoft-Extensions-Logging",
//           "guid":"3ac73b97-..."},"messages_per_second":100,"span_size":5,"exceptions_per_second":10,
//           "levels":["Trace",...],"categories":["Logs.Orders","Logs.Payments"],
//           "exceptions":{"inner":{"type":"System.TimeoutException","thrown_in":"Logs.Payments.Gateway.Connect"},
//                         "outer":{"type":"Logs.Payments.PaymentDeclinedException","thrown_in":"Logs.Payments.Gateway.Charge"}},
//           "tids":{"Logger":1234,"Thrower":1235}}
//   per span (unless --no-span-lines), after it stopped:
//     {"span":"Logs.Batch","trace_id":"32 hex","span_id":"16 hex","first":S,"last":S,"written":N}
//     {"span":"Logs.Charge","trace_id":..,"span_id":..,"episode":N}
//     first/last: the sequences logged inside; written: how many of them the EventSource wrote (passed
//     the session's filter).
//   every second: {"progress":"Logs","elapsed_s":1,"logged":100,"written":{"Trace":0,...},
//                  "episodes":10,"exceptions":20,"totals":{"logged":..,"written":{..},"episodes":..,"exceptions":..,"last_sequence":S}}
//   at exit: {"exit":"Logs","elapsed_s":5.0,"totals":{...}}
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Diagnostics.Tracing;
using System.Runtime.CompilerServices;
using System.Text;
using System.Threading;
using Testbed;

namespace Logs
{
    /// <summary>Microsoft.Extensions.Logging.LogLevel: its values are what the events carry.</summary>
    public enum LogLevel { Trace = 0, Debug = 1, Information = 2, Warning = 3, Error = 4, Critical = 5, None = 6 }

    /// <summary>The stand-in for Microsoft.Extensions.Logging.EventSource.LoggingEventSource (see the top).</summary>
    [EventSource(Name = "Microsoft-Extensions-Logging")]
    public sealed class LoggingEventSource : EventSource
    {
        public static class Keywords
        {
            public const EventKeywords Meta = (EventKeywords)1;
            public const EventKeywords Message = (EventKeywords)2;
            public const EventKeywords FormattedMessage = (EventKeywords)4;
            public const EventKeywords JsonMessage = (EventKeywords)8;
        }

        public static readonly LoggingEventSource Instance = new LoggingEventSource();

        sealed class Rule { public string Prefix; public bool Wildcard; public LogLevel Level; }
        volatile Rule[] rules = new Rule[0];
        volatile bool appFilters;

        LoggingEventSource() : base(EventSourceSettings.EtwSelfDescribingEventFormat) { }

        [Event(1, Keywords = Keywords.FormattedMessage, Level = EventLevel.LogAlways, Version = 2)]
        public void FormattedMessage(LogLevel Level, int FactoryID, string LoggerName, int EventId, string EventName, string FormattedMessage)
        {
            WriteEvent(1, Level, FactoryID, LoggerName, EventId, EventName ?? "", FormattedMessage ?? "");
        }

        [Event(5, Keywords = Keywords.JsonMessage, Level = EventLevel.LogAlways, Version = 2)]
        public void MessageJson(LogLevel Level, int FactoryID, string LoggerName, int EventId, string EventName,
            string ExceptionJson, string ArgumentsJson, string FormattedMessage)
        {
            WriteEvent(5, Level, FactoryID, LoggerName, EventId, EventName ?? "", ExceptionJson, ArgumentsJson, FormattedMessage ?? "");
        }

        [Event(6, Keywords = Keywords.JsonMessage | Keywords.FormattedMessage, Level = EventLevel.LogAlways, ActivityOptions = EventActivityOptions.Recursive)]
        public void ActivityJsonStart(int ID, int FactoryID, string LoggerName, string ArgumentsJson)
        {
            WriteEvent(6, ID, FactoryID, LoggerName, ArgumentsJson);
        }

        [Event(7, Keywords = Keywords.JsonMessage | Keywords.FormattedMessage, Level = EventLevel.LogAlways)]
        public void ActivityJsonStop(int ID, int FactoryID, string LoggerName)
        {
            WriteEvent(7, ID, FactoryID, LoggerName);
        }

        /// <summary>Whether a message of LEVEL in CATEGORY passes the session's FilterSpecs.</summary>
        [NonEvent]
        public bool Enabled(string category, LogLevel level)
        {
            if (!IsEnabled()) return false;
            foreach (Rule r in rules)
            {
                bool match = r.Wildcard ? category.StartsWith(r.Prefix, StringComparison.Ordinal) : category == r.Prefix;
                if (match) return level >= r.Level;
            }
            return appFilters; // no rule matched: the implicit "all = None" rule, unless UseAppFilters
        }

        protected override void OnEventCommand(EventCommandEventArgs command)
        {
            if (command.Command != EventCommand.Update && command.Command != EventCommand.Enable) return;
            string spec;
            if (command.Arguments == null || !command.Arguments.TryGetValue("FilterSpecs", out spec)) spec = "";
            LogLevel fallback = DefaultLevel();
            var parsed = new List<Rule>();
            bool useApp = false;
            if (spec.Length == 0)
            {
                parsed.Add(new Rule { Prefix = "", Wildcard = true, Level = fallback });
            }
            else
            {
                string[] parts = spec.Split(new[] { ';' }, StringSplitOptions.RemoveEmptyEntries);
                int start = 0;
                if (parts.Length > 0 && parts[0].Equals("UseAppFilters", StringComparison.OrdinalIgnoreCase)) { useApp = true; start = 1; }
                for (int i = start; i < parts.Length; i++)
                {
                    string[] nl = parts[i].Split(new[] { ':' }, 2);
                    string name = nl[0];
                    if (name.Length == 0) continue;
                    var r = new Rule { Level = fallback };
                    if (name[name.Length - 1] == '*') { r.Wildcard = true; name = name.Substring(0, name.Length - 1); }
                    r.Prefix = name;
                    if (nl.Length > 1)
                    {
                        int number;
                        LogLevel named;
                        if (int.TryParse(nl[1], out number)) r.Level = (LogLevel)number;
                        else if (Enum.TryParse(nl[1], true, out named)) r.Level = named;
                    }
                    parsed.Add(r);
                }
            }
            appFilters = useApp;
            rules = parsed.ToArray();
        }

        LogLevel DefaultLevel()
        {
            // EventSource exposes the session level only through IsEnabled(level, keywords).
            if (IsEnabled(EventLevel.Verbose, EventKeywords.None)) return LogLevel.Debug;
            if (IsEnabled(EventLevel.Informational, EventKeywords.None)) return LogLevel.Information;
            if (IsEnabled(EventLevel.Warning, EventKeywords.None)) return LogLevel.Warning;
            if (IsEnabled(EventLevel.Error, EventKeywords.None)) return LogLevel.Error;
            return LogLevel.Critical;
        }
    }

    public static class Json
    {
        /// <summary>A JSON string literal, as System.Text.Json escapes the characters used here.</summary>
        public static string Str(string s)
        {
            var sb = new StringBuilder("\"");
            foreach (char c in s)
            {
                if (c == '"' || c == '\\') sb.Append('\\').Append(c);
                else if (c == '\n') sb.Append("\\n");
                else if (c == '\r') sb.Append("\\r");
                else if (c < ' ') sb.Append("\\u").Append(((int)c).ToString("x4"));
                else sb.Append(c);
            }
            return sb.Append('"').ToString();
        }
    }
}

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
            "  logs through a Microsoft-Extensions-Logging EventSource stand-in inside spans and throws nested\n" +
            "  exceptions at known rates; see the top of Logs.cs for the lines it prints";

        static readonly string[] LevelNames = { "Trace", "Debug", "Information", "Warning", "Error", "Critical" };
        static readonly LogLevel[] Cycle = {
            LogLevel.Trace, LogLevel.Debug, LogLevel.Information, LogLevel.Information, LogLevel.Information,
            LogLevel.Information, LogLevel.Warning, LogLevel.Warning, LogLevel.Error, LogLevel.Critical };
        const string Template = "Order {OrderId} for {Customer} costs {Amount}";
        const int FactoryId = 1;

        static readonly ActivitySource Source = new ActivitySource("Logs");
        static readonly object CountGate = new object();
        static long logged, episodes, exceptions, lastSequence;
        static readonly long[] written = new long[6];
        static bool spanLines;
        /// <summary>Set after the ready line: the work starts then.</summary>
        static readonly ManualResetEvent Go = new ManualResetEvent(false);
        static int scopeIds;

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
            Guid guid = LoggingEventSource.Instance.Guid;

            var tids = new Testbed.Json();
            var threads = new List<Thread>();
            if (rate > 0) tids.Add("Logger", StartThread(threads, "Logger", () => LogLoop(rate, spanSize)));
            if (exceptionRate > 0) tids.Add("Thrower", StartThread(threads, "Thrower", () =>
            {
                if (exceptionsAfter > 0 && Lifetime.StopHandle.WaitOne(TimeSpan.FromSeconds(exceptionsAfter))) return;
                Paced(exceptionRate, n => { if (exceptionsTotal == 0 || n < exceptionsTotal) ChargeOnce(n); });
            }));

            Out.Line(Out.Ready("Logs")
                .Add("provider", new Testbed.Json().Add("name", "Microsoft-Extensions-Logging").Add("guid", guid.ToString()))
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
                    .Add("written", WrittenJson(now.Written, before.Written))
                    .Add("episodes", now.Episodes - before.Episodes)
                    .Add("exceptions", now.Exceptions - before.Exceptions)
                    .Add("totals", TotalsJson(now)));
                before = now;
            });
            foreach (Thread t in threads) t.Join();
            Out.Line(new Testbed.Json().Add("exit", "Logs").Add("elapsed_s", Math.Round(elapsed, 3)).Add("totals", TotalsJson(Totals())));
            return 0;
        }

        sealed class Snapshot { public long Logged, Episodes, Exceptions, Last; public long[] Written; }

        static Snapshot Totals()
        {
            lock (CountGate)
                return new Snapshot { Logged = logged, Episodes = episodes, Exceptions = exceptions, Last = lastSequence, Written = (long[])written.Clone() };
        }

        static Testbed.Json WrittenJson(long[] now, long[] before)
        {
            var j = new Testbed.Json();
            for (int i = 0; i < LevelNames.Length; i++) j.Add(LevelNames[i], now[i] - (before == null ? 0 : before[i]));
            return j;
        }

        static Testbed.Json TotalsJson(Snapshot s)
        {
            return new Testbed.Json().Add("logged", s.Logged).Add("written", WrittenJson(s.Written, null))
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
            long first = 0, spanWritten = 0;
            int scope = 0;
            Paced(rate, n =>
            {
                sequence = n + 1;
                if (span == null)
                {
                    spanNumber++;
                    span = Source.StartActivity("Logs.Batch", ActivityKind.Internal);
                    first = sequence;
                    spanWritten = 0;
                    if (spanNumber % 4 == 0) scope = BeginScope("Logs.Orders", spanNumber);
                }
                if (LogOne(sequence)) spanWritten++;
                if (sequence - first + 1 == spanSize || Lifetime.Stopping)
                {
                    if (scope != 0) { EndScope(scope, "Logs.Orders"); scope = 0; }
                    string traceId = span.TraceId.ToHexString(), spanId = span.SpanId.ToHexString();
                    span.Dispose();
                    span = null;
                    if (spanLines)
                        Out.Line(new Testbed.Json().Add("span", "Logs.Batch").Add("trace_id", traceId).Add("span_id", spanId)
                            .Add("first", first).Add("last", sequence).Add("written", spanWritten));
                }
            });
            if (span != null) span.Dispose();
        }

        static int BeginScope(string category, long spanNumber)
        {
            int id = Interlocked.Increment(ref scopeIds);
            if (LoggingEventSource.Instance.IsEnabled(EventLevel.LogAlways, LoggingEventSource.Keywords.JsonMessage))
                LoggingEventSource.Instance.ActivityJsonStart(id, FactoryId, category, "{\"Batch\":" + Json.Str(spanNumber.ToString()) + "}");
            return id;
        }

        static void EndScope(int id, string category)
        {
            if (LoggingEventSource.Instance.IsEnabled(EventLevel.LogAlways, LoggingEventSource.Keywords.JsonMessage))
                LoggingEventSource.Instance.ActivityJsonStop(id, FactoryId, category);
        }

        /// <summary>One ILogger.Log call as EventSourceLogger turns it into MessageJson.</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        static bool LogOne(long sequence)
        {
            LogLevel level = Cycle[sequence % Cycle.Length];
            string category = sequence % 2 == 0 ? "Logs.Orders" : "Logs.Payments";
            bool wrote = false;
            var es = LoggingEventSource.Instance;
            if (es.IsEnabled(EventLevel.LogAlways, LoggingEventSource.Keywords.JsonMessage) && es.Enabled(category, level))
            {
                string customer = "c" + (sequence % 7);
                string amount = (sequence % 100) + ".5";
                string message = "Order " + sequence + " for " + customer + " costs " + amount;
                string args = "{\"OrderId\":" + Json.Str(sequence.ToString()) + ",\"Customer\":" + Json.Str(customer) +
                    ",\"Amount\":" + Json.Str(amount) + ",\"{OriginalFormat}\":" + Json.Str(Template) + "}";
                string exception = "{}";
                if (level >= LogLevel.Error)
                {
                    string text = "declined #" + sequence;
                    exception = "{\"TypeName\":" + Json.Str("Logs.Payments.PaymentDeclinedException") + ",\"Message\":" + Json.Str(text) +
                        ",\"HResult\":\"-2146233088\",\"VerboseMessage\":" + Json.Str("Logs.Payments.PaymentDeclinedException: " + text) + "}";
                }
                es.MessageJson(level, FactoryId, category, 1000 + (int)level, "OrderLogged", exception, args, message);
                wrote = true;
            }
            // EventSourceLogger writes each enabled form; clrscope turns on the JSON one only.
            if (es.IsEnabled(EventLevel.LogAlways, LoggingEventSource.Keywords.FormattedMessage) && es.Enabled(category, level))
                es.FormattedMessage(level, FactoryId, category, 1000 + (int)level, "OrderLogged",
                    "Order " + sequence + " for c" + (sequence % 7) + " costs " + (sequence % 100) + ".5");
            lock (CountGate)
            {
                logged++;
                lastSequence = sequence;
                if (wrote) written[(int)level]++;
            }
            return wrote;
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
