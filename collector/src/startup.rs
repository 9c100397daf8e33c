//! How long a process must run before the agent enables its EventSources: enabling one runs its
//! callback in the process under `EventListener`'s lock, which on some runtimes deadlocks against
//! the app's own first use of the thread pool, a timer or `ArrayPool` while it starts. Measured
//! per version by `tests/suite/startup.rs` (docs/runtimes.md, "Startup hang").

use std::time::Duration;

use tokio::sync::mpsc;

/// The grace of runtimes known to hang (and of any whose version does not parse).
pub const HANGING_GRACE: Duration = Duration::from_secs(30);

/// The startup grace for a runtime by its product version (ProcessInfo's
/// `clr_product_version`, e.g. `8.0.31` or `10.0.12+abc`): zero where enabling the agent's
/// EventSources at startup was not seen to hang, [`HANGING_GRACE`] where it hangs.
pub fn startup_grace(product_version: &str) -> Duration {
    match major(product_version) {
        Some(major) if major >= 11 => Duration::ZERO,
        _ => HANGING_GRACE,
    }
}

/// Whether the agent starts the sessions a rule or linkage needs while a runtime waits in listen
/// mode, before it resumes it: enabling an EventSource before any managed code runs finds none of
/// the app's threads to deadlock with. Measured per version by
/// `startup::enabling_eventsources_before_the_resume` (docs/runtimes.md, "Startup hang").
pub fn sessions_before_resume(product_version: &str) -> bool {
    major(product_version).is_some()
}

/// What a runtime waiting in listen mode waits for before it is resumed: one [`ResumeHold`] per
/// session that must be enabled first (dotnet-monitor resumes a runtime once its startup rules'
/// actions have started, so that their traces see the process from its first managed code).
#[derive(Debug)]
pub struct ResumeHolds {
    /// Cloned into each hold; dropped by [`ResumeHolds::released`], so that the receiver ends
    /// once every hold is gone.
    sender: Option<mpsc::Sender<()>>,
    receiver: mpsc::Receiver<()>,
}

/// One session the resume waits for: released when dropped (its session enabled, failed to
/// start, or was never started).
#[derive(Debug)]
pub struct ResumeHold {
    _open: mpsc::Sender<()>,
}

impl ResumeHold {
    /// The session is enabled (or will not be): the resume need not wait for it.
    pub fn release(self) {}
}

impl Default for ResumeHolds {
    fn default() -> Self {
        let (sender, receiver) = mpsc::channel(1);
        ResumeHolds {
            sender: Some(sender),
            receiver,
        }
    }
}

impl ResumeHolds {
    /// A hold for one more session.
    pub fn hold(&self) -> Option<ResumeHold> {
        self.sender.clone().map(|open| ResumeHold { _open: open })
    }

    /// Waits until every hold is released, or `timeout`: true if all were.
    pub async fn released(mut self, timeout: Duration) -> bool {
        drop(self.sender.take());
        tokio::time::timeout(timeout, self.receiver.recv())
            .await
            .is_ok()
    }
}

/// The major version of a product version; `None` when it does not start with one.
fn major(product_version: &str) -> Option<u32> {
    product_version.split('.').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_resume_waits_for_every_hold() {
        let holds = ResumeHolds::default();
        let (first, second) = (holds.hold().unwrap(), holds.hold().unwrap());
        let released = tokio::spawn(holds.released(Duration::from_secs(30)));
        first.release();
        tokio::task::yield_now().await;
        assert!(!released.is_finished(), "one hold is still held");
        drop(second);
        assert!(released.await.unwrap());

        let holds = ResumeHolds::default();
        let _held = holds.hold().unwrap();
        assert!(
            !holds.released(Duration::from_millis(50)).await,
            "timed out"
        );
        assert!(ResumeHolds::default().released(Duration::ZERO).await);
    }

    #[test]
    fn the_grace_goes_by_the_runtimes_major_version() {
        assert_eq!(startup_grace("8.0.31"), HANGING_GRACE);
        assert_eq!(startup_grace("10.0.12+4c8a4d9c"), HANGING_GRACE);
        assert_eq!(startup_grace("11.0.0"), Duration::ZERO);
        assert_eq!(startup_grace(""), HANGING_GRACE);
        assert_eq!(startup_grace("garbage"), HANGING_GRACE);
    }
}
