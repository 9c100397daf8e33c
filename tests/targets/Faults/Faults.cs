// Faults: a .NET test-bed target with exceptions, lock contention and custom EventSource events at
// known rates.
//
// What it does
//   * thread "FaultInjector" throws and catches Faults.InjectedFaultException (: InvalidOperationException)
//     --exceptions-per-second times a second: thrown in Faults.Program.ThrowInjected, caught in
//     Faults.Program.InjectFault;
//   * thread "FaultSecondary" does the same with Faults.SecondaryFaultException (: ArgumentException),
//     --secondary-per-second times a second (Faults.Program.ThrowSecondary / InjectSecondary);
//   * after each catch, EventSource "Clrscope-Test-Faults" writes event 1
//     FaultInjected(int Sequence, string Kind, double Value), Informational, no keywords, where
//     Sequence = 1, 2, 3, ... over both threads, Kind = the exception's full type name,
//     Value = Sequence * 0.5;
//   * lock contention on one Monitor (a System.Object): thread "LockHolder" takes the lock
//     --lock-episodes-per-second times a second (Faults.Program.HoldLock), wakes the --lock-waiters
//     threads "LockWaiter1", "LockWaiter2", ..., waits until each has arrived at the lock (at most
//     100 ms), then keeps holding it --lock-hold-ms ms (asleep); each waiter tries the lock in
//     Faults.Program.ContendGate: Monitor.TryEnter fails and Monitor.Enter blocks until the holder
//     lets go. Designed contentions per second = episodes_per_second * waiters, each waiting about
//     hold_ms (the second waiter a little longer).
//   Rates are paced against a clock (no drift), so counts over N seconds are rate * N (±1).
//
// Arguments
//   --exceptions-per-second N     InjectedFaultException rate (default 50; 0: none)
//   --secondary-per-second N      SecondaryFaultException rate (default 10; 0: none)
//   --lock-episodes-per-second N  lock episodes per second (default 20; 0: no contention)
//   --lock-hold-ms N              how long the holder keeps the lock per episode (default 5)
//   --lock-waiters N              waiter threads, 1..8 (default 2)
//   --duration-seconds N          run N seconds, then exit 0 (default: until killed; Ctrl-C exits cleanly)
//
// Lines printed to stdout (one JSON object per line)
//   ready, once every thread runs:
//     {"ready":"Faults","pid":1234,"runtime":"8.0.4",
//      "exceptions":{"Faults.InjectedFaultException":{"per_second":50,"base":"System.InvalidOperationException",
//          "thrown_in":"Faults.Program.ThrowInjected","caught_in":"Faults.Program.InjectFault",
//          "thread":"FaultInjector","tid":1240},
//        "Faults.SecondaryFaultException":{"per_second":10,"base":"System.ArgumentException",...}},
//      "event_source":{"name":"Clrscope-Test-Faults","guid":"...","per_second":60,
//          "events":[{"id":1,"name":"FaultInjected","level":"Informational","fields":["Sequence","Kind","Value"]}]},
//      "lock":{"episodes_per_second":20,"hold_ms":5,"waiters":2,"contentions_per_second":40,
//          "lock_type":"System.Object","holder":{"thread":"LockHolder","method":"Faults.Program.HoldLock","tid":1242},
//          "waiter_threads":[{"thread":"LockWaiter1","method":"Faults.Program.ContendGate","tid":1243},...]}}
//   every second (counts during that second, and totals since the ready line):
//     {"progress":"Faults","elapsed_s":1,
//      "exceptions":{"Faults.InjectedFaultException":50,"Faults.SecondaryFaultException":10},"events":60,
//      "lock_episodes":20,"contentions":40,"uncontended":0,"lock_wait_ms":215.3,
//      "totals":{"exceptions":{...},"events":60,"lock_episodes":20,"contentions":40,"uncontended":0}}
//     contentions: waiter attempts that found the lock taken (TryEnter failed); uncontended: attempts
//     that got it at once (should stay 0; non-zero only on an overloaded machine).
//   at exit: {"exit":"Faults","elapsed_s":5.001,"totals":{...}}
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Diagnostics.Tracing;
using System.Runtime.CompilerServices;
using System.Threading;
using Testbed;

