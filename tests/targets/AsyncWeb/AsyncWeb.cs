// AsyncWeb: a .NET test-bed target serving HTTP with ASP.NET Core (Kestrel, minimal API endpoints)
// with async handlers, spans and metrics. The hosting layer is ASP.NET Core's own: its
// "Microsoft.AspNetCore.Hosting" EventSource, its "Microsoft.AspNetCore" DiagnosticListener events
// (HttpRequestIn .Start/.Stop, BeginRequest/EndRequest) and its server span, which honours an incoming
// W3C "traceparent" (common/WebHost.cs starts it).
//
// What it does
//   Serves http://127.0.0.1:PORT/ (PORT: --port, else a free port Kestrel binds); each request is
//   handled by AsyncWeb.Program.HandleAsync, started from the endpoint on the Kestrel thread-pool thread:
//     /alpha  span "AsyncWeb.Alpha" from ActivitySource "AsyncWeb"; runs AsyncWeb.Handlers.AlphaHot for
//             half of --alpha-ms, then `await Task.Delay(1)`, then AlphaHot for the other half.
//             The continuation after the await resumes on ANOTHER thread-pool thread: the worker that
//             started the request (AsyncWeb.Program.StartRequest) stays blocked (HoldWorkerUntilResumed) until the
//             continuation has started (at most 200 ms; the pool keeps >= 16 workers for this).
//     /bravo  the same with span "AsyncWeb.Bravo", AsyncWeb.Handlers.BravoHot and --bravo-ms.
//     /charlie  span "AsyncWeb.Charlie" with NESTED SYNCHRONOUS SPANS, for --charlie-ms in total:
//             AsyncWeb.Handlers.CharlieOuterHot for a quarter, `await Task.Delay(1)` (resumes on another
//             thread-pool thread, as above), then an inner span "AsyncWeb.Charlie.Inner" (a child of
//             AsyncWeb.Charlie, started and stopped synchronously on that thread) around
//             AsyncWeb.Handlers.CharlieInnerHot for half, then CharlieOuterHot again for the last quarter
//             once the inner span has stopped.
//     other   404 (the fallback endpoint), no span of its own (the hosting events are still emitted).
//   `?status=NNN` (100..599) on /alpha, /bravo or /charlie sets the response status code (e.g. 500 to test
//   AspNetResponseStatus triggers). The response body is the request's JSON line (below).
//   Each AsyncWeb.* span carries tags (SPAN TAGS below) and a status: Error with description "status NNN"
//   when the response status is >= 500, else Ok. AsyncWeb.Charlie.Inner has the tag asyncweb.part=inner
//   and status Unset.
//   Activity.DefaultIdFormat = W3C (forced); an ActivityListener samples sources "AsyncWeb" and
//   "Microsoft.AspNetCore" (AllDataAndRecorded), so spans are really created, ASP.NET Core's server span
//   (HttpRequestIn) among them.
//   Meter "AsyncWeb": Histogram<double> "asyncweb.request.duration" (unit ms) and Counter<long>
//   "asyncweb.requests", each recorded once per request with tags kind (alpha|bravo|charlie|none) and
//   status.
//   --self-load N: thread "SelfLoad" sends N requests per second with HttpClient, cycling through the
//   paths of --self-load-paths (default /alpha and /bravo alternately), so a test gets load without an
//   external tool (at most 64 in flight).
//
// Arguments
//   --port P                port to listen on (default: a free one)
//   --alpha-ms MS           busy time of an /alpha request, split before/after the await (default 4)
//   --bravo-ms MS           busy time of a /bravo request (default 2)
//   --charlie-ms MS         busy time of a /charlie request, outer and inner span together (default 4)
//   --self-load N           requests per second from the built-in load generator (default 0: none)
//   --self-load-paths LIST  comma-separated paths the load generator cycles through, each one of
//                           alpha, bravo, charlie (default alpha,bravo)
//   --no-request-lines      do not print a line per request (for high loads)
//   --duration-seconds N    run N seconds, then exit 0 (default: until killed; Ctrl-C exits cleanly)
//
// Lines printed to stdout (one JSON object per line)
//   ready, once the listener accepts requests:
//     {"ready":"AsyncWeb","pid":1234,"runtime":"10.0.12","port":40123,"url":"http://127.0.0.1:40123/",
//      "server":"Kestrel","aspnetcore":"10.0.12","diagnostic_listener":"Microsoft.AspNetCore",
//      "hosting_activity":"Microsoft.AspNetCore.Hosting.HttpRequestIn",
//      "hosting_event_source":"Microsoft.AspNetCore.Hosting","id_format":"W3C",
//      "endpoints":{"/alpha":"AsyncWeb.Handlers.AlphaHot","/bravo":"AsyncWeb.Handlers.BravoHot",
//                   "/charlie":"AsyncWeb.Handlers.CharlieOuterHot"},
//      "alpha_ms":4,"bravo_ms":2,"charlie_ms":4,"activity_source":"AsyncWeb",
//      "spans":["AsyncWeb.Alpha","AsyncWeb.Bravo","AsyncWeb.Charlie","AsyncWeb.Charlie.Inner"],
//      "inner_spans":{"AsyncWeb.Charlie.Inner":{"parent":"AsyncWeb.Charlie","hot":"AsyncWeb.Handlers.CharlieInnerHot"}},
//      "meter":"AsyncWeb","histogram":"asyncweb.request.duration","histogram_unit":"ms",
//      "counter":"asyncweb.requests","self_load_per_second":0,"self_load_paths":["/alpha","/bravo"],"request_lines":true}
//   one per request (unless --no-request-lines), printed before the response is sent:
//     {"request":1,"kind":"alpha","method":"GET","path":"/alpha","status":200,
//      "trace_id":"<32 hex>","span_id":"<16 hex, the request's AsyncWeb.Alpha|Bravo|Charlie span>",
//      "inner_span_id":"<16 hex, the AsyncWeb.Charlie.Inner span of a /charlie request; else null>",
//      "hosting_span_id":"<16 hex, the HttpRequestIn span = parent of span_id>",
//      "parent_span_id":"<16 hex of the incoming traceparent, or null>",
//      "tid_before":1250,"tid_after":1252,"thread_before":7,"thread_after":9,"switched_thread":true,
//      "duration_ms":4.8,
//      "span_kind":"Internal","hosting_kind":"Server",
//      "span_tags":{"asyncweb.kind":"alpha","asyncweb.request":"1","asyncweb.slow":"False"},
//      "span_status":"Ok","span_status_description":null,
//      "span_ms":4.61,"inner_span_ms":null,
//      "span_duration_ms":4.5871,"inner_span_duration_ms":null}
//     span_tags: SPAN TAGS, each value as the app's own ToString() of it (asyncweb.request is a long,
//     asyncweb.slow a bool: true when the request's busy time is over 10 ms). span_ms / inner_span_ms /
//     each span's duration measured by the target with Stopwatch from just before its start to just after
//     its stop, so it exceeds the span's own Activity.Duration by the cost of starting and stopping it
//     (and any preemption meanwhile).
//     *_duration_ms: the span's own Activity.Duration once stopped, to 0.1 us.
//     tid_*: OS thread ids before/after the await; thread_*: managed thread ids; switched_thread is
//     true unless the 200 ms guard expired. For 404s kind is null and span_id, inner_span_id, tid_* and
//     thread_* are null.
//   one per request of a known kind (unless --no-request-lines), once ASP.NET Core has stopped its server
//   span, after the response (the span ends with the request, so its duration is known only then):
//     {"hosting":1,"trace_id":"<32 hex>","hosting_span_id":"<16 hex>","pipeline_ms":4.93,
//      "hosting_duration_ms":5.1207}
//     hosting: the request number of its request line; pipeline_ms: the middleware pipeline's time,
//     measured by the target's first middleware with Stopwatch around the rest of the pipeline, INSIDE
//     the server span (which also covers parsing and writing the response); hosting_duration_ms: the
//     span's own Activity.Duration, to 0.1 us.
//   every second: {"progress":"AsyncWeb","elapsed_s":1,"requests":{"alpha":10,"bravo":10,"charlie":0,"none":0},
//                  "self_load":{"sent":20,"ok":20,"failed":0}}   (totals so far)
//   at exit: {"exit":"AsyncWeb","elapsed_s":5.001,"requests":{...},"self_load":{...}}
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Diagnostics.Metrics;
using System.Globalization;
using System.Net.Http;
using System.Runtime.CompilerServices;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Http.Features;
using Testbed;

