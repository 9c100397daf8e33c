//! One grid of instants that a node agent's periodic work falls on: sampling windows that open
//! and close, windows named after them, and long-lived sessions' streams, read in batches
//! ([`park`]). Work due at nearby times then wakes the agent once rather than once each, which
//! matters when one agent serves a hundred processes.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The grid's step. The default duty cycle's period and window are multiples of it, so a
/// sampling loop stays on it once there.
pub const STEP: Duration = Duration::from_millis(250);

/// Where the grid starts: the first time anything asks.
static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);

/// The last instant of the grid at or before `at`.
pub fn floor(at: Instant) -> Instant {
    let origin = *ORIGIN;
    if at <= origin {
        return at;
    }
    let step = STEP.as_nanos();
    let steps = (at - origin).as_nanos() / step;
    origin + Duration::from_nanos(u64::try_from(steps * step).unwrap_or(u64::MAX))
}

/// The first instant of the grid at or after `at`.
pub fn ceil(at: Instant) -> Instant {
    let floor = floor(at);
    if floor < at {
        floor + STEP
    } else {
        floor
    }
}

/// Sleeps at least `delay`, until the next instant of the grid.
pub async fn sleep(delay: Duration) {
    tokio::time::sleep_until(ceil(Instant::now() + delay)).await;
}

/// Streams parked out of the async runtime's reactor, which would wake the agent for every
/// chunk that arrives on a stream it watches, whether or not a task waits for it. Parked streams
/// are watched by a readiness set of their own, on a thread of their own: once one is readable,
/// the thread waits for the next step of the grid, then wakes the readers of every stream
/// readable by then, together.
struct Parking {
    registry: Registry,
    readers: Mutex<HashMap<Token, (RawFd, Arc<Notify>)>>,
    next_token: AtomicUsize,
}

/// Readiness reports taken at once; more are taken in further rounds of the same step.
const EVENTS_AT_ONCE: usize = 256;

static PARKING: LazyLock<std::io::Result<Parking>> = LazyLock::new(|| {
    let poll = Poll::new()?;
    let registry = poll.registry().try_clone()?;
    std::thread::Builder::new()
        .name("clrscope-grid".to_string())
        .spawn(move || watch_parked(poll))?;
    Ok(Parking {
        registry,
        readers: Mutex::new(HashMap::new()),
        next_token: AtomicUsize::new(0),
    })
});

/// Parks `stream` until the returned [`Parked`] is dropped; its reader waits in
/// [`Parked::readable`], and reads the stream dry each time (readiness is reported once per
/// arrival).
pub fn park(stream: &UnixStream) -> std::io::Result<Parked> {
    let parking = PARKING
        .as_ref()
        .map_err(|error| std::io::Error::new(error.kind(), error.to_string()))?;
    let fd = stream.as_raw_fd();
    let notify = Arc::new(Notify::new());
    let token = Token(parking.next_token.fetch_add(1, Ordering::Relaxed));
    readers(parking).insert(token, (fd, notify.clone()));
    if let Err(error) = parking
        .registry
        .register(&mut SourceFd(&fd), token, Interest::READABLE)
    {
        readers(parking).remove(&token);
        return Err(error);
    }
    Ok(Parked { token, notify })
}

fn readers(parking: &Parking) -> std::sync::MutexGuard<'_, HashMap<Token, (RawFd, Arc<Notify>)>> {
    parking
        .readers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// A parked stream. Dropped before the stream is closed or handed back to the reactor.
#[derive(Debug)]
pub struct Parked {
    token: Token,
    notify: Arc<Notify>,
}

impl Parked {
    /// Resolves at the first step of the grid at which the stream is readable, or at once when
    /// it became readable since the last call.
    pub async fn readable(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        if let Ok(parking) = PARKING.as_ref() {
            if let Some((fd, _)) = readers(parking).remove(&self.token) {
                let _ = parking.registry.deregister(&mut SourceFd(&fd));
            }
        }
    }
}

