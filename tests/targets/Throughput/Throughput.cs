// Throughput: a .NET test-bed target that does a fixed amount of mixed managed work per operation as
// fast as it can, so that a profiler's overhead shows as lost operations per second.
//
// What it does
//   Starts --threads worker threads "Worker1", "Worker2", ...; each runs operations back to back in
//   Throughput.Worker.Run. One operation (Throughput.Worker.Op) does the same work every time, only
//   the data it picks depends on the operation's number (so runs are repeatable):
//     Lookups   32 Dictionary<string,int> lookups in a 256-entry price list (one in eight misses)
//     Format    a StringBuilder line (ints, a fixed-point number, invariant culture) and one
//               string.Format with a hex field
//     Allocate  a List<LineItem> of 16 new Throughput.LineItem objects (each with its own string)
//     Sort      Array.Sort of 64 ints through an IComparer<int> (interface calls on every compare)
//     Dispatch  area and perimeter of 12 shapes of 3 classes through the IShape interface
//   Each step is its own [NoInlining] method, so a CPU profile shows Throughput.Worker.Lookups,
//   .Format, .Allocate, .Sort and .Dispatch under .Op. One operation allocates about 1.8 KB.
//   With --blocked-threads M, M more threads stay blocked for the whole run: odd ones
//   ("BlockedWait1", "BlockedWait3", ...) in Monitor.Wait, even ones ("BlockedSleep2", ...) in
//   Thread.Sleep. They do no work, but the runtime's sampler walks every managed thread on each tick,
//   so they make sampling more expensive the way a large thread pool does.
//
// Arguments
//   --threads N            worker threads, 1..64 (default 4)
//   --blocked-threads M    idle blocked threads, 0..1000 (default 0)
//   --duration-seconds N   run N seconds, then exit 0 (default: until killed; Ctrl-C exits cleanly)
//   --tick-ms T            also print a tick line every T ms, 10..1000 (default: none), from a thread
//                          "Ticker" of its own: operations against the wall clock at a finer grain
//                          than the progress lines, to see when in time a profiler's cost falls
//
// Lines printed to stdout (one JSON object per line)
//   ready, once every thread runs:
//     {"ready":"Throughput","pid":1234,"runtime":"8.0.4","threads":4,"blocked_threads":0,
//      "op_checksum":123456789,"tid_source":"gettid",
//      "workers":[{"name":"Worker1","tid":1240},...],"blocked":[{"name":"BlockedWait1","tid":1250},...]}
//     op_checksum: the combined result of operations 0..999, computed before the workers start;
//     the same on every run and machine (a check that the work is deterministic).
//   every second:
//     {"progress":"Throughput","elapsed_s":1,"t_s":1.0003,"ops":812345,"ops_per_second":812101.5,
//      "total_ops":812345,"allocated_bytes":1876543210,"gen0_collections":312}
//     t_s: seconds since the ready line (Stopwatch); ops: operations finished since the previous
//     line, over all workers; ops_per_second: ops divided by the time since the previous line;
//     total_ops: since the ready line; allocated_bytes: GC.GetTotalAllocatedBytes of the process
//     (-1 where the runtime lacks it); gen0_collections: GC.CollectionCount(0).
//   every T ms with --tick-ms T, once every thread runs:
//     {"tick":"Throughput","unix_ms":1764528000123.4,"total_ops":812345}
//     unix_ms: the wall clock (UTC) when total_ops was read; total_ops: since the ready line.
//   at exit (after --duration-seconds or Ctrl-C):
//     {"exit":"Throughput","elapsed_s":5.001,"total_ops":4061234,"ops_per_second":812084.1,
//      "per_worker":[1015301,...]}
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.Reflection;
using System.Runtime.CompilerServices;
using System.Text;
using System.Threading;
using Testbed;

namespace Throughput
{
    interface IShape
    {
        double Area();
        double Perimeter();
    }

