// Bookstore: a small online bookshop, the sample service of `make demo`. It has the problems a real
// service has — a slow CPU-bound report export, a payment call whose latency tail goes bad, a cache
// that leaks — so that clrscope's continuous profiles and collection rules have something to find.
//
// It is an ASP.NET Core service (Kestrel, minimal API endpoints; common/WebHost.cs starts it): the
// hosting layer's "Microsoft.AspNetCore.Hosting" EventSource and "Microsoft.AspNetCore"
// DiagnosticListener events are ASP.NET Core's own, so dotnet-monitor's AspNetRequestCount /
// AspNetRequestDuration / AspNetResponseStatus rules work on it unchanged.
//
// What it does
//   Serves http://127.0.0.1:PORT/ (PORT: --port, else a free port Kestrel binds); each route is an
//   endpoint whose handler runs inside a span from ActivitySource "Bookstore" (a child of ASP.NET Core's
//   server span, which honours an incoming W3C "traceparent"):
//     GET  /books[?q=TEXT]      the catalogue (--books books, generated the same every run), titles or
//                               authors containing TEXT (case-insensitive); span "Bookstore.Catalogue.Search",
//                               Bookstore.Catalogue.Search
//     GET  /books/ID            one book, 404 if there is none; span "Bookstore.Catalogue.Get"
//     GET  /reports/sales.csv[?rows=N]   the sales report as CSV (default --report-rows rows), built row
//                               by row with a StringBuilder: CPU-bound and slow by design (hundreds of
//                               ms); span "Bookstore.Reports.ExportSales"; the hot path is
//                               Bookstore.SalesReport.ExportCsv -> AppendOrderRow -> StringBuilder
//     POST /orders[?book=ID&quantity=N]  places an order and pays for it: a fraud check (CPU, ~1 ms,
//                               Bookstore.Ordering.PaymentService.FraudScore) then the payment gateway
//                               (`await Task.Delay`: --payment-ms, and --payment-slow-ms for every
//                               --payment-slow-every-th payment); span "Bookstore.Ordering.PlaceOrder"
//                               with a child "Bookstore.Ordering.Charge" around the payment. Records
//                               Histogram<double> "bookstore.payment.duration" (ms, the payment alone,
//                               tag payment.outcome=approved) and Counter<long> "bookstore.orders" of
//                               Meter "Bookstore.Ordering". With every 10th payment slow (the default)
//                               the p95 of the histogram is the slow latency.
//     GET  /recommendations[?user=N]  recommendations for a user, "cached" forever: each request adds
//                               --leak-kb KiB of Bookstore.Recommendations.CachedRecommendation objects to
//                               a static list that is never trimmed — a memory leak — until
//                               --leak-limit-mb MiB are held (then it stops growing, so a forgotten demo
//                               cannot exhaust the machine); span "Bookstore.Recommendations.ForUser"
//     GET  /health              200 "ok", no span
//     other                     404 (a known path with another method: 405, by ASP.NET Core's routing);
//                               the hosting events are still emitted
//   --self-load N: thread "SelfLoad" sends N requests per second (at most 64 in flight) for
//   --self-load-seconds S (default: until the target stops), interleaving the routes of
//   --self-load-mix by weight (default books:12,order:6,report:1,recommend:1).
//
// Arguments
//   --port P                 port to listen on (default: a free one)
//   --books N                books in the catalogue (default 500)
//   --report-rows N          rows of the sales report (default 100000: 100-300 ms on a 2-core VM once
//                            compiled, twice the demo rule's 50 ms or more on a fast machine)
//   --payment-ms MS          payment gateway latency (default 20)
//   --payment-slow-ms MS     latency of a slow payment (default 400)
//   --payment-slow-every N   every Nth payment is slow (default 10; 0: none)
//   --leak-kb KB             KiB kept per /recommendations request (default 256)
//   --leak-limit-mb MB       the leak stops growing at this many MiB (default 256)
//   --self-load N            requests per second from the built-in load generator (default 0: none)
//   --self-load-seconds S    stop the load after S seconds (default: run as long as the target)
//   --self-load-mix LIST     route:weight,... with routes books, book, report, order, recommend
//                            (default books:12,order:6,report:1,recommend:1)
//   --no-request-lines       do not print a line per request
//   --duration-seconds N     run N seconds, then exit 0 (default: until killed; Ctrl-C exits cleanly)
//
// Lines printed to stdout (one JSON object per line)
//   ready, once the listener accepts requests:
//     {"ready":"Bookstore","pid":1234,"runtime":"10.0.12","port":40123,"url":"http://127.0.0.1:40123/",
//      "server":"Kestrel","aspnetcore":"10.0.12","diagnostic_listener":"Microsoft.AspNetCore",
//      "hosting_activity":"Microsoft.AspNetCore.Hosting.HttpRequestIn",
//      "hosting_event_source":"Microsoft.AspNetCore.Hosting","id_format":"W3C",
//      "endpoints":{"GET /books":"Bookstore.Catalogue.Search","GET /books/{id}":"Bookstore.Catalogue.Get",
//                   "GET /reports/sales.csv":"Bookstore.Reports.SalesReport.ExportCsv",
//                   "POST /orders":"Bookstore.Ordering.PaymentService.Charge",
//                   "GET /recommendations":"Bookstore.Recommendations.RecommendationCache.Remember",
//                   "GET /health":null},
//      "books":500,"report_rows":100000,"payment_ms":20,"payment_slow_ms":400,"payment_slow_every":10,
//      "leak_kb":256,"leak_limit_mb":256,"activity_source":"Bookstore","spans":[...],
//      "meter":"Bookstore.Ordering","histogram":"bookstore.payment.duration","histogram_unit":"ms",
//      "counter":"bookstore.orders","leak_type":"Bookstore.Recommendations.CachedRecommendation",
//      "self_load_per_second":0,"self_load_seconds":null,
//      "self_load_mix":{"books":12,"order":6,"report":1,"recommend":1},"request_lines":true}
//   one per request (unless --no-request-lines), printed as the response starts (before its headers go
//   out: HttpResponse.OnStarting, registered by the first middleware):
//     {"request":1,"route":"report","method":"GET","path":"/reports/sales.csv","status":200,
//      "trace_id":"<32 hex>","span_id":"<16 hex, the request's Bookstore span, null without one>",
//      "hosting_span_id":"<16 hex>","duration_ms":412.7}
//     route: books | book | report | order | recommend | health | null (404/405)
//   every second: {"progress":"Bookstore","elapsed_s":1,
//                  "requests":{"books":12,"book":0,"report":1,"order":6,"recommend":1,"health":0,"other":0},
//                  "payments":{"count":6,"slow":1},"leaked_bytes":262144,
//                  "self_load":{"sent":20,"ok":20,"failed":0}}   (totals so far)
//   at exit: {"exit":"Bookstore","elapsed_s":5.001,"requests":{...},"payments":{...},"leaked_bytes":N,"self_load":{...}}
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Diagnostics.Metrics;
using System.Globalization;
using System.Net.Http;
using System.Runtime.CompilerServices;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Http.Features;
using Testbed;
using Bookstore.Ordering;
using Bookstore.Recommendations;
using Bookstore.Reports;

