//! How long a process must run before the agent enables its EventSources: enabling one runs its
//! callback in the process under `EventListener`'s lock, which on some runtimes deadlocks against
//! the app's own first use of the thread pool, a timer or `ArrayPool` while it starts. Measured
//! per version by `tests/suite/startup.rs` (docs/runtimes.md, "Startup hang").

use std::time::Duration;

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

/// The major version of a product version; `None` when it does not start with one.
fn major(product_version: &str) -> Option<u32> {
    product_version.split('.').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_goes_by_the_runtimes_major_version() {
        assert_eq!(startup_grace("8.0.31"), HANGING_GRACE);
        assert_eq!(startup_grace("10.0.12+4c8a4d9c"), HANGING_GRACE);
        assert_eq!(startup_grace("11.0.0"), Duration::ZERO);
        assert_eq!(startup_grace(""), HANGING_GRACE);
        assert_eq!(startup_grace("garbage"), HANGING_GRACE);
    }
}
