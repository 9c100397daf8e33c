// TraceEventReader: what Microsoft's TraceEvent library reads from a trace, as JSON on stdout, for the
// suite to compare with clrscope's own reading (tests/suite/peers.rs).
//
//   TraceEventReader events FILE.nettrace [FROM UNTIL]
//                                           providers; per (provider, event id): name, count, payload
//                                           fields, and with FROM and UNTIL the count of those dated
//                                           within [FROM, UNTIL]; the first and last event's time and
//                                           the rundown's first. Times are ticks of the runtime's
//                                           clock (QPC), the same in every session's file; a file's
//                                           UTC mapping is not (its sync time has whole milliseconds)
//   TraceEventReader cpu FILE.nettrace [FOLD]
//                                           managed-code ThreadSamples through TraceLog's stack source:
//                                           per function, inclusive and exclusive sample counts; FOLD is
//                                           PerfView's fold pattern (frames matching it count as their
//                                           caller's)
//   TraceEventReader gcdump FILE.gcdump DOTNET_GCDUMP_DLL
//                                           a .gcdump through PerfView's own reader (GCHeapDump and
//                                           MemoryGraph: TraceEvent's NuGet package does not ship them,
//                                           dotnet-gcdump.dll compiles them in, public): per type name,
//                                           objects, bytes and the smallest and largest object; the
//                                           totals; the pseudo-nodes (roots) apart
//
// Exit code 2 on bad usage, 1 when TraceEvent cannot read the file (the message on stderr).
using System;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using System.Linq;
using System.Runtime.Loader;
using System.Text.Json;
using Diagnostics.Tracing.StackSources;
using Microsoft.Diagnostics.Tracing;
using Microsoft.Diagnostics.Tracing.Etlx;
using Microsoft.Diagnostics.Tracing.Parsers;
using Microsoft.Diagnostics.Tracing.Parsers.Clr;
using Microsoft.Diagnostics.Tracing.Stacks;

static class Program
{
    const string SampleProfiler = "Microsoft-DotNETCore-SampleProfiler";
    // SampleProfilerSampleType::Managed in the runtime: the thread was running managed code.
    const int ManagedSample = 2;

    static int Main(string[] args)
    {
        bool events = args.Length >= 2 && args[0] == "events" && (args.Length == 2 || args.Length == 4);
        bool cpu = args.Length >= 2 && args.Length <= 3 && args[0] == "cpu";
        bool gcdump = args.Length == 3 && args[0] == "gcdump";
        if (!events && !cpu && !gcdump)
        {
            Console.Error.WriteLine("usage: TraceEventReader events FILE.nettrace [FROM UNTIL] | cpu FILE.nettrace [FOLD] | gcdump FILE.gcdump DOTNET_GCDUMP_DLL");
            return 2;
        }
        try
        {
            using var stdout = Console.OpenStandardOutput();
            using var json = new Utf8JsonWriter(stdout, new JsonWriterOptions { Indented = true });
            if (events)
            {
                (long, long)? window = args.Length == 4
                    ? (long.Parse(args[2], CultureInfo.InvariantCulture), long.Parse(args[3], CultureInfo.InvariantCulture))
                    : null;
                Events(args[1], window, json);
            }
            else if (gcdump)
                GcDump(args[1], args[2], json);
            else
                Cpu(args[1], args.Length == 3 ? args[2] : null, json);
            json.Flush();
            return 0;
        }
        catch (Exception e)
        {
            Console.Error.WriteLine($"TraceEventReader: {args[1]}: {e}");
            return 1;
        }
    }

    sealed class EventKind
    {
        public string Provider;
        public int Id;
        public string Name;
        public long Count;
        public long InWindow;
        public string[] Payload;
    }

