// Activities: a .NET test-bed target running spans at a fixed rate, from an ActivitySource and, with
// --legacy, as DiagnosticListener-only activities (`new Activity(...)`, no ActivitySource), the way
// libraries written before ActivitySource (and ASP.NET Core or HttpClient when no ActivityListener
// wants their source) create them.
//
// What it does
//   Thread "Spans" runs --spans-per-second iterations a second (paced in 10 ms steps; an iteration
//   that falls behind runs late, none is skipped), each:
//     1. span "Activities.Work" of ActivitySource "Activities" (version "1.2.3"; W3C ids, recorded:
//        an ActivityListener samples the source AllDataAndRecorded, as OpenTelemetry tracing would),
//        kind Internal, with --tags tags (activities.i0 .. activities.iN-1: "value-<k>" strings, but
//        activities.i0 = the iteration number, a long) and status Ok;
//     2. with --legacy, inside it, "Activities.Legacy.Child": `new Activity(...)` started and stopped
//        through DiagnosticListener "Activities.Legacy" (StartActivity/StopActivity, payload an object
//        with a property Iteration), tags legacy.kind=child and legacy.iteration=<iteration>, status
//        Error "legacy failure <iteration>" on every 4th iteration (iteration % 4 == 3), else Unset.
//        Its parent is the recorded span, so it is recorded too (flags are inherited);
//     3. with --legacy, after the span, two root activities of the same listener:
//        "Activities.Legacy.Root" with ActivityTraceFlags = Recorded set before it starts (as
//        OpenTelemetry's SDK records the legacy activities it is told of), tag legacy.kind=root;
//        "Activities.Legacy.Unrecorded", flags left None: nothing records it, so it must not be
//        exported.
//     4. with --unsampled-leaf, inside the span, "Activities.Unsampled.Leaf" of ActivitySource
//        "Activities.Unsampled", which no ActivityListener of the app listens to: without an
//        out-of-process listener StartActivity returns null; with one (a DiagnosticSourceEventSource
//        session voting Propagate for every source) the runtime creates it, IsAllDataRequested
//        false and the sampled flag inherited from the span. The app records nothing of it.
//   Every activity created by a constructor has ActivitySource "" (Activity.Source), kind Internal.
//
// Arguments
//   --spans-per-second N   iterations a second (default 100)
//   --tags K               tags of each "Activities.Work" span, 0..64 (default 3)
//   --legacy               also run the DiagnosticListener-only activities (2 and 3 above)
//   --unsampled-leaf       also start the leaf of a source the app does not listen to (4 above)
//   --no-span-lines        do not print a line per iteration
//   --duration-seconds N   run N seconds, then exit 0 (default: until killed; Ctrl-C exits cleanly)
//
// Lines printed to stdout (one JSON object per line)
//   ready, once the first iteration has run:
//     {"ready":"Activities","pid":1234,"runtime":"8.0.4","activity_source":"Activities",
//      "source_version":"1.2.3","span_name":"Activities.Work","diagnostic_listener":"Activities.Legacy",
//      "legacy_spans":["Activities.Legacy.Child","Activities.Legacy.Root"],
//      "unrecorded_span":"Activities.Legacy.Unrecorded","spans_per_second":100,"tags":3,"legacy":true}
//   one per iteration after the ready line (unless --no-span-lines), once its activities stopped:
//     {"iteration":17,"trace_id":"<32 hex>","span_id":"<16 hex>","span_ms":0.0123,
//      "span_tags":{"activities.i0":"17","activities.i1":"value-1","activities.i2":"value-2"},
//      "legacy":{"child":{"trace_id":..,"span_id":..,"parent_span_id":"<the span's id>","flags":"Recorded",
//                         "duration_ms":0.004,"status":"Unset","status_description":null,
//                         "tags":{"legacy.kind":"child","legacy.iteration":"17"}},
//                "root":{"trace_id":..,"span_id":..,"parent_span_id":null,"flags":"Recorded",
//                        "duration_ms":..,"tags":{"legacy.kind":"root"}},
//                "unrecorded":{"trace_id":..,"span_id":..,"flags":"None"}},
//      "recorded_span_ids":["<the span's id>", <the legacy child's and root's ids>],
//      "unsampled":{"created":true,"span_id":"<16 hex>","is_all_data_requested":false,"flags":"Recorded"}}
//     ("legacy" is null without --legacy; "unsampled" null without --unsampled-leaf, and
//     {"created":false} when StartActivity returned null.) "recorded_span_ids": every span of the
//     iteration the app records (an ActivityListener of its own asked for all its data and it is
//     sampled), the ground truth of what an exporter may send. *_ms: Activity.Duration in ms, to 0.1 us; tag values
//     as the app's own ToString() of them.
//   every second: {"progress":"Activities","elapsed_s":1,"iterations":100,"unsampled_created":0}
//     (iterations so far; leaves of --unsampled-leaf that StartActivity created so far)
//   at exit: {"exit":"Activities","elapsed_s":5.001,"iterations":500}
using System;
using System.Diagnostics;
using System.Globalization;
using System.Threading;
using Testbed;

