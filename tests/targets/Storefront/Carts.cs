using System;
using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Threading;
using Testbed;

namespace Storefront.Carts
{
    /// <summary>Shopping carts behind one lock. Requests add items under it (AddItem, the waiters);
    /// the CartJanitor thread compacts the carts under it too (CompactUnderLock, the holder), for
    /// Knobs.LockHoldMs of CPU every Knobs.LockPeriodMs: with a hold of a few ms, requests queue on
    /// the lock behind it and behind each other, a lock convoy.</summary>
    public static class CartStore
    {
        static readonly object Gate = new object();
        static readonly Dictionary<long, Dictionary<long, int>> carts = new Dictionary<long, Dictionary<long, int>>();
        static long openCarts;

        public static long OpenCarts => Interlocked.Read(ref openCarts);

        /// <summary>Adds QUANTITY of PRODUCTID to cart CARTID; the cart's item count.</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        public static int AddItem(long cartId, long productId, int quantity)
        {
            lock (Gate)
            {
                if (!carts.TryGetValue(cartId, out Dictionary<long, int> cart))
                {
                    cart = new Dictionary<long, int>();
                    carts[cartId] = cart;
                    Interlocked.Increment(ref openCarts);
                }
                cart.TryGetValue(productId, out int had);
                cart[productId] = had + quantity;
                int items = 0;
                foreach (int q in cart.Values) items += q;
                Counts.Add(ref Counts.CartItemsAdded);
                Telemetry.CartItems.Add(quantity);
                return items;
            }
        }

        /// <summary>The janitor's pass, holding the lock for HOLDMS of its CPU: walks the carts and
        /// drops those grown past 100 items (checkout would have emptied them).</summary>
        [MethodImpl(MethodImplOptions.NoInlining)]
        public static void CompactUnderLock(double holdMs)
        {
            lock (Gate)
            {
                long start = ThreadCpu.Nanoseconds();
                long budget = (long)(holdMs * 1e6);
                var full = new List<long>();
                do
                {
                    full.Clear();
                    foreach (KeyValuePair<long, Dictionary<long, int>> kv in carts)
                    {
                        int items = 0;
                        foreach (int q in kv.Value.Values) items += q;
                        if (items > 100) full.Add(kv.Key);
                    }
                } while (ThreadCpu.Nanoseconds() - start < budget);
                foreach (long id in full)
                {
                    int items = 0;
                    foreach (int q in carts[id].Values) items += q;
                    carts.Remove(id);
                    Interlocked.Decrement(ref openCarts);
                    Telemetry.CartItems.Add(-items);
                }
                Counts.Add(ref Counts.JanitorCompactions);
            }
        }
    }

    /// <summary>The thread "CartJanitor": one CartStore.CompactUnderLock per Knobs.LockPeriodMs while
    /// Knobs.LockHoldMs is above 0, else a pass of no hold every 100 ms.</summary>
    public static class CartJanitor
    {
        public const string ThreadName = "CartJanitor";

        /// <summary>Starts the thread; its OS thread id.</summary>
        public static int Start()
        {
            int tid = 0;
            using var started = new ManualResetEventSlim();
            var thread = new Thread(() =>
            {
                tid = Native.CurrentTid();
                started.Set();
                while (!Lifetime.Stopping)
                {
                    Knobs k = Behaviour.Current;
                    if (k.LockHoldMs > 0)
                    {
                        CartStore.CompactUnderLock(k.LockHoldMs);
                        Lifetime.StopHandle.WaitOne(TimeSpan.FromMilliseconds(Math.Max(0, k.LockPeriodMs - k.LockHoldMs)));
                    }
                    else
                    {
                        CartStore.CompactUnderLock(0);
                        Lifetime.StopHandle.WaitOne(100);
                    }
                }
            }) { Name = ThreadName, IsBackground = true };
            thread.Start();
            started.Wait();
            return tid;
        }
    }
}
