// StorefrontLoad: drives a Storefront (../Storefront) at a known rate, open loop, and says every second
// what it sent, what came back, how long it took and what failed: the ground truth for request rates,
// latencies and errors that later tests hold clrscope's (and the OpenTelemetry SDK's) figures against.
//
// What it does
//   Request i is due at i/--rps seconds after the start, whether or not earlier ones have answered
//   (open loop: a slow service does not slow the offered load). It is sent then by thread
//   "LoadScheduler", unless --max-in-flight requests are already outstanding: then it is skipped and
//   counted. Routes are interleaved by weight (smooth weighted round robin: the same sequence every run)
//   and each request's parameters follow from i, the number of requests of its route before it:
//     catalog    GET  /api/products?q=WORD          (lamp, kettle, kitchen, audio, bottle in turn)
//     product    GET  /api/products/P               P = 1 + 7i mod --products
//     cart       POST /api/cart/items?cart=i%50&product=P&quantity=1
//     checkout   POST /api/orders {"productId":P,"quantity":1+i%3,"coupon":SAVE10 every 5th, else null}
//     recommend  GET  /api/recommendations?product=P
//     coupon     GET  /api/coupons/CODE             (SAVE10, SAVE20, WELCOME, EXPIRED in turn: EXPIRED is a 404)
//     report     GET  /api/reports/sales
//     health     GET  /health
//     grpc       gRPC storefront.v1.Catalog/GetProduct {id:P} at --grpc-target
//   Every request carries a W3C traceparent of its own (a random trace id and parent span id, sampled),
//   so the service's spans of that request have a trace id this generator knows (see --request-lines).
//   Latency: from the send to the last byte of the answer (the time a request waited for a free slot
//   in this process is "late_ms", reported apart).
//
// Arguments
//   --target URL           the Storefront's HTTP base URL (required)
//   --grpc-target URL      its gRPC URL (the ready line's grpc_url); needed by the grpc route
//   --rps N                requests per second (default 50)
//   --mix LIST             route:weight,... (default catalog:4,product:4,cart:2,checkout:2,recommend:1,coupon:1,report:1)
//   --products N           product ids used, 1..N (default 200, the Storefront's default)
//   --max-in-flight N      outstanding requests at most (default 256)
//   --timeout-ms MS        a request's timeout (default 10000)
//   --request-lines        one JSON line per finished request
//   --duration-seconds N   send for N seconds, wait for what is outstanding (at most --timeout-ms), exit 0
//
// Lines on stdout (JSON)
//   ready: {"ready":"StorefrontLoad","pid":…,"runtime":…,"target":…,"grpc_target":…,"rps":50,"mix":{route:weight},
//           "products":200,"max_in_flight":256,"timeout_ms":10000,"threads":[{"name":"LoadScheduler","tid":…}]}
//   every second, about the second just ended (requests by when they were due; answers by when they came):
//     {"progress":"StorefrontLoad","elapsed_s":N,"sent":…,"skipped":…,"completed":…,"ok":…,"failed":…,
//      "status":{"200":…,"404":…,"500":…},"errors":{"timeout":…,"connection":…,"grpc_NotFound":…},
//      "latency_ms":{"p50":…,"p90":…,"p99":…,"max":…},"late_ms_max":…,"in_flight":…,
//      "routes":{route:{"sent":…,"completed":…,"failed":…,"p50":…,"p99":…}}}
//     ok: answered with a status below 500 (a 404 for an unknown coupon is the service working); failed:
//     a 5xx, a gRPC error, a timeout or a connection error. Percentiles: nearest rank; null without answers.
//   per request (--request-lines): {"request":i,"route":…,"status":200|null,"error":null|"timeout"|…,
//     "latency_ms":…,"trace_id":…,"parent_span_id":…,"sent_unix_nano":…}
//   at exit: {"exit":"StorefrontLoad","elapsed_s":…, the same fields over the whole run,
//     "rate":{"target":50,"achieved":49.98}}
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.Linq;
using System.Net.Http;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using Grpc.Core;
using Grpc.Net.Client;
using Storefront.Grpc;
using Testbed;

namespace StorefrontLoad
{
    /// <summary>What came back for one request.</summary>
    sealed class Outcome
    {
        public string Route;
        public int? Status;
        public string Error;
        public double LatencyMs;
        public double LateMs;
        public bool Failed => Error != null || Status >= 500;
    }

    /// <summary>Requests sent and answers received over one span (a second, or the whole run).</summary>
    sealed class Window
    {
        public readonly Dictionary<string, long> Sent = new Dictionary<string, long>();
        public long Skipped;
        public readonly List<Outcome> Outcomes = new List<Outcome>();

