using System.Runtime.InteropServices;

namespace Storefront
{
    /// <summary>The calling thread's CPU time (clock_gettime(CLOCK_THREAD_CPUTIME_ID), ns resolution):
    /// the hot paths burn a number of CPU milliseconds, not of wall-clock ones, so that what a request
    /// costs stays the same on a machine loaded by others.</summary>
    public static class ThreadCpu
    {
        [StructLayout(LayoutKind.Sequential)]
        struct Timespec
        {
            public long Seconds;
            public long Nanoseconds;
        }

        const int ClockThreadCpuTimeId = 3;

        [DllImport("libc", EntryPoint = "clock_gettime")]
        static extern int ClockGetTime(int clock, out Timespec time);

        public static long Nanoseconds()
        {
            ClockGetTime(ClockThreadCpuTimeId, out Timespec t);
            return t.Seconds * 1_000_000_000L + t.Nanoseconds;
        }
    }
}