namespace Faults
{
    public sealed class InjectedFaultException : InvalidOperationException
    {
        public InjectedFaultException(long sequence) : base("injected fault #" + sequence) { Sequence = sequence; }
        public long Sequence { get; private set; }
    }

    public sealed class SecondaryFaultException : ArgumentException
    {
        public SecondaryFaultException(long sequence) : base("secondary fault #" + sequence, "sequence") { Sequence = sequence; }
        public long Sequence { get; private set; }
    }

    [EventSource(Name = "Clrscope-Test-Faults")]
    public sealed class FaultsEventSource : EventSource
    {
        public static readonly FaultsEventSource Log = new FaultsEventSource();

        [Event(1, Level = EventLevel.Informational, Message = "fault {0} of kind {1} (value {2})")]
        public void FaultInjected(int Sequence, string Kind, double Value)
        {
            if (IsEnabled()) WriteEvent(1, Sequence, Kind, Value);
        }
    }

    sealed class Counters
    {
        public long Injected, Secondary, Events, Episodes, Contentions, Uncontended, WaitTicks;

        public Counters Snapshot()
        {
            return new Counters
            {
                Injected = Interlocked.Read(ref Injected),
                Secondary = Interlocked.Read(ref Secondary),
                Events = Interlocked.Read(ref Events),
                Episodes = Interlocked.Read(ref Episodes),
                Contentions = Interlocked.Read(ref Contentions),
                Uncontended = Interlocked.Read(ref Uncontended),
                WaitTicks = Interlocked.Read(ref WaitTicks),
            };
        }

        public Counters Minus(Counters o)
        {
            return new Counters
            {
                Injected = Injected - o.Injected,
                Secondary = Secondary - o.Secondary,
                Events = Events - o.Events,
                Episodes = Episodes - o.Episodes,
                Contentions = Contentions - o.Contentions,
                Uncontended = Uncontended - o.Uncontended,
                WaitTicks = WaitTicks - o.WaitTicks,
            };
        }

        public Json AddTo(Json j)
        {
            return j.Add("exceptions", new Json()
                    .Add("Faults.InjectedFaultException", Injected)
                    .Add("Faults.SecondaryFaultException", Secondary))
                .Add("events", Events)
                .Add("lock_episodes", Episodes)
                .Add("contentions", Contentions)
                .Add("uncontended", Uncontended);
        }
    }

    static class Program
    {
        const string Usage =
            "usage: Faults [--exceptions-per-second 50] [--secondary-per-second 10] [--lock-episodes-per-second 20]\n" +
            "              [--lock-hold-ms 5] [--lock-waiters 2] [--duration-seconds N]\n" +
            "  throws/catches exceptions, contends on a lock and writes EventSource Clrscope-Test-Faults\n" +
            "  events at known rates; see the top of Faults.cs for the lines it prints";

        static readonly object Gate = new object();
        static readonly Counters counters = new Counters();
        static long sequence;
        static AutoResetEvent[] wake;
        static int holdMs;
        static int arrived; // waiters that arrived at the lock during the current episode
        const int ArrivalGuardMs = 100;

