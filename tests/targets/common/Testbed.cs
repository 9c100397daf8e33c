// Shared helpers compiled into every test-bed target (tests/targets/*.cs); see tests/targets/README.md.
//
//   Testbed.Json      a tiny JSON writer: every machine-readable line a target prints is one JSON object
//   Testbed.Out       prints one JSON line to stdout and flushes (thread-safe, one write per line)
//   Testbed.Args      `--name value`, `--name=value` and `--flag` parsing; a bad argument exits with 2
//   Testbed.Native    the OS thread id (gettid through libc, else /proc/thread-self/stat) and a
//                     thread's consumed CPU time (/proc/self/task/<tid>/stat)
//   Testbed.Lifetime  `--duration-seconds N` (else run until killed), Ctrl-C/SIGINT ends cleanly,
//                     and a once-a-second callback for progress lines; with the environment variable
//                     TESTBED_EXIT_WITH_PARENT=1 (set by the Rust test support) the target also exits
//                     within about a second once its parent process is gone, so a killed test run
//                     leaves no target behind
//
// Built by the .NET SDK with every target (tests/targets/Directory.Build.props: net8.0, net9.0, net10.0).
using System;
using System.Collections;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using System.Runtime.InteropServices;
using System.Text;
using System.Threading;

namespace Testbed
{
    /// <summary>An ordered JSON object. Values: null, string, bool, integers, doubles (non-finite → null),
    /// Json, IDictionary (string keys), IEnumerable (arrays); anything else is written as its ToString().</summary>
    public sealed class Json
    {
        readonly List<KeyValuePair<string, object>> fields = new List<KeyValuePair<string, object>>();

        public Json Add(string key, object value)
        {
            fields.Add(new KeyValuePair<string, object>(key, value));
            return this;
        }

        public override string ToString()
        {
            var sb = new StringBuilder();
            Write(sb, this);
            return sb.ToString();
        }

        public static void Write(StringBuilder sb, object v)
        {
            if (v == null) { sb.Append("null"); return; }
            var obj = v as Json;
            if (obj != null)
            {
                sb.Append('{');
                for (int i = 0; i < obj.fields.Count; i++)
                {
                    if (i > 0) sb.Append(',');
                    WriteString(sb, obj.fields[i].Key);
                    sb.Append(':');
                    Write(sb, obj.fields[i].Value);
                }
                sb.Append('}');
                return;
            }
            var s = v as string;
            if (s != null) { WriteString(sb, s); return; }
            if (v is bool) { sb.Append((bool)v ? "true" : "false"); return; }
            if (v is int || v is long || v is uint || v is ulong || v is short || v is ushort || v is byte || v is sbyte)
            {
                sb.Append(Convert.ToString(v, CultureInfo.InvariantCulture));
                return;
            }
            if (v is double || v is float || v is decimal)
            {
                double d = Convert.ToDouble(v, CultureInfo.InvariantCulture);
                if (double.IsNaN(d) || double.IsInfinity(d)) sb.Append("null");
                else sb.Append(d.ToString("R", CultureInfo.InvariantCulture));
                return;
            }
            var dict = v as IDictionary;
            if (dict != null)
            {
                sb.Append('{');
                bool first = true;
                foreach (DictionaryEntry e in dict)
                {
                    if (!first) sb.Append(',');
                    first = false;
                    WriteString(sb, Convert.ToString(e.Key, CultureInfo.InvariantCulture));
                    sb.Append(':');
                    Write(sb, e.Value);
                }
                sb.Append('}');
                return;
            }
            var seq = v as IEnumerable;
            if (seq != null)
            {
                sb.Append('[');
                bool first = true;
                foreach (object item in seq)
                {
                    if (!first) sb.Append(',');
                    first = false;
                    Write(sb, item);
                }
                sb.Append(']');
                return;
            }
            WriteString(sb, Convert.ToString(v, CultureInfo.InvariantCulture));
        }

        static void WriteString(StringBuilder sb, string s)
        {
            sb.Append('"');
            foreach (char c in s)
            {
                switch (c)
                {
                    case '"': sb.Append("\\\""); break;
                    case '\\': sb.Append("\\\\"); break;
                    case '\n': sb.Append("\\n"); break;
                    case '\r': sb.Append("\\r"); break;
                    case '\t': sb.Append("\\t"); break;
                    default:
                        if (c < 0x20) sb.Append("\\u").Append(((int)c).ToString("x4", CultureInfo.InvariantCulture));
                        else sb.Append(c);
                        break;
                }
            }
            sb.Append('"');
        }
    }

    public static class Out
    {
        static readonly object Gate = new object();
        static readonly int pid = Process.GetCurrentProcess().Id;

        public static int Pid { get { return pid; } }