namespace Bookstore
{
    public sealed class Book
    {
        public int Id;
        public string Title;
        public string Author;
        public int Year;
        public decimal Price;

        public Json ToJson()
        {
            return new Json().Add("id", Id).Add("title", Title).Add("author", Author).Add("year", Year)
                .Add("price", (double)Price);
        }
    }

    public static class Catalogue
    {
        static readonly string[] Adjectives = { "Silent", "Crimson", "Hidden", "Last", "Distant", "Broken", "Golden", "Quiet", "Restless", "Northern" };
        static readonly string[] Nouns = { "Harbour", "Garden", "Cipher", "Orchard", "Lighthouse", "Archive", "River", "Compiler", "Winter", "Library" };
        static readonly string[] First = { "Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Margaret", "Niklaus" };
        static readonly string[] Last = { "Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson", "Hamilton", "Wirth" };

        public static Book[] Books = new Book[0];

        /// <summary>COUNT books, the same every run.</summary>
        public static void Stock(int count)
        {
            var books = new Book[count];
            for (int i = 0; i < count; i++)
            {
                books[i] = new Book
                {
                    Id = i + 1,
                    Title = "The " + Adjectives[i % 10] + " " + Nouns[(i / 10) % 10] + (i >= 100 ? " " + (i / 100 + 1).ToString(CultureInfo.InvariantCulture) : ""),
                    Author = First[(i * 7) % 10] + " " + Last[(i * 3) % 10],
                    Year = 1950 + (i * 13) % 75,
                    Price = 5m + (i * 37 % 4500) / 100m,
                };
            }
            Books = books;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        public static List<Book> Search(string text)
        {
            var found = new List<Book>();
            foreach (Book b in Books)
            {
                if (string.IsNullOrEmpty(text) ||
                    b.Title.IndexOf(text, StringComparison.OrdinalIgnoreCase) >= 0 ||
                    b.Author.IndexOf(text, StringComparison.OrdinalIgnoreCase) >= 0)
                    found.Add(b);
            }
            return found;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        public static Book Get(int id)
        {
            return id >= 1 && id <= Books.Length ? Books[id - 1] : null;
        }
    }

    public sealed class Order
    {
        public long Id;
        public DateTime PlacedAt;
        public string Customer;
        public Book Book;
        public int Quantity;
    }

}

namespace Bookstore.Reports
{
    public static class SalesReport
    {
        static Order[] orders = new Order[0];

