using System;
using System.Collections.Generic;
using System.Globalization;
using System.Runtime.CompilerServices;

namespace Storefront.Reports
{
    /// <summary>One row of the sales report (the allocation path's main type).</summary>
    public sealed class SalesReportRow
    {
        public long OrderNumber;
        public string Customer;
        public string Region;
        public LineItem[] Items;
        public string Summary;
    }

    public sealed class LineItem
    {
        public long ProductId;
        public int Quantity;
        public long PriceCents;
        public string Sku;
    }

    /// <summary>The allocation-heavy path: a sales report built as objects (Knobs.ReportRows rows,
    /// each a SalesReportRow, a LineItem[] of 4, 4 LineItems and 4 strings), then summed.</summary>
    public static class SalesReport
    {
        static readonly string[] Regions = { "north", "south", "east", "west" };

        [MethodImpl(MethodImplOptions.NoInlining)]
        public static List<SalesReportRow> Build(int rows)
        {
            var report = new List<SalesReportRow>(Math.Min(rows, 1 << 16));
            for (int i = 0; i < rows; i++)
            {
                var items = new LineItem[4];
                for (int j = 0; j < items.Length; j++)
                {
                    long product = 1 + (i * 7 + j * 13) % 200;
                    items[j] = new LineItem
                    {
                        ProductId = product,
                        Quantity = 1 + (i + j) % 3,
                        PriceCents = 499 + product * 379 % 14500,
                        Sku = "SKU-" + product.ToString("D5", CultureInfo.InvariantCulture),
                    };
                }
                report.Add(new SalesReportRow
                {
                    OrderNumber = 100000 + i,
                    Customer = "customer-" + (i * 7919 % 5000).ToString(CultureInfo.InvariantCulture),
                    Region = Regions[i % Regions.Length],
                    Items = items,
                    Summary = string.Format(CultureInfo.InvariantCulture, "order {0}: {1} items", 100000 + i, items.Length),
                });
            }
            return report;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        public static long TotalCents(List<SalesReportRow> report)
        {
            long total = 0;
            foreach (SalesReportRow row in report)
                foreach (LineItem item in row.Items)
                    total += item.PriceCents * item.Quantity;
            return total;
        }
    }
}
