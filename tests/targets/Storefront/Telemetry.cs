using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.Diagnostics.Metrics;
using System.Linq;
using System.Threading;
using Testbed;

namespace Storefront
{
    /// <summary>The service's own telemetry, made with the runtime's APIs only (no SDK): spans of
    /// ActivitySource "Storefront" and instruments of Meter "Storefront", one of each kind.</summary>
    public static class Telemetry
    {
        public const string SourceName = "Storefront";
        public const string MeterName = "Storefront";
        public const string Version = "1.0.0";

        public static readonly ActivitySource Source = new ActivitySource(SourceName, Version);
        public static readonly Meter Meter = new Meter(MeterName, Version);

        public static readonly Counter<long> OrdersPlaced = Meter.CreateCounter<long>(
            "storefront.orders.placed", "{order}", "Orders placed, by whether a coupon was applied");
        public static readonly Histogram<double> CheckoutDuration = Meter.CreateHistogram<double>(
            "storefront.checkout.duration", "s", "Time to place an order, stock check and reservation included");
        public static readonly UpDownCounter<long> CartItems = Meter.CreateUpDownCounter<long>(
            "storefront.cart.items", "{item}", "Items in open carts");
        public static readonly Counter<long> InventoryReservations = Meter.CreateCounter<long>(
            "storefront.inventory.reservations", "{reservation}", "Reservations served, by whether they were slow");
        public static readonly Counter<long> CouponFailures = Meter.CreateCounter<long>(
            "storefront.coupon.failures", "{failure}", "Coupon lookups that threw");
        public static readonly Histogram<long> ReportRows = Meter.CreateHistogram<long>(
            "storefront.report.rows", "{row}", "Rows per sales report");

        static Telemetry()
        {
            Meter.CreateObservableGauge("storefront.inventory.reserved", () => Inventory.InventoryService.ReservedUnits,
                "{unit}", "Units reserved so far (downstream)");
            Meter.CreateObservableCounter("storefront.recommendations.cpu_time", () => Recommendations.RecommendationEngine.CpuSeconds,
                "s", "CPU time the recommendation engine has burned");
            Meter.CreateObservableUpDownCounter("storefront.cart.open", () => Carts.CartStore.OpenCarts,
                "{cart}", "Open carts");
        }

        static readonly AsyncLocal<RequestSpans> request = new AsyncLocal<RequestSpans>();

        /// <summary>Called by the request middleware: the spans the request starts from here on are noted in what it returns.</summary>
        public static RequestSpans BeginRequest()
        {
            var spans = new RequestSpans();
            request.Value = spans;
            return spans;
        }

        /// <summary>A span of the service's own source (null when nothing listens to it), the request's first noted for its line.</summary>
        public static Activity StartSpan(string name)
        {
            Activity span = Source.StartActivity(name);
            RequestSpans spans = request.Value;
            if (spans != null && spans.First == null) spans.First = span;
            return span;
        }

        /// <summary>Every instrument: name and kind (for the ready line).</summary>
        public static Json Instruments()
        {
            return new Json()
                .Add("storefront.orders.placed", "Counter<long>")
                .Add("storefront.checkout.duration", "Histogram<double>")
                .Add("storefront.cart.items", "UpDownCounter<long>")
                .Add("storefront.inventory.reservations", "Counter<long>")
                .Add("storefront.coupon.failures", "Counter<long>")
                .Add("storefront.report.rows", "Histogram<long>")
                .Add("storefront.inventory.reserved", "ObservableGauge<long>")
                .Add("storefront.recommendations.cpu_time", "ObservableCounter<double>")
                .Add("storefront.cart.open", "ObservableUpDownCounter<long>");
        }

        /// <summary>The spans the service starts itself (each a child of the request's server span).</summary>
        public static readonly string[] SpanNames =
        {
            "catalog.search", "catalog.get", "cart.add_item", "checkout.place_order", "recommendations.score",
            "coupon.validate", "reports.sales", "inventory.reserve", "inventory.check_stock",
        };
    }

    /// <summary>The first span of the service's own source a request started.</summary>
    public sealed class RequestSpans
    {
        public Activity First;
    }

    /// <summary>What the service did, counted as it did it: the totals of the progress and exit
    /// lines and of GET /admin/stats.</summary>
    public static class Counts
    {
        static readonly ConcurrentDictionary<string, long[]> routes = new ConcurrentDictionary<string, long[]>();
        public static long OrdersPlaced, Reservations, SlowReservations, StockChecks, DownstreamCalls, DownstreamFailures;
        public static long DbQueries, CouponExceptions, ReportRows, PricingEvaluations, CartItemsAdded, JanitorCompactions;
        public static long PricingCpuNanoseconds;

        /// <summary>One finished request: [count, 2xx, 3xx, 4xx, 5xx] of its route.</summary>
        public static void Request(string route, int status)
        {
            long[] c = routes.GetOrAdd(route, _ => new long[5]);
            Interlocked.Increment(ref c[0]);
            int cls = status / 100;
            if (cls >= 2 && cls <= 5) Interlocked.Increment(ref c[cls - 1]);
        }

        public static void Add(ref long counter) { Interlocked.Increment(ref counter); }

        /// <summary>Adds the totals to LINE; returns it.</summary>
        public static Json AddTo(Json line)
        {
            var byRoute = new Json();
            foreach (KeyValuePair<string, long[]> kv in routes.OrderBy(kv => kv.Key, StringComparer.Ordinal))
            {
                long[] c = kv.Value;
                byRoute.Add(kv.Key, new Json().Add("count", Interlocked.Read(ref c[0])).Add("2xx", Interlocked.Read(ref c[1]))
                    .Add("3xx", Interlocked.Read(ref c[2])).Add("4xx", Interlocked.Read(ref c[3])).Add("5xx", Interlocked.Read(ref c[4])));
            }
            return line
                .Add("requests", byRoute)
                .Add("orders_placed", Interlocked.Read(ref OrdersPlaced))
                .Add("reservations", Interlocked.Read(ref Reservations))
                .Add("slow_reservations", Interlocked.Read(ref SlowReservations))
                .Add("stock_checks", Interlocked.Read(ref StockChecks))
                .Add("downstream_calls", Interlocked.Read(ref DownstreamCalls))
                .Add("downstream_failures", Interlocked.Read(ref DownstreamFailures))
                .Add("db_queries", Interlocked.Read(ref DbQueries))
                .Add("coupon_exceptions", Interlocked.Read(ref CouponExceptions))
                .Add("report_rows", Interlocked.Read(ref ReportRows))
                .Add("pricing_evaluations", Interlocked.Read(ref PricingEvaluations))
                .Add("pricing_cpu_ns", Interlocked.Read(ref PricingCpuNanoseconds))
                .Add("cart_items_added", Interlocked.Read(ref CartItemsAdded))
                .Add("janitor_compactions", Interlocked.Read(ref JanitorCompactions))
                .Add("hot_cpu_ms", Recommendations.RecommendationEngine.CpuSeconds * 1000)
                // The runtime's own counts, for what a profiler or a GC view should agree with.
                .Add("lock_contentions", Monitor.LockContentionCount)
                .Add("allocated_bytes", GC.GetTotalAllocatedBytes(false))
                .Add("gc_collections", new[] { GC.CollectionCount(0), GC.CollectionCount(1), GC.CollectionCount(2) })
                .Add("exceptions_thrown", Program.FirstChanceExceptions);
        }
    }
}
