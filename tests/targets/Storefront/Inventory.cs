using System.Diagnostics;
using System.Runtime.CompilerServices;
using System.Text.Json;
using System.Text.Json.Serialization;
using System.Threading;
using System.Threading.Tasks;
using Grpc.Core;
using Storefront.Grpc;

namespace Storefront.Inventory
{
    public sealed class ReserveRequest
    {
        public long ProductId { get; set; }
        public int Quantity { get; set; }
    }

    public sealed class ReserveReply
    {
        public long Reservation { get; set; }
        public double DelayMs { get; set; }
    }

    /// <summary>The reservation's JSON, generated at build time (web defaults, as PostAsJsonAsync's): the
    /// NativeAOT build (../StorefrontAot) has no reflection-based serializer for the client side.</summary>
    [JsonSourceGenerationOptions(JsonSerializerDefaults.Web)]
    [JsonSerializable(typeof(ReserveRequest))]
    [JsonSerializable(typeof(ReserveReply))]
    public sealed partial class InventoryJson : JsonSerializerContext
    {
    }

    /// <summary>The downstream's inventory: POST /api/inventory/reserve answers after
    /// Knobs.InventoryDelayMs, every Knobs.InventoryTailEvery-th after Knobs.InventoryTailMs (the
    /// slow dependency with a latency tail, as the frontend's checkout sees it).</summary>
    public static class InventoryService
    {
        static long reservations;
        static long reservedUnits;

        public static long ReservedUnits => Interlocked.Read(ref reservedUnits);

        [MethodImpl(MethodImplOptions.NoInlining)]
        public static async Task<ReserveReply> Reserve(ReserveRequest request)
        {
            using Activity span = Telemetry.StartSpan("inventory.reserve");
            long n = Interlocked.Increment(ref reservations);
            Knobs k = Behaviour.Current;
            bool slow = k.InventoryTailMs > 0 && n % k.InventoryTailEvery == 0;
            double delay = slow ? k.InventoryTailMs : k.InventoryDelayMs;
            span?.SetTag("inventory.reservation", n);
            span?.SetTag("inventory.slow", slow);
            if (delay > 0) await Task.Delay(System.TimeSpan.FromMilliseconds(delay));
            Interlocked.Add(ref reservedUnits, request.Quantity);
            Counts.Add(ref Counts.Reservations);
            if (slow) Counts.Add(ref Counts.SlowReservations);
            Telemetry.InventoryReservations.Add(1, new System.Collections.Generic.KeyValuePair<string, object>("inventory.slow", slow));
            return new ReserveReply { Reservation = n, DelayMs = delay };
        }
    }

    /// <summary>gRPC storefront.v1.Inventory: the stock check the frontend makes before it reserves.</summary>
    public sealed class InventoryGrpcService : Grpc.Inventory.InventoryBase
    {
        public override Task<StockReply> CheckStock(StockRequest request, ServerCallContext context)
        {
            using Activity span = Telemetry.StartSpan("inventory.check_stock");
            Counts.Add(ref Counts.StockChecks);
            long onHand = 1000 + request.ProductId % 50;
            return Task.FromResult(new StockReply { ProductId = request.ProductId, Available = request.Quantity <= onHand, OnHand = onHand });
        }
    }
}
