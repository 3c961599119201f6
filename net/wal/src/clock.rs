//! Where the WAL reads the time: the retry of a failed disk waits `RETRY_INTERVAL` on this
//! clock, and a snapshot's duration is measured on it. The server uses [`SystemClock`]; tests
//! use [`ManualClock`] and move time themselves, so they neither sleep nor race. Waits for the
//! WAL's own threads (`flush`, `close`) are real time, since real threads do the work.

#[cfg(feature = "test-storage")]
use std::sync::{Arc, Mutex};
#[cfg(feature = "test-storage")]
use std::time::Duration;
use std::time::Instant;

/// A monotonic clock.
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
}

/// `Instant::now()`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that stands still until [`ManualClock::advance`] moves it; clones share the time.
#[cfg(feature = "test-storage")]
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<Instant>>);

#[cfg(feature = "test-storage")]
impl ManualClock {
    pub fn new() -> Self {
        ManualClock(Arc::new(Mutex::new(Instant::now())))
    }

    pub fn advance(&self, by: Duration) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) += by;
    }
}

#[cfg(feature = "test-storage")]
impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "test-storage")]
impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