namespace AsyncWeb
{
    // ---- the application ----

    public static class Handlers
    {
        public static double Sink;

        /// <summary>Busy for MS milliseconds (floating-point work); the /alpha hot method.</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        public static void AlphaHot(double ms)
        {
            long until = Stopwatch.GetTimestamp() + (long)(ms * Stopwatch.Frequency / 1000.0);
            double acc = 1.0;
            do
            {
                for (int k = 0; k < 1000; k++) acc = acc * 0.9999991 + 1e-7;
            } while (Stopwatch.GetTimestamp() < until);
            Sink = acc;
        }

        /// <summary>Busy for MS milliseconds (integer hashing); the /bravo hot method.</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        public static void BravoHot(double ms)
        {
            long until = Stopwatch.GetTimestamp() + (long)(ms * Stopwatch.Frequency / 1000.0);
            ulong h = 1469598103934665603UL;
            do
            {
                for (int k = 0; k < 1000; k++) h = (h ^ (ulong)k) * 1099511628211UL;
            } while (Stopwatch.GetTimestamp() < until);
            Sink = h;
        }

        /// <summary>Busy for MS milliseconds (integer square roots); the /charlie hot method of the outer
        /// span "AsyncWeb.Charlie".</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        public static void CharlieOuterHot(double ms)
        {
            long until = Stopwatch.GetTimestamp() + (long)(ms * Stopwatch.Frequency / 1000.0);
            long acc = 0;
            do
            {
                for (int k = 1; k < 1000; k++) acc += (long)Math.Sqrt(k * 7919.0);
            } while (Stopwatch.GetTimestamp() < until);
            Sink = acc;
        }

