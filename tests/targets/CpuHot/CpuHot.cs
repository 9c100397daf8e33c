// CpuHot: a .NET test-bed target with a designed CPU profile.
//
// What it does
//   Starts one named thread per entry of --split; thread i runs its own method
//   CpuHot.Program.Spin<Name> (Alpha, Bravo, Charlie, Delta, Echo, Foxtrot, Golf, Hotel, in that order),
//   whose code is a floating-point busy loop (the leaf frame while busy is that method itself).
//   Every --window-ms (100 ms) window, thread i is busy for
//       busy_i = window_ms * cores * split_i / sum(split)      (capped at window_ms)
//   and sleeps the rest. The busy intervals of the threads are laid end to end inside the window
//   (thread i starts busy where thread i-1 stops), so with the default --cores 1 at most one thread is
//   busy at any moment: the split holds on a 1- or 2-core machine, and the process uses ~1 core.
//   A managed CPU profile therefore shows Spin<Name> with share split_i / sum(split).
//   Thread names (also the OS thread names, /proc/PID/task/TID/comm) are the method names: SpinAlpha, ...
//
// Arguments
//   --split A,B,...         1..8 positive integers, the designed CPU split (default 60,30,10)
//   --cores C               total CPU budget of the spinning threads in cores, 0 < C <= 8 (default 1)
//   --window-ms W           scheduling window in ms, 10..10000 (default 100)
//   --duration-seconds N    run N seconds, then exit 0 (default: until killed; Ctrl-C exits cleanly)
//
// Lines printed to stdout (one JSON object per line)
//   ready, once all threads run:
//     {"ready":"CpuHot","pid":1234,"runtime":"8.0.4","window_ms":100,"cores":1,"split":[60,30,10],
//      "tid_source":"gettid","threads":[{"name":"SpinAlpha","method":"CpuHot.Program.SpinAlpha",
//      "tid":1240,"managed_thread_id":4,"share":0.6,"cpu_fraction":0.6,"busy_ms_per_window":60,
//      "offset_ms":0}, ...]}
//     share = split_i / sum(split); cpu_fraction = the fraction of one core the thread is designed to use.
//   every second:
//     {"progress":"CpuHot","elapsed_s":1,"busy_ms":{"SpinAlpha":600,...},"cpu_ms":{"SpinAlpha":600,...}}
//     busy_ms: wall time spent in the busy loops so far; cpu_ms: CPU time the OS accounted to each
//     thread so far (/proc/self/task/TID/stat, 10 ms resolution).
//   at exit (after --duration-seconds or Ctrl-C):
//     {"exit":"CpuHot","elapsed_s":5.001,"busy_ms":{...},"cpu_ms":{...}}   then exit code 0
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Runtime.CompilerServices;
using System.Threading;
using Testbed;

namespace CpuHot
{
    /// <summary>Per-thread schedule and results.</summary>
    sealed class Spinner
    {
        public string Name;
        public int Index;
        public double BusyMs;
        public double OffsetMs;
        public double WindowMs;
        public int Tid;
        public int ManagedThreadId;
        public Thread Thread;
        public volatile bool Stop;
        public long BusyTicks;  // Stopwatch ticks spent busy, updated once per window
        public long BusyUntil;  // Stopwatch timestamp at which the current busy interval ends
        public double Sink;     // keeps the busy loop's result alive
        public readonly ManualResetEvent Started = new ManualResetEvent(false);

        long windowStart;       // Stopwatch timestamp of the current window's busy start
        bool first = true;
        long windowTicks;
        long busyTicksPerWindow;