        public Json AddTo(Json line, long inFlight)
        {
            var status = new SortedDictionary<string, long>(StringComparer.Ordinal);
            var errors = new SortedDictionary<string, long>(StringComparer.Ordinal);
            foreach (Outcome o in Outcomes)
            {
                if (o.Status.HasValue) Bump(status, o.Status.Value.ToString(CultureInfo.InvariantCulture));
                if (o.Error != null) Bump(errors, o.Error);
            }
            var routes = new Json();
            foreach (string route in Sent.Keys.Concat(Outcomes.Select(o => o.Route)).Distinct().OrderBy(r => r, StringComparer.Ordinal))
            {
                List<Outcome> mine = Outcomes.Where(o => o.Route == route).ToList();
                double[] latencies = Sorted(mine);
                routes.Add(route, new Json().Add("sent", Sent.TryGetValue(route, out long s) ? s : 0).Add("completed", mine.Count)
                    .Add("failed", mine.Count(o => o.Failed)).Add("p50", Percentile(latencies, 50)).Add("p99", Percentile(latencies, 99)));
            }
            double[] all = Sorted(Outcomes);
            return line
                .Add("sent", Sent.Values.Sum()).Add("skipped", Skipped).Add("completed", Outcomes.Count)
                .Add("ok", Outcomes.Count(o => !o.Failed)).Add("failed", Outcomes.Count(o => o.Failed))
                .Add("status", status).Add("errors", errors)
                .Add("latency_ms", new Json().Add("p50", Percentile(all, 50)).Add("p90", Percentile(all, 90))
                    .Add("p99", Percentile(all, 99)).Add("max", all.Length == 0 ? (double?)null : all[all.Length - 1]))
                .Add("late_ms_max", Outcomes.Count == 0 ? 0 : Math.Round(Outcomes.Max(o => o.LateMs), 3))
                .Add("in_flight", inFlight)
                .Add("routes", routes);
        }

        static void Bump(IDictionary<string, long> d, string key) { d[key] = d.TryGetValue(key, out long n) ? n + 1 : 1; }

        static double[] Sorted(IEnumerable<Outcome> outcomes)
        {
            double[] l = outcomes.Select(o => o.LatencyMs).ToArray();
            Array.Sort(l);
            return l;
        }

        /// <summary>Nearest-rank percentile of SORTED, or null if empty.</summary>
        static double? Percentile(double[] sorted, double p)
        {
            if (sorted.Length == 0) return null;
            int rank = (int)Math.Ceiling(p / 100 * sorted.Length);
            return Math.Round(sorted[Math.Clamp(rank, 1, sorted.Length) - 1], 3);
        }
    }

    static class Program
    {
        const string Usage =
            "usage: StorefrontLoad --target URL [--grpc-target URL] [--rps N] [--mix route:weight,...] [--products N]\n" +
            "                      [--max-in-flight N] [--timeout-ms MS] [--request-lines] [--duration-seconds N]";

        static readonly string[] Routes = { "catalog", "product", "cart", "checkout", "recommend", "coupon", "report", "health", "grpc" };
        static readonly string[] Words = { "lamp", "kettle", "kitchen", "audio", "bottle" };
        static readonly string[] Coupons = { "SAVE10", "SAVE20", "WELCOME", "EXPIRED" };

        static readonly object Gate = new object();
        static Window second = new Window();
        static readonly Window total = new Window();
        static long inFlight;
        static HttpClient http;
        static Catalog.CatalogClient grpc;
        static bool requestLines;
        static int products;

