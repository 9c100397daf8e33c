// Alloc: a .NET test-bed target with a known heap and a steady allocation rate.
//
// What it does
//   1. Allocates and keeps alive (static fields, until exit) exactly
//        A x Alloc.SmallNode, B x Alloc.MediumRecord, C x Alloc.LargeBlob      (--keep A,B,C)
//      held by one array per type (Alloc.SmallNode[A], Alloc.MediumRecord[B], Alloc.LargeBlob[C]);
//      each LargeBlob also owns one byte[--blob-bytes]. SmallNode.Next points at node i/2 (a shallow
//      tree: no long reference chains). No other instances of these types are alive at the ready line
//      (the ones made to measure their sizes are collected by a full blocking GC before it).
//   2. Then a thread "AllocChurn" allocates Alloc.ChurnItem objects at a steady rate (--churn-per-second),
//      in batches every 10 ms from Alloc.Program.ChurnBatch, keeping only the last 1024 alive, so
//      GC/AllocationTick events (one per ~100 KB allocated: ~20/s at the default rate) occur
//      continuously, and a gen0 GC whenever the gen0 budget (some MB, machine dependent) fills.
//
// Types and fields (sizes on 64-bit, object header and method table included; measured values are in
// the ready line):
//   Alloc.SmallNode    { long Value; SmallNode Next; int Id; }                                 40 bytes
//   Alloc.MediumRecord { long Id; long Timestamp; double Score; double Weight; Guid Key;
//                        int Flags; string Label; }   (Label: one shared interned string)       80 bytes
//   Alloc.LargeBlob    { int Id; long Checksum; byte[] Data; }    + byte[blob-bytes] each        40 bytes
//   Alloc.ChurnItem    { long Sequence; long Ticks; int A; int B; }                            40 bytes
//
// Arguments
//   --keep A,B,C            live SmallNode, MediumRecord, LargeBlob counts (default 100000,25000,1000)
//   --million               shorthand for --keep 1000000,25000,1000 (over a million live objects)
//   --blob-bytes N          length of each LargeBlob's byte[] (default 4096; >= 85000 puts them on the LOH)
//   --churn-per-second N    ChurnItem allocations per second (default 50000 = 2 MB/s; 0: no churn thread)
//   --duration-seconds N    run N seconds, then exit 0 (default: until killed; Ctrl-C exits cleanly)
//
// Lines printed to stdout (one JSON object per line)
//   ready, once the kept objects are allocated and the churn thread runs:
//     {"ready":"Alloc","pid":1234,"runtime":"8.0.4",
//      "kept":{"Alloc.SmallNode":100000,"Alloc.MediumRecord":25000,"Alloc.LargeBlob":1000},
//      "kept_arrays":{"Alloc.SmallNode[]":100000,"Alloc.MediumRecord[]":25000,"Alloc.LargeBlob[]":1000},
//      "blob_bytes":4096,"blob_arrays":1000,
//      "instance_bytes":{"Alloc.SmallNode":40,"Alloc.MediumRecord":80,"Alloc.LargeBlob":40,
//                        "Alloc.ChurnItem":40,"System.Byte[]":4120},
//      "kept_objects":127003,"churn":{"type":"Alloc.ChurnItem","per_second":50000,"bytes_per_second":2000000,
//      "method":"Alloc.Program.ChurnBatch","thread":"AllocChurn","tid":1250},
//      "gc":{"total_memory_bytes":...,"gen0_collections":...,"gen1_collections":...,"gen2_collections":...}}
//     kept_arrays: array lengths; kept_objects: kept instances + their byte[]s + the 3 holder arrays;
//     instance_bytes: measured (GC.GetAllocatedBytesForCurrentThread), "System.Byte[]" is one blob array.
//   every second:
//     {"progress":"Alloc","elapsed_s":1,"churn_allocated":50000,"churn_bytes":2000000,
//      "gc":{"total_memory_bytes":...,"gen0_collections":...,"gen1_collections":...,"gen2_collections":...}}
//   at exit: {"exit":"Alloc","elapsed_s":5.001,"churn_allocated":...,"churn_bytes":...,"gc":{...}}
using System;
using System.Diagnostics;
using System.Reflection;
using System.Runtime.CompilerServices;
using System.Threading;
using Testbed;

namespace Alloc
{
    public sealed class SmallNode
    {
        public long Value;
        public SmallNode Next;
        public int Id;
    }