    // Every event the EventPipe source delivers, named by the parsers a PerfView user has: the runtime's
    // (and its rundown), and the dynamic one that reads EventSource events from the trace's metadata.
    static void Events(string path, (long From, long Until)? window, Utf8JsonWriter json)
    {
        var kinds = new Dictionary<(string, int), EventKind>();
        var providers = new SortedSet<string>(StringComparer.Ordinal);
        long total = 0;
        long? first = null, last = null, rundown = null;
        using (var source = new EventPipeEventSource(path))
        {
            Action<TraceEvent> count = e =>
            {
                total++;
                providers.Add(e.ProviderName);
                var key = (e.ProviderName, (int)e.ID);
                if (!kinds.TryGetValue(key, out var kind))
                {
                    kind = new EventKind
                    {
                        Provider = e.ProviderName,
                        Id = (int)e.ID,
                        Name = e.EventName,
                        Payload = e.PayloadNames ?? Array.Empty<string>(),
                    };
                    kinds[key] = kind;
                }
                kind.Count++;
#pragma warning disable CS0618 // "discouraged": the raw clock is the point, being the same in every file
                long at = e.TimeStampQPC;
#pragma warning restore CS0618
                first ??= at;
                last = at;
                if (rundown == null && e.ProviderName == ClrRundownTraceEventParser.ProviderName)
                    rundown = at;
                if (window is var (from, until) && at >= from && at <= until)
                    kind.InWindow++;
            };
            // A parser's templates are registered by subscribing to them; each event goes to one.
            source.Clr.All += count;
            new ClrRundownTraceEventParser(source).All += count;
            source.Dynamic.All += count;
            // GCDynamicEvent (id 39) reaches a subscriber only through its own parser.
            new GCDynamicTraceEventParser(source).All += count;
            source.UnhandledEvents += count;
            source.Process();
            json.WriteStartObject();
            json.WriteString("file", path);
            json.WriteNumber("events", total);
            json.WriteNumber("events_lost", source.EventsLost);
            json.WriteNumber("pointer_size", source.PointerSize);
            WriteTime(json, "first", first);
            WriteTime(json, "last", last);
            WriteTime(json, "rundown_from", rundown);
        }
        json.WriteStartArray("providers");
        foreach (var p in providers)
            json.WriteStringValue(p);
        json.WriteEndArray();
        json.WriteStartArray("by_event");
        foreach (var k in kinds.Values.OrderBy(k => k.Provider, StringComparer.Ordinal).ThenBy(k => k.Id))
        {
            json.WriteStartObject();
            json.WriteString("provider", k.Provider);
            json.WriteNumber("id", k.Id);
            json.WriteString("name", k.Name);
            json.WriteNumber("count", k.Count);
            if (window.HasValue)
                json.WriteNumber("in_window", k.InWindow);
            json.WriteStartArray("payload");
            foreach (var f in k.Payload)
                json.WriteStringValue(f);
            json.WriteEndArray();
            json.WriteEndObject();
        }
        json.WriteEndArray();
        json.WriteEndObject();
    }

    static void WriteTime(Utf8JsonWriter json, string name, long? at)
    {
        if (at is long ticks)
            json.WriteNumber(name, ticks);
        else
            json.WriteNull(name);
    }

    // PerfView's CPU view of an EventPipe trace: TraceLog resolves each sample's stack with the trace's
    // method events and rundown; MutableTraceEventStackSource holds them; CallTree's by-name view gives
    // inclusive (recursion counted once) and exclusive counts per frame.
    static void Cpu(string path, string fold, Utf8JsonWriter json)
    {
        var etlx = Path.Combine(Path.GetTempPath(), $"TraceEventReader-{Environment.ProcessId}-{Guid.NewGuid():N}.etlx");
        try
        {
            TraceLog.CreateFromEventPipeDataFile(path, etlx);
            using var log = new TraceLog(etlx);
            var stacks = new MutableTraceEventStackSource(log);
            var sample = new StackSourceSample(stacks);
            long managed = 0, all = 0;
            foreach (var e in log.Events)
            {
                if (e.ProviderName != SampleProfiler || (int)e.ID != 0)
                    continue;
                all++;
                if (Convert.ToInt32(e.PayloadByName("Type")) != ManagedSample)
                    continue;
                managed++;
                sample.Metric = 1;
                sample.TimeRelativeMSec = e.TimeStampRelativeMSec;
                sample.StackIndex = stacks.GetCallStack(e.CallStackIndex(), e);
                stacks.AddSample(sample);
            }
            stacks.DoneAddingSamples();
            StackSource view = stacks;
            if (fold != null)
                view = new FilterStackSource(new FilterParams { FoldRegExs = fold }, stacks, ScalingPolicyKind.ScaleToData);
            var tree = new CallTree(ScalingPolicyKind.ScaleToData) { StackSource = view };
            json.WriteStartObject();
            json.WriteString("file", path);
            json.WriteNumber("thread_samples", all);
            json.WriteNumber("managed_samples", managed);
            if (fold != null)
                json.WriteString("fold", fold);
            json.WriteStartArray("functions");
            foreach (var node in tree.ByIDSortedExclusiveMetric().OrderByDescending(n => n.InclusiveMetric))
            {
                if (IsPseudoFrame(node.Name))
                    continue;
                json.WriteStartObject();
                json.WriteString("name", node.Name);
                json.WriteNumber("inclusive", node.InclusiveMetric);
                json.WriteNumber("exclusive", node.ExclusiveMetric);
                json.WriteEndObject();
            }
            json.WriteEndArray();
            json.WriteEndObject();
        }
        finally
        {
            File.Delete(etlx);
        }
    }