namespace Activities
{
    public sealed class LegacyPayload
    {
        public long Iteration { get; set; }
    }

    static class Program
    {
        const string Usage =
            "usage: Activities [--spans-per-second 100] [--tags 3] [--legacy] [--no-span-lines]\n" +
            "                  [--duration-seconds N]\n" +
            "  spans at a fixed rate from an ActivitySource and DiagnosticListener-only activities;\n" +
            "  see the top of Activities.cs";

        const string SourceName = "Activities";
        const string SourceVersion = "1.2.3";
        const string SpanName = "Activities.Work";
        const string ListenerName = "Activities.Legacy";
        const string ChildName = "Activities.Legacy.Child";
        const string RootName = "Activities.Legacy.Root";
        const string UnrecordedName = "Activities.Legacy.Unrecorded";
        const string UnsampledSourceName = "Activities.Unsampled";
        const string LeafName = "Activities.Unsampled.Leaf";

        static readonly ActivitySource Source = new ActivitySource(SourceName, SourceVersion);
        static readonly ActivitySource Unsampled = new ActivitySource(UnsampledSourceName);
        static readonly DiagnosticListener Legacy = new DiagnosticListener(ListenerName);
        static long iterations;
        static long unsampledCreated;

        static int Main(string[] argv)
        {
            var args = new Args("Activities", Usage, argv,
                new[] { "spans-per-second", "tags" }, new[] { "legacy", "unsampled-leaf", "no-span-lines" });
            int perSecond = args.Int("spans-per-second", 100, 1, 1000000);
            int tags = args.Int("tags", 3, 0, 64);
            bool legacy = args.Has("legacy");
            bool leaf = args.Has("unsampled-leaf");
            bool lines = !args.Has("no-span-lines");
            double? duration = args.DurationSeconds();
            Lifetime.Install();

            Activity.DefaultIdFormat = ActivityIdFormat.W3C;
            Activity.ForceDefaultIdFormat = true;
            ActivitySource.AddActivityListener(new ActivityListener
            {
                ShouldListenTo = s => s.Name == SourceName,
                Sample = SampleAll,
                SampleUsingParentId = SampleAllByParentId,
            });
            var tagNames = new string[tags];
            var tagValues = new string[tags];
            for (int k = 0; k < tags; k++)
            {
                tagNames[k] = "activities.i" + k;
                tagValues[k] = "value-" + k;
            }

            var first = new ManualResetEvent(false);
            bool ready = false;
            var thread = new Thread(() =>
            {
                var clock = Stopwatch.StartNew();
                long done = 0;
                while (!Lifetime.Stopping)
                {
                    long due = (long)(clock.Elapsed.TotalSeconds * perSecond) + 1;
                    while (done < due && !Lifetime.Stopping)
                    {
                        Json line = Iterate(done, tagNames, tagValues, legacy, leaf);
                        done++;
                        Interlocked.Exchange(ref iterations, done);
                        if (lines && Volatile.Read(ref ready)) Out.Line(line);
                        first.Set();
                    }
                    Thread.Sleep(10);
                }
            }) { Name = "Spans", IsBackground = true };
            thread.Start();
            first.WaitOne();

            Out.Line(Out.Ready("Activities")
                .Add("activity_source", SourceName)
                .Add("source_version", SourceVersion)
                .Add("span_name", SpanName)
                .Add("diagnostic_listener", ListenerName)
                .Add("legacy_spans", new[] { ChildName, RootName })
                .Add("unrecorded_span", UnrecordedName)
                .Add("unsampled_source", UnsampledSourceName)
                .Add("unsampled_span", LeafName)
                .Add("spans_per_second", perSecond)
                .Add("tags", tags)
                .Add("legacy", legacy)
                .Add("unsampled_leaf", leaf));
            Volatile.Write(ref ready, true);

            double elapsed = Lifetime.Run(duration, s => Out.Line(new Json()
                .Add("progress", "Activities").Add("elapsed_s", s)
                .Add("iterations", Interlocked.Read(ref iterations))
                .Add("unsampled_created", Interlocked.Read(ref unsampledCreated))));
            thread.Join(2000);
            Out.Line(new Json().Add("exit", "Activities").Add("elapsed_s", Math.Round(elapsed, 3))
                .Add("iterations", Interlocked.Read(ref iterations)));
            return 0;
        }

