// Shared by the test-bed targets that serve HTTP with ASP.NET Core (AsyncWeb, Bookstore); see
// tests/targets/README.md. Nothing here stands in for the framework: the hosting layer, its
// "Microsoft.AspNetCore.Hosting" EventSource, its "Microsoft.AspNetCore" DiagnosticListener events and
// its HttpRequestIn server span are ASP.NET Core's own.
//
//   Testbed.WebHost.Start        a WebApplication on Kestrel, HTTP/1.1 on 127.0.0.1:PORT (0: a free port),
//                                no logging providers (stdout is for the JSON lines), started
//   Testbed.WebHost.RecordSpans  W3C ids and an ActivityListener sampling the app's source and the
//                                hosting source, so spans are really created, as with an OpenTelemetry SDK
//   Testbed.WebHost.Facts        the ready-line facts about the server and the hosting events
//   Testbed.WebHost.Respond      a body with its Content-Length (no chunked answers)
using System;
using System.Diagnostics;
using System.IO;
using System.Net;
using System.Reflection;
using System.Text;
using System.Threading.Tasks;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Server.Kestrel.Core;
using Microsoft.Extensions.Logging;

namespace Testbed
{
    public static class WebHost
    {
        /// <summary>ASP.NET Core's ActivitySource and DiagnosticListener.</summary>
        public const string HostingSource = "Microsoft.AspNetCore";
        public const string HostingActivity = "Microsoft.AspNetCore.Hosting.HttpRequestIn";
        public const string HostingEventSource = "Microsoft.AspNetCore.Hosting";

        /// <summary>Builds the app on 127.0.0.1:REQUESTED (0: a free port), lets MAP add its middleware
        /// and endpoints, and starts it; a port that cannot be bound fails ARGS (exit 2).</summary>
        public static WebApplication Start(int requested, Args args, Action<WebApplication> map, out int port)
        {
            WebApplicationBuilder builder = WebApplication.CreateBuilder(new WebApplicationOptions
            {
                Args = Array.Empty<string>(), // the arguments are the target's, not configuration
                ContentRootPath = AppContext.BaseDirectory,
            });
            builder.Logging.ClearProviders();
            ListenOptions http = null;
            builder.WebHost.ConfigureKestrel(kestrel =>
                kestrel.Listen(IPAddress.Loopback, requested, l => { l.Protocols = HttpProtocols.Http1; http = l; }));
            WebApplication app = builder.Build();
            map(app);
            try
            {
                app.StartAsync().GetAwaiter().GetResult();
            }
            catch (IOException e)
            {
                args.Fail("cannot listen on 127.0.0.1:" + requested + ": " + e.Message);
                throw;
            }
            app.Lifetime.ApplicationStopping.Register(Lifetime.RequestStop); // SIGTERM reaches the host first
            port = ((IPEndPoint)http.EndPoint).Port;
            return app;
        }

        /// <summary>W3C ids (forced), and an ActivityListener that records every span of the hosting
        /// source and of SOURCE; STOPPED (if not null) is called as each span stops.</summary>
        public static void RecordSpans(string source, Action<Activity> stopped)
        {
            Activity.DefaultIdFormat = ActivityIdFormat.W3C;
            Activity.ForceDefaultIdFormat = true;
            ActivitySource.AddActivityListener(new ActivityListener
            {
                ShouldListenTo = s => s.Name == source || s.Name == HostingSource,
                Sample = (ref ActivityCreationOptions<ActivityContext> _) => ActivitySamplingResult.AllDataAndRecorded,
                SampleUsingParentId = (ref ActivityCreationOptions<string> _) => ActivitySamplingResult.AllDataAndRecorded,
                ActivityStopped = stopped,
            });
        }

        /// <summary>The ready-line facts of an HTTP target listening on PORT.</summary>
        public static Json Facts(Json ready, int port)
        {
            string version = typeof(HttpContext).Assembly
                .GetCustomAttribute<AssemblyInformationalVersionAttribute>().InformationalVersion;
            int plus = version.IndexOf('+');
            return ready
                .Add("port", port)
                .Add("url", "http://127.0.0.1:" + port + "/")
                .Add("server", "Kestrel")
                .Add("aspnetcore", plus < 0 ? version : version.Substring(0, plus))
                .Add("diagnostic_listener", HostingSource)
                .Add("hosting_activity", HostingActivity)
                .Add("hosting_event_source", HostingEventSource)
                .Add("id_format", Activity.DefaultIdFormat.ToString());
        }

        /// <summary>Answers with STATUS and BODY; a client that went away is not an error.</summary>
        public static async Task Respond(HttpContext context, int status, string contentType, string body)
        {
            byte[] bytes = Encoding.UTF8.GetBytes(body);
            context.Response.StatusCode = status;
            context.Response.ContentType = contentType;
            context.Response.ContentLength = bytes.Length;
            try
            {
                await context.Response.Body.WriteAsync(bytes, 0, bytes.Length, context.RequestAborted);
            }
            catch (OperationCanceledException)
            {
                // the client went away
            }
            catch (IOException)
            {
                // the client went away
            }
        }
    }
}