        /// <summary>Busy for MS milliseconds (a xorshift generator); the /charlie hot method of the inner
        /// span "AsyncWeb.Charlie.Inner".</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        public static void CharlieInnerHot(double ms)
        {
            long until = Stopwatch.GetTimestamp() + (long)(ms * Stopwatch.Frequency / 1000.0);
            ulong x = 88172645463325252UL;
            do
            {
                for (int k = 0; k < 1000; k++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; }
            } while (Stopwatch.GetTimestamp() < until);
            Sink = x;
        }
    }

    static class Program
    {
        const string Usage =
            "usage: AsyncWeb [--port P] [--alpha-ms 4] [--bravo-ms 2] [--charlie-ms 4] [--self-load N]\n" +
            "                [--self-load-paths alpha,bravo] [--no-request-lines] [--duration-seconds N]\n" +
            "  HTTP server on 127.0.0.1 with /alpha, /bravo and /charlie async handlers, spans, metrics and the\n" +
            "  ASP.NET Core hosting diagnostic events; see the top of AsyncWeb.cs for the lines it prints";

        const int ResumeGuardMs = 200;
        const int MinThreads = 16;
        const string InnerSpanName = "AsyncWeb.Charlie.Inner";
        // Custom properties of ASP.NET Core's server span: the request number, the pipeline's time.
        const string RequestProperty = "asyncweb.request";
        const string PipelineProperty = "asyncweb.pipeline_ms";

        static readonly ActivitySource Source = new ActivitySource("AsyncWeb");
        static readonly Meter Meter = new Meter("AsyncWeb");
        static readonly Histogram<double> Duration = Meter.CreateHistogram<double>(
            "asyncweb.request.duration", "ms", "Duration of AsyncWeb requests");
        static readonly Counter<long> Requests = Meter.CreateCounter<long>("asyncweb.requests", null, "AsyncWeb requests handled");

        static readonly string[] Kinds = { "alpha", "bravo", "charlie" };

        static double alphaMs, bravoMs, charlieMs;
        static bool requestLines;
        static int port;
        static long alphaCount, bravoCount, charlieCount, noneCount, requestSeq;
        static LoadGenerator load;

