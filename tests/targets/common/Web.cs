// Shared by the test-bed targets that serve HTTP (AsyncWeb, Bookstore); see tests/targets/README.md.
//
//   Testbed.Web.Hosting      STANDS IN FOR ASP.NET Core's hosting layer, which is not available here
//                            (no ASP.NET Core shared framework on any reachable registry): around each
//                            request it emits the same DiagnosticListener events ASP.NET Core's
//                            HostingApplicationDiagnostics emits — listener "Microsoft.AspNetCore",
//                            activity "Microsoft.AspNetCore.Hosting.HttpRequestIn" with its ".Start" and
//                            ".Stop" events (plus the older "Microsoft.AspNetCore.Hosting.BeginRequest"/
//                            "EndRequest" events), whose payload is an object shaped like ASP.NET Core's
//                            HttpContext for DiagnosticSource payload specs: TraceIdentifier,
//                            Request.{Scheme,Host,PathBase,Path,QueryString,Method,Protocol},
//                            Response.StatusCode. That is what dotnet-monitor's AspNetRequestCount /
//                            AspNetRequestDuration / AspNetResponseStatus triggers and dotnet-trace's
//                            "aspnet" filter read through Microsoft-Diagnostics-DiagnosticSource. The
//                            server span (the HttpRequestIn activity) is always created, from
//                            ActivitySource "Microsoft.AspNetCore" (or as a plain Activity when nothing
//                            listens), and honours an incoming W3C "traceparent" header like ASP.NET
//                            Core does.
//   Testbed.Web.Server       an HttpListener on 127.0.0.1 (a given port, or a free one found by
//                            probing: HttpListener cannot bind port 0) and its accept loop
//   Testbed.Web.LoadGenerator  N requests per second from a thread "SelfLoad" with HttpClient, the
//                            request i chosen by a function of i, at most 64 in flight (a saturated
//                            server makes it skip requests rather than queue them), optionally for a
//                            bounded number of seconds; counts sent/ok/failed
//
// Compiled with Mono's mcs against Mono's mscorlib and run on .NET 8 (C# 7, no Span).
using System;
using System.Diagnostics;
using System.Globalization;
using System.Net;
using System.Net.Http;
using System.Net.Sockets;
using System.Threading;
using System.Threading.Tasks;

namespace Testbed.Web
{
    // ---- stand-ins for ASP.NET Core's HttpContext, as DiagnosticSource payload specs see them ----

    public sealed class HostingHttpContext
    {
        public HostingHttpContext(string traceIdentifier, HostingRequest request, HostingResponse response)
        {
            TraceIdentifier = traceIdentifier;
            Request = request;
            Response = response;
        }

        /// <summary>The context ASP.NET Core would build for RAW, with a 200 response so far.</summary>
        public static HostingHttpContext For(HttpListenerContext raw, string traceIdentifier)
        {
            return new HostingHttpContext(
                traceIdentifier,
                new HostingRequest
                {
                    Scheme = raw.Request.Url.Scheme,
                    Host = raw.Request.Url.Authority,
                    PathBase = "",
                    Path = raw.Request.Url.AbsolutePath,
                    QueryString = raw.Request.Url.Query ?? "",
                    Method = raw.Request.HttpMethod,
                    Protocol = "HTTP/" + raw.Request.ProtocolVersion.ToString(2),
                },
                new HostingResponse { StatusCode = 200 });
        }

        public string TraceIdentifier { get; private set; }
        public HostingRequest Request { get; private set; }
        public HostingResponse Response { get; private set; }
    }

    public sealed class HostingRequest
    {
        public string Scheme { get; set; }
        public string Host { get; set; }        // "127.0.0.1:40123", as HostString.ToString()
        public string PathBase { get; set; }    // "", as PathString.ToString()
        public string Path { get; set; }        // "/alpha"
        public string QueryString { get; set; } // "" or "?status=500", as QueryString.ToString()
        public string Method { get; set; }
        public string Protocol { get; set; }    // "HTTP/1.1"
    }

    public sealed class HostingResponse
    {
        public int StatusCode { get; set; }
    }

