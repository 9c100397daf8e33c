// Tiering: a .NET test-bed target for the symbolizer: code that appears while a profile records.
//
// What it does
//   From the start, a thread "LinqLoop" runs Tiering.Program.LinqLoop, which calls the framework's
//   ReadyToRun-compiled System.Linq.Enumerable.Sum(IEnumerable<int>) and .Where(...).Count() over a
//   large array, so framework code from System.Linq.dll is on the hot path.
//   After --late-start-ms milliseconds, a thread "LateLoop" starts Tiering.Program.LateLoop, which
//   calls Tiering.Program.LateHelper in a tight loop. Neither method runs before then, so both are
//   first compiled while a recording that started earlier is running; LateHelper is called millions
//   of times, so tiered compilation promotes it from tier 0 to tier 1 during the recording too.
//   Run with DOTNET_TieredCompilation=0 to keep the framework's ReadyToRun code (tiering would
//   otherwise replace hot ReadyToRun methods by tier-1 jitted code after ~30 calls).
//
// Arguments
//   --late-start-ms M       delay before LateLoop starts, 0..600000 (default 1500)
//   --duration-seconds N    run N seconds, then exit 0 (default: until killed; Ctrl-C exits cleanly)
//
// Lines printed to stdout (one JSON object per line)
//   ready, once LinqLoop runs:
//     {"ready":"Tiering","pid":1234,"runtime":"8.0.4","late_start_ms":1500,
//      "linq_method":"Tiering.Program.LinqLoop","late_method":"Tiering.Program.LateLoop",
//      "late_helper":"Tiering.Program.LateHelper"}
//   when LateLoop starts:   {"late_started":"Tiering","elapsed_ms":1501}
//   every second:           {"progress":"Tiering","elapsed_s":1,"linq_rounds":12,"late_calls":0}
//   at exit:                {"exit":"Tiering","elapsed_s":5.001}   then exit code 0
using System;
using System.Diagnostics;
using System.Linq;
using System.Runtime.CompilerServices;
using System.Threading;
using Testbed;

namespace Tiering
{
    static class Program
    {
        const string Usage =
            "usage: Tiering [--late-start-ms 1500] [--duration-seconds N]\n" +
            "  System.Linq on the hot path from the start; LateLoop/LateHelper first run after --late-start-ms";

        static long linqRounds;
        static long lateCalls;
        static long sink;

        static int Main(string[] argv)
        {
            var args = new Args("Tiering", Usage, argv, new[] { "late-start-ms" }, new string[0]);
            int lateStartMs = args.Int("late-start-ms", 1500, 0, 600000);
            double? duration = args.DurationSeconds();
            Lifetime.Install();
            var clock = Stopwatch.StartNew();

            var linq = new Thread(LinqLoop) { Name = "LinqLoop", IsBackground = true };
            linq.Start();
            var late = new Thread(() =>
            {
                if (Lifetime.StopHandle.WaitOne(lateStartMs)) return;
                Out.Line(new Json().Add("late_started", "Tiering").Add("elapsed_ms", clock.ElapsedMilliseconds));
                LateLoop();
            }) { Name = "LateLoop", IsBackground = true };
            late.Start();

            Out.Line(Out.Ready("Tiering")
                .Add("late_start_ms", lateStartMs)
                .Add("linq_method", "Tiering.Program.LinqLoop")
                .Add("late_method", "Tiering.Program.LateLoop")
                .Add("late_helper", "Tiering.Program.LateHelper"));
            double elapsed = Lifetime.Run(duration, second =>
                Out.Line(new Json().Add("progress", "Tiering").Add("elapsed_s", second)
                    .Add("linq_rounds", Interlocked.Read(ref linqRounds))
                    .Add("late_calls", Interlocked.Read(ref lateCalls))));
            Out.Line(new Json().Add("exit", "Tiering").Add("elapsed_s", Math.Round(elapsed, 3)));
            return 0;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void LinqLoop()
        {
            int[] data = Enumerable.Range(0, 1 << 20).Select(i => i % 1000).ToArray();
            while (!Lifetime.Stopping)
            {
                long total = data.Sum();
                total += data.Where(v => (v & 1) == 0).Count();
                Interlocked.Exchange(ref sink, total);
                Interlocked.Increment(ref linqRounds);
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void LateLoop()
        {
            long acc = 0;
            while (!Lifetime.Stopping)
            {
                for (int i = 0; i < 100000; i++) acc += LateHelper(i);
                Interlocked.Add(ref lateCalls, 100000);
            }
            Interlocked.Exchange(ref sink, acc);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static long LateHelper(int i)
        {
            long x = i;
            for (int k = 0; k < 20; k++) x = (x * 31 + k) % 1000003;
            return x;
        }
    }
}
