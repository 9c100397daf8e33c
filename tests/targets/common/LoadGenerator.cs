// The built-in load generator of the HTTP test-bed targets (AsyncWeb, Bookstore); see
// tests/targets/README.md: N requests per second from a thread "SelfLoad" with HttpClient, the request i
// chosen by a function of i, at most 64 in flight (a saturated server makes it skip requests rather than
// queue them), optionally for a bounded number of seconds; counts sent/ok/failed.
using System;
using System.Diagnostics;
using System.Net.Http;
using System.Threading;
using System.Threading.Tasks;

namespace Testbed
{
    /// <summary>The built-in load generator of the HTTP targets.</summary>
    public sealed class LoadGenerator
    {
        const int MaxInFlight = 64;

        readonly double perSecond;
        readonly double? seconds;
        readonly Func<long, HttpRequestMessage> request;
        long sent, ok, failed;
        Thread thread;

        /// <param name="perSecond">requests per second</param>
        /// <param name="seconds">stop sending after this many seconds (null: until the target stops)</param>
        /// <param name="request">the request number i (0, 1, ...) to send</param>
        public LoadGenerator(double perSecond, double? seconds, Func<long, HttpRequestMessage> request)
        {
            this.perSecond = perSecond;
            this.seconds = seconds;
            this.request = request;
        }

        public void Start()
        {
            thread = new Thread(Run) { Name = "SelfLoad", IsBackground = true };
            thread.Start();
        }

        public void Join(int timeoutMs)
        {
            if (thread != null) thread.Join(timeoutMs);
        }

        /// <summary>{"sent":N,"ok":N,"failed":N} so far.</summary>
        public Json Totals()
        {
            return new Json()
                .Add("sent", Interlocked.Read(ref sent))
                .Add("ok", Interlocked.Read(ref ok))
                .Add("failed", Interlocked.Read(ref failed));
        }

        void Run()
        {
            var client = new HttpClient { Timeout = TimeSpan.FromSeconds(10) };
            var inFlight = new SemaphoreSlim(MaxInFlight);
            var sw = Stopwatch.StartNew();
            long next = 0;
            while (!Lifetime.Stopping && !(seconds.HasValue && sw.Elapsed.TotalSeconds >= seconds.Value))
            {
                long due = (long)(sw.Elapsed.TotalSeconds * perSecond) + 1;
                if (due - next > perSecond + 1) next = due - (long)perSecond - 1;
                while (next < due && !Lifetime.Stopping)
                {
                    if (!inFlight.Wait(0)) { next = due; break; } // saturated: skip rather than queue up
                    HttpRequestMessage message = request(next);
                    next++;
                    Interlocked.Increment(ref sent);
                    client.SendAsync(message).ContinueWith(t =>
                    {
                        if (t.Status == TaskStatus.RanToCompletion && t.Result.IsSuccessStatusCode) Interlocked.Increment(ref ok);
                        else Interlocked.Increment(ref failed);
                        if (t.Status == TaskStatus.RanToCompletion) t.Result.Dispose();
                        message.Dispose();
                        inFlight.Release();
                    });
                }
                double waitMs = (next / perSecond - sw.Elapsed.TotalSeconds) * 1000.0;
                if (waitMs > 0) Lifetime.StopHandle.WaitOne(Math.Max(1, (int)Math.Ceiling(waitMs)));
            }
        }
    }
}