    // The frames TraceEvent adds above a stack's outermost method: the tree's root, the process and the
    // thread, and BROKEN where the stack does not reach a thread's start.
    static bool IsPseudoFrame(string name) =>
        name == "ROOT" || name == "BROKEN" || name.StartsWith("Process64 ", StringComparison.Ordinal)
        || name.StartsWith("Process32 ", StringComparison.Ordinal) || name.StartsWith("Thread (", StringComparison.Ordinal);

    sealed class TypeRow
    {
        public long Count;
        public long Bytes;
        public long MinSize = long.MaxValue;
        public long MaxSize;
    }

    // PerfView's heap graph as dotnet-gcdump compiled it, loaded with the tool's own dependencies (its
    // TraceEvent is older than ours) and used through reflection: a node with an address is an object;
    // the others are the roots PerfView adds ([.NET Roots], [static vars], ...).
    static void GcDump(string path, string toolDll, Utf8JsonWriter json)
    {
        toolDll = Path.GetFullPath(toolDll);
        var resolver = new AssemblyDependencyResolver(toolDll);
        var context = new AssemblyLoadContext("dotnet-gcdump");
        context.Resolving += (ctx, name) => resolver.ResolveAssemblyToPath(name) is string p ? ctx.LoadFromAssemblyPath(p) : null;
        var tool = context.LoadFromAssemblyPath(toolDll);
        dynamic dump = Activator.CreateInstance(tool.GetType("GCHeapDump", true), path);
        dynamic graph = dump.MemoryGraph;
        var nodeIndex = tool.GetType("Graphs.NodeIndex", true);
        var typeIndex = tool.GetType("Graphs.NodeTypeIndex", true);
        dynamic node = graph.AllocNodeStorage();
        dynamic type = graph.AllocTypeNodeStorage();
        var byType = new Dictionary<int, TypeRow>();
        long objects = 0, bytes = 0, pseudo = 0;
        int limit = (int)graph.NodeIndexLimit;
        for (int i = 0; i < limit; i++)
        {
            dynamic index = Enum.ToObject(nodeIndex, i);
            if ((ulong)graph.GetAddress(index) == 0)
            {
                pseudo++;
                continue;
            }
            graph.GetNode(index, node);
            long size = (int)node.Size;
            int t = (int)node.TypeIndex;
            if (!byType.TryGetValue(t, out var row))
                byType[t] = row = new TypeRow();
            row.Count++;
            row.Bytes += size;
            row.MinSize = Math.Min(row.MinSize, size);
            row.MaxSize = Math.Max(row.MaxSize, size);
            objects++;
            bytes += size;
        }
        // Types of one name (the same name in two modules) are one row, as clrscope's report has them.
        var byName = new SortedDictionary<string, TypeRow>(StringComparer.Ordinal);
        foreach (var (t, row) in byType)
        {
            dynamic index = Enum.ToObject(typeIndex, t);
            string name = graph.GetType(index, type).Name;
            if (!byName.TryGetValue(name, out var sum))
                byName[name] = sum = new TypeRow();
            sum.Count += row.Count;
            sum.Bytes += row.Bytes;
            sum.MinSize = Math.Min(sum.MinSize, row.MinSize);
            sum.MaxSize = Math.Max(sum.MaxSize, row.MaxSize);
        }
        json.WriteStartObject();
        json.WriteString("file", path);
        json.WriteString("creation_tool", (string)dump.CreationTool);
        json.WriteNumber("objects", objects);
        json.WriteNumber("bytes", bytes);
        json.WriteNumber("pseudo_nodes", pseudo);
        json.WriteStartArray("types");
        foreach (var (name, row) in byName)
        {
            json.WriteStartObject();
            json.WriteString("name", name);
            json.WriteNumber("count", row.Count);
            json.WriteNumber("bytes", row.Bytes);
            json.WriteNumber("min_size", row.MinSize);
            json.WriteNumber("max_size", row.MaxSize);
            json.WriteEndObject();
        }
        json.WriteEndArray();
        json.WriteEndObject();
    }
}
