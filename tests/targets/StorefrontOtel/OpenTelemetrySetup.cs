// StorefrontOtel only: the OpenTelemetry .NET SDK inside the Storefront, the way its documentation
// sets it up for ASP.NET Core — tracing and metrics of the service's own source and meter and of the
// framework's built-in ones, logs through the OpenTelemetry logger provider, all exported over OTLP.
using System;
using System.Reflection;
using Microsoft.AspNetCore.Builder;
using Microsoft.Extensions.DependencyInjection;
using OpenTelemetry;
using OpenTelemetry.Exporter;
using OpenTelemetry.Logs;
using OpenTelemetry.Metrics;
using OpenTelemetry.Resources;
using OpenTelemetry.Trace;
using Testbed;

namespace Storefront
{
    public static class OpenTelemetrySetup
    {
        /// <summary>ActivitySources: the service's, then ASP.NET Core's hosting, HttpClient's (.NET 9+),
        /// the gRPC client's and Npgsql's.</summary>
        public static readonly string[] Sources =
        {
            Telemetry.SourceName, "Microsoft.AspNetCore", "System.Net.Http", "Grpc.Net.Client", "Npgsql",
        };

        /// <summary>Meters: the service's, then the built-in ones of ASP.NET Core, Kestrel, HttpClient,
        /// DNS, the runtime (.NET 9+) and Npgsql.</summary>
        public static readonly string[] Meters =
        {
            Telemetry.MeterName, "Microsoft.AspNetCore.Hosting", "Microsoft.AspNetCore.Server.Kestrel",
            "Microsoft.AspNetCore.Routing", "Microsoft.AspNetCore.Diagnostics", "System.Net.Http",
            "System.Net.NameResolution", "System.Runtime", "Npgsql",
        };

        /// <summary>Adds the SDK to BUILDER, exporting to --otlp-endpoint (else OTEL_EXPORTER_OTLP_ENDPOINT;
        /// one of them is required) over --otlp-protocol (else OTEL_EXPORTER_OTLP_PROTOCOL, else grpc);
        /// the ready line's "opentelemetry".</summary>
        public static Json Configure(WebApplicationBuilder builder, StorefrontOptions options)
        {
            string endpoint = options.OtlpEndpoint ?? Environment.GetEnvironmentVariable("OTEL_EXPORTER_OTLP_ENDPOINT");
            Uri endpointUri = null;
            if (string.IsNullOrEmpty(endpoint) || !Uri.TryCreate(endpoint, UriKind.Absolute, out endpointUri))
                Fail("needs an OTLP endpoint URL: --otlp-endpoint URL or OTEL_EXPORTER_OTLP_ENDPOINT (got '" + endpoint + "')");
            string protocolName = options.OtlpProtocol ?? Environment.GetEnvironmentVariable("OTEL_EXPORTER_OTLP_PROTOCOL") ?? "grpc";
            OtlpExportProtocol protocol = OtlpExportProtocol.Grpc;
            if (protocolName == "http/protobuf") protocol = OtlpExportProtocol.HttpProtobuf;
            else if (protocolName != "grpc") Fail("--otlp-protocol must be grpc or http/protobuf, not '" + protocolName + "'");
            string serviceName = Environment.GetEnvironmentVariable("OTEL_SERVICE_NAME") ?? "Storefront";

            builder.Services.AddOpenTelemetry()
                .ConfigureResource(resource => resource.AddService(serviceName, serviceVersion: Telemetry.Version))
                .WithTracing(tracing => tracing.AddSource(Sources).AddAspNetCoreInstrumentation().AddHttpClientInstrumentation())
                .WithMetrics(metrics => metrics.AddMeter(Meters).AddAspNetCoreInstrumentation().AddHttpClientInstrumentation())
                .WithLogging()
                .UseOtlpExporter(protocol, endpointUri);

            return new Json()
                .Add("sdk", typeof(Sdk).Assembly.GetCustomAttribute<AssemblyInformationalVersionAttribute>()?.InformationalVersion)
                .Add("endpoint", endpointUri.ToString()).Add("protocol", protocolName).Add("service_name", serviceName)
                .Add("sources", Sources).Add("meters", Meters)
                .Add("instrumentation", new[] { "AspNetCore", "Http" })
                .Add("logs", "OpenTelemetryLoggerProvider (defaults: no formatted message, no scopes)")
                // What the SDK reads from the environment for its export cadence (null: its default).
                .Add("env", new Json()
                    .Add("OTEL_METRIC_EXPORT_INTERVAL", Environment.GetEnvironmentVariable("OTEL_METRIC_EXPORT_INTERVAL"))
                    .Add("OTEL_BSP_SCHEDULE_DELAY", Environment.GetEnvironmentVariable("OTEL_BSP_SCHEDULE_DELAY"))
                    .Add("OTEL_BLRP_SCHEDULE_DELAY", Environment.GetEnvironmentVariable("OTEL_BLRP_SCHEDULE_DELAY"))
                    .Add("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
                        Environment.GetEnvironmentVariable("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE")));
        }

        static void Fail(string message)
        {
            Console.Error.Write("StorefrontOtel: " + message + "\n" + StorefrontOptions.Usage + "\n");
            Environment.Exit(2);
        }
    }
}