        /// <summary>Called by the spin method before each busy interval: sleeps until this thread's
        /// next busy interval, sets BusyUntil, and returns false when it is time to stop.</summary>
        public bool NextWindow(long epoch)
        {
            if (first)
            {
                first = false;
                Tid = Native.CurrentTid();
                ManagedThreadId = Thread.CurrentThread.ManagedThreadId;
                windowTicks = (long)(WindowMs * Stopwatch.Frequency / 1000.0);
                busyTicksPerWindow = (long)(BusyMs * Stopwatch.Frequency / 1000.0);
                windowStart = epoch + (long)(OffsetMs * Stopwatch.Frequency / 1000.0);
                Started.Set();
            }
            else
            {
                BusyTicks += busyTicksPerWindow;
                windowStart += windowTicks;
            }
            while (true)
            {
                if (Stop) return false;
                long now = Stopwatch.GetTimestamp();
                if (now - windowStart > windowTicks)
                {
                    // fell behind (preempted, or the machine is loaded): skip windows, never catch up in a burst
                    long behind = (now - windowStart) / windowTicks;
                    windowStart += behind * windowTicks;
                }
                long wait = windowStart - now;
                if (wait <= 0) break;
                int ms = (int)Math.Ceiling(wait * 1000.0 / Stopwatch.Frequency);
                Thread.Sleep(ms > 0 ? ms : 1);
            }
            BusyUntil = windowStart + busyTicksPerWindow;
            return true;
        }

        public long BusyMsSoFar { get { return Interlocked.Read(ref BusyTicks) * 1000 / Stopwatch.Frequency; } }
    }

    static class Program
    {
        static readonly string[] Names = { "Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel" };
        static long epoch;

        const string Usage =
            "usage: CpuHot [--split 60,30,10] [--cores 1] [--window-ms 100] [--duration-seconds N]\n" +
            "  one thread per --split entry spinning in CpuHot.Program.Spin{Alpha,Bravo,...} for its share\n" +
            "  of each window; see the top of CpuHot.cs for the lines it prints";

        static int Main(string[] argv)
        {
            var args = new Args("CpuHot", Usage, argv, new[] { "split", "cores", "window-ms" }, new string[0]);
            long[] split = args.LongList("split", new long[] { 60, 30, 10 }, 1, Names.Length, 1, 1000000);
            double cores = args.Double("cores", 1.0, 1e-6, 8.0);
            double windowMs = args.Double("window-ms", 100, 10, 10000);
            double? duration = args.DurationSeconds();
            Lifetime.Install();

            long sum = 0;
            foreach (long s in split) sum += s;

            epoch = Stopwatch.GetTimestamp() + Stopwatch.Frequency / 20; // first windows start in 50 ms
            var spinners = new List<Spinner>();
            double offset = 0;
            for (int i = 0; i < split.Length; i++)
            {
                double fraction = Math.Min(1.0, cores * split[i] / sum);
                var sp = new Spinner
                {
                    Name = "Spin" + Names[i],
                    Index = i,
                    BusyMs = windowMs * fraction,
                    OffsetMs = offset % windowMs,
                    WindowMs = windowMs,
                };
                offset += sp.BusyMs;
                sp.Thread = new Thread(Body(i, sp)) { Name = sp.Name, IsBackground = true };
                spinners.Add(sp);
            }
            foreach (var sp in spinners) sp.Thread.Start();
            foreach (var sp in spinners) sp.Started.WaitOne();

            var threads = new List<Json>();
            foreach (var sp in spinners)
            {
                threads.Add(new Json()
                    .Add("name", sp.Name)
                    .Add("method", "CpuHot.Program." + sp.Name)
                    .Add("tid", sp.Tid)
                    .Add("managed_thread_id", sp.ManagedThreadId)
                    .Add("share", (double)split[sp.Index] / sum)
                    .Add("cpu_fraction", sp.BusyMs / windowMs)
                    .Add("busy_ms_per_window", sp.BusyMs)
                    .Add("offset_ms", sp.OffsetMs));
            }
            Out.Line(Out.Ready("CpuHot")
                .Add("window_ms", windowMs)
                .Add("cores", cores)
                .Add("split", split)
                .Add("tid_source", Native.TidSource)
                .Add("threads", threads));

            double elapsed = Lifetime.Run(duration, second =>
                Out.Line(Stats(spinners, new Json().Add("progress", "CpuHot").Add("elapsed_s", second))));

            var cpuAtExit = CpuMs(spinners); // before the threads end and leave /proc/self/task
            foreach (var sp in spinners) sp.Stop = true;
            foreach (var sp in spinners) sp.Thread.Join(2000);
            Out.Line(Stats(spinners, new Json().Add("exit", "CpuHot").Add("elapsed_s", Math.Round(elapsed, 3)), cpuAtExit));
            return 0;
        }