        /// <summary>The order history the report is built from: COUNT orders, the same every run.</summary>
        public static void Load(int count)
        {
            var history = new Order[count];
            var epoch = new DateTime(2025, 1, 1, 0, 0, 0, DateTimeKind.Utc);
            Book[] books = Catalogue.Books;
            for (int i = 0; i < count; i++)
            {
                history[i] = new Order
                {
                    Id = 100000 + i,
                    PlacedAt = epoch.AddMinutes(i * 7.3),
                    Customer = "customer-" + ((i * 7919) % 5000).ToString(CultureInfo.InvariantCulture) + "@example.com",
                    Book = books[(i * 31) % books.Length],
                    Quantity = 1 + i % 3,
                };
            }
            orders = history;
        }

        /// <summary>ROWS orders as CSV, one StringBuilder for the whole report, each field formatted
        /// and quoted on its own: the slow, CPU-bound path of the demo.</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        public static string ExportCsv(int rows)
        {
            var sb = new StringBuilder();
            sb.Append("order_id,placed_at,customer,title,author,quantity,unit_price,total\n");
            decimal grand = 0;
            for (int i = 0; i < rows; i++)
                grand += AppendOrderRow(sb, orders[i % orders.Length]);
            sb.Append("total,,,,,,,").Append(grand.ToString("F2", CultureInfo.InvariantCulture)).Append('\n');
            return sb.ToString();
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static decimal AppendOrderRow(StringBuilder sb, Order o)
        {
            decimal total = o.Book.Price * o.Quantity;
            sb.Append(o.Id.ToString(CultureInfo.InvariantCulture)).Append(',');
            sb.Append(o.PlacedAt.ToString("yyyy-MM-dd'T'HH:mm:ss'Z'", CultureInfo.InvariantCulture)).Append(',');
            sb.Append(Quote(o.Customer)).Append(',');
            sb.Append(Quote(o.Book.Title)).Append(',');
            sb.Append(Quote(o.Book.Author)).Append(',');
            sb.AppendFormat(CultureInfo.InvariantCulture, "{0},{1:F2},{2:F2}\n", o.Quantity, o.Book.Price, total);
            return total;
        }

        /// <summary>A CSV field, quoted, with its quotes doubled.</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        static string Quote(string field)
        {
            var sb = new StringBuilder(field.Length + 2);
            sb.Append('"').Append(field.Replace("\"", "\"\"")).Append('"');
            return sb.ToString();
        }
    }
}

namespace Bookstore.Ordering
{
    public static class Checkout
    {
        public const string MeterName = "Bookstore.Ordering";
        public const string HistogramName = "bookstore.payment.duration";

