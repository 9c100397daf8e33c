// Storefront: an ASP.NET Core sample service a user would recognise — minimal APIs and gRPC on
// Kestrel, the default host and its logging, HttpClient and gRPC calls to a second instance of itself,
// a database (PostgreSQL through Npgsql, or SQLite) — with its own spans and metrics made by the
// runtime's APIs only, and known behaviour to find, switchable at run time. Built twice from these
// sources: Storefront (no telemetry SDK) and StorefrontOtel (the OpenTelemetry .NET SDK inside,
// exporting OTLP; ../StorefrontOtel). tests/targets/README.md has the contract; this is the detail.
//
// Roles (--role): a "frontend" serves the shop and, for each order, asks a "downstream" instance
// (--downstream, --downstream-grpc; default: itself) for stock over gRPC and reserves it over HTTP.
// Every instance serves every route; the roles differ only in who calls whom.
//
// Routes (HTTP/1.1 on --port; gRPC needs HTTP/2, which Kestrel offers without TLS only on an endpoint
// of its own, so gRPC is on --grpc-port). Label (request lines, counts) then route:
//   health        GET  /health                       "ok"
//   catalog       GET  /api/products[?q=TEXT]        up to 20 products whose name or category holds TEXT (database)
//   product       GET  /api/products/{id}            one product and its price after DiscountRules.Evaluate; 404
//   cart          POST /api/cart/items?cart=C&product=P[&quantity=N]   CartStore.AddItem under the carts' lock
//   checkout      POST /api/orders {"productId":P,"quantity":N,"coupon":null}   price, stock check (gRPC) and
//                                                    reservation (HTTP) at the downstream, the order row, metrics, a log line
//   recommend     GET  /api/recommendations?product=P   five similar products; burns hot_ms of CPU
//   coupon        GET  /api/coupons/{code}           percent off (SAVE10, SAVE20, WELCOME) or 404; every
//                                                    exception_every-th lookup (checkouts with a coupon look up
//                                                    too) throws CouponServiceException (500)
//   report        GET  /api/reports/sales            a sales report of report_rows rows built as objects
//   reserve       POST /api/inventory/reserve {"productId":P,"quantity":N}   the downstream's reservation:
//                                                    inventory_delay_ms, every inventory_tail_every-th inventory_tail_ms
//   grpc.catalog  gRPC storefront.v1.Catalog/GetProduct      grpc.inventory  gRPC storefront.v1.Inventory/CheckStock
//   admin         GET /admin/behaviour, POST /admin/behaviour?k=v&…  (the knobs; a bad one: 400), GET /admin/stats
//
// Behaviour knobs (Behaviour.cs; `--behaviour k=v,…` at start, POST /admin/behaviour while running):
//   hot_ms (2)  regression (off)  regression_ms (2)  exception_every (0)  report_rows (200)  lock_hold_ms (0)
//   lock_period_ms (20)  inventory_delay_ms (2)  inventory_tail_ms (0)  inventory_tail_every (10)
//
// Arguments
//   --role frontend|downstream   (default frontend)
//   --port P, --grpc-port Q      (default: free ports)
//   --downstream URL             the downstream's HTTP base URL (default: this instance)
//   --downstream-grpc URL        the downstream's gRPC URL (default: this instance)
//   --postgres CONNSTRING        PostgreSQL (Npgsql connection string), else SQLite:
//   --sqlite PATH                the SQLite file (default $TMPDIR/storefront-PID.db; removed at start and at exit,
//                                and those of instances no longer running when this one starts)
//   --products N                 products in the catalogue (default 200)
//   --behaviour k=v,…            initial knobs
//   --request-lines              one JSON line per request
//   --otlp-endpoint URL, --otlp-protocol grpc|http/protobuf   StorefrontOtel only (else OTEL_EXPORTER_OTLP_*)
//   --duration-seconds N
//
// Logging: the default host's providers (console, debug, EventSource; StorefrontOtel adds OpenTelemetry's),
// levels from appsettings.json; the console provider writes to stderr (stdout is for the lines below).
//
// Lines on stdout (JSON, one per line)
//   ready: {"ready":"Storefront","pid":…,"runtime":"10.0.12","role":"frontend","port":…,"url":"http://127.0.0.1:P/",
//           "grpc_port":…,"grpc_url":…,"downstream":{"http":…,"grpc":…,"self":true},"database":{"kind":"sqlite",
//           "server_version":…,"location":…},"assemblies":{…},"logger_providers":[…],"routes":{label:"METHOD path"},
//           "behaviour":{knobs},"behaviours":{where each lives, by name},"activity_source":"Storefront",
//           "meter":"Storefront","instruments":{…},"spans":[…],"threads":[{"name":"CartJanitor","tid":…}],
//           "tid_source":"gettid","request_lines":false,"opentelemetry":null|{…}}
//   per request (--request-lines), once the response is done:
//     {"request":N,"route":"checkout","method":"POST","path":"/api/orders","status":200,"duration_ms":12.3,
//      "trace_id":…,"span_id":… (the server span, Activity.Current in the middleware),"parent_span_id":… (the caller's),
//      "app_span_id":… (the route's own Storefront span, null when nothing listens to the source),"tid":…}
//   when the knobs change: {"behaviour":{knobs},"changed":{k:v},"unix_nano":…}
//   every second: {"progress":"Storefront","elapsed_s":N, counts…}; at exit {"exit":"Storefront","elapsed_s":…, counts…}
//   counts: "requests":{label:{"count","2xx","3xx","4xx","5xx"}},"orders_placed","reservations","slow_reservations",
//           "stock_checks","downstream_calls","downstream_failures","db_queries","coupon_exceptions","report_rows",
//           "pricing_evaluations","cart_items_added","janitor_compactions","hot_cpu_ms", and the runtime's
//           "lock_contentions" (Monitor.LockContentionCount),"allocated_bytes","gc_collections","exceptions_thrown"
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Net;
using System.Reflection;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Server.Kestrel.Core;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Hosting;
using Microsoft.Extensions.Logging;
using Storefront.Carts;
using Storefront.Catalog;
using Storefront.Data;
using Storefront.Inventory;
using Storefront.Ordering;
using Storefront.Pricing;
using Storefront.Recommendations;
using Storefront.Reports;
using Testbed;

