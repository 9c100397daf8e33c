//! The startup grace: how long a process runs before sessions that enable its EventSources
//! start (`--startup-grace`).

use std::future::Future;
use std::time::Duration;

use collector::local::LocalProcess;
use tokio::time::Instant;

/// When sessions that enable a process's EventSources may start: once it has run the grace, by
/// its start time in `/proc` (unknown: from now; a runtime in listen mode connects as it
/// starts). Enabling an EventSource runs its callback in the process under `EventListener`'s
/// lock, which on .NET 8 to 10 can deadlock against the app's own first use of the thread pool,
/// a timer or `ArrayPool` while it starts (dotnet/runtime#105682, #118014, #119014).
#[derive(Debug, Clone, Copy)]
pub struct StartupGrace {
    ends: Instant,
}

impl StartupGrace {
    pub fn of(local: Option<&LocalProcess>, grace: Duration) -> StartupGrace {
        let age = local.and_then(LocalProcess::age).unwrap_or_default();
        StartupGrace {
            ends: Instant::now() + grace.saturating_sub(age),
        }
    }

    /// How long the process has still to run before the grace ends.
    pub fn remaining(&self) -> Duration {
        self.ends.saturating_duration_since(Instant::now())
    }

    /// Waits until the grace ends: true then, false if `stop` resolved first.
    pub async fn wait_or(self, stop: impl Future<Output = ()>) -> bool {
        tokio::select! {
            () = tokio::time::sleep_until(self.ends) => true,
            () = stop => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_grace_ends_after_its_time_unless_stopped_first() {
        let time = Duration::from_millis(300);
        let grace = StartupGrace::of(None, time);
        assert!(grace.remaining() <= time);
        assert!(grace.wait_or(std::future::pending()).await);
        assert_eq!(grace.remaining(), Duration::ZERO, "it waited until the end");

        let grace = StartupGrace::of(None, Duration::from_secs(600));
        let stop = tokio::time::sleep(Duration::from_millis(50));
        assert!(!grace.wait_or(stop).await);
        assert!(
            grace.remaining() > Duration::from_secs(300),
            "the stop cut the wait short"
        );
        // Ended already: no wait.
        let grace = StartupGrace::of(None, Duration::ZERO);
        assert!(grace.wait_or(std::future::pending()).await);
    }
}