        static int Main(string[] argv)
        {
            var args = new Args("AsyncWeb", Usage, argv,
                new[] { "port", "alpha-ms", "bravo-ms", "charlie-ms", "self-load", "self-load-paths" },
                new[] { "no-request-lines" });
            int requestedPort = args.Int("port", 0, 0, 65535);
            alphaMs = args.Double("alpha-ms", 4, 0, 10000);
            bravoMs = args.Double("bravo-ms", 2, 0, 10000);
            charlieMs = args.Double("charlie-ms", 4, 0, 10000);
            double selfLoad = args.Double("self-load", 0, 0, 10000);
            string[] selfLoadPaths = SelfLoadPaths(args);
            requestLines = !args.Has("no-request-lines");
            double? duration = args.DurationSeconds();
            Lifetime.Install();

            // Request workers block until their continuation has started elsewhere (StartRequest):
            // make sure there are enough workers for that without waiting for thread injection.
            int workers, ports;
            ThreadPool.GetMinThreads(out workers, out ports);
            ThreadPool.SetMinThreads(Math.Max(workers, MinThreads), Math.Max(ports, MinThreads));

            WebHost.RecordSpans("AsyncWeb", HostingStopped);
            WebApplication app = WebHost.Start(requestedPort, args, MapRoutes, out port);

            string baseUrl = "http://127.0.0.1:" + port.ToString(CultureInfo.InvariantCulture);
            load = new LoadGenerator(selfLoad, null,
                i => new HttpRequestMessage(HttpMethod.Get, baseUrl + selfLoadPaths[(int)(i % selfLoadPaths.Length)]));
            if (selfLoad > 0) load.Start();

            Out.Line(WebHost.Facts(Out.Ready("AsyncWeb"), port)
                .Add("endpoints", new Json()
                    .Add("/alpha", "AsyncWeb.Handlers.AlphaHot")
                    .Add("/bravo", "AsyncWeb.Handlers.BravoHot")
                    .Add("/charlie", "AsyncWeb.Handlers.CharlieOuterHot"))
                .Add("alpha_ms", alphaMs)
                .Add("bravo_ms", bravoMs)
                .Add("charlie_ms", charlieMs)
                .Add("activity_source", "AsyncWeb")
                .Add("spans", new[] { "AsyncWeb.Alpha", "AsyncWeb.Bravo", "AsyncWeb.Charlie", InnerSpanName })
                .Add("inner_spans", new Json().Add(InnerSpanName, new Json()
                    .Add("parent", "AsyncWeb.Charlie")
                    .Add("hot", "AsyncWeb.Handlers.CharlieInnerHot")))
                .Add("meter", "AsyncWeb")
                .Add("histogram", "asyncweb.request.duration")
                .Add("histogram_unit", "ms")
                .Add("counter", "asyncweb.requests")
                .Add("self_load_per_second", selfLoad)
                .Add("self_load_paths", selfLoadPaths)
                .Add("request_lines", requestLines));

            double elapsed = Lifetime.Run(duration, second => Out.Line(Totals(new Json().Add("progress", "AsyncWeb").Add("elapsed_s", second))));
            load.Join(2000);
            app.StopAsync().GetAwaiter().GetResult();
            Out.Line(Totals(new Json().Add("exit", "AsyncWeb").Add("elapsed_s", Math.Round(elapsed, 3))));
            ((IDisposable)app).Dispose();
            return 0;
        }

        /// <summary>The first middleware times the rest of the pipeline (inside ASP.NET Core's server
        /// span); each kind is an endpoint, anything else the fallback (404).</summary>
        static void MapRoutes(WebApplication app)
        {
            app.Use(async (context, next) =>
            {
                long start = Stopwatch.GetTimestamp();
                await next(context);
                Activity hosting = HostingSpan(context);
                if (hosting != null) hosting.SetCustomProperty(PipelineProperty, Elapsed(start));
            });
            foreach (string kind in Kinds)
            {
                string k = kind;
                app.MapGet("/" + k, context => StartRequest(context, k));
            }
            app.MapFallback(context => StartRequest(context, null));
        }

        /// <summary>ASP.NET Core's server span (HttpRequestIn) of CONTEXT.</summary>
        static Activity HostingSpan(HttpContext context)
        {
            IHttpActivityFeature feature = context.Features.Get<IHttpActivityFeature>();
            return feature != null ? feature.Activity : null;
        }

        /// <summary>Prints the hosting line of a request once ASP.NET Core has stopped its server span.</summary>
        static void HostingStopped(Activity activity)
        {
            if (!requestLines || activity.OperationName != WebHost.HostingActivity) return;
            object seq = activity.GetCustomProperty(RequestProperty);
            object pipelineMs = activity.GetCustomProperty(PipelineProperty);
            if (seq == null || pipelineMs == null) return;
            Out.Line(new Json()
                .Add("hosting", (long)seq)
                .Add("trace_id", activity.TraceId.ToHexString())
                .Add("hosting_span_id", activity.SpanId.ToHexString())
                .Add("pipeline_ms", Math.Round((double)pipelineMs, 3))
                .Add("hosting_duration_ms", Math.Round(activity.Duration.TotalMilliseconds, 4)));
        }