namespace Storefront
{
    /// <summary>An endpoint's label in request lines and counts.</summary>
    public sealed record RouteLabel(string Name);

    public sealed class StorefrontOptions
    {
        public string Role;
        public int Port, GrpcPort, Products;
        public Uri Downstream, DownstreamGrpc;
        public string Postgres, SqlitePath, OtlpEndpoint, OtlpProtocol;
        public bool RequestLines;
        public double? Duration;

        public const string Usage =
            "usage: Storefront [--role frontend|downstream] [--port P] [--grpc-port Q] [--downstream URL] [--downstream-grpc URL]\n" +
            "                  [--postgres CONNSTRING | --sqlite PATH] [--products N] [--behaviour k=v,...] [--request-lines]\n" +
            "                  [--otlp-endpoint URL] [--otlp-protocol grpc|http/protobuf] [--duration-seconds N]";

        public static StorefrontOptions Parse(string name, string[] argv)
        {
            var a = new Args(name, Usage, argv,
                new[] { "role", "port", "grpc-port", "downstream", "downstream-grpc", "postgres", "sqlite", "products", "behaviour", "otlp-endpoint", "otlp-protocol" },
                new[] { "request-lines" });
            var o = new StorefrontOptions
            {
                Role = a.String("role", "frontend"),
                Port = a.Int("port", 0, 0, 65535),
                GrpcPort = a.Int("grpc-port", 0, 0, 65535),
                Products = a.Int("products", 200, 1, 1_000_000),
                Postgres = a.String("postgres", null),
                SqlitePath = a.String("sqlite", Store.DefaultSqlitePath(Out.Pid)),
                OtlpEndpoint = a.String("otlp-endpoint", null),
                OtlpProtocol = a.String("otlp-protocol", null),
                RequestLines = a.Has("request-lines"),
                Duration = a.DurationSeconds(),
            };
            if (o.Role != "frontend" && o.Role != "downstream") a.Fail("--role must be frontend or downstream, not '" + o.Role + "'");
            if (a.Has("postgres") && a.Has("sqlite")) a.Fail("--postgres and --sqlite exclude each other");
            if (!a.Has("postgres") && !a.Has("sqlite")) Store.RemoveDeadInstancesFiles();
            o.Downstream = Url(a, "downstream");
            o.DownstreamGrpc = Url(a, "downstream-grpc");
#if !STOREFRONT_OTEL
            if (o.OtlpEndpoint != null || o.OtlpProtocol != null)
                a.Fail("this build has no telemetry SDK: --otlp-endpoint and --otlp-protocol are StorefrontOtel's");
#endif
            try
            {
                Behaviour.Set(Behaviour.Current.WithList(a.String("behaviour", "")));
            }
            catch (ArgumentException e)
            {
                a.Fail("--behaviour: " + e.Message);
            }
            return o;
        }

