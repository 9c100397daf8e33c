using System.Collections.Generic;
using System.Diagnostics;
using System.Threading.Tasks;
using Grpc.Core;
using Microsoft.AspNetCore.Http;
using Storefront.Data;
using Storefront.Grpc;
using Storefront.Pricing;

namespace Storefront.Catalog
{
    /// <summary>GET /api/products[?q=], GET /api/products/{id} and gRPC storefront.v1.Catalog.</summary>
    public static class CatalogEndpoints
    {
        public static async Task<IResult> Search(Store store, string q)
        {
            using Activity span = Telemetry.StartSpan("catalog.search");
            span?.SetTag("storefront.query", q ?? "");
            List<Product> found = await store.Search(q);
            span?.SetTag("storefront.results", found.Count);
            return Results.Ok(found);
        }

        public static async Task<IResult> Get(Store store, long id)
        {
            using Activity span = Telemetry.StartSpan("catalog.get");
            span?.SetTag("storefront.product_id", id);
            Product p = await store.Get(id);
            if (p == null) return Results.NotFound(new { error = "no product " + id });
            return Results.Ok(new { p.Id, p.Name, p.Category, p.PriceCents, DiscountedCents = DiscountRules.Evaluate(p.PriceCents, 1) });
        }
    }

    public sealed class CatalogGrpcService : Grpc.Catalog.CatalogBase
    {
        readonly Store store;

        public CatalogGrpcService(Store store) { this.store = store; }

        public override async Task<ProductReply> GetProduct(GetProductRequest request, ServerCallContext context)
        {
            using Activity span = Telemetry.StartSpan("catalog.get");
            span?.SetTag("storefront.product_id", request.Id);
            Product p = await store.Get(request.Id);
            if (p == null) throw new RpcException(new Status(StatusCode.NotFound, "no product " + request.Id));
            return new ProductReply
            {
                Id = p.Id, Name = p.Name, Category = p.Category, PriceCents = p.PriceCents,
                DiscountedCents = DiscountRules.Evaluate(p.PriceCents, 1),
            };
        }
    }
}