        /// <summary>The start of a ready line: {"ready":NAME,"pid":PID,"runtime":"8.0.4", ...}.</summary>
        public static Json Ready(string name)
        {
            return new Json().Add("ready", name).Add("pid", pid).Add("runtime", Environment.Version.ToString());
        }

        public static void Line(Json j) { Line(j.ToString()); }

        public static void Line(string s)
        {
            lock (Gate)
            {
                Console.Out.Write(s + "\n");
                Console.Out.Flush();
            }
        }
    }

    public sealed class Args
    {
        readonly string program;
        readonly string usage;
        readonly Dictionary<string, string> values = new Dictionary<string, string>();
        readonly HashSet<string> flags = new HashSet<string>();

        /// <param name="valueOptions">names taking a value, without "--"</param>
        /// <param name="flagOptions">names without a value, without "--"</param>
        public Args(string program, string usage, string[] argv, string[] valueOptions, string[] flagOptions)
        {
            this.program = program;
            this.usage = usage;
            var takesValue = new HashSet<string>(valueOptions);
            takesValue.Add("duration-seconds");
            var isFlag = new HashSet<string>(flagOptions);
            for (int i = 0; i < argv.Length; i++)
            {
                string a = argv[i];
                if (a == "--help" || a == "-h")
                {
                    Console.Out.Write(usage + "\n");
                    Environment.Exit(0);
                }
                if (!a.StartsWith("--", StringComparison.Ordinal)) Fail("unexpected argument '" + a + "'");
                string name = a.Substring(2);
                string value = null;
                int eq = name.IndexOf('=');
                if (eq >= 0)
                {
                    value = name.Substring(eq + 1);
                    name = name.Substring(0, eq);
                }
                if (isFlag.Contains(name))
                {
                    if (value != null) Fail("--" + name + " takes no value");
                    flags.Add(name);
                }
                else if (takesValue.Contains(name))
                {
                    if (value == null)
                    {
                        if (i + 1 >= argv.Length) Fail("--" + name + " needs a value");
                        value = argv[++i];
                    }
                    values[name] = value;
                }
                else
                {
                    Fail("unknown option --" + name);
                }
            }
        }

        public void Fail(string message)
        {
            Console.Error.Write(program + ": " + message + "\n" + usage + "\n");
            Console.Error.Flush();
            Environment.Exit(2);
        }

        public bool Has(string name) { return flags.Contains(name) || values.ContainsKey(name); }

        public string String(string name, string def)
        {
            string v;
            return values.TryGetValue(name, out v) ? v : def;
        }

        public long Long(string name, long def, long min, long max)
        {
            string v;
            if (!values.TryGetValue(name, out v)) return def;
            long r;
            if (!long.TryParse(v, NumberStyles.Integer, CultureInfo.InvariantCulture, out r) || r < min || r > max)
                Fail("--" + name + " must be an integer in [" + min + ", " + max + "], not '" + v + "'");
            return r;
        }

        public int Int(string name, int def, int min, int max) { return (int)Long(name, def, min, max); }

        public double Double(string name, double def, double min, double max)
        {
            string v;
            if (!values.TryGetValue(name, out v)) return def;
            double r;
            if (!double.TryParse(v, NumberStyles.Float, CultureInfo.InvariantCulture, out r) || !(r >= min && r <= max))
                Fail("--" + name + " must be a number in [" + min.ToString(CultureInfo.InvariantCulture) + ", " +
                     max.ToString(CultureInfo.InvariantCulture) + "], not '" + v + "'");
            return r;
        }

        public long[] LongList(string name, long[] def, int minCount, int maxCount, long min, long max)
        {
            string v;
            if (!values.TryGetValue(name, out v)) return def;
            string[] parts = v.Split(',');
            if (parts.Length < minCount || parts.Length > maxCount)
                Fail("--" + name + " takes " + minCount + ".." + maxCount + " comma-separated integers, not '" + v + "'");
            var r = new long[parts.Length];
            for (int i = 0; i < parts.Length; i++)
            {
                if (!long.TryParse(parts[i].Trim(), NumberStyles.Integer, CultureInfo.InvariantCulture, out r[i]) || r[i] < min || r[i] > max)
                    Fail("--" + name + ": '" + parts[i] + "' is not an integer in [" + min + ", " + max + "]");
            }
            return r;
        }

        /// <summary>--duration-seconds N (a positive number), or null: run until killed.</summary>
        public double? DurationSeconds()
        {
            if (!values.ContainsKey("duration-seconds")) return null;
            return Double("duration-seconds", 0, 0.001, 1e9);
        }
    }

    public static class Native
    {
        [DllImport("libc", EntryPoint = "gettid")]
        static extern int gettid();

        [DllImport("libc", EntryPoint = "sysconf")]
        static extern long sysconf(int name);

        [DllImport("libc", EntryPoint = "getppid")]
        static extern int getppid();