        static Json CpuMs(List<Spinner> spinners)
        {
            var cpu = new Json();
            foreach (var sp in spinners) cpu.Add(sp.Name, Native.ThreadCpuMs(sp.Tid));
            return cpu;
        }

        static Json Stats(List<Spinner> spinners, Json j, Json cpu = null)
        {
            var busy = new Json();
            foreach (var sp in spinners) busy.Add(sp.Name, sp.BusyMsSoFar);
            return j.Add("busy_ms", busy).Add("cpu_ms", cpu ?? CpuMs(spinners));
        }

        static ThreadStart Body(int i, Spinner sp)
        {
            switch (i)
            {
                case 0: return () => SpinAlpha(sp);
                case 1: return () => SpinBravo(sp);
                case 2: return () => SpinCharlie(sp);
                case 3: return () => SpinDelta(sp);
                case 4: return () => SpinEcho(sp);
                case 5: return () => SpinFoxtrot(sp);
                case 6: return () => SpinGolf(sp);
                default: return () => SpinHotel(sp);
            }
        }

        // Each Spin method has its own copy of the busy loop so that it is the leaf frame of its samples.

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void SpinAlpha(Spinner s)
        {
            double acc = 1.0;
            while (s.NextWindow(epoch))
            {
                long until = s.BusyUntil;
                while (Stopwatch.GetTimestamp() < until)
                    for (int k = 0; k < 2000; k++) acc = acc * 0.9999991 + 1e-7;
                s.Sink = acc;
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void SpinBravo(Spinner s)
        {
            double acc = 2.0;
            while (s.NextWindow(epoch))
            {
                long until = s.BusyUntil;
                while (Stopwatch.GetTimestamp() < until)
                    for (int k = 0; k < 2000; k++) acc = acc * 0.9999992 + 2e-7;
                s.Sink = acc;
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void SpinCharlie(Spinner s)
        {
            double acc = 3.0;
            while (s.NextWindow(epoch))
            {
                long until = s.BusyUntil;
                while (Stopwatch.GetTimestamp() < until)
                    for (int k = 0; k < 2000; k++) acc = acc * 0.9999993 + 3e-7;
                s.Sink = acc;
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void SpinDelta(Spinner s)
        {
            double acc = 4.0;
            while (s.NextWindow(epoch))
            {
                long until = s.BusyUntil;
                while (Stopwatch.GetTimestamp() < until)
                    for (int k = 0; k < 2000; k++) acc = acc * 0.9999994 + 4e-7;
                s.Sink = acc;
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void SpinEcho(Spinner s)
        {
            double acc = 5.0;
            while (s.NextWindow(epoch))
            {
                long until = s.BusyUntil;
                while (Stopwatch.GetTimestamp() < until)
                    for (int k = 0; k < 2000; k++) acc = acc * 0.9999995 + 5e-7;
                s.Sink = acc;
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void SpinFoxtrot(Spinner s)
        {
            double acc = 6.0;
            while (s.NextWindow(epoch))
            {
                long until = s.BusyUntil;
                while (Stopwatch.GetTimestamp() < until)
                    for (int k = 0; k < 2000; k++) acc = acc * 0.9999996 + 6e-7;
                s.Sink = acc;
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void SpinGolf(Spinner s)
        {
            double acc = 7.0;
            while (s.NextWindow(epoch))
            {
                long until = s.BusyUntil;
                while (Stopwatch.GetTimestamp() < until)
                    for (int k = 0; k < 2000; k++) acc = acc * 0.9999997 + 7e-7;
                s.Sink = acc;
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void SpinHotel(Spinner s)
        {
            double acc = 8.0;
            while (s.NextWindow(epoch))
            {
                long until = s.BusyUntil;
                while (Stopwatch.GetTimestamp() < until)
                    for (int k = 0; k < 2000; k++) acc = acc * 0.9999998 + 8e-7;
                s.Sink = acc;
            }
        }
    }
}