        static Uri Url(Args a, string name)
        {
            string text = a.String(name, null);
            if (text == null) return null;
            if (!Uri.TryCreate(text.EndsWith('/') ? text : text + "/", UriKind.Absolute, out Uri uri) || uri.Scheme != "http")
                a.Fail("--" + name + " must be an http:// URL, not '" + text + "'");
            return uri;
        }
    }

    public static partial class Program
    {
        static long firstChanceExceptions;
        static long requestNumber;

        /// <summary>Exceptions the runtime raised in this process so far (first chance, handled or not).</summary>
        public static long FirstChanceExceptions => Interlocked.Read(ref firstChanceExceptions);

        public static int Main(string[] argv)
        {
            string name = Assembly.GetEntryAssembly().GetName().Name;
            StorefrontOptions options = StorefrontOptions.Parse(name, argv);
            Lifetime.Install();
            AppDomain.CurrentDomain.FirstChanceException += (_, _) => Interlocked.Increment(ref firstChanceExceptions);

            WebApplicationBuilder builder = WebApplication.CreateBuilder(new WebApplicationOptions
            {
                Args = Array.Empty<string>(), // the arguments are ours, not configuration
                ContentRootPath = AppContext.BaseDirectory, // appsettings.json beside the dll, whatever the cwd
            });
            ListenOptions http = null, grpc = null;
            builder.WebHost.ConfigureKestrel(kestrel =>
            {
                kestrel.Listen(IPAddress.Loopback, options.Port, l => { l.Protocols = HttpProtocols.Http1; http = l; });
                kestrel.Listen(IPAddress.Loopback, options.GrpcPort, l => { l.Protocols = HttpProtocols.Http2; grpc = l; });
            });
            builder.Services.AddGrpc();
            builder.Services.AddSingleton(sp => Store.Open(options.Postgres, options.SqlitePath,
                sp.GetRequiredService<ILoggerFactory>(), name + "-" + Out.Pid));
            builder.Services.AddTransient<Checkout>();
            // The downstream's addresses are known once Kestrel has bound when it is this instance:
            // both clients read them when first created, after the start.
            builder.Services.AddHttpClient(Checkout.HttpClientName, c => c.BaseAddress = Downstream.Http);
            builder.Services.AddGrpcClient<Grpc.Inventory.InventoryClient>(o => o.Address = Downstream.Grpc);
#if STOREFRONT_OTEL
            Json openTelemetry = OpenTelemetrySetup.Configure(builder, options);
#else
            Json openTelemetry = null;
#endif
            WebApplication app = builder.Build();
            MapRoutes(app, options);

            Store store = app.Services.GetRequiredService<Store>();
            store.Migrate(options.Products).GetAwaiter().GetResult();
            app.StartAsync().GetAwaiter().GetResult();
            app.Lifetime.ApplicationStopping.Register(Lifetime.RequestStop); // SIGTERM reaches the host first
            int port = ((IPEndPoint)http.EndPoint).Port, grpcPort = ((IPEndPoint)grpc.EndPoint).Port;
            Downstream.Http = options.Downstream ?? new Uri("http://127.0.0.1:" + port + "/");
            Downstream.Grpc = options.DownstreamGrpc ?? new Uri("http://127.0.0.1:" + grpcPort + "/");
            int janitorTid = CartJanitor.Start();

            Out.Line(Ready(name, options, app, store, port, grpcPort, janitorTid, openTelemetry));
            double elapsed = Lifetime.Run(options.Duration, second =>
                Out.Line(Counts.AddTo(new Json().Add("progress", name).Add("elapsed_s", second))));
            app.StopAsync().GetAwaiter().GetResult();
            Out.Line(Counts.AddTo(new Json().Add("exit", name).Add("elapsed_s", Math.Round(elapsed, 3))));
            ((IDisposable)app).Dispose();
            store.Dispose();
            return 0;
        }

        static class Downstream
        {
            public static Uri Http, Grpc;
        }

