using System;
using System.Collections.Generic;
using System.Globalization;
using Testbed;

namespace Storefront
{
    /// <summary>The service's known behaviour, switchable at run time (`--behaviour k=v,…` at start,
    /// `POST /admin/behaviour?k=v&amp;…` while running): one immutable snapshot, swapped whole, so a
    /// request sees one consistent set of knobs.</summary>
    public sealed record Knobs
    {
        /// <summary>CPU ms each GET /api/recommendations burns in RecommendationEngine.Similarity.</summary>
        public double HotMs { get; init; } = 2;
        /// <summary>The CPU regression: DiscountRules.Evaluate re-runs its rules for RegressionMs of CPU.</summary>
        public bool Regression { get; init; }
        public double RegressionMs { get; init; } = 2;
        /// <summary>Every Nth GET /api/coupons/{code} throws CouponServiceException (0: never).</summary>
        public int ExceptionEvery { get; init; }
        /// <summary>Rows (SalesReportRow + LineItem[] + strings) each GET /api/reports/sales builds.</summary>
        public int ReportRows { get; init; } = 200;
        /// <summary>CPU ms the CartJanitor holds the carts' lock in each period (0: no convoy).</summary>
        public double LockHoldMs { get; init; }
        /// <summary>The CartJanitor's period, ms.</summary>
        public double LockPeriodMs { get; init; } = 20;
        /// <summary>Latency of POST /api/inventory/reserve, ms (the downstream's usual answer).</summary>
        public double InventoryDelayMs { get; init; } = 2;
        /// <summary>Latency of every InventoryTailEvery-th reservation, ms (0: no tail).</summary>
        public double InventoryTailMs { get; init; }
        public int InventoryTailEvery { get; init; } = 10;

        static readonly string[] names =
        {
            "hot_ms", "regression", "regression_ms", "exception_every", "report_rows", "lock_hold_ms", "lock_period_ms",
            "inventory_delay_ms", "inventory_tail_ms", "inventory_tail_every",
        };

        public static IReadOnlyList<string> Names => names;

        /// <summary>These knobs with NAME set to VALUE; ArgumentException names what is wrong.</summary>
        public Knobs With(string name, string value)
        {
            switch (name)
            {
                case "hot_ms": return this with { HotMs = Number(name, value, 0, 10_000) };
                case "regression": return this with { Regression = Flag(name, value) };
                case "regression_ms": return this with { RegressionMs = Number(name, value, 0, 10_000) };
                case "exception_every": return this with { ExceptionEvery = (int)Number(name, value, 0, 1_000_000) };
                case "report_rows": return this with { ReportRows = (int)Number(name, value, 0, 10_000_000) };
                case "lock_hold_ms": return this with { LockHoldMs = Number(name, value, 0, 10_000) };
                case "lock_period_ms": return this with { LockPeriodMs = Number(name, value, 1, 60_000) };
                case "inventory_delay_ms": return this with { InventoryDelayMs = Number(name, value, 0, 60_000) };
                case "inventory_tail_ms": return this with { InventoryTailMs = Number(name, value, 0, 60_000) };
                case "inventory_tail_every": return this with { InventoryTailEvery = (int)Number(name, value, 1, 1_000_000) };
                default: throw new ArgumentException("unknown behaviour '" + name + "' (known: " + string.Join(", ", names) + ")");
            }
        }

        /// <summary>"k=v,k=v" applied in order.</summary>
        public Knobs WithList(string list)
        {
            Knobs k = this;
            foreach (string item in list.Split(',', StringSplitOptions.RemoveEmptyEntries | StringSplitOptions.TrimEntries))
            {
                int eq = item.IndexOf('=');
                if (eq <= 0) throw new ArgumentException("'" + item + "' is not name=value");
                k = k.With(item.Substring(0, eq), item.Substring(eq + 1));
            }
            return k;
        }

        static double Number(string name, string value, double min, double max)
        {
            if (!double.TryParse(value, NumberStyles.Float, CultureInfo.InvariantCulture, out double v) || !(v >= min && v <= max))
                throw new ArgumentException(name + " must be a number in [" + min.ToString(CultureInfo.InvariantCulture) + ", " +
                                            max.ToString(CultureInfo.InvariantCulture) + "], not '" + value + "'");
            return v;
        }

        static bool Flag(string name, string value)
        {
            switch (value)
            {
                case "true": case "on": case "1": return true;
                case "false": case "off": case "0": return false;
                default: throw new ArgumentException(name + " must be on or off, not '" + value + "'");
            }
        }

        public Json ToJson()
        {
            return new Json()
                .Add("hot_ms", HotMs).Add("regression", Regression).Add("regression_ms", RegressionMs).Add("exception_every", ExceptionEvery)
                .Add("report_rows", ReportRows).Add("lock_hold_ms", LockHoldMs).Add("lock_period_ms", LockPeriodMs)
                .Add("inventory_delay_ms", InventoryDelayMs).Add("inventory_tail_ms", InventoryTailMs)
                .Add("inventory_tail_every", InventoryTailEvery);
        }
    }

    public static class Behaviour
    {
        static volatile Knobs current = new Knobs();

        public static Knobs Current => current;

        public static void Set(Knobs knobs) { current = knobs; }

        /// <summary>Where each behaviour lives: the knob, the route that shows it, and the names a
        /// profile or an exception record will carry (the ready line lists this).</summary>
        public static Json Catalogue()
        {
            return new Json()
                .Add("hot", new Json().Add("knob", "hot_ms").Add("route", "recommend")
                    .Add("method", "Storefront.Recommendations.RecommendationEngine.Similarity")
                    .Add("caller", "Storefront.Recommendations.RecommendationEngine.ScoreCandidates"))
                .Add("regression", new Json().Add("knobs", new[] { "regression", "regression_ms" })
                    .Add("routes", new[] { "product", "checkout", "grpc.catalog" })
                    .Add("method", "Storefront.Pricing.DiscountRules.Evaluate"))
                .Add("exceptions", new Json().Add("knob", "exception_every").Add("route", "coupon")
                    .Add("type", typeof(Pricing.CouponServiceException).FullName)
                    .Add("thrown_by", "Storefront.Pricing.CouponService.Lookup"))
                .Add("allocations", new Json().Add("knob", "report_rows").Add("route", "report")
                    .Add("types", new[] { typeof(Reports.SalesReportRow).FullName, typeof(Reports.LineItem).FullName + "[]", typeof(Reports.LineItem).FullName })
                    .Add("method", "Storefront.Reports.SalesReport.Build"))
                .Add("lock_convoy", new Json().Add("knob", "lock_hold_ms").Add("route", "cart")
                    .Add("holder", "Storefront.Carts.CartStore.CompactUnderLock").Add("holder_thread", Carts.CartJanitor.ThreadName)
                    .Add("waiter", "Storefront.Carts.CartStore.AddItem"))
                .Add("dependency_tail", new Json().Add("knobs", new[] { "inventory_delay_ms", "inventory_tail_ms", "inventory_tail_every" })
                    .Add("served_by", "downstream").Add("route", "reserve").Add("seen_at", "checkout")
                    .Add("method", "Storefront.Inventory.InventoryService.Reserve"));
        }
    }
}