    sealed class Circle : IShape
    {
        readonly double r;
        public Circle(double r) { this.r = r; }
        public double Area() { return Math.PI * r * r; }
        public double Perimeter() { return 2 * Math.PI * r; }
    }

    sealed class Rect : IShape
    {
        readonly double w, h;
        public Rect(double w, double h) { this.w = w; this.h = h; }
        public double Area() { return w * h; }
        public double Perimeter() { return 2 * (w + h); }
    }

    sealed class Triangle : IShape
    {
        readonly double a, b, c;
        public Triangle(double a, double b, double c) { this.a = a; this.b = b; this.c = c; }
        public double Area()
        {
            double s = (a + b + c) / 2;
            return Math.Sqrt(s * (s - a) * (s - b) * (s - c));
        }
        public double Perimeter() { return a + b + c; }
    }

    sealed class LineItem
    {
        public string Sku;
        public int Quantity;
        public long PriceCents;
    }

    /// <summary>Descending order: a class (not a delegate) so every comparison is an interface call.</summary>
    sealed class Descending : IComparer<int>
    {
        public int Compare(int x, int y) { return y.CompareTo(x); }
    }

    /// <summary>One worker thread's data and counter. Each worker owns all it touches, so the
    /// workers never contend with each other.</summary>
    sealed class Worker
    {
        const int Keys = 256;
        readonly string[] keys = new string[Keys];
        readonly string[] misses = new string[Keys];
        readonly Dictionary<string, int> prices = new Dictionary<string, int>(StringComparer.Ordinal);
        readonly int[] template = new int[64];
        readonly int[] scratch = new int[64];
        readonly IComparer<int> order = new Descending();
        readonly IShape[] shapes = new IShape[12];
        readonly StringBuilder line = new StringBuilder(128);

        public string Name;
        public int Tid;
        public Thread Thread;
        public readonly ManualResetEvent Started = new ManualResetEvent(false);
        long ops;               // written by this worker only, read by the reporter
        public long Sink;       // keeps results alive so the JIT cannot drop the work

        public Worker()
        {
            for (int i = 0; i < Keys; i++)
            {
                keys[i] = "sku-" + (i * 7919 % 100000).ToString("D5", CultureInfo.InvariantCulture);
                misses[i] = "none-" + i.ToString(CultureInfo.InvariantCulture);
                prices[keys[i]] = 100 + i * 37 % 9900;
            }
            for (int i = 0; i < template.Length; i++) template[i] = (i * 40503) % 65536;
            for (int i = 0; i < shapes.Length; i++)
            {
                switch (i % 3)
                {
                    case 0: shapes[i] = new Circle(1 + i * 0.25); break;
                    case 1: shapes[i] = new Rect(1 + i, 2 + i * 0.5); break;
                    default: shapes[i] = new Triangle(3 + i, 4 + i, 5 + i); break;
                }
            }
        }

        public long Ops { get { return Volatile.Read(ref ops); } }

        [MethodImpl(MethodImplOptions.NoInlining)]
        public void Run()
        {
            Tid = Native.CurrentTid();
            Started.Set();
            long n = 0;
            long sink = 0;
            while (!Lifetime.Stopping)
            {
                sink += Op(n++);
                Volatile.Write(ref ops, n);
            }
            Sink = sink;
        }

