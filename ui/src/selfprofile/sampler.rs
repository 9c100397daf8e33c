//! `SIGPROF` sampling of this process's threads into memory allocated before sampling starts
//! and freed when it ends, so that a self-profile leaves the agent as large as it found it.
//! (The `pprof` crate, used before, keeps a 100+ MB sample table for the life of the process
//! once used, and resolves a backtrace on start, which loads the binary's DWARF tables for good.)
//!
//! The signal handler takes no lock and allocates nothing: it claims the next slot of a fixed
//! buffer with an atomic counter and writes the interrupted thread's id and return addresses
//! into it. The profiling timer (`ITIMER_PROF`) counts the CPU time of the whole process, so
//! samples land on the threads that spend it.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::time::Duration;

/// Deepest stack kept; deeper ones keep their innermost frames.
pub const MAX_DEPTH: usize = 96;

/// Most samples one profile keeps (~25 MB of slots), whatever it asks: past it, samples are
/// counted as dropped.
pub const MAX_SAMPLES: usize = 32 * 1024;

/// Words of one sample in the buffer: the thread id and depth (`tid | depth << 32`), then the
/// stack, innermost frame first.
const SLOT_WORDS: usize = 1 + MAX_DEPTH;

/// The buffer the handler writes into; null while no profile runs.
static SLOTS: AtomicPtr<u64> = AtomicPtr::new(std::ptr::null_mut());
static CAPACITY: AtomicUsize = AtomicUsize::new(0);
/// Slots claimed so far (may pass the capacity: those samples were dropped).
static CLAIMED: AtomicUsize = AtomicUsize::new(0);
/// Handlers running now; the buffer is read only once none is.
static RUNNING: AtomicUsize = AtomicUsize::new(0);
/// Address ranges of code whose interruption must not be unwound from (the unwinder and the
/// dynamic loader take locks there that the interrupted thread may hold): `(start, end)` pairs.
static BLOCKED: AtomicPtr<(u64, u64)> = AtomicPtr::new(std::ptr::null_mut());
static BLOCKED_LEN: AtomicUsize = AtomicUsize::new(0);

/// One sampled stack.
pub struct Sample {
    pub thread_id: u32,
    /// Innermost first; the first is where the thread was interrupted, the others are return
    /// addresses.
    pub addresses: Vec<u64>,
}

/// What a profile collected.
pub struct Samples {
    pub samples: Vec<Sample>,
    /// Samples past [`MAX_SAMPLES`].
    pub dropped: usize,
}

/// Why sampling could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SamplerError {
    #[error("installing the SIGPROF handler failed: {0}")]
    Handler(std::io::Error),
    #[error("starting the profiling timer failed: {0}")]
    Timer(std::io::Error),
}

/// Samples every thread at `frequency` Hz of the process's CPU time for `duration`. Blocks the
/// calling thread; only one call may run at a time (the timer and the handler are
/// process-wide), which the caller ensures.
pub fn sample(
    frequency: u32,
    duration: Duration,
    blocked: &[(u64, u64)],
) -> Result<Samples, SamplerError> {
    let capacity = capacity(frequency, duration);
    // Zeroed memory is only backed once written: a quiet agent's profile costs little.
    let mut slots = vec![0u64; capacity * SLOT_WORDS];
    let mut blocked = blocked.to_vec();
    BLOCKED_LEN.store(blocked.len(), Ordering::SeqCst);
    BLOCKED.store(blocked.as_mut_ptr(), Ordering::SeqCst);
    CLAIMED.store(0, Ordering::SeqCst);
    CAPACITY.store(capacity, Ordering::SeqCst);
    SLOTS.store(slots.as_mut_ptr(), Ordering::SeqCst);

    let result = run(frequency, duration);

    // No handler may write once the buffer is taken back: one that saw it running is counted.
    SLOTS.store(std::ptr::null_mut(), Ordering::SeqCst);
    while RUNNING.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
    BLOCKED.store(std::ptr::null_mut(), Ordering::SeqCst);
    BLOCKED_LEN.store(0, Ordering::SeqCst);
    result?;
    let claimed = CLAIMED.load(Ordering::SeqCst);
    let kept = claimed.min(capacity);
    let samples = slots
        .chunks_exact(SLOT_WORDS)
        .take(kept)
        .filter_map(|slot| {
            let depth = ((slot[0] >> 32) as usize).min(MAX_DEPTH);
            (depth > 0).then(|| Sample {
                thread_id: slot[0] as u32,
                addresses: slot[1..=depth].to_vec(),
            })
        })
        .collect();
    Ok(Samples {
        samples,
        dropped: claimed - kept,
    })
}

/// Slots for `duration` at `frequency` on every core, within [`MAX_SAMPLES`].
fn capacity(frequency: u32, duration: Duration) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let per_core = (duration.as_secs_f64() * f64::from(frequency)).ceil() as usize + 1;
    per_core.saturating_mul(cores).clamp(1, MAX_SAMPLES)
}

