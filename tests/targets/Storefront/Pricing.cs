using System;
using System.Runtime.CompilerServices;
using System.Threading;

namespace Storefront.Pricing
{
    /// <summary>Discount rules every price goes through. The "CPU regression" switch (Knobs.Regression)
    /// makes Evaluate re-run its rule table for about Knobs.RegressionMs of CPU per price (as a
    /// change that dropped a cache would): the same answer, about a thousand times the CPU, all of it in
    /// this one method. The CPU it takes is measured (the thread's CPU clock before and after) and
    /// reported as pricing_cpu_ns.</summary>
    public static class DiscountRules
    {
        const int RuleCount = 256;
        static readonly long[] MinimumCents = new long[RuleCount];
        static readonly int[] PercentOff = new int[RuleCount];
        static readonly int[] MinimumQuantity = new int[RuleCount];
        /// <summary>Passes over the rule table a millisecond of CPU takes, as the last regressed
        /// evaluations measured it.</summary>
        static double passesPerMs = 1000;

        static DiscountRules()
        {
            for (int i = 0; i < RuleCount; i++)
            {
                MinimumCents[i] = 1000 + i * 97 % 9000;
                PercentOff[i] = 1 + i % 15;
                MinimumQuantity[i] = 1 + i % 5;
            }
        }

        /// <summary>The price of QUANTITY items at PRICECENTS each, after the best rule that applies.</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        public static long Evaluate(long priceCents, int quantity)
        {
            Counts.Add(ref Counts.PricingEvaluations);
            Knobs k = Behaviour.Current;
            // A pass count rather than a clock read per pass: a call in the loop would be the only
            // place the runtime can stop this thread, and its sampler would find it in the clock's
            // P/Invoke (outside managed code) instead of here.
            long passes = k.Regression ? Math.Max(1, (long)(k.RegressionMs * passesPerMs)) : 1;
            long start = k.Regression ? ThreadCpu.Nanoseconds() : 0;
            long gross = priceCents * quantity;
            long best = 0;
            for (long pass = 0; pass < passes; pass++)
            {
                long passBest = 0;
                for (int i = 0; i < RuleCount; i++)
                {
                    if (gross < MinimumCents[i] || quantity < MinimumQuantity[i]) continue;
                    long off = gross * PercentOff[i] / 100;
                    long rounded = off - off % 5;
                    if (rounded > passBest) passBest = rounded;
                }
                // Every pass finds the same discount; keeping the largest keeps the JIT from dropping any.
                if (passBest > best) best = passBest;
            }
            if (k.Regression)
            {
                long used = ThreadCpu.Nanoseconds() - start;
                Interlocked.Add(ref Counts.PricingCpuNanoseconds, used);
                if (used > 0) passesPerMs = 0.8 * passesPerMs + 0.2 * (passes * 1e6 / used);
            }
            return gross - best;
        }
    }

    /// <summary>The coupon service failed: thrown on the exception path (Knobs.ExceptionEvery) and
    /// left to ASP.NET Core, which logs it and answers 500.</summary>
    public sealed class CouponServiceException : Exception
    {
        public CouponServiceException(string message) : base(message) { }
    }

    public static class CouponService
    {
        static long lookups;

        /// <summary>Percent off for CODE, or null for an unknown code; throws CouponServiceException
        /// on every Knobs.ExceptionEvery-th lookup.</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        public static int? Lookup(string code)
        {
            long n = Interlocked.Increment(ref lookups);
            int every = Behaviour.Current.ExceptionEvery;
            if (every > 0 && n % every == 0)
            {
                Counts.Add(ref Counts.CouponExceptions);
                Telemetry.CouponFailures.Add(1);
                throw new CouponServiceException("coupon service unavailable while looking up '" + code + "' (lookup " + n + ")");
            }
            switch (code)
            {
                case "SAVE10": return 10;
                case "SAVE20": return 20;
                case "WELCOME": return 15;
                default: return null;
            }
        }
    }
}