        static readonly Meter Meter = new Meter(MeterName);
        static readonly Histogram<double> PaymentDuration = Meter.CreateHistogram<double>(
            HistogramName, "ms", "Time to charge an order's payment");
        static readonly Counter<long> Orders = Meter.CreateCounter<long>("bookstore.orders", null, "Orders placed");

        public static int GatewayMs, SlowGatewayMs, SlowEvery;
        static long payments, slowPayments, orderIds;

        public static Json Totals()
        {
            return new Json().Add("count", Interlocked.Read(ref payments)).Add("slow", Interlocked.Read(ref slowPayments));
        }

        public sealed class Receipt
        {
            public long OrderId;
            public decimal Amount;
            public double PaymentMs;
            public bool Slow;
        }

        public static async Task<Receipt> PlaceOrder(Book book, int quantity, ActivitySource source)
        {
            var receipt = new Receipt { OrderId = Interlocked.Increment(ref orderIds), Amount = book.Price * quantity };
            long start = Stopwatch.GetTimestamp();
            using (source.StartActivity("Bookstore.Ordering.Charge", ActivityKind.Client))
            {
                receipt.Slow = await PaymentService.Charge(receipt.OrderId, receipt.Amount);
            }
            receipt.PaymentMs = (Stopwatch.GetTimestamp() - start) * 1000.0 / Stopwatch.Frequency;
            PaymentDuration.Record(receipt.PaymentMs, new KeyValuePair<string, object>("payment.outcome", "approved"));
            Orders.Add(1);
            Interlocked.Increment(ref payments);
            if (receipt.Slow) Interlocked.Increment(ref slowPayments);
            return receipt;
        }
    }

    public static class PaymentService
    {
        public static double Sink;

        /// <summary>Charges AMOUNT: a fraud check, then the gateway's latency. True when this was a
        /// slow payment.</summary>
        public static async Task<bool> Charge(long orderId, decimal amount)
        {
            FraudScore(orderId, amount);
            bool slow = Checkout.SlowEvery > 0 && orderId % Checkout.SlowEvery == 0;
            await Task.Delay(slow ? Checkout.SlowGatewayMs : Checkout.GatewayMs);
            return slow;
        }

        /// <summary>About a millisecond of arithmetic.</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        static void FraudScore(long orderId, decimal amount)
        {
            double x = (double)amount + orderId;
            for (int k = 0; k < 200000; k++) x = x * 1.0000001 + 0.5 / (k + 1);
            Sink = x;
        }
    }
}

namespace Bookstore.Recommendations
{
    public sealed class CachedRecommendation
    {
        public int User;
        public int[] BookIds;
        public byte[] Features;
    }

    public static class RecommendationCache
    {
        /// <summary>Never trimmed: the leak.</summary>
        static readonly List<CachedRecommendation> Cache = new List<CachedRecommendation>();
        static long bytes;

        public static long LimitBytes;
        public static int BytesPerRequest;

        public static long LeakedBytes { get { return Interlocked.Read(ref bytes); } }

        [MethodImpl(MethodImplOptions.NoInlining)]
        public static int[] Remember(int user)
        {
            var ids = new int[5];
            for (int i = 0; i < ids.Length; i++) ids[i] = 1 + (user * 17 + i * 101) % Math.Max(1, Catalogue.Books.Length);
            lock (Cache)
            {
                // 1 KiB objects, so a heap snapshot shows many of them, not a few large arrays
                for (int kb = 0; kb < BytesPerRequest / 1024 && bytes + 1024 <= LimitBytes; kb++)
                {
                    Cache.Add(new CachedRecommendation { User = user, BookIds = ids, Features = new byte[1024 - 64] });
                    bytes += 1024;
                }
            }
            return ids;
        }
    }
}

namespace Bookstore
{
    static class Program
    {
        const string Usage =
            "usage: Bookstore [--port P] [--books 500] [--report-rows 100000] [--payment-ms 20] [--payment-slow-ms 400]\n" +
            "                 [--payment-slow-every 10] [--leak-kb 256] [--leak-limit-mb 256] [--self-load N]\n" +
            "                 [--self-load-seconds S] [--self-load-mix books:12,order:6,report:1,recommend:1]\n" +
            "                 [--no-request-lines] [--duration-seconds N]\n" +
            "  a bookshop over HTTP on 127.0.0.1: catalogue, a slow CSV report, payments with a latency histogram,\n" +
            "  a leaking cache, spans and the ASP.NET Core hosting diagnostic events; see the top of Bookstore.cs";