    public sealed class MediumRecord
    {
        public long Id;
        public long Timestamp;
        public double Score;
        public double Weight;
        public Guid Key;
        public int Flags;
        public string Label;
    }

    public sealed class LargeBlob
    {
        public int Id;
        public long Checksum;
        public byte[] Data;
    }

    public sealed class ChurnItem
    {
        public long Sequence;
        public long Ticks;
        public int A;
        public int B;
    }

    static class Program
    {
        const string Usage =
            "usage: Alloc [--keep 100000,25000,1000 | --million] [--blob-bytes 4096] [--churn-per-second 50000]\n" +
            "             [--duration-seconds N]\n" +
            "  keeps known counts of Alloc.SmallNode/MediumRecord/LargeBlob alive and allocates\n" +
            "  Alloc.ChurnItem at a steady rate; see the top of Alloc.cs for the lines it prints";

        const string Label = "medium-record";
        const int ChurnRing = 1024;

        // The kept heap: reachable from these statics until exit.
        static SmallNode[] keptSmall;
        static MediumRecord[] keptMedium;
        static LargeBlob[] keptLarge;

        static ChurnItem[] ring = new ChurnItem[ChurnRing];
        static long churnAllocated;
        static volatile int churnTid;

        static int Main(string[] argv)
        {
            var args = new Args("Alloc", Usage, argv, new[] { "keep", "blob-bytes", "churn-per-second" }, new[] { "million" });
            if (args.Has("million") && args.Has("keep")) args.Fail("--million and --keep exclude each other");
            long[] keep = args.LongList("keep", new long[] { 100000, 25000, 1000 }, 3, 3, 0, 100000000);
            if (args.Has("million")) keep = new long[] { 1000000, 25000, 1000 };
            int blobBytes = args.Int("blob-bytes", 4096, 0, 16 * 1024 * 1024);
            long churnPerSecond = args.Long("churn-per-second", 50000, 0, 100000000);
            double? duration = args.DurationSeconds();
            Lifetime.Install();

            // Sizes first (these instances are garbage by the ready line).
            var sizes = new Json()
                .Add("Alloc.SmallNode", MeasureBytes(() => new SmallNode()))
                .Add("Alloc.MediumRecord", MeasureBytes(() => new MediumRecord()))
                .Add("Alloc.LargeBlob", MeasureBytes(() => new LargeBlob()))
                .Add("Alloc.ChurnItem", MeasureBytes(() => new ChurnItem()))
                .Add("System.Byte[]", MeasureBytes(() => new byte[blobBytes], Math.Max(1, Math.Min(1000, 1000000 / (blobBytes + 24)))));

            keptSmall = AllocateSmallNodes((int)keep[0]);
            keptMedium = AllocateMediumRecords((int)keep[1]);
            keptLarge = AllocateLargeBlobs((int)keep[2], blobBytes);

            Thread churn = null;
            if (churnPerSecond > 0)
            {
                var started = new ManualResetEvent(false);
                churn = new Thread(() => ChurnLoop(churnPerSecond, started)) { Name = "AllocChurn", IsBackground = true };
                churn.Start();
                started.WaitOne();
            }

            GC.Collect(2, GCCollectionMode.Forced, true);
            GC.WaitForPendingFinalizers();
            GC.Collect(2, GCCollectionMode.Forced, true);

            long churnItemBytes = MeasureBytes(() => new ChurnItem());
            Out.Line(Out.Ready("Alloc")
                .Add("kept", new Json()
                    .Add("Alloc.SmallNode", keptSmall.Length)
                    .Add("Alloc.MediumRecord", keptMedium.Length)
                    .Add("Alloc.LargeBlob", keptLarge.Length))
                .Add("kept_arrays", new Json()
                    .Add("Alloc.SmallNode[]", keptSmall.Length)
                    .Add("Alloc.MediumRecord[]", keptMedium.Length)
                    .Add("Alloc.LargeBlob[]", keptLarge.Length))
                .Add("blob_bytes", blobBytes)
                .Add("blob_arrays", keptLarge.Length)
                .Add("instance_bytes", sizes)
                .Add("kept_objects", keep[0] + keep[1] + 2 * keep[2] + 3)
                .Add("churn", new Json()
                    .Add("type", "Alloc.ChurnItem")
                    .Add("per_second", churnPerSecond)
                    .Add("bytes_per_second", churnPerSecond * churnItemBytes)
                    .Add("method", "Alloc.Program.ChurnBatch")
                    .Add("thread", churnPerSecond > 0 ? "AllocChurn" : null)
                    .Add("tid", churnPerSecond > 0 ? (object)churnTid : null))
                .Add("gc", GcFacts()));

            double elapsed = Lifetime.Run(duration, second => Out.Line(Progress(new Json().Add("progress", "Alloc").Add("elapsed_s", second), churnItemBytes)));
            if (churn != null) churn.Join(2000);
            Out.Line(Progress(new Json().Add("exit", "Alloc").Add("elapsed_s", Math.Round(elapsed, 3)), churnItemBytes));
            GC.KeepAlive(keptSmall);
            GC.KeepAlive(keptMedium);
            GC.KeepAlive(keptLarge);
            return 0;
        }

