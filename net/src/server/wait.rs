//! The loop's wait for readiness: one `epoll_wait` with the turn's timeout, or, with
//! `--busy-poll`, non-blocking polls first for up to that long. A request that arrives while
//! the loop spins is served without the wake-up a sleeping thread pays (tens of µs on a VM
//! against a few for a poll that finds it); one that does not arrive in time finds the loop
//! asleep as before. The loop decides how long it may wait; this file only decides how.

use std::io;
use std::time::{Duration, Instant};

use mio::{Events, Poll};

/// Waits for events on `poll` until `timeout` (`None`: until one comes). When the wait would
/// block and `busy` is not zero, polls without blocking until an event comes or `busy` (at
/// most `timeout`) has passed, then blocks for what is left of `timeout`. Spinning is
/// `epoll_wait` with a zero timeout, a system call each time: readiness of a socket cannot be
/// seen from user space without one.
pub(super) fn wait(
    poll: &mut Poll,
    events: &mut Events,
    timeout: Option<Duration>,
    busy: Duration,
) -> io::Result<()> {
    if busy.is_zero() || timeout == Some(Duration::ZERO) {
        return poll.poll(events, timeout);
    }
    let spin = timeout.map_or(busy, |t| t.min(busy));
    let start = Instant::now();
    loop {
        poll.poll(events, Some(Duration::ZERO))?;
        if !events.is_empty() {
            return Ok(());
        }
        let spent = start.elapsed();
        if spent >= spin {
            return poll.poll(events, timeout.map(|t| t.saturating_sub(spent)));
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Token, Waker};

    fn poll_and_waker() -> (Poll, Waker) {
        let poll = Poll::new().unwrap();
        let waker = Waker::new(poll.registry(), Token(7)).unwrap();
        (poll, waker)
    }

    #[test]
    fn an_event_pending_before_the_spin_is_returned_by_it() {
        let (mut poll, waker) = poll_and_waker();
        let mut events = Events::with_capacity(8);
        waker.wake().unwrap();
        // No timeout at all: only an event can end this wait.
        wait(&mut poll, &mut events, None, Duration::from_secs(1)).unwrap();
        assert_eq!(
            events.iter().map(|e| e.token()).collect::<Vec<_>>(),
            [Token(7)]
        );
    }

    #[test]
    fn an_event_during_the_spin_ends_it_and_one_after_it_wakes_the_sleep() {
        let (mut poll, waker) = poll_and_waker();
        let waker = std::sync::Arc::new(waker);
        let mut events = Events::with_capacity(8);
        for busy in [Duration::from_secs(30), Duration::from_micros(1)] {
            let w = waker.clone();
            let from = std::thread::spawn(move || w.wake().unwrap());
            // Without a timeout and with a spin longer than any test: the wake ends it,
            // whether it comes while spinning or while asleep.
            wait(&mut poll, &mut events, None, busy).unwrap();
            assert_eq!(events.iter().count(), 1, "busy {busy:?}");
            from.join().unwrap();
        }
    }

    #[test]
    fn the_spin_never_outlasts_the_timeout() {
        let (mut poll, _waker) = poll_and_waker();
        let mut events = Events::with_capacity(8);
        let start = Instant::now();
        // A spin of an hour under a timeout of 1 ms: the timeout wins.
        wait(
            &mut poll,
            &mut events,
            Some(Duration::from_millis(1)),
            Duration::from_secs(3600),
        )
        .unwrap();
        assert!(events.is_empty());
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{:?}",
            start.elapsed()
        );
    }
}