        static int Main(string[] argv)
        {
            var args = new Args("Faults", Usage, argv,
                new[] { "exceptions-per-second", "secondary-per-second", "lock-episodes-per-second", "lock-hold-ms", "lock-waiters" },
                new string[0]);
            double injectedRate = args.Double("exceptions-per-second", 50, 0, 100000);
            double secondaryRate = args.Double("secondary-per-second", 10, 0, 100000);
            double episodeRate = args.Double("lock-episodes-per-second", 20, 0, 1000);
            holdMs = args.Int("lock-hold-ms", 5, 1, 1000);
            int waiters = args.Int("lock-waiters", 2, 1, 8);
            double? duration = args.DurationSeconds();
            if (episodeRate * holdMs >= 900)
                args.Fail("--lock-episodes-per-second x --lock-hold-ms must stay below 900 ms of every second");
            Lifetime.Install();

            // Touch the event source so it is registered before the ready line.
            Guid guid = FaultsEventSource.Log.Guid;

            var threads = new List<Thread>();
            var exceptionFacts = new Json();
            if (injectedRate > 0)
            {
                int tid = StartThread(threads, "FaultInjector", () => Paced(injectedRate, InjectFault));
                exceptionFacts.Add("Faults.InjectedFaultException", new Json()
                    .Add("per_second", injectedRate).Add("base", "System.InvalidOperationException")
                    .Add("thrown_in", "Faults.Program.ThrowInjected").Add("caught_in", "Faults.Program.InjectFault")
                    .Add("thread", "FaultInjector").Add("tid", tid));
            }
            if (secondaryRate > 0)
            {
                int tid = StartThread(threads, "FaultSecondary", () => Paced(secondaryRate, InjectSecondary));
                exceptionFacts.Add("Faults.SecondaryFaultException", new Json()
                    .Add("per_second", secondaryRate).Add("base", "System.ArgumentException")
                    .Add("thrown_in", "Faults.Program.ThrowSecondary").Add("caught_in", "Faults.Program.InjectSecondary")
                    .Add("thread", "FaultSecondary").Add("tid", tid));
            }

            Json lockFacts = null;
            if (episodeRate > 0)
            {
                wake = new AutoResetEvent[waiters];
                var waiterFacts = new List<Json>();
                for (int i = 0; i < waiters; i++)
                {
                    wake[i] = new AutoResetEvent(false);
                    AutoResetEvent mine = wake[i];
                    string name = "LockWaiter" + (i + 1);
                    int tid = StartThread(threads, name, () => WaiterLoop(mine));
                    waiterFacts.Add(new Json().Add("thread", name).Add("method", "Faults.Program.ContendGate").Add("tid", tid));
                }
                int holderTid = StartThread(threads, "LockHolder", () => Paced(episodeRate, HoldLock));
                lockFacts = new Json()
                    .Add("episodes_per_second", episodeRate)
                    .Add("hold_ms", holdMs)
                    .Add("waiters", waiters)
                    .Add("contentions_per_second", episodeRate * waiters)
                    .Add("lock_type", "System.Object")
                    .Add("holder", new Json().Add("thread", "LockHolder").Add("method", "Faults.Program.HoldLock").Add("tid", holderTid))
                    .Add("waiter_threads", waiterFacts);
            }

            Out.Line(Out.Ready("Faults")
                .Add("exceptions", exceptionFacts)
                .Add("event_source", new Json()
                    .Add("name", "Clrscope-Test-Faults")
                    .Add("guid", guid.ToString())
                    .Add("per_second", injectedRate + secondaryRate)
                    .Add("events", new[] { new Json().Add("id", 1).Add("name", "FaultInjected").Add("level", "Informational")
                        .Add("fields", new[] { "Sequence", "Kind", "Value" }) }))
                .Add("lock", lockFacts));

            Counters start = counters.Snapshot(), last = start;
            double elapsed = Lifetime.Run(duration, second =>
            {
                Counters now = counters.Snapshot();
                Counters delta = now.Minus(last);
                last = now;
                Out.Line(delta.AddTo(new Json().Add("progress", "Faults").Add("elapsed_s", second))
                    .Add("lock_wait_ms", Math.Round(delta.WaitTicks * 1000.0 / Stopwatch.Frequency, 3))
                    .Add("totals", now.Minus(start).AddTo(new Json())));
            });
            if (wake != null) foreach (var w in wake) w.Set();
            foreach (var t in threads) t.Join(2000);
            Out.Line(new Json().Add("exit", "Faults").Add("elapsed_s", Math.Round(elapsed, 3))
                .Add("totals", counters.Snapshot().Minus(start).AddTo(new Json())));
            return 0;
        }