        /// <summary>--self-load-paths: "alpha,bravo" -> { "/alpha", "/bravo" }; each entry must be a kind.</summary>
        static string[] SelfLoadPaths(Args args)
        {
            string[] names = args.String("self-load-paths", "alpha,bravo").Split(',');
            var paths = new string[names.Length];
            for (int i = 0; i < names.Length; i++)
            {
                string name = names[i].Trim();
                if (Array.IndexOf(Kinds, name) < 0)
                    args.Fail("--self-load-paths: \"" + name + "\" is not one of alpha, bravo, charlie");
                paths[i] = "/" + name;
            }
            return paths;
        }

        static Json Totals(Json j)
        {
            return j.Add("requests", new Json()
                    .Add("alpha", Interlocked.Read(ref alphaCount))
                    .Add("bravo", Interlocked.Read(ref bravoCount))
                    .Add("charlie", Interlocked.Read(ref charlieCount))
                    .Add("none", Interlocked.Read(ref noneCount)))
                .Add("self_load", load.Totals());
        }

        /// <summary>The endpoint of every request. The thread-pool thread that starts the handler stays
        /// blocked until the handler's continuation after the await has started, so that continuation
        /// always resumes on another thread-pool thread (a guard of ResumeGuardMs bounds the wait).</summary>
        static Task StartRequest(HttpContext context, string kind)
        {
            long seq = Interlocked.Increment(ref requestSeq);
            var resumed = new ManualResetEventSlim(false);
            Task handler = HandleAsync(context, kind, seq, resumed);
            if (!handler.IsCompleted) HoldWorkerUntilResumed(resumed);
            return handler;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void HoldWorkerUntilResumed(ManualResetEventSlim resumed)
        {
            resumed.Wait(ResumeGuardMs);
        }

        static double Elapsed(long since)
        {
            return (Stopwatch.GetTimestamp() - since) * 1000.0 / Stopwatch.Frequency;
        }

        static string SpanName(string kind)
        {
            return kind == "alpha" ? "AsyncWeb.Alpha" : kind == "bravo" ? "AsyncWeb.Bravo" : "AsyncWeb.Charlie";
        }

        /// <summary>The hot method of a request kind (for /charlie: the outer span's).</summary>
        static void Hot(string kind, double ms)
        {
            if (kind == "alpha") Handlers.AlphaHot(ms);
            else if (kind == "bravo") Handlers.BravoHot(ms);
            else Handlers.CharlieOuterHot(ms);
        }

        static async Task HandleAsync(HttpContext context, string kind, long seq, ManualResetEventSlim resumed)
        {
            var start = Stopwatch.GetTimestamp();
            string path = context.Request.Path.ToString();
            int status = kind != null ? 200 : 404;
            string statusParam = context.Request.Query.TryGetValue("status", out var statusValues) ? statusValues.ToString() : null;
            int parsed;
            if (kind != null && statusParam != null && int.TryParse(statusParam, NumberStyles.Integer, CultureInfo.InvariantCulture, out parsed) &&
                parsed >= 100 && parsed <= 599)
                status = parsed;

            string traceparent = context.Request.Headers.TryGetValue("traceparent", out var parents) ? parents.ToString() : null;
            Activity hosting = HostingSpan(context);
            if (kind != null) hosting.SetCustomProperty(RequestProperty, seq);

            var line = new Json()
                .Add("request", seq)
                .Add("kind", kind)
                .Add("method", context.Request.Method)
                .Add("path", path)
                .Add("status", status)
                .Add("trace_id", hosting.TraceId.ToHexString());
            try
            {
                if (kind != null)
                {
                    double ms = kind == "alpha" ? alphaMs : kind == "bravo" ? bravoMs : charlieMs;
                    long spanStart = Stopwatch.GetTimestamp();
                    Activity span = Source.StartActivity(SpanName(kind), ActivityKind.Internal);
                    var tags = new Json();
                    if (span != null)
                    {
                        span.SetTag("asyncweb.kind", kind);
                        span.SetTag("asyncweb.request", seq);
                        span.SetTag("asyncweb.slow", ms > 10);
                        tags.Add("asyncweb.kind", kind)
                            .Add("asyncweb.request", seq.ToString())
                            .Add("asyncweb.slow", (ms > 10).ToString());
                    }
                    double? innerMs = null;
                    double? innerDurationMs = null;
                    try
                    {
                        // /charlie keeps half of its time for the inner span, after the await
                        double before = kind == "charlie" ? ms / 4 : ms / 2;
                        int tidBefore = Native.CurrentTid();
                        int threadBefore = Thread.CurrentThread.ManagedThreadId;
                        Hot(kind, before);
                        await Task.Delay(1);
                        resumed.Set();
                        int tidAfter = Native.CurrentTid();
                        int threadAfter = Thread.CurrentThread.ManagedThreadId;
                        string innerSpanId = null;
                        if (kind == "charlie")
                        {
                            long innerStart = Stopwatch.GetTimestamp();
                            double? innerDuration = null;
                            using (Activity inner = Source.StartActivity(InnerSpanName, ActivityKind.Internal))
                            {
                                if (inner != null) inner.SetTag("asyncweb.part", "inner");
                                Handlers.CharlieInnerHot(ms / 2);
                                innerSpanId = inner != null ? inner.SpanId.ToHexString() : null;
                                if (inner != null) inner.Stop();
                                innerDuration = inner != null ? (double?)inner.Duration.TotalMilliseconds : null;
                            }
                            innerMs = Elapsed(innerStart);
                            innerDurationMs = innerDuration;
                            Hot(kind, ms - before - ms / 2);
                        }
                        else
                        {
                            Hot(kind, ms - before);
                        }
                        line.Add("span_id", span != null ? span.SpanId.ToHexString() : null)
                            .Add("inner_span_id", innerSpanId)
                            .Add("hosting_span_id", hosting.SpanId.ToHexString())
                            .Add("parent_span_id", traceparent != null ? hosting.ParentSpanId.ToHexString() : null)
                            .Add("tid_before", tidBefore).Add("tid_after", tidAfter)
                            .Add("thread_before", threadBefore).Add("thread_after", threadAfter)
                            .Add("switched_thread", tidBefore != tidAfter);
                        if (span != null)
                        {
                            bool failed = status >= 500;
                            span.SetStatus(failed ? ActivityStatusCode.Error : ActivityStatusCode.Ok,
                                failed ? "status " + status.ToString(CultureInfo.InvariantCulture) : null);
                        }
                    }
                    finally
                    {
                        if (span != null) span.Dispose();
                    }
                    double spanMs = Elapsed(spanStart);
                    line.Add("span_kind", span != null ? span.Kind.ToString() : null)
                        .Add("hosting_kind", hosting.Kind.ToString())
                        .Add("span_tags", tags)
                        .Add("span_status", span != null ? span.Status.ToString() : null)
                        .Add("span_status_description", span != null ? span.StatusDescription : null)
                        .Add("span_ms", Math.Round(spanMs, 3))
                        .Add("inner_span_ms", innerMs.HasValue ? (object)Math.Round(innerMs.Value, 3) : null)
                        .Add("span_duration_ms", span != null ? (object)Math.Round(span.Duration.TotalMilliseconds, 4) : null)
                        .Add("inner_span_duration_ms", innerDurationMs.HasValue ? (object)Math.Round(innerDurationMs.Value, 4) : null);
                }
                else
                {
                    line.Add("span_id", null)
                        .Add("inner_span_id", null)
                        .Add("hosting_span_id", hosting.SpanId.ToHexString())
                        .Add("parent_span_id", traceparent != null ? hosting.ParentSpanId.ToHexString() : null)
                        .Add("tid_before", null).Add("tid_after", null)
                        .Add("thread_before", null).Add("thread_after", null)
                        .Add("switched_thread", null);
                }
            }
            catch (Exception e)
            {
                status = 500;
                line.Add("error", e.GetType().FullName + ": " + e.Message);
            }

            double durationMs = (Stopwatch.GetTimestamp() - start) * 1000.0 / Stopwatch.Frequency;
            var kindTag = new KeyValuePair<string, object>("kind", kind ?? "none");
            var statusTag = new KeyValuePair<string, object>("status", status);
            Duration.Record(durationMs, kindTag, statusTag);
            Requests.Add(1, kindTag, statusTag);
            if (kind == "alpha") Interlocked.Increment(ref alphaCount);
            else if (kind == "bravo") Interlocked.Increment(ref bravoCount);
            else if (kind == "charlie") Interlocked.Increment(ref charlieCount);
            else Interlocked.Increment(ref noneCount);

            line.Add("duration_ms", Math.Round(durationMs, 3));
            string text = line.ToString();
            if (requestLines) Out.Line(text);
            await WebHost.Respond(context, status, "application/json", text + "\n");
        }
    }
}
