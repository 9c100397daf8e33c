using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Net.Http;
using System.Net.Http.Json;
using System.Runtime.CompilerServices;
using System.Threading.Tasks;
using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.Logging;
using Storefront.Data;
using Storefront.Grpc;
using Storefront.Inventory;
using Storefront.Pricing;

namespace Storefront.Ordering
{
    public sealed class OrderRequest
    {
        public long ProductId { get; set; }
        public int Quantity { get; set; } = 1;
        public string Coupon { get; set; }
    }

    /// <summary>POST /api/orders: price, stock check (gRPC to the downstream), reservation (HTTP to
    /// the downstream), the order row, the metrics and a log line.</summary>
    public sealed class Checkout
    {
        public const string HttpClientName = "inventory";
        /// <summary>A reservation slower than this is logged as a warning.</summary>
        public const double SlowReservationMs = 100;

        readonly Store store;
        readonly IHttpClientFactory clients;
        readonly Grpc.Inventory.InventoryClient stock;
        readonly ILogger<Checkout> log;

        public Checkout(Store store, IHttpClientFactory clients, Grpc.Inventory.InventoryClient stock, ILogger<Checkout> log)
        {
            this.store = store;
            this.clients = clients;
            this.stock = stock;
            this.log = log;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        public async Task<IResult> PlaceOrder(OrderRequest order)
        {
            long started = Stopwatch.GetTimestamp();
            using Activity span = Telemetry.StartSpan("checkout.place_order");
            span?.SetTag("storefront.product_id", order.ProductId);
            if (order.Quantity < 1 || order.Quantity > 100) return Results.BadRequest(new { error = "quantity must be 1..100" });
            Product product = await store.Get(order.ProductId);
            if (product == null) return Results.NotFound(new { error = "no product " + order.ProductId });
            int? percentOff = order.Coupon == null ? null : CouponService.Lookup(order.Coupon);
            long total = DiscountRules.Evaluate(product.PriceCents, order.Quantity);
            if (percentOff.HasValue) total -= total * percentOff.Value / 100;

            Counts.Add(ref Counts.DownstreamCalls);
            StockReply stockReply = await stock.CheckStockAsync(new StockRequest { ProductId = product.Id, Quantity = order.Quantity });
            if (!stockReply.Available) return Results.Conflict(new { error = "out of stock" });

            long reserveStart = Stopwatch.GetTimestamp();
            Counts.Add(ref Counts.DownstreamCalls);
            HttpResponseMessage reserved = await clients.CreateClient(HttpClientName).PostAsJsonAsync(
                "api/inventory/reserve", new ReserveRequest { ProductId = product.Id, Quantity = order.Quantity },
                InventoryJson.Default.ReserveRequest);
            double reserveMs = Stopwatch.GetElapsedTime(reserveStart).TotalMilliseconds;
            if (!reserved.IsSuccessStatusCode)
            {
                Counts.Add(ref Counts.DownstreamFailures);
                log.LogError("Inventory reservation for product {ProductId} failed with {StatusCode}", product.Id, (int)reserved.StatusCode);
                return Results.StatusCode(StatusCodes.Status502BadGateway);
            }
            ReserveReply reservation = await reserved.Content.ReadFromJsonAsync(InventoryJson.Default.ReserveReply);

            long orderId = await store.InsertOrder(product.Id, order.Quantity, total, order.Coupon);
            Counts.Add(ref Counts.OrdersPlaced);
            Telemetry.OrdersPlaced.Add(1, new KeyValuePair<string, object>("storefront.coupon_applied", percentOff.HasValue));
            Telemetry.CheckoutDuration.Record(Stopwatch.GetElapsedTime(started).TotalSeconds);
            if (reserveMs > SlowReservationMs)
                log.LogWarning("Inventory reservation {Reservation} for order {OrderId} took {ElapsedMs} ms", reservation.Reservation, orderId, Math.Round(reserveMs, 1));
            log.LogInformation("Order {OrderId} placed: {Quantity} x product {ProductId} for {TotalCents} cents", orderId, order.Quantity, product.Id, total);
            span?.SetTag("storefront.order_id", orderId);
            return Results.Ok(new { orderId, productId = product.Id, quantity = order.Quantity, totalCents = total, reservation = reservation.Reservation });
        }
    }
}