        /// <summary>The parent process id, or -1 if it cannot be found.</summary>
        public static int ParentPid()
        {
            try { return getppid(); }
            catch (DllNotFoundException) { }
            catch (EntryPointNotFoundException) { }
            try
            {
                string stat = File.ReadAllText("/proc/self/stat");
                return int.Parse(stat.Substring(stat.LastIndexOf(')') + 2).Split(' ')[1], CultureInfo.InvariantCulture);
            }
            catch (Exception)
            {
                return -1;
            }
        }

        static volatile int useProc; // 1 once gettid turned out to be unavailable
        static long clockTicks;

        /// <summary>How thread ids are obtained: "gettid" (libc) or "proc" (/proc/thread-self/stat).</summary>
        public static string TidSource { get { CurrentTid(); return useProc == 1 ? "proc" : "gettid"; } }

        /// <summary>The calling thread's OS thread id (the tid in /proc/PID/task and in EventPipe events).</summary>
        public static int CurrentTid()
        {
            if (useProc == 0)
            {
                try { return gettid(); }
                catch (DllNotFoundException) { useProc = 1; }
                catch (EntryPointNotFoundException) { useProc = 1; }
            }
            string stat = File.ReadAllText("/proc/thread-self/stat");
            return int.Parse(stat.Substring(0, stat.IndexOf(' ')), CultureInfo.InvariantCulture);
        }

        static long ClockTicksPerSecond()
        {
            if (clockTicks == 0)
            {
                long t = 0;
                try { t = sysconf(2); } // _SC_CLK_TCK
                catch (DllNotFoundException) { }
                catch (EntryPointNotFoundException) { }
                clockTicks = t > 0 ? t : 100;
            }
            return clockTicks;
        }

        /// <summary>User+system CPU time consumed so far by thread TID of this process, in ms
        /// (resolution: one clock tick, 10 ms), or -1 if unreadable.</summary>
        public static long ThreadCpuMs(int tid)
        {
            try
            {
                string stat = File.ReadAllText("/proc/self/task/" + tid.ToString(CultureInfo.InvariantCulture) + "/stat");
                // fields after "(comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
                string[] f = stat.Substring(stat.LastIndexOf(')') + 2).Split(' ');
                long ticks = long.Parse(f[11], CultureInfo.InvariantCulture) + long.Parse(f[12], CultureInfo.InvariantCulture);
                return ticks * 1000 / ClockTicksPerSecond();
            }
            catch (Exception)
            {
                return -1;
            }
        }
    }

    public static class Lifetime
    {
        static readonly ManualResetEvent stop = new ManualResetEvent(false);
        static volatile bool stopping;

        /// <summary>True once the target should wind down (duration over, Ctrl-C, or RequestStop).</summary>
        public static bool Stopping { get { return stopping; } }

        public static WaitHandle StopHandle { get { return stop; } }

        /// <summary>Ctrl-C (SIGINT) ends the target cleanly instead of killing it.</summary>
        public static void Install()
        {
            Console.CancelKeyPress += (sender, e) =>
            {
                e.Cancel = true;
                RequestStop();
            };
            if (Environment.GetEnvironmentVariable("TESTBED_EXIT_WITH_PARENT") == "1")
            {
                int parent = Native.ParentPid();
                var watch = new Thread(() =>
                {
                    // When the parent dies the process is re-parented (to init or a subreaper).
                    while (Native.ParentPid() == parent) Thread.Sleep(500);
                    Console.Error.Write("testbed: parent process " + parent + " is gone, exiting\n");
                    Environment.Exit(3);
                }) { Name = "ParentWatch", IsBackground = true };
                watch.Start();
            }
        }

        public static void RequestStop()
        {
            stopping = true;
            stop.Set();
        }

        /// <summary>Blocks until DURATION seconds have passed (forever if null) or a stop was requested,
        /// calling EVERYSECOND(n) at n = 1, 2, ... seconds after the call (if not null).
        /// Returns the seconds that passed.</summary>
        public static double Run(double? duration, Action<int> everySecond)
        {
            var sw = Stopwatch.StartNew();
            int second = 0;
            while (!stopping)
            {
                double now = sw.Elapsed.TotalSeconds;
                if (duration.HasValue && now >= duration.Value) break;
                double next = second + 1;
                if (duration.HasValue && duration.Value < next) next = duration.Value;
                int waitMs = (int)Math.Ceiling((next - now) * 1000);
                if (waitMs > 0 && stop.WaitOne(waitMs)) break;
                if (sw.Elapsed.TotalSeconds >= second + 1)
                {
                    second++;
                    if (everySecond != null) everySecond(second);
                }
            }
            stopping = true;
            stop.Set();
            return sw.Elapsed.TotalSeconds;
        }
    }
}