    /// <summary>What ASP.NET Core's HostingApplicationDiagnostics does around each request.</summary>
    public static class Hosting
    {
        public const string ListenerName = "Microsoft.AspNetCore";
        public const string ActivityName = "Microsoft.AspNetCore.Hosting.HttpRequestIn";
        const string StartKey = ActivityName + ".Start";
        const string BeginRequestKey = "Microsoft.AspNetCore.Hosting.BeginRequest";
        const string EndRequestKey = "Microsoft.AspNetCore.Hosting.EndRequest";

        static readonly DiagnosticListener Diagnostics = new DiagnosticListener(ListenerName);
        static readonly ActivitySource Source = new ActivitySource(ListenerName);

        public sealed class State
        {
            public Activity Activity;
            public bool DiagnosticStarted;
            public long StartTimestamp;
        }

        /// <summary>W3C ids (forced), and an ActivityListener that records every span of the hosting
        /// source and of SOURCE, so that spans are really created, as an app with OpenTelemetry
        /// tracing has them.</summary>
        public static void RecordSpans(string source)
        {
            Activity.DefaultIdFormat = ActivityIdFormat.W3C;
            Activity.ForceDefaultIdFormat = true;
            ActivitySource.AddActivityListener(new ActivityListener
            {
                ShouldListenTo = s => s.Name == source || s.Name == ListenerName,
                Sample = SampleAll,
                SampleUsingParentId = SampleAllByParentId,
            });
        }

        static ActivitySamplingResult SampleAll(ref ActivityCreationOptions<ActivityContext> options)
        {
            return ActivitySamplingResult.AllDataAndRecorded;
        }

        static ActivitySamplingResult SampleAllByParentId(ref ActivityCreationOptions<string> options)
        {
            return ActivitySamplingResult.AllDataAndRecorded;
        }

        public static State BeginRequest(HostingHttpContext context, string traceparent)
        {
            var state = new State { StartTimestamp = Stopwatch.GetTimestamp() };
            bool enabled = Diagnostics.IsEnabled();
            // ASP.NET Core asks IsEnabled(ActivityName, httpContext) before creating the activity when
            // DiagnosticListener subscribers exist; the answer does not change what this stand-in does.
            if (enabled) Diagnostics.IsEnabled(ActivityName, context);

            Activity activity = traceparent != null
                ? Source.CreateActivity(ActivityName, ActivityKind.Server, traceparent)
                : Source.CreateActivity(ActivityName, ActivityKind.Server);
            if (activity == null)
            {
                activity = new Activity(ActivityName);
                if (traceparent != null) activity.SetParentId(traceparent);
            }
            if (enabled && Diagnostics.IsEnabled(StartKey))
            {
                Diagnostics.StartActivity(activity, context); // Start(), then writes ".Start"
                state.DiagnosticStarted = true;
            }
            else
            {
                activity.Start();
            }
            state.Activity = activity;
            if (enabled && Diagnostics.IsEnabled(BeginRequestKey))
                Diagnostics.Write(BeginRequestKey, new { httpContext = context, timestamp = state.StartTimestamp });
            return state;
        }

        public static void EndRequest(State state, HostingHttpContext context)
        {
            long now = Stopwatch.GetTimestamp();
            if (Diagnostics.IsEnabled() && Diagnostics.IsEnabled(EndRequestKey))
                Diagnostics.Write(EndRequestKey, new { httpContext = context, timestamp = now });
            if (state.DiagnosticStarted)
                Diagnostics.StopActivity(state.Activity, context); // sets the end time, writes ".Stop", Stop()
            else
                state.Activity.Stop();
        }
    }

    public static class Server
    {
        /// <summary>Starts an HttpListener on 127.0.0.1:REQUESTED, or on a free port: HttpListener cannot
        /// bind port 0, so ask the kernel for a free port with a TcpListener and retry if it is taken by
        /// the time HttpListener binds it. A port that cannot be bound fails ARGS (exit 2).</summary>
        public static HttpListener Listen(int requested, Args args, out int port)
        {
            for (int attempt = 0; ; attempt++)
            {
                int p = requested;
                if (p == 0)
                {
                    var probe = new TcpListener(IPAddress.Loopback, 0);
                    probe.Start();
                    p = ((IPEndPoint)probe.LocalEndpoint).Port;
                    probe.Stop();
                }
                var http = new HttpListener();
                http.Prefixes.Add("http://127.0.0.1:" + p.ToString(CultureInfo.InvariantCulture) + "/");
                try
                {
                    http.Start();
                    port = p;
                    return http;
                }
                catch (HttpListenerException e)
                {
                    http.Close();
                    if (requested != 0 || attempt >= 20)
                    {
                        args.Fail("cannot listen on 127.0.0.1:" + p + ": " + e.Message);
                        throw;
                    }
                }
            }
        }

