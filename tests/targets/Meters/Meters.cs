// Meters: a .NET test-bed target whose System.Diagnostics.Metrics instruments take known values
// over time, for the tests of the agent's metrics export and /livemetrics.
//
// What it does
//   Meter "Clrscope.Test.Meters", version "1.2.3", with
//     * Counter<long> "meters.orders" (unit "{order}"), every measurement tagged kind=online;
//     * UpDownCounter<long> "meters.queue" (unit "{item}");
//     * ObservableGauge<double> "meters.temperature" (unit "Cel"), observing the current value;
//     * Histogram<double> "meters.latency" (unit "ms").
//   Unless --no-wait, it waits until a listener (the runtime's metrics source, enabled by a tool)
//   listens to all four instruments, so that every measurement is aggregated. Then, thread
//   "Recorder" takes --steps steps, one every --step-ms ms; step k (1, 2, ...):
//     * orders.Add(k), one call: the total after step k is k(k+1)/2;
//     * queue.Add(+3k) for odd k, queue.Add(-k) for even k, one call;
//     * temperature := 20 + k/2;
//     * latency.Record(v) for v = 1, 2, ..., 100 in a tight loop: 100 measurements summing 5050
//       (p50 = 50, p95 = 95, p99 = 99 of one step's values).
//   After the last step the values stay as they are until the process ends.
//
// Arguments
//   --steps N                 steps to take (default 8, 1..1000)
//   --step-ms N               ms between steps (default 1500, 10..60000)
//   --no-wait                 start recording at once, listened to or not
//   --duration-seconds N      run N seconds, then exit 0 (default: until killed)
//
// Lines printed to stdout (one JSON object per line)
//   ready: {"ready":"Meters","pid":1234,"runtime":"8.0.4","meter":"Clrscope.Test.Meters",
//           "meter_version":"1.2.3","instruments":{"counter":"meters.orders",
//           "up_down_counter":"meters.queue","gauge":"meters.temperature",
//           "histogram":"meters.latency"},"steps":8,"step_ms":1500}
//   {"listened":true,"waited_ms":812,"unix_ms":1765100000123} once every instrument is listened to
//           (or at once with --no-wait): unix_ms is when the first step's measurements follow
//   after each step: {"step":3,"orders_total":6,"queue":7,"temperature":21.5,
//                     "latency_count":300,"latency_sum":15150}
//   {"done":"Meters","steps":8} after the last step
//   every second: {"progress":"Meters","elapsed_s":N}
//   at exit: {"exit":"Meters","elapsed_s":N}
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Diagnostics.Metrics;
using System.Threading;
using Testbed;

namespace Meters
{
    static class Program
    {
        const string Usage =
            "usage: Meters [--steps 8] [--step-ms 1500] [--no-wait] [--duration-seconds N]\n" +
            "  a counter, up-down counter, observable gauge and histogram of meter\n" +
            "  Clrscope.Test.Meters take known values step by step; see the top of Meters.cs";

        const string MeterName = "Clrscope.Test.Meters";
        static readonly Meter Meter = new Meter(MeterName, "1.2.3");
        static readonly Counter<long> Orders = Meter.CreateCounter<long>("meters.orders", "{order}", "Orders placed");
        static readonly UpDownCounter<long> Queue = Meter.CreateUpDownCounter<long>("meters.queue", "{item}", "Items waiting");
        static readonly Histogram<double> Latency = Meter.CreateHistogram<double>("meters.latency", "ms", "Time per request");
        static ObservableGauge<double> temperatureGauge;
        static double temperature = 20.0;

        static int Main(string[] argv)
        {
            var args = new Args("Meters", Usage, argv, new[] { "steps", "step-ms" }, new[] { "no-wait" });
            int steps = args.Int("steps", 8, 1, 1000);
            int stepMs = args.Int("step-ms", 1500, 10, 60000);
            bool wait = !args.Has("no-wait");
            double? duration = args.DurationSeconds();
            Lifetime.Install();
            temperatureGauge = Meter.CreateObservableGauge<double>("meters.temperature",
                () => Volatile.Read(ref temperature), "Cel", "Room temperature");

            var recorder = new Thread(() => Record(steps, stepMs, wait)) { Name = "Recorder", IsBackground = true };
            Out.Line(Out.Ready("Meters")
                .Add("meter", MeterName)
                .Add("meter_version", "1.2.3")
                .Add("instruments", new Json()
                    .Add("counter", "meters.orders")
                    .Add("up_down_counter", "meters.queue")
                    .Add("gauge", "meters.temperature")
                    .Add("histogram", "meters.latency"))
                .Add("steps", steps)
                .Add("step_ms", stepMs));
            recorder.Start();
            double elapsed = Lifetime.Run(duration, second =>
                Out.Line(new Json().Add("progress", "Meters").Add("elapsed_s", second)));
            Out.Line(new Json().Add("exit", "Meters").Add("elapsed_s", Math.Round(elapsed, 3)));
            return 0;
        }

        static bool AllListened()
        {
            return Orders.Enabled && Queue.Enabled && Latency.Enabled && temperatureGauge.Enabled;
        }

        static void Record(int steps, int stepMs, bool wait)
        {
            var watch = Stopwatch.StartNew();
            while (wait && !AllListened() && !Lifetime.Stopping)
                Lifetime.StopHandle.WaitOne(20);
            Out.Line(new Json().Add("listened", AllListened()).Add("waited_ms", watch.ElapsedMilliseconds)
                .Add("unix_ms", DateTimeOffset.UtcNow.ToUnixTimeMilliseconds()));
            long ordersTotal = 0, queue = 0, latencyCount = 0;
            double latencySum = 0;
            var online = new KeyValuePair<string, object>("kind", "online");
            var next = Stopwatch.StartNew();
            for (int k = 1; k <= steps && !Lifetime.Stopping; k++)
            {
                Orders.Add(k, online);
                ordersTotal += k;
                long change = k % 2 == 1 ? 3L * k : -k;
                Queue.Add(change);
                queue += change;
                Volatile.Write(ref temperature, 20.0 + k / 2.0);
                for (int v = 1; v <= 100; v++)
                {
                    Latency.Record(v);
                    latencyCount++;
                    latencySum += v;
                }
                Out.Line(new Json().Add("step", k).Add("orders_total", ordersTotal).Add("queue", queue)
                    .Add("temperature", 20.0 + k / 2.0).Add("latency_count", latencyCount).Add("latency_sum", latencySum));
                long due = (long)k * stepMs;
                long waitMs = due - next.ElapsedMilliseconds;
                if (waitMs > 0 && k < steps) Lifetime.StopHandle.WaitOne((int)waitMs);
            }
            Out.Line(new Json().Add("done", "Meters").Add("steps", steps));
        }
    }
}