        /// <summary>Operation number N: the same work for every N, only the chosen data differs.</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        public long Op(long n)
        {
            int seed = (int)(n & 0x7fffffff);
            long total = Lookups(seed);
            total += Format(seed, total);
            total += Allocate(seed);
            total += Sort(seed);
            total += Dispatch();
            return total;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        long Lookups(int seed)
        {
            long sum = 0;
            for (int k = 0; k < 32; k++)
            {
                int i = (seed * 31 + k * 17) & (Keys - 1);
                int price;
                if (prices.TryGetValue((k & 7) == 7 ? misses[i] : keys[i], out price)) sum += price;
                else sum -= 1;
            }
            return sum;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        long Format(int seed, long amount)
        {
            line.Clear();
            line.Append("order ").Append(seed).Append(" for ").Append(keys[seed & (Keys - 1)])
                .Append(": ").Append((amount / 100.0).ToString("F2", CultureInfo.InvariantCulture))
                .Append(" EUR");
            string id = string.Format(CultureInfo.InvariantCulture, "{0}/{1:X8}", line.Length, seed);
            return line.Length + id.Length;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        long Allocate(int seed)
        {
            var items = new List<LineItem>(16);
            for (int k = 0; k < 16; k++)
            {
                string sku = keys[(seed + k) & (Keys - 1)];
                items.Add(new LineItem
                {
                    Sku = string.Concat(sku, "/", k.ToString(CultureInfo.InvariantCulture)),
                    Quantity = 1 + k,
                    PriceCents = prices[sku],
                });
            }
            long sum = 0;
            foreach (var item in items) sum += item.Quantity * item.PriceCents + item.Sku.Length;
            return sum;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        long Sort(int seed)
        {
            int shift = seed % template.Length;
            for (int i = 0; i < template.Length; i++) scratch[i] = template[(i + shift) % template.Length] ^ (seed & 0xff);
            Array.Sort(scratch, order);
            return scratch[0] - scratch[scratch.Length - 1];
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        long Dispatch()
        {
            double sum = 0;
            foreach (IShape s in shapes) sum += s.Area() + s.Perimeter();
            return (long)sum;
        }
    }

    static class Program
    {
        const string Usage =
            "usage: Throughput [--threads 4] [--blocked-threads 0] [--duration-seconds N] [--tick-ms T]\n" +
            "  runs a fixed mixed managed operation as fast as possible on --threads threads and prints\n" +
            "  operations per second each second; see the top of Throughput.cs for the lines it prints";

        static readonly object BlockedGate = new object();

        /// <summary>Prints a tick line every TICKMS ms, on the wall clock's multiples of TICKMS, so
        /// that ticks of separate runs line up.</summary>
        static void StartTicker(List<Worker> workers, int tickMs)
        {
            var epoch = new DateTime(1970, 1, 1, 0, 0, 0, DateTimeKind.Utc);
            var ticker = new Thread(() =>
            {
                while (true)
                {
                    double now = (DateTime.UtcNow - epoch).TotalMilliseconds;
                    int wait = (int)Math.Ceiling(tickMs - now % tickMs);
                    Thread.Sleep(Math.Max(1, wait));
                    long total = TotalOps(workers);
                    double at = (DateTime.UtcNow - epoch).TotalMilliseconds;
                    Out.Line(new Json()
                        .Add("tick", "Throughput")
                        .Add("unix_ms", Math.Round(at, 1))
                        .Add("total_ops", total));
                }
            }) { Name = "Ticker", IsBackground = true };
            ticker.Start();
        }

        static int Main(string[] argv)
        {
            var args = new Args("Throughput", Usage, argv, new[] { "threads", "blocked-threads", "tick-ms" }, new string[0]);
            int threads = args.Int("threads", 4, 1, 64);
            int blockedCount = args.Int("blocked-threads", 0, 0, 1000);
            int tickMs = args.Int("tick-ms", 0, 0, 1000);
            if (tickMs != 0 && tickMs < 10) args.Fail("--tick-ms must be 0 (none) or 10..1000");
            double? duration = args.DurationSeconds();
            Lifetime.Install();

            long checksum = 0;
            var probe = new Worker();
            for (long n = 0; n < 1000; n++) checksum = checksum * 31 + probe.Op(n);

            var blocked = new List<KeyValuePair<string, int>>();
            var blockedStarted = new CountdownEvent(blockedCount);
            for (int i = 1; i <= blockedCount; i++)
            {
                bool wait = i % 2 == 1;
                string name = (wait ? "BlockedWait" : "BlockedSleep") + i.ToString(CultureInfo.InvariantCulture);
                var t = new Thread(() =>
                {
                    lock (blocked) blocked.Add(new KeyValuePair<string, int>(name, Native.CurrentTid()));
                    blockedStarted.Signal();
                    if (wait) BlockInWait();
                    else BlockInSleep();
                }) { Name = name, IsBackground = true };
                t.Start();
            }
            blockedStarted.Wait();

            var workers = new List<Worker>();
            for (int i = 1; i <= threads; i++)
            {
                var w = new Worker { Name = "Worker" + i.ToString(CultureInfo.InvariantCulture) };
                w.Thread = new Thread(w.Run) { Name = w.Name, IsBackground = true };
                workers.Add(w);
            }
            var clock = Stopwatch.StartNew();
            foreach (var w in workers) w.Thread.Start();
            foreach (var w in workers) w.Started.WaitOne();

            var workerLines = new List<Json>();
            foreach (var w in workers) workerLines.Add(new Json().Add("name", w.Name).Add("tid", w.Tid));
            var blockedLines = new List<Json>();
            lock (blocked)
                foreach (var b in blocked) blockedLines.Add(new Json().Add("name", b.Key).Add("tid", b.Value));
            Out.Line(Out.Ready("Throughput")
                .Add("threads", threads)
                .Add("blocked_threads", blockedCount)
                .Add("op_checksum", checksum)
                .Add("tid_source", Native.TidSource)
                .Add("workers", workerLines)
                .Add("blocked", blockedLines));

            clock.Restart();
            if (tickMs != 0) StartTicker(workers, tickMs);
            var allocated = AllocatedBytesReader();
            long lastOps = 0;
            double lastT = 0;
            double elapsed = Lifetime.Run(duration, second =>
            {
                double t = clock.Elapsed.TotalSeconds;
                long total = TotalOps(workers);
                Out.Line(new Json()
                    .Add("progress", "Throughput")
                    .Add("elapsed_s", second)
                    .Add("t_s", Math.Round(t, 4))
                    .Add("ops", total - lastOps)
                    .Add("ops_per_second", Math.Round((total - lastOps) / (t - lastT), 1))
                    .Add("total_ops", total)
                    .Add("allocated_bytes", allocated())
                    .Add("gen0_collections", GC.CollectionCount(0)));
                lastOps = total;
                lastT = t;
            });

            double end = clock.Elapsed.TotalSeconds;
            long finalOps = TotalOps(workers);
            foreach (var w in workers) w.Thread.Join(2000);
            lock (BlockedGate) Monitor.PulseAll(BlockedGate);
            var perWorker = new List<long>();
            foreach (var w in workers) perWorker.Add(w.Ops);
            Out.Line(new Json()
                .Add("exit", "Throughput")
                .Add("elapsed_s", Math.Round(elapsed, 3))
                .Add("total_ops", finalOps)
                .Add("ops_per_second", Math.Round(finalOps / end, 1))
                .Add("per_worker", perWorker));
            return 0;
        }

        static long TotalOps(List<Worker> workers)
        {
            long total = 0;
            foreach (var w in workers) total += w.Ops;
            return total;
        }

        /// <summary>GC.GetTotalAllocatedBytes(false): in the .NET runtime, not in the Mono mscorlib
        /// this is compiled against, hence found by reflection.</summary>
        static Func<long> AllocatedBytesReader()
        {
            MethodInfo m = typeof(GC).GetMethod("GetTotalAllocatedBytes", new[] { typeof(bool) });
            if (m == null) return () => -1;
            var read = (Func<bool, long>)Delegate.CreateDelegate(typeof(Func<bool, long>), m);
            return () => read(false);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void BlockInWait()
        {
            lock (BlockedGate)
                while (!Lifetime.Stopping) Monitor.Wait(BlockedGate);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void BlockInSleep()
        {
            while (!Lifetime.Stopping) Thread.Sleep(1000);
        }
    }
}