        static void MapRoutes(WebApplication app, StorefrontOptions options)
        {
            app.Use((context, next) => CountRequest(context, next, options.RequestLines));

            app.MapGet("/health", () => "ok").WithMetadata(new RouteLabel("health"));
            app.MapGet("/api/products", (Store store, string q = null) => CatalogEndpoints.Search(store, q))
                .WithMetadata(new RouteLabel("catalog"));
            app.MapGet("/api/products/{id:long}", (Store store, long id) => CatalogEndpoints.Get(store, id))
                .WithMetadata(new RouteLabel("product"));
            app.MapPost("/api/cart/items", (long cart, long product, int quantity = 1) =>
            {
                using Activity span = Telemetry.StartSpan("cart.add_item");
                return Results.Ok(new { cart, items = CartStore.AddItem(cart, product, quantity) });
            }).WithMetadata(new RouteLabel("cart"));
            app.MapPost("/api/orders", (OrderRequest order, Checkout checkout) => checkout.PlaceOrder(order))
                .WithMetadata(new RouteLabel("checkout"));
            app.MapGet("/api/recommendations", (long product = 1) =>
            {
                using Activity span = Telemetry.StartSpan("recommendations.score");
                return Results.Ok(new { product, similar = RecommendationEngine.ScoreCandidates(product, Behaviour.Current.HotMs) });
            }).WithMetadata(new RouteLabel("recommend"));
            app.MapGet("/api/coupons/{code}", (string code) =>
            {
                using Activity span = Telemetry.StartSpan("coupon.validate");
                int? percentOff = CouponService.Lookup(code);
                return percentOff.HasValue ? Results.Ok(new { code, percentOff }) : Results.NotFound(new { code, error = "unknown coupon" });
            }).WithMetadata(new RouteLabel("coupon"));
            app.MapGet("/api/reports/sales", () =>
            {
                using Activity span = Telemetry.StartSpan("reports.sales");
                long before = GC.GetAllocatedBytesForCurrentThread();
                List<SalesReportRow> report = SalesReport.Build(Behaviour.Current.ReportRows);
                long total = SalesReport.TotalCents(report);
                long allocated = GC.GetAllocatedBytesForCurrentThread() - before;
                Interlocked.Add(ref Counts.ReportRows, report.Count);
                Telemetry.ReportRows.Record(report.Count);
                return Results.Ok(new { rows = report.Count, totalCents = total, allocatedBytes = allocated });
            }).WithMetadata(new RouteLabel("report"));
            app.MapPost("/api/inventory/reserve", (ReserveRequest request) => InventoryService.Reserve(request))
                .WithMetadata(new RouteLabel("reserve"));
            app.MapGrpcService<CatalogGrpcService>().WithMetadata(new RouteLabel("grpc.catalog"));
            app.MapGrpcService<InventoryGrpcService>().WithMetadata(new RouteLabel("grpc.inventory"));

            app.MapGet("/admin/behaviour", () => Results.Content(Behaviour.Current.ToJson().ToString(), "application/json"))
                .WithMetadata(new RouteLabel("admin"));
            app.MapPost("/admin/behaviour", (HttpRequest request) => ChangeBehaviour(request)).WithMetadata(new RouteLabel("admin"));
            app.MapGet("/admin/stats", () => Results.Content(Counts.AddTo(new Json()).ToString(), "application/json"))
                .WithMetadata(new RouteLabel("admin"));
        }

        /// <summary>The first middleware: counts every request by label and status, and prints its
        /// line (--request-lines) with the ids of the server span ASP.NET Core made for it.</summary>
        static async Task CountRequest(HttpContext context, RequestDelegate next, bool lines)
        {
            long started = Stopwatch.GetTimestamp();
            Activity server = Activity.Current;
            RequestSpans spans = Telemetry.BeginRequest();
            int status = 500;
            try
            {
                await next(context);
                status = context.Response.StatusCode;
            }
            finally
            {
                string route = context.GetEndpoint()?.Metadata.GetMetadata<RouteLabel>()?.Name ?? "other";
                Counts.Request(route, status);
                if (lines)
                {
                    Activity app = spans.First;
                    Out.Line(new Json()
                        .Add("request", Interlocked.Increment(ref requestNumber)).Add("route", route)
                        .Add("method", context.Request.Method).Add("path", context.Request.Path.Value).Add("status", status)
                        .Add("duration_ms", Math.Round(Stopwatch.GetElapsedTime(started).TotalMilliseconds, 3))
                        .Add("trace_id", server?.TraceId.ToHexString()).Add("span_id", server?.SpanId.ToHexString())
                        .Add("parent_span_id", server == null || server.ParentSpanId == default ? null : server.ParentSpanId.ToHexString())
                        .Add("app_span_id", app?.SpanId.ToHexString()).Add("tid", Native.CurrentTid()));
                }
            }
        }