/// The parking thread: blocks until a parked stream is readable, waits for the next step of
/// the grid, and wakes the readers of the streams readable by then.
fn watch_parked(mut poll: Poll) {
    let mut events = Events::with_capacity(EVENTS_AT_ONCE);
    let mut ready = Vec::new();
    loop {
        if let Err(error) = poll.poll(&mut events, None) {
            if error.kind() != std::io::ErrorKind::Interrupted {
                tracing::warn!(%error, "watching parked streams failed; trying again in a step");
                std::thread::sleep(STEP);
            }
            continue;
        }
        ready.extend(events.iter().map(|event| event.token()));
        let now = Instant::now();
        std::thread::sleep(ceil(now) - now);
        // Rounds until one reports less than a full batch: what became readable meanwhile.
        loop {
            if poll.poll(&mut events, Some(Duration::ZERO)).is_err() {
                break;
            }
            ready.extend(events.iter().map(|event| event.token()));
            if events.iter().count() < EVENTS_AT_ONCE {
                break;
            }
        }
        if let Ok(parking) = PARKING.as_ref() {
            let readers = readers(parking);
            for token in ready.drain(..) {
                if let Some((_, notify)) = readers.get(&token) {
                    notify.notify_one();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_fall_on_one_grid() {
        let now = Instant::now();
        let later = now + Duration::from_millis(1_234);
        for at in [now, later, later + STEP * 7] {
            let (floor, ceil) = (floor(at), ceil(at));
            assert!(floor <= at && at <= ceil, "{floor:?} {at:?} {ceil:?}");
            assert!(at - floor < STEP && ceil - at < STEP);
            assert!(ceil == floor || ceil - floor == STEP);
            // On the grid already: stays.
            assert_eq!((super::floor(floor), super::ceil(floor)), (floor, floor));
        }
        // Instants asked for by different loops fall on the same grid.
        let (a, b) = (ceil(later), ceil(later + Duration::from_millis(1)));
        let apart = b.max(a) - b.min(a);
        assert!(apart.is_zero() || apart == STEP, "{apart:?}");
        assert_eq!(
            floor(a + Duration::from_secs(10)),
            a + Duration::from_secs(10)
        );
    }

    /// Reads what is readable now, without blocking.
    fn read_dry(stream: &UnixStream) -> Vec<u8> {
        let mut read = Vec::new();
        let mut buf = [0u8; 64];
        loop {
            match std::io::Read::read(&mut &*stream, &mut buf) {
                Ok(0) => return read,
                Ok(n) => read.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return read,
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[tokio::test]
    async fn a_parked_stream_wakes_its_reader_on_the_grid_once_per_arrival() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let parked = park(&ours).unwrap();
        let nothing_yet = tokio::time::timeout(STEP * 3, parked.readable()).await;
        assert!(nothing_yet.is_err(), "woken with nothing to read");

        std::io::Write::write_all(&mut &theirs, b"first").unwrap();
        let woken = tokio::time::timeout(Duration::from_secs(30), parked.readable()).await;
        assert!(woken.is_ok(), "not woken for what arrived");
        assert_eq!(read_dry(&ours), b"first");
        // Read dry, it is not woken again until more arrives ...
        let again = tokio::time::timeout(STEP * 3, parked.readable()).await;
        assert!(again.is_err(), "woken again with nothing new");
        // ... and then it is, also for the end of the stream.
        std::io::Write::write_all(&mut &theirs, b"second").unwrap();
        drop(theirs);
        tokio::time::timeout(Duration::from_secs(30), parked.readable())
            .await
            .expect("woken for the second chunk and the end");
        assert_eq!(read_dry(&ours), b"second");
        let token = parked.token;
        drop(parked);
        let parking = PARKING.as_ref().unwrap();
        assert!(
            !readers(parking).contains_key(&token),
            "a dropped stream is no longer watched"
        );
    }
}