        static int Main(string[] argv)
        {
            var a = new Args("StorefrontLoad", Usage, argv,
                new[] { "target", "grpc-target", "rps", "mix", "products", "max-in-flight", "timeout-ms" }, new[] { "request-lines" });
            string target = a.String("target", null);
            if (target == null) a.Fail("--target is required");
            if (!target.EndsWith('/')) target += "/";
            string grpcTarget = a.String("grpc-target", null);
            double rps = a.Double("rps", 50, 0.01, 100_000);
            products = a.Int("products", 200, 1, 1_000_000);
            int maxInFlight = a.Int("max-in-flight", 256, 1, 100_000);
            int timeoutMs = a.Int("timeout-ms", 10_000, 1, 3_600_000);
            requestLines = a.Has("request-lines");
            KeyValuePair<string, int>[] mix = ParseMix(a, a.String("mix", "catalog:4,product:4,cart:2,checkout:2,recommend:1,coupon:1,report:1"));
            if (mix.Any(m => m.Key == "grpc") && grpcTarget == null) a.Fail("the grpc route needs --grpc-target");
            double? duration = a.DurationSeconds();
            Lifetime.Install();

            http = new HttpClient(new SocketsHttpHandler
            {
                MaxConnectionsPerServer = maxInFlight,
                // The traceparent is this generator's own, not one the runtime would derive from an Activity.
                ActivityHeadersPropagator = null,
            }) { BaseAddress = new Uri(target), Timeout = TimeSpan.FromMilliseconds(timeoutMs) };
            if (grpcTarget != null)
            {
                GrpcChannel channel = GrpcChannel.ForAddress(grpcTarget, new GrpcChannelOptions
                {
                    HttpHandler = new SocketsHttpHandler { EnableMultipleHttp2Connections = true, ActivityHeadersPropagator = null },
                });
                grpc = new Catalog.CatalogClient(channel);
            }

            int schedulerTid = 0;
            using var started = new ManualResetEventSlim();
            var clock = Stopwatch.StartNew();
            var scheduler = new Thread(() =>
            {
                schedulerTid = Native.CurrentTid();
                started.Set();
                Schedule(clock, rps, mix, maxInFlight, timeoutMs);
            }) { Name = "LoadScheduler", IsBackground = true };

            var mixJson = new Json();
            foreach (KeyValuePair<string, int> m in mix) mixJson.Add(m.Key, m.Value);
            scheduler.Start();
            started.Wait();
            Out.Line(Out.Ready("StorefrontLoad").Add("target", target).Add("grpc_target", grpcTarget).Add("rps", rps)
                .Add("mix", mixJson).Add("products", products).Add("max_in_flight", maxInFlight).Add("timeout_ms", timeoutMs)
                .Add("threads", new[] { new Json().Add("name", "LoadScheduler").Add("tid", schedulerTid) }));

            double elapsed = Lifetime.Run(duration, n =>
            {
                Window ended;
                lock (Gate)
                {
                    ended = second;
                    second = new Window();
                }
                Out.Line(ended.AddTo(new Json().Add("progress", "StorefrontLoad").Add("elapsed_s", n), Interlocked.Read(ref inFlight)));
            });
            scheduler.Join();
            // What is still outstanding gets its answer or its timeout.
            var drain = Stopwatch.StartNew();
            while (Interlocked.Read(ref inFlight) > 0 && drain.ElapsedMilliseconds < timeoutMs + 1000) Thread.Sleep(10);
            lock (Gate)
            {
                long sent = total.Sent.Values.Sum();
                Out.Line(total.AddTo(new Json().Add("exit", "StorefrontLoad").Add("elapsed_s", Math.Round(elapsed, 3)), Interlocked.Read(ref inFlight))
                    .Add("rate", new Json().Add("target", rps).Add("achieved", Math.Round(sent / elapsed, 3))));
            }
            return 0;
        }

        static KeyValuePair<string, int>[] ParseMix(Args a, string text)
        {
            var mix = new List<KeyValuePair<string, int>>();
            foreach (string item in text.Split(',', StringSplitOptions.RemoveEmptyEntries | StringSplitOptions.TrimEntries))
            {
                string[] parts = item.Split(':');
                if (parts.Length != 2 || !Routes.Contains(parts[0]) || !int.TryParse(parts[1], NumberStyles.Integer, CultureInfo.InvariantCulture, out int w) || w < 0)
                    a.Fail("--mix: '" + item + "' is not route:weight with a route of " + string.Join(", ", Routes) + " and a weight >= 0");
                mix.Add(new KeyValuePair<string, int>(parts[0], int.Parse(parts[1], CultureInfo.InvariantCulture)));
            }
            if (mix.Sum(m => m.Value) == 0) a.Fail("--mix has no route with a weight above 0");
            return mix.Where(m => m.Value > 0).ToArray();
        }

        /// <summary>The scheduler: request i due at i/RPS, routes by smooth weighted round robin.</summary>
        static void Schedule(Stopwatch clock, double rps, KeyValuePair<string, int>[] mix, int maxInFlight, int timeoutMs)
        {
            var credit = new int[mix.Length];
            var sequence = new long[mix.Length]; // each route's own count: its parameters follow from it
            int weights = mix.Sum(m => m.Value);
            for (long i = 0; !Lifetime.Stopping; i++)
            {
                double due = i / rps;
                double wait = due - clock.Elapsed.TotalSeconds;
                if (wait > 0 && Lifetime.StopHandle.WaitOne(TimeSpan.FromSeconds(wait))) break;
                if (Lifetime.Stopping) break;
                int pick = 0;
                for (int r = 0; r < mix.Length; r++)
                {
                    credit[r] += mix[r].Value;
                    if (credit[r] > credit[pick]) pick = r;
                }
                credit[pick] -= weights;
                string route = mix[pick].Key;
                lock (Gate)
                {
                    if (Interlocked.Read(ref inFlight) >= maxInFlight)
                    {
                        second.Skipped++;
                        total.Skipped++;
                        continue;
                    }
                    Count(second.Sent, route);
                    Count(total.Sent, route);
                }
                Interlocked.Increment(ref inFlight);
                double lateMs = Math.Max(0, (clock.Elapsed.TotalSeconds - due) * 1000);
                _ = Send(i, sequence[pick]++, route, lateMs, timeoutMs);
            }
        }