        /// <summary>Starts a named background thread and returns its OS thread id once it runs.</summary>
        static int StartThread(List<Thread> threads, string name, Action body)
        {
            int tid = 0;
            var started = new ManualResetEvent(false);
            var t = new Thread(() =>
            {
                tid = Native.CurrentTid();
                started.Set();
                body();
            }) { Name = name, IsBackground = true };
            t.Start();
            started.WaitOne();
            threads.Add(t);
            return tid;
        }

        /// <summary>Calls BODY(n) for n = 0, 1, 2, ... at RATE per second against a clock (no drift;
        /// after a stall it skips ahead instead of bursting more than a second's worth).</summary>
        static void Paced(double rate, Action<long> body)
        {
            var sw = Stopwatch.StartNew();
            long done = 0;
            while (!Lifetime.Stopping)
            {
                long due = (long)(sw.Elapsed.TotalSeconds * rate) + 1; // the first call happens at once
                if (due - done > rate + 1) done = due - (long)rate - 1;
                while (done < due && !Lifetime.Stopping) body(done++);
                double waitMs = (done / rate - sw.Elapsed.TotalSeconds) * 1000.0;
                if (waitMs > 0) Lifetime.StopHandle.WaitOne(Math.Max(1, (int)Math.Ceiling(waitMs)));
            }
        }

        static void Record(string kind, ref long counter)
        {
            long seq = Interlocked.Increment(ref sequence);
            Interlocked.Increment(ref counter);
            FaultsEventSource.Log.FaultInjected((int)seq, kind, seq * 0.5);
            Interlocked.Increment(ref counters.Events);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void InjectFault(long n)
        {
            try
            {
                ThrowInjected(n);
            }
            catch (InjectedFaultException e)
            {
                Record(e.GetType().FullName, ref counters.Injected);
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void ThrowInjected(long n)
        {
            throw new InjectedFaultException(n);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void InjectSecondary(long n)
        {
            try
            {
                ThrowSecondary(n);
            }
            catch (SecondaryFaultException e)
            {
                Record(e.GetType().FullName, ref counters.Secondary);
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void ThrowSecondary(long n)
        {
            throw new SecondaryFaultException(n);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void HoldLock(long n)
        {
            lock (Gate)
            {
                Volatile.Write(ref arrived, 0);
                foreach (var w in wake) w.Set();
                // Wait (holding the lock) until every waiter is about to try it, so that each one finds
                // it taken however late the OS wakes it (bounded: an overloaded machine may miss some).
                var guard = Stopwatch.StartNew();
                var spin = new SpinWait();
                while (Volatile.Read(ref arrived) < wake.Length && guard.ElapsedMilliseconds < ArrivalGuardMs) spin.SpinOnce();
                Thread.Sleep(holdMs);
            }
            Interlocked.Increment(ref counters.Episodes);
        }

        static void WaiterLoop(AutoResetEvent mine)
        {
            var handles = new WaitHandle[] { mine, Lifetime.StopHandle };
            while (true)
            {
                WaitHandle.WaitAny(handles);
                if (Lifetime.Stopping) return;
                Interlocked.Increment(ref arrived);
                ContendGate();
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void ContendGate()
        {
            if (Monitor.TryEnter(Gate))
            {
                Monitor.Exit(Gate);
                Interlocked.Increment(ref counters.Uncontended);
                return;
            }
            long t0 = Stopwatch.GetTimestamp();
            Monitor.Enter(Gate);
            long waited = Stopwatch.GetTimestamp() - t0;
            Monitor.Exit(Gate);
            Interlocked.Increment(ref counters.Contentions);
            Interlocked.Add(ref counters.WaitTicks, waited);
        }
    }
}