        static readonly ActivitySource Source = new ActivitySource("Bookstore");
        static readonly string[] Routes = { "books", "book", "report", "order", "recommend", "health" };
        static readonly long[] RouteCounts = new long[Routes.Length];
        static long otherCount, requestSeq;
        const string SpanIdItem = "bookstore.span_id";
        static int reportRows;
        static bool requestLines;
        static LoadGenerator load;

        static int Main(string[] argv)
        {
            var args = new Args("Bookstore", Usage, argv,
                new[] { "port", "books", "report-rows", "payment-ms", "payment-slow-ms", "payment-slow-every", "leak-kb",
                        "leak-limit-mb", "self-load", "self-load-seconds", "self-load-mix" },
                new[] { "no-request-lines" });
            int requestedPort = args.Int("port", 0, 0, 65535);
            int books = args.Int("books", 500, 1, 1000000);
            reportRows = args.Int("report-rows", 100000, 1, 10000000);
            Checkout.GatewayMs = args.Int("payment-ms", 20, 0, 60000);
            Checkout.SlowGatewayMs = args.Int("payment-slow-ms", 400, 0, 60000);
            Checkout.SlowEvery = args.Int("payment-slow-every", 10, 0, 1000000);
            int leakKb = args.Int("leak-kb", 256, 0, 1 << 20);
            int leakLimitMb = args.Int("leak-limit-mb", 256, 0, 1 << 20);
            RecommendationCache.BytesPerRequest = leakKb * 1024;
            RecommendationCache.LimitBytes = (long)leakLimitMb << 20;
            double selfLoad = args.Double("self-load", 0, 0, 10000);
            double? selfLoadSeconds = args.Has("self-load-seconds") ? args.Double("self-load-seconds", 0, 0.001, 1e9) : (double?)null;
            KeyValuePair<string, int>[] mix = Mix(args);
            requestLines = !args.Has("no-request-lines");
            double? duration = args.DurationSeconds();
            Lifetime.Install();

            Catalogue.Stock(books);
            SalesReport.Load(Math.Min(reportRows, 100000));
            WebHost.RecordSpans("Bookstore", null);

            int port;
            WebApplication app = WebHost.Start(requestedPort, args, MapRoutes, out port);
            string baseUrl = "http://127.0.0.1:" + port.ToString(CultureInfo.InvariantCulture);
            string[] schedule = Schedule(mix);
            load = new LoadGenerator(selfLoad, selfLoadSeconds, i => LoadRequest(baseUrl, schedule[i % schedule.Length], i));
            if (selfLoad > 0) load.Start();

            var mixJson = new Json();
            foreach (var m in mix) mixJson.Add(m.Key, m.Value);
            Out.Line(WebHost.Facts(Out.Ready("Bookstore"), port)
                .Add("endpoints", new Json()
                    .Add("GET /books", "Bookstore.Catalogue.Search")
                    .Add("GET /books/{id}", "Bookstore.Catalogue.Get")
                    .Add("GET /reports/sales.csv", "Bookstore.Reports.SalesReport.ExportCsv")
                    .Add("POST /orders", "Bookstore.Ordering.PaymentService.Charge")
                    .Add("GET /recommendations", "Bookstore.Recommendations.RecommendationCache.Remember")
                    .Add("GET /health", null))
                .Add("books", books)
                .Add("report_rows", reportRows)
                .Add("payment_ms", Checkout.GatewayMs)
                .Add("payment_slow_ms", Checkout.SlowGatewayMs)
                .Add("payment_slow_every", Checkout.SlowEvery)
                .Add("leak_kb", leakKb)
                .Add("leak_limit_mb", leakLimitMb)
                .Add("activity_source", "Bookstore")
                .Add("spans", new[] { "Bookstore.Catalogue.Search", "Bookstore.Catalogue.Get", "Bookstore.Reports.ExportSales",
                                      "Bookstore.Ordering.PlaceOrder", "Bookstore.Ordering.Charge", "Bookstore.Recommendations.ForUser" })
                .Add("meter", Checkout.MeterName)
                .Add("histogram", Checkout.HistogramName)
                .Add("histogram_unit", "ms")
                .Add("counter", "bookstore.orders")
                .Add("leak_type", typeof(CachedRecommendation).FullName)
                .Add("self_load_per_second", selfLoad)
                .Add("self_load_seconds", selfLoadSeconds)
                .Add("self_load_mix", mixJson)
                .Add("request_lines", requestLines));

            double elapsed = Lifetime.Run(duration, second => Out.Line(Totals(new Json().Add("progress", "Bookstore").Add("elapsed_s", second))));
            load.Join(2000);
            app.StopAsync().GetAwaiter().GetResult();
            Out.Line(Totals(new Json().Add("exit", "Bookstore").Add("elapsed_s", Math.Round(elapsed, 3))));
            ((IDisposable)app).Dispose();
            return 0;
        }

