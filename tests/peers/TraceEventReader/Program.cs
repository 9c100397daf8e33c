// TraceEventReader: what Microsoft's TraceEvent library reads from a trace, as JSON on stdout, for the
// suite to compare with clrscope's own reading (tests/suite/peers.rs).
//
//   TraceEventReader events FILE.nettrace   providers; per (provider, event id): name, count, payload fields
//   TraceEventReader cpu FILE.nettrace      managed-code ThreadSamples through TraceLog's stack source:
//                                           per function, inclusive and exclusive sample counts
//
// Exit code 2 on bad usage, 1 when TraceEvent cannot read the file (the message on stderr).
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Text.Json;
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
        if (args.Length != 2 || (args[0] != "events" && args[0] != "cpu"))
        {
            Console.Error.WriteLine("usage: TraceEventReader events|cpu FILE.nettrace");
            return 2;
        }
        try
        {
            using var stdout = Console.OpenStandardOutput();
            using var json = new Utf8JsonWriter(stdout, new JsonWriterOptions { Indented = true });
            if (args[0] == "events")
                Events(args[1], json);
            else
                Cpu(args[1], json);
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
        public string[] Payload;
    }

    // Every event the EventPipe source delivers, named by the parsers a PerfView user has: the runtime's
    // (and its rundown), and the dynamic one that reads EventSource events from the trace's metadata.
    static void Events(string path, Utf8JsonWriter json)
    {
        var kinds = new Dictionary<(string, int), EventKind>();
        var providers = new SortedSet<string>(StringComparer.Ordinal);
        long total = 0;
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
            };
            // A parser's templates are registered by subscribing to them; each event goes to one.
            source.Clr.All += count;
            new ClrRundownTraceEventParser(source).All += count;
            source.Dynamic.All += count;
            source.UnhandledEvents += count;
            source.Process();
            json.WriteStartObject();
            json.WriteString("file", path);
            json.WriteNumber("events", total);
            json.WriteNumber("events_lost", source.EventsLost);
            json.WriteNumber("pointer_size", source.PointerSize);
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
            json.WriteStartArray("payload");
            foreach (var f in k.Payload)
                json.WriteStringValue(f);
            json.WriteEndArray();
            json.WriteEndObject();
        }
        json.WriteEndArray();
        json.WriteEndObject();
    }

    // PerfView's CPU view of an EventPipe trace: TraceLog resolves each sample's stack with the trace's
    // method events and rundown; MutableTraceEventStackSource holds them; CallTree's by-name view gives
    // inclusive (recursion counted once) and exclusive counts per frame.
    static void Cpu(string path, Utf8JsonWriter json)
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
            var tree = new CallTree(ScalingPolicyKind.ScaleToData) { StackSource = stacks };
            json.WriteStartObject();
            json.WriteString("file", path);
            json.WriteNumber("thread_samples", all);
            json.WriteNumber("managed_samples", managed);
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
}