        /// <summary>Starts a background thread "HttpAccept" that hands each request, with its sequence
        /// number (1, 2, ...), to HANDLE on the thread pool until Lifetime.Stopping.</summary>
        public static Thread StartAccepting(HttpListener http, Action<HttpListenerContext, long> handle)
        {
            var accept = new Thread(() =>
            {
                long seq = 0;
                while (!Lifetime.Stopping)
                {
                    HttpListenerContext raw;
                    try
                    {
                        raw = http.GetContext();
                    }
                    catch (Exception)
                    {
                        if (Lifetime.Stopping || !http.IsListening) return;
                        continue;
                    }
                    long n = ++seq;
                    ThreadPool.QueueUserWorkItem(_ => handle(raw, n));
                }
            }) { Name = "HttpAccept", IsBackground = true };
            accept.Start();
            return accept;
        }

        /// <summary>Answers RAW with STATUS and BODY; a client that went away is not an error.</summary>
        public static void Respond(HttpListenerContext raw, int status, string contentType, byte[] body)
        {
            try
            {
                raw.Response.StatusCode = status;
                raw.Response.ContentType = contentType;
                raw.Response.ContentLength64 = body.Length;
                raw.Response.OutputStream.Write(body, 0, body.Length);
                raw.Response.Close();
            }
            catch (Exception)
            {
                // the client went away
            }
        }
    }

    /// <summary>The built-in load generator of the HTTP targets.</summary>
    public sealed class LoadGenerator
    {
        const int MaxInFlight = 64;

        readonly double perSecond;
        readonly double? seconds;
        readonly Func<long, HttpRequestMessage> request;
        long sent, ok, failed;
        Thread thread;

        /// <param name="perSecond">requests per second</param>
        /// <param name="seconds">stop sending after this many seconds (null: until the target stops)</param>
        /// <param name="request">the request number i (0, 1, ...) to send</param>
        public LoadGenerator(double perSecond, double? seconds, Func<long, HttpRequestMessage> request)
        {
            this.perSecond = perSecond;
            this.seconds = seconds;
            this.request = request;
        }

        public void Start()
        {
            thread = new Thread(Run) { Name = "SelfLoad", IsBackground = true };
            thread.Start();
        }

        public void Join(int timeoutMs)
        {
            if (thread != null) thread.Join(timeoutMs);
        }

        /// <summary>{"sent":N,"ok":N,"failed":N} so far.</summary>
        public Json Totals()
        {
            return new Json()
                .Add("sent", Interlocked.Read(ref sent))
                .Add("ok", Interlocked.Read(ref ok))
                .Add("failed", Interlocked.Read(ref failed));
        }

        void Run()
        {
            var client = new HttpClient { Timeout = TimeSpan.FromSeconds(10) };
            var inFlight = new SemaphoreSlim(MaxInFlight);
            var sw = Stopwatch.StartNew();
            long next = 0;
            while (!Lifetime.Stopping && !(seconds.HasValue && sw.Elapsed.TotalSeconds >= seconds.Value))
            {
                long due = (long)(sw.Elapsed.TotalSeconds * perSecond) + 1;
                if (due - next > perSecond + 1) next = due - (long)perSecond - 1;
                while (next < due && !Lifetime.Stopping)
                {
                    if (!inFlight.Wait(0)) { next = due; break; } // saturated: skip rather than queue up
                    HttpRequestMessage message = request(next);
                    next++;
                    Interlocked.Increment(ref sent);
                    client.SendAsync(message).ContinueWith(t =>
                    {
                        if (t.Status == TaskStatus.RanToCompletion && t.Result.IsSuccessStatusCode) Interlocked.Increment(ref ok);
                        else Interlocked.Increment(ref failed);
                        if (t.Status == TaskStatus.RanToCompletion) t.Result.Dispose();
                        message.Dispose();
                        inFlight.Release();
                    });
                }
                double waitMs = (next / perSecond - sw.Elapsed.TotalSeconds) * 1000.0;
                if (waitMs > 0) Lifetime.StopHandle.WaitOne(Math.Max(1, (int)Math.Ceiling(waitMs)));
            }
        }
    }
}
