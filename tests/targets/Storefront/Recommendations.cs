using System;
using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Threading;

namespace Storefront.Recommendations
{
    /// <summary>The hot endpoint: products like a given one, by cosine similarity of feature vectors,
    /// scored over and over until the request has burned Knobs.HotMs of CPU (thread CPU time), so the
    /// cost per request is what the knob says whatever the machine's load.</summary>
    public static class RecommendationEngine
    {
        const int Dimensions = 64;
        const int Candidates = 256;
        static readonly float[][] Features = new float[Candidates][];
        static long cpuNanoseconds;

        /// <summary>CPU the engine has burned so far, in seconds.</summary>
        public static double CpuSeconds => Interlocked.Read(ref cpuNanoseconds) / 1e9;

        static RecommendationEngine()
        {
            var rng = new Random(4545);
            for (int i = 0; i < Candidates; i++)
            {
                Features[i] = new float[Dimensions];
                for (int d = 0; d < Dimensions; d++) Features[i][d] = (float)rng.NextDouble() - 0.5f;
            }
        }

        /// <summary>The five products most like PRODUCTID (ids 1..Candidates).</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        public static long[] ScoreCandidates(long productId, double cpuMs)
        {
            long start = ThreadCpu.Nanoseconds();
            long budget = (long)(cpuMs * 1e6);
            float[] self = Features[(int)((productId - 1) % Candidates + Candidates) % Candidates];
            var scores = new float[Candidates];
            do
            {
                for (int i = 0; i < Candidates; i++) scores[i] = Similarity(self, Features[i]);
            } while (ThreadCpu.Nanoseconds() - start < budget);
            Interlocked.Add(ref cpuNanoseconds, ThreadCpu.Nanoseconds() - start);
            return Top(scores, productId, 5);
        }

        /// <summary>Cosine similarity: the hot path's leaf.</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        public static float Similarity(float[] a, float[] b)
        {
            float dot = 0, na = 0, nb = 0;
            for (int d = 0; d < a.Length; d++)
            {
                dot += a[d] * b[d];
                na += a[d] * a[d];
                nb += b[d] * b[d];
            }
            return dot / MathF.Sqrt(na * nb + 1e-9f);
        }

        static long[] Top(float[] scores, long productId, int count)
        {
            var order = new List<int>(Candidates);
            for (int i = 0; i < Candidates; i++) if (i + 1 != productId) order.Add(i);
            order.Sort((x, y) => scores[y].CompareTo(scores[x]));
            var top = new long[count];
            for (int i = 0; i < count; i++) top[i] = order[i] + 1;
            return top;
        }
    }
}