        static void Count(Dictionary<string, long> d, string route) { d[route] = d.TryGetValue(route, out long n) ? n + 1 : 1; }

        /// <summary>Request I of the run, the Kth of ROUTE.</summary>
        static async Task Send(long i, long k, string route, double lateMs, int timeoutMs)
        {
            ActivityTraceId traceId = ActivityTraceId.CreateRandom();
            ActivitySpanId parent = ActivitySpanId.CreateRandom();
            string traceparent = "00-" + traceId.ToHexString() + "-" + parent.ToHexString() + "-01";
            long sentUnixNano = (DateTime.UtcNow - DateTime.UnixEpoch).Ticks * 100;
            var outcome = new Outcome { Route = route, LateMs = lateMs };
            long start = Stopwatch.GetTimestamp();
            try
            {
                if (route == "grpc")
                {
                    await grpc.GetProductAsync(new GetProductRequest { Id = Product(k) },
                        new Metadata { { "traceparent", traceparent } }, DateTime.UtcNow.AddMilliseconds(timeoutMs));
                    outcome.Status = 200;
                }
                else
                {
                    using HttpRequestMessage request = Request(k, route);
                    request.Headers.Add("traceparent", traceparent);
                    using HttpResponseMessage response = await http.SendAsync(request, HttpCompletionOption.ResponseContentRead);
                    outcome.Status = (int)response.StatusCode;
                }
            }
            catch (RpcException e)
            {
                outcome.Error = e.StatusCode == StatusCode.DeadlineExceeded ? "timeout" : "grpc_" + e.StatusCode;
            }
            catch (TaskCanceledException)
            {
                outcome.Error = "timeout";
            }
            catch (HttpRequestException)
            {
                outcome.Error = "connection";
            }
            outcome.LatencyMs = Stopwatch.GetElapsedTime(start).TotalMilliseconds;
            lock (Gate)
            {
                second.Outcomes.Add(outcome);
                total.Outcomes.Add(outcome);
            }
            Interlocked.Decrement(ref inFlight);
            if (requestLines)
                Out.Line(new Json().Add("request", i).Add("route", route).Add("status", outcome.Status).Add("error", outcome.Error)
                    .Add("latency_ms", Math.Round(outcome.LatencyMs, 3)).Add("trace_id", traceId.ToHexString())
                    .Add("parent_span_id", parent.ToHexString()).Add("sent_unix_nano", sentUnixNano));
        }

        static long Product(long i) { return 1 + i * 7 % products; }

        /// <summary>The Ith request of ROUTE.</summary>
        static HttpRequestMessage Request(long i, string route)
        {
            long p = Product(i);
            string s(long v) => v.ToString(CultureInfo.InvariantCulture);
            switch (route)
            {
                case "catalog": return new HttpRequestMessage(HttpMethod.Get, "api/products?q=" + Words[i % Words.Length]);
                case "product": return new HttpRequestMessage(HttpMethod.Get, "api/products/" + s(p));
                case "cart": return new HttpRequestMessage(HttpMethod.Post, "api/cart/items?cart=" + s(i % 50) + "&product=" + s(p) + "&quantity=1");
                case "checkout":
                    string coupon = i % 5 == 0 ? "\"SAVE10\"" : "null";
                    return new HttpRequestMessage(HttpMethod.Post, "api/orders")
                    {
                        Content = new StringContent("{\"productId\":" + s(p) + ",\"quantity\":" + s(1 + i % 3) + ",\"coupon\":" + coupon + "}",
                            Encoding.UTF8, "application/json"),
                    };
                case "recommend": return new HttpRequestMessage(HttpMethod.Get, "api/recommendations?product=" + s(p));
                case "coupon": return new HttpRequestMessage(HttpMethod.Get, "api/coupons/" + Coupons[i % Coupons.Length]);
                case "report": return new HttpRequestMessage(HttpMethod.Get, "api/reports/sales");
                default: return new HttpRequestMessage(HttpMethod.Get, "health");
            }
        }
    }
}