/// Installs the handler, runs the timer for `duration`, then stops it and ignores SIGPROF.
fn run(frequency: u32, duration: Duration) -> Result<(), SamplerError> {
    // SAFETY: a zeroed sigaction is a valid value to fill in.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigprof as *const () as usize;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: `action` is a live sigaction; the handler is async-signal-safe.
    if unsafe { libc::sigaction(libc::SIGPROF, &action, std::ptr::null_mut()) } != 0 {
        return Err(SamplerError::Handler(std::io::Error::last_os_error()));
    }
    let micros = (1_000_000 / frequency.max(1)) as libc::suseconds_t;
    let interval = libc::timeval {
        tv_sec: 0,
        tv_usec: micros,
    };
    let on = libc::itimerval {
        it_interval: interval,
        it_value: interval,
    };
    // SAFETY: `on` is a live itimerval; the old value is not wanted.
    let started = if unsafe { libc::setitimer(libc::ITIMER_PROF, &on, std::ptr::null_mut()) } == 0 {
        std::thread::sleep(duration);
        Ok(())
    } else {
        Err(SamplerError::Timer(std::io::Error::last_os_error()))
    };
    let off = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        it_value: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
    };
    // SAFETY: as above.
    unsafe {
        libc::setitimer(libc::ITIMER_PROF, &off, std::ptr::null_mut());
    }
    // Ignored rather than given back to the default action (which ends the process): a SIGPROF
    // raised just before the timer stopped may still be on its way.
    // SAFETY: a zeroed sigaction with SIG_IGN is valid.
    let mut ignore: libc::sigaction = unsafe { std::mem::zeroed() };
    ignore.sa_sigaction = libc::SIG_IGN;
    // SAFETY: `ignore` is a live sigaction.
    unsafe {
        libc::sigaction(libc::SIGPROF, &ignore, std::ptr::null_mut());
    }
    started
}

extern "C" fn on_sigprof(_: libc::c_int, _: *mut libc::siginfo_t, context: *mut libc::c_void) {
    RUNNING.fetch_add(1, Ordering::SeqCst);
    let slots = SLOTS.load(Ordering::SeqCst);
    if !slots.is_null() {
        let index = CLAIMED.fetch_add(1, Ordering::SeqCst);
        if index < CAPACITY.load(Ordering::SeqCst) {
            // SAFETY: the slot is inside the buffer, which lives until RUNNING drops to 0, and
            // the atomic counter gave it to this handler alone.
            let slot = unsafe {
                std::slice::from_raw_parts_mut(slots.add(index * SLOT_WORDS), SLOT_WORDS)
            };
            record(slot, interrupted_at(context));
        }
    }
    RUNNING.fetch_sub(1, Ordering::SeqCst);
}

/// Writes the calling thread's id and stack, from the interrupted frame outwards, into `slot`
/// (see [`SLOT_WORDS`]).
fn record(slot: &mut [u64], pc: Option<u64>) {
    let (header, addresses) = slot.split_at_mut(1);
    let mut depth = 0;
    if pc.is_none_or(|pc| !blocked(pc)) {
        // The handler's own frames come first: recording starts at the interrupted one (or at
        // once where the context tells no program counter).
        let mut found = pc.is_none();
        // SAFETY: the unwinder is what the `pprof` crate and others call from SIGPROF handlers;
        // code that holds its locks (see BLOCKED) is not unwound from.
        unsafe {
            backtrace::trace_unsynchronized(|frame| {
                let ip = frame.ip() as u64;
                // The outermost frame's caller.
                if ip == 0 {
                    return false;
                }
                found |= Some(ip) == pc;
                if found {
                    addresses[depth] = ip;
                    depth += 1;
                }
                depth < MAX_DEPTH
            });
        }
    }
    if depth == 0 {
        if let Some(pc) = pc {
            addresses[0] = pc;
            depth = 1;
        }
    }
    // SAFETY: gettid has no preconditions and is async-signal-safe.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    header[0] = u64::from(tid) | (depth as u64) << 32;
}

fn blocked(pc: u64) -> bool {
    let ranges = BLOCKED.load(Ordering::SeqCst);
    if ranges.is_null() {
        return false;
    }
    // SAFETY: the caller of `sample` keeps the ranges alive while handlers may run.
    let ranges = unsafe { std::slice::from_raw_parts(ranges, BLOCKED_LEN.load(Ordering::SeqCst)) };
    ranges
        .iter()
        .any(|&(start, end)| (start..end).contains(&pc))
}

/// The program counter of the interrupted code, from the signal's context.
fn interrupted_at(context: *mut libc::c_void) -> Option<u64> {
    if context.is_null() {
        return None;
    }
    let context = context as *const libc::ucontext_t;
    // SAFETY: the kernel passes a ucontext_t to SA_SIGINFO handlers.
    #[cfg(target_arch = "x86_64")]
    return Some(unsafe { (*context).uc_mcontext.gregs[libc::REG_RIP as usize] as u64 });
    // SAFETY: as above.
    #[cfg(target_arch = "aarch64")]
    return Some(unsafe { (*context).uc_mcontext.pc });
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    None
}