        static ActivitySamplingResult SampleAll(ref ActivityCreationOptions<ActivityContext> options)
        {
            return ActivitySamplingResult.AllDataAndRecorded;
        }

        static ActivitySamplingResult SampleAllByParentId(ref ActivityCreationOptions<string> options)
        {
            return ActivitySamplingResult.AllDataAndRecorded;
        }

        /// <summary>One iteration (see the top of the file); returns its line.</summary>
        static Json Iterate(long i, string[] tagNames, string[] tagValues, bool legacy, bool leaf)
        {
            Json spanTags = new Json();
            Json legacyLine = null;
            Json leafLine = null;
            Activity span = Source.StartActivity(SpanName, ActivityKind.Internal);
            for (int k = 0; k < tagNames.Length; k++)
            {
                if (k == 0)
                {
                    span.SetTag(tagNames[0], i);
                    spanTags.Add(tagNames[0], i.ToString(CultureInfo.InvariantCulture));
                }
                else
                {
                    span.SetTag(tagNames[k], tagValues[k]);
                    spanTags.Add(tagNames[k], tagValues[k]);
                }
            }
            if (leaf) leafLine = UnsampledLeaf();
            Activity child = null;
            if (legacy)
            {
                var payload = new LegacyPayload { Iteration = i };
                child = new Activity(ChildName);
                child.SetTag("legacy.kind", "child");
                child.SetTag("legacy.iteration", i);
                if (i % 4 == 3) child.SetStatus(ActivityStatusCode.Error, "legacy failure " + i);
                Legacy.StartActivity(child, payload);
                Legacy.StopActivity(child, payload);
            }
            span.SetStatus(ActivityStatusCode.Ok);
            span.Stop();
            Activity legacyRoot = null;
            if (legacy)
            {
                var payload = new LegacyPayload { Iteration = i };
                var root = legacyRoot = new Activity(RootName);
                root.ActivityTraceFlags = ActivityTraceFlags.Recorded;
                root.SetTag("legacy.kind", "root");
                Legacy.StartActivity(root, payload);
                Legacy.StopActivity(root, payload);
                var unrecorded = new Activity(UnrecordedName);
                Legacy.StartActivity(unrecorded, payload);
                Legacy.StopActivity(unrecorded, payload);
                legacyLine = new Json()
                    .Add("child", Describe(child)
                        .Add("tags", new Json().Add("legacy.kind", "child")
                            .Add("legacy.iteration", i.ToString(CultureInfo.InvariantCulture))))
                    .Add("root", Describe(root).Add("tags", new Json().Add("legacy.kind", "root")))
                    .Add("unrecorded", Describe(unrecorded));
            }
            var recordedIds = new System.Collections.Generic.List<string> { span.SpanId.ToHexString() };
            if (legacy)
            {
                recordedIds.Add(child.SpanId.ToHexString());
                recordedIds.Add(legacyRoot.SpanId.ToHexString());
            }
            return new Json()
                .Add("iteration", i)
                .Add("trace_id", span.TraceId.ToHexString())
                .Add("span_id", span.SpanId.ToHexString())
                .Add("span_ms", Math.Round(span.Duration.TotalMilliseconds, 4))
                .Add("span_tags", spanTags)
                .Add("legacy", legacyLine)
                .Add("recorded_span_ids", recordedIds.ToArray())
                .Add("unsampled", leafLine);
        }

        /// <summary>Step 4 (see the top of the file): the leaf nobody in the app samples.</summary>
        static Json UnsampledLeaf()
        {
            Activity leaf = Unsampled.StartActivity(LeafName, ActivityKind.Internal);
            if (leaf == null) return new Json().Add("created", false);
            Interlocked.Increment(ref unsampledCreated);
            leaf.Stop();
            return new Json()
                .Add("created", true)
                .Add("span_id", leaf.SpanId.ToHexString())
                .Add("is_all_data_requested", leaf.IsAllDataRequested)
                .Add("flags", leaf.ActivityTraceFlags.ToString());
        }

        static Json Describe(Activity a)
        {
            string parent = a.ParentSpanId.ToHexString();
            return new Json()
                .Add("trace_id", a.TraceId.ToHexString())
                .Add("span_id", a.SpanId.ToHexString())
                .Add("parent_span_id", parent == "0000000000000000" ? null : parent)
                .Add("flags", a.ActivityTraceFlags.ToString())
                .Add("duration_ms", Math.Round(a.Duration.TotalMilliseconds, 4))
                .Add("status", a.Status.ToString())
                .Add("status_description", a.StatusDescription);
        }
    }
}
