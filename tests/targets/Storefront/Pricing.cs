using System;
using System.Runtime.CompilerServices;
using System.Threading;

namespace Storefront.Pricing
{
    /// <summary>Discount rules every price goes through. The "CPU regression" switch (Knobs.Regression)
    /// makes Evaluate re-run its rule table until it has used Knobs.RegressionMs of CPU per price (as a
    /// change that dropped a cache would): the same answer, about a thousand times the CPU, all of it in
    /// this one method.</summary>
    public static class DiscountRules
    {
        const int RuleCount = 256;
        static readonly long[] MinimumCents = new long[RuleCount];
        static readonly int[] PercentOff = new int[RuleCount];
        static readonly int[] MinimumQuantity = new int[RuleCount];

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
            long budget = k.Regression ? (long)(k.RegressionMs * 1e6) : 0;
            long start = budget > 0 ? ThreadCpu.Nanoseconds() : 0;
            long gross = priceCents * quantity;
            long best = 0;
            do
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
            } while (budget > 0 && ThreadCpu.Nanoseconds() - start < budget);
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