        static IResult ChangeBehaviour(HttpRequest request)
        {
            Knobs knobs = Behaviour.Current;
            var changed = new Json();
            try
            {
                foreach (KeyValuePair<string, Microsoft.Extensions.Primitives.StringValues> kv in request.Query)
                {
                    knobs = knobs.With(kv.Key, kv.Value.ToString());
                    changed.Add(kv.Key, kv.Value.ToString());
                }
            }
            catch (ArgumentException e)
            {
                return Results.BadRequest(new { error = e.Message });
            }
            Behaviour.Set(knobs);
            Out.Line(new Json().Add("behaviour", knobs.ToJson()).Add("changed", changed)
                .Add("unix_nano", (DateTime.UtcNow - DateTime.UnixEpoch).Ticks * 100));
            return Results.Content(knobs.ToJson().ToString(), "application/json");
        }

        static Json Ready(string name, StorefrontOptions options, WebApplication app, Store store, int port, int grpcPort,
                          int janitorTid, Json openTelemetry)
        {
            var routes = new Json()
                .Add("health", "GET /health").Add("catalog", "GET /api/products").Add("product", "GET /api/products/{id}")
                .Add("cart", "POST /api/cart/items").Add("checkout", "POST /api/orders").Add("recommend", "GET /api/recommendations")
                .Add("coupon", "GET /api/coupons/{code}").Add("report", "GET /api/reports/sales")
                .Add("reserve", "POST /api/inventory/reserve").Add("grpc.catalog", "gRPC storefront.v1.Catalog/GetProduct")
                .Add("grpc.inventory", "gRPC storefront.v1.Inventory/CheckStock").Add("admin", "GET|POST /admin/behaviour, GET /admin/stats");
            return Out.Ready(name)
                .Add("role", options.Role)
                .Add("port", port).Add("url", "http://127.0.0.1:" + port + "/")
                .Add("grpc_port", grpcPort).Add("grpc_url", "http://127.0.0.1:" + grpcPort + "/")
                .Add("downstream", new Json().Add("http", Downstream.Http.ToString()).Add("grpc", Downstream.Grpc.ToString())
                    .Add("self", options.Downstream == null && options.DownstreamGrpc == null))
                .Add("database", new Json().Add("kind", store.Kind).Add("server_version", store.ServerVersion)
                    .Add("location", store.Location).Add("products", options.Products).Add("instance", store.Instance))
                .Add("assemblies", Assemblies())
                .Add("logger_providers", app.Services.GetServices<ILoggerProvider>().Select(p => p.GetType().FullName).ToArray())
                .Add("routes", routes)
                .Add("behaviour", Behaviour.Current.ToJson())
                .Add("behaviours", Behaviour.Catalogue())
                .Add("activity_source", Telemetry.SourceName).Add("meter", Telemetry.MeterName)
                .Add("instruments", Telemetry.Instruments()).Add("spans", Telemetry.SpanNames)
                .Add("threads", new[] { new Json().Add("name", CartJanitor.ThreadName).Add("tid", janitorTid) })
                .Add("tid_source", Native.TidSource)
                .Add("request_lines", options.RequestLines)
                .Add("opentelemetry", openTelemetry);
        }

        /// <summary>The telemetry-relevant assemblies as loaded: a NuGet package can bring a newer
        /// System.Diagnostics.DiagnosticSource (whose EventSources clrscope reads) than the runtime's.</summary>
        static Json Assemblies()
        {
            var found = new Json();
            foreach (Type t in new[] { typeof(Activity), typeof(ILogger), typeof(LoggerFactory), typeof(WebApplication) })
            {
                Assembly a = t.Assembly;
                // A NativeAOT build (../StorefrontAot) has no assembly files: from_app is null there.
                string location = a.Location, app = typeof(Program).Assembly.Location;
                found.Add(a.GetName().Name, new Json()
                    .Add("version", a.GetName().Version.ToString())
                    .Add("file_version", a.GetCustomAttribute<AssemblyFileVersionAttribute>()?.Version)
                    .Add("from_app", location.Length == 0 ? null : (object)(Path.GetDirectoryName(location) == Path.GetDirectoryName(app))));
            }
            return found;
        }
    }
}