        /// <summary>--self-load-mix "books:12,order:6" -> (route, weight) pairs; routes are Routes but health.</summary>
        static KeyValuePair<string, int>[] Mix(Args args)
        {
            string text = args.String("self-load-mix", "books:12,order:6,report:1,recommend:1");
            var mix = new List<KeyValuePair<string, int>>();
            foreach (string part in text.Split(','))
            {
                string[] kv = part.Split(':');
                int weight;
                string route = kv[0].Trim();
                if (kv.Length != 2 || Array.IndexOf(Routes, route) < 0 || route == "health" ||
                    !int.TryParse(kv[1], NumberStyles.Integer, CultureInfo.InvariantCulture, out weight) || weight < 0 || weight > 1000)
                {
                    args.Fail("--self-load-mix: \"" + part + "\" is not ROUTE:WEIGHT with ROUTE one of books, book, report, order, recommend and WEIGHT in [0, 1000]");
                    throw new InvalidOperationException();
                }
                mix.Add(new KeyValuePair<string, int>(route, weight));
            }
            int total = 0;
            foreach (var m in mix) total += m.Value;
            if (total == 0) args.Fail("--self-load-mix: every weight is 0");
            return mix.ToArray();
        }

        /// <summary>One cycle of the mix with the routes spread out (smooth weighted round robin): for
        /// books:2,report:1, "books","report","books".</summary>
        static string[] Schedule(KeyValuePair<string, int>[] mix)
        {
            int total = 0;
            foreach (var m in mix) total += m.Value;
            var current = new int[mix.Length];
            var schedule = new string[total];
            for (int n = 0; n < total; n++)
            {
                int best = 0;
                for (int i = 0; i < mix.Length; i++)
                {
                    current[i] += mix[i].Value;
                    if (current[i] > current[best]) best = i;
                }
                current[best] -= total;
                schedule[n] = mix[best].Key;
            }
            return schedule;
        }

        static HttpRequestMessage LoadRequest(string baseUrl, string route, long i)
        {
            int books = Catalogue.Books.Length;
            switch (route)
            {
                case "books": return new HttpRequestMessage(HttpMethod.Get, baseUrl + (i % 3 == 0 ? "/books?q=" + (i % 2 == 0 ? "garden" : "knuth") : "/books"));
                case "book": return new HttpRequestMessage(HttpMethod.Get, baseUrl + "/books/" + (1 + i % books).ToString(CultureInfo.InvariantCulture));
                case "report": return new HttpRequestMessage(HttpMethod.Get, baseUrl + "/reports/sales.csv");
                case "order": return new HttpRequestMessage(HttpMethod.Post, baseUrl + "/orders?book=" + (1 + i % books).ToString(CultureInfo.InvariantCulture) + "&quantity=" + (1 + i % 3).ToString(CultureInfo.InvariantCulture));
                default: return new HttpRequestMessage(HttpMethod.Get, baseUrl + "/recommendations?user=" + (i % 1000).ToString(CultureInfo.InvariantCulture));
            }
        }