        static Json Progress(Json j, long churnItemBytes)
        {
            long n = Interlocked.Read(ref churnAllocated);
            return j.Add("churn_allocated", n).Add("churn_bytes", n * churnItemBytes).Add("gc", GcFacts());
        }

        static Json GcFacts()
        {
            return new Json()
                .Add("total_memory_bytes", GC.GetTotalMemory(false))
                .Add("gen0_collections", GC.CollectionCount(0))
                .Add("gen1_collections", GC.CollectionCount(1))
                .Add("gen2_collections", GC.CollectionCount(2));
        }

        /// <summary>Bytes one allocation of MAKE takes, via GC.GetAllocatedBytesForCurrentThread
        /// (.NET Core 3+; bound by reflection since Mono's mscorlib lacks it). -1 if unavailable.</summary>
        static long MeasureBytes(Func<object> make, int n = 1000)
        {
            MethodInfo m = typeof(GC).GetMethod("GetAllocatedBytesForCurrentThread", BindingFlags.Public | BindingFlags.Static);
            if (m == null) return -1;
            var allocated = (Func<long>)Delegate.CreateDelegate(typeof(Func<long>), m);
            var hold = new object[n];
            hold[0] = make(); // JIT and type loading outside the measurement
            allocated();
            long before = allocated();
            for (int i = 0; i < n; i++) hold[i] = make();
            long after = allocated();
            GC.KeepAlive(hold);
            return (after - before) / n;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static SmallNode[] AllocateSmallNodes(int count)
        {
            var nodes = new SmallNode[count];
            for (int i = 0; i < count; i++)
            {
                nodes[i] = new SmallNode { Id = i, Value = (long)i * 7 };
                nodes[i].Next = i > 0 ? nodes[i / 2] : null;
            }
            return nodes;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static MediumRecord[] AllocateMediumRecords(int count)
        {
            var records = new MediumRecord[count];
            for (int i = 0; i < count; i++)
            {
                records[i] = new MediumRecord
                {
                    Id = i,
                    Timestamp = 638000000000000000L + i,
                    Score = i * 0.5,
                    Weight = 1.0 / (i + 1),
                    Key = new Guid(i, (short)(i >> 16), 0, 1, 2, 3, 4, 5, 6, 7, 8),
                    Flags = i & 0xff,
                    Label = Label,
                };
            }
            return records;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static LargeBlob[] AllocateLargeBlobs(int count, int blobBytes)
        {
            var blobs = new LargeBlob[count];
            for (int i = 0; i < count; i++)
            {
                var data = new byte[blobBytes];
                long sum = 0;
                for (int j = 0; j < data.Length; j++)
                {
                    data[j] = (byte)(i + j);
                    sum += data[j];
                }
                blobs[i] = new LargeBlob { Id = i, Checksum = sum, Data = data };
            }
            return blobs;
        }

        static void ChurnLoop(long perSecond, ManualResetEvent started)
        {
            churnTid = Native.CurrentTid();
            started.Set();
            var sw = Stopwatch.StartNew();
            long done = 0;
            while (!Lifetime.Stopping)
            {
                long due = (long)(sw.Elapsed.TotalSeconds * perSecond);
                if (due - done > perSecond) done = due - perSecond; // never burst more than a second's worth
                if (due > done)
                {
                    ChurnBatch(done, (int)(due - done));
                    Interlocked.Add(ref churnAllocated, due - done);
                    done = due;
                }
                Lifetime.StopHandle.WaitOne(10);
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static void ChurnBatch(long first, int count)
        {
            long ticks = DateTime.UtcNow.Ticks;
            for (int i = 0; i < count; i++)
            {
                long seq = first + i;
                ring[seq % ChurnRing] = new ChurnItem { Sequence = seq, Ticks = ticks, A = (int)seq, B = (int)(seq >> 32) };
            }
        }
    }
}