        static Json Totals(Json j)
        {
            var requests = new Json();
            for (int i = 0; i < Routes.Length; i++) requests.Add(Routes[i], Interlocked.Read(ref RouteCounts[i]));
            requests.Add("other", Interlocked.Read(ref otherCount));
            return j.Add("requests", requests)
                .Add("payments", Checkout.Totals())
                .Add("leaked_bytes", RecommendationCache.LeakedBytes)
                .Add("self_load", load.Totals());
        }

        /// <summary>The route an endpoint serves (its label in request lines and counts).</summary>
        sealed class RouteLabel
        {
            public RouteLabel(string name) { Name = name; }
            public string Name { get; private set; }
        }

        sealed class Answer
        {
            public int Status = 200;
            public string ContentType = "application/json";
            public string Body;
        }

        /// <summary>The first middleware prints the request line and counts the request as the response
        /// starts; each route is an endpoint; ASP.NET Core's routing answers the rest (404, 405).</summary>
        static void MapRoutes(WebApplication app)
        {
            app.Use((context, next) =>
            {
                long seq = Interlocked.Increment(ref requestSeq);
                long start = Stopwatch.GetTimestamp();
                context.Response.OnStarting(() =>
                {
                    RequestDone(context, seq, start);
                    return Task.CompletedTask;
                });
                return next(context);
            });
            app.MapGet("/books", Spanned("books", c => Task.FromResult(SearchBooks(Query(c, "q")))))
                .WithMetadata(new RouteLabel("books"));
            app.MapGet("/books/{id}", Spanned("book", c => Task.FromResult(GetBook((string)c.Request.RouteValues["id"]))))
                .WithMetadata(new RouteLabel("book"));
            app.MapGet("/reports/sales.csv", Spanned("report", c => Task.FromResult(ExportReport(Query(c, "rows")))))
                .WithMetadata(new RouteLabel("report"));
            app.MapPost("/orders", Spanned("order", c => Order(Query(c, "book"), Query(c, "quantity"))))
                .WithMetadata(new RouteLabel("order"));
            app.MapGet("/recommendations", Spanned("recommend", c => Task.FromResult(Recommend(Query(c, "user")))))
                .WithMetadata(new RouteLabel("recommend"));
            app.MapGet("/health", c => WebHost.Respond(c, 200, "text/plain", "ok\n"))
                .WithMetadata(new RouteLabel("health"));
        }

        static string Query(HttpContext context, string name)
        {
            return context.Request.Query.TryGetValue(name, out var values) ? values.ToString() : null;
        }

        /// <summary>An endpoint answering with SERVE inside the route's span.</summary>
        static RequestDelegate Spanned(string route, Func<HttpContext, Task<Answer>> serve)
        {
            return async context =>
            {
                Answer answer;
                try
                {
                    using (Activity span = Source.StartActivity(SpanName(route), ActivityKind.Internal))
                    {
                        if (span != null) context.Items[SpanIdItem] = span.SpanId.ToHexString();
                        answer = await serve(context);
                    }
                }
                catch (Exception e)
                {
                    answer = Problem(500, e.GetType().FullName + ": " + e.Message);
                }
                await WebHost.Respond(context, answer.Status, answer.ContentType, answer.Body);
            };
        }

        /// <summary>Counts the request and prints its line (the response is starting).</summary>
        static void RequestDone(HttpContext context, long seq, long start)
        {
            Endpoint endpoint = context.GetEndpoint();
            RouteLabel label = endpoint != null ? endpoint.Metadata.GetMetadata<RouteLabel>() : null;
            string route = label != null ? label.Name : null;
            if (route != null) Interlocked.Increment(ref RouteCounts[Array.IndexOf(Routes, route)]);
            else Interlocked.Increment(ref otherCount);
            if (!requestLines) return;
            IHttpActivityFeature hosting = context.Features.Get<IHttpActivityFeature>();
            Out.Line(new Json()
                .Add("request", seq)
                .Add("route", route)
                .Add("method", context.Request.Method)
                .Add("path", context.Request.Path.ToString())
                .Add("status", context.Response.StatusCode)
                .Add("trace_id", hosting.Activity.TraceId.ToHexString())
                .Add("span_id", context.Items.TryGetValue(SpanIdItem, out object spanId) ? spanId : null)
                .Add("hosting_span_id", hosting.Activity.SpanId.ToHexString())
                .Add("duration_ms", Math.Round((Stopwatch.GetTimestamp() - start) * 1000.0 / Stopwatch.Frequency, 3)));
        }

        static string SpanName(string route)
        {
            switch (route)
            {
                case "books": return "Bookstore.Catalogue.Search";
                case "book": return "Bookstore.Catalogue.Get";
                case "report": return "Bookstore.Reports.ExportSales";
                case "order": return "Bookstore.Ordering.PlaceOrder";
                default: return "Bookstore.Recommendations.ForUser";
            }
        }

        static Answer SearchBooks(string q)
        {
            var list = new List<object>();
            foreach (Book b in Catalogue.Search(q)) list.Add(b.ToJson());
            return Ok(new Json().Add("books", list));
        }

        static Answer GetBook(string idText)
        {
            int id;
            Book b = int.TryParse(idText, NumberStyles.Integer, CultureInfo.InvariantCulture, out id) ? Catalogue.Get(id) : null;
            return b != null ? Ok(b.ToJson()) : Problem(404, "no book " + idText);
        }

        static Answer ExportReport(string rowsText)
        {
            int rows = reportRows;
            if (rowsText != null && (!int.TryParse(rowsText, NumberStyles.Integer, CultureInfo.InvariantCulture, out rows) || rows < 1 || rows > 10000000))
                return Problem(400, "rows must be an integer in [1, 10000000]");
            return new Answer { ContentType = "text/csv", Body = SalesReport.ExportCsv(rows) };
        }

        static async Task<Answer> Order(string bookText, string quantityText)
        {
            int bookId = 1, quantity = 1;
            if (bookText != null && !int.TryParse(bookText, NumberStyles.Integer, CultureInfo.InvariantCulture, out bookId))
                return Problem(400, "book must be a book id");
            if (quantityText != null && (!int.TryParse(quantityText, NumberStyles.Integer, CultureInfo.InvariantCulture, out quantity) || quantity < 1 || quantity > 100))
                return Problem(400, "quantity must be an integer in [1, 100]");
            Book book = Catalogue.Get(bookId);
            if (book == null) return Problem(404, "no book " + bookId.ToString(CultureInfo.InvariantCulture));
            Checkout.Receipt receipt = await Checkout.PlaceOrder(book, quantity, Source);
            return Ok(new Json()
                .Add("order", receipt.OrderId)
                .Add("book", book.Id)
                .Add("quantity", quantity)
                .Add("amount", (double)receipt.Amount)
                .Add("payment_ms", Math.Round(receipt.PaymentMs, 3))
                .Add("slow_payment", receipt.Slow)
                .Add("status", "paid"));
        }

        static Answer Recommend(string userText)
        {
            int user = 0;
            if (userText != null && !int.TryParse(userText, NumberStyles.Integer, CultureInfo.InvariantCulture, out user))
                return Problem(400, "user must be an integer");
            int[] ids = RecommendationCache.Remember(user);
            return Ok(new Json()
                .Add("user", user)
                .Add("books", ids)
                .Add("cached_bytes", RecommendationCache.LeakedBytes));
        }

        static Answer Ok(Json body)
        {
            return new Answer { Body = body.ToString() + "\n" };
        }

        static Answer Problem(int status, string detail)
        {
            return new Answer
            {
                Status = status,
                ContentType = "application/problem+json",
                Body = new Json().Add("status", status).Add("detail", detail).ToString() + "\n",
            };
        }
    }
}
