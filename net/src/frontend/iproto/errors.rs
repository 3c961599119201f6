//! The IPROTO front-end's wording of refusals: the error code and text each API's client gets
//! for each [`Refusal`], and for the engine's [`QueueError`]s a table by [`Style`]. Clients
//! match these texts (as substrings, in scripts and drivers), so they are byte for byte what
//! the seed queue and tarantool/queue 1.5.0 send, or tarq's own where the original has no such
//! error; `docs/seed-api.md` and `docs/tubes.md` list them. The engine's texts, which say what
//! happened in its own words, never reach the wire. The original's quirks live here too: the
//! tube API answers every ack, release or touch of a task the caller does not hold with the one
//! `Task was not taken` (tarantool/queue looks in its taken table only, whatever the reason),
//! and names a task it cannot find by its number in the tube, as the caller gave it. The core's
//! own refusals are worded here too: a replica's is the stable `read-only replica: the primary
//! is ADDR` that clients parse to find the primary (`tarq_client`'s `primary_in`).

use tarq_engine::{number_from, Hold, QueueError, TubeIx};
use tarq_iproto::codes::{ER_NO_SUCH_PROC, ER_OUTCOME_UNKNOWN, ER_PROC_LUA, ER_READONLY};
use tarq_iproto::response;

use super::calls::{self, CallError};
use super::{Reply, Style};
use crate::core::parked::MAX_PARKED_PER_CONN;
use crate::core::Refusal;

/// Writes the error reply to `r` that refuses with `e`.
pub(super) fn error(out: &mut Vec<u8>, r: Reply, e: &Refusal) {
    let (code, text) = wording(r, e);
    response::error(out, r.sync, code, &text);
}

/// The code and text of the error reply to `r` that refuses with `e`.
fn wording(r: Reply, e: &Refusal) -> (u32, String) {
    match e {
        Refusal::Queue(e) => (ER_PROC_LUA, text(r.style, r.tube, r.first, e)),
        // A server without a WAL has no snapshot call at all, as Tarantool would have none.
        Refusal::NoSnapshots => {
            let missing = CallError::NoSuchProc(calls::SNAPSHOT.to_string());
            (ER_NO_SUCH_PROC, missing.to_string())
        }
        Refusal::ReadOnly(_) | Refusal::NoPrimary(_) => (ER_READONLY, refusal_text(e)),
        Refusal::Unknown(_) => (ER_OUTCOME_UNKNOWN, refusal_text(e)),
        Refusal::Journal(_)
        | Refusal::TooManyParked
        | Refusal::Consumers
        | Refusal::Shards(_)
        | Refusal::User(_) => (ER_PROC_LUA, refusal_text(e)),
    }
}

/// What an IPROTO client reads for a refusal of the core's own.
pub fn refusal_text(e: &Refusal) -> String {
    match e {
        Refusal::ReadOnly(primary) => format!("read-only replica: the primary is {primary}"),
        Refusal::NoPrimary(why) => format!("read-only replica: no primary now: {why}"),
        Refusal::Journal(why) | Refusal::Shards(why) | Refusal::User(why) => why.clone(),
        Refusal::TooManyParked => {
            format!("Too many waiting takes on this connection: the limit is {MAX_PARKED_PER_CONN}")
        }
        // The original's words.
        Refusal::Consumers => "There are consumers connected the tube".to_owned(),
        Refusal::Queue(_) | Refusal::NoSnapshots | Refusal::Unknown(_) => e.to_string(),
    }
}

/// The text a client of `style` reads for `e`. A task the tube API does not find is named by
/// its number in `tube`, which numbers from `first` ([`Reply::first`]).
pub(crate) fn text(style: Style, tube: TubeIx, first: u64, e: &QueueError) -> String {
    use QueueError as E;
    // Only the seed's own calls are worded as the seed's; an EVAL and a batch item are the
    // tube API's.
    let seed = style == Style::Seed;
    match e {
        // The seed says which of the three it was...
        E::NotHeld {
            id,
            hold: Hold::NoTask,
            ..
        } if seed => format!("Task {{{id}}} was not found"),
        E::NotHeld {
            id,
            hold: Hold::Untaken(_),
            ..
        } if seed => format!("Task {id} not taken by anybody"),
        E::NotHeld {
            id,
            caller,
            hold: Hold::TakenBy(owner),
        } if seed => format!("Task {id} taken by {owner}. Not you ({caller})"),
        // ...the original one thing for all of them.
        E::NotHeld { .. } => "Task was not taken".to_owned(),
        E::NotInTube { id, .. } => format!("Task {} not found", number_from(tube, first, *id)),
        E::UnknownTubeType(kind) => format!("Unknown tube type {kind}"),
        E::TubeExists(name) => format!("Space '{name}' already exists"),
        E::TubeNotFound(_) => "Tube not found".to_owned(),
        E::TubeHasTaken(_) => "There are taken tasks in the tube".to_owned(),
        E::DefaultTubeUndroppable => "The tube 'default' cannot be dropped".to_owned(),
        E::TubeFull { name, capacity } => format!("Tube '{name}' is full: {capacity} tasks"),
        E::BadTubeName { len, max } => {
            format!("Tube name of {len} bytes: the limit is {max} (and it may not be empty)")
        }
        E::TooManyTasks { max } => format!("Too many tasks: the queue holds {max}, its limit"),
        E::TooManyTubes { max } => format!("Too many tubes: the limit is {max}"),
        E::UtubeKeyTooLong { len, max } => format!("Utube key of {len} bytes: the limit is {max}"),
        E::DedupKeyTooLong { len, max } => format!("Dedup key of {len} bytes: the limit is {max}"),
        E::TouchUnsupported(kind) => format!("{kind} queue does not support touch"),
        E::TubeNumbersSpent { name } => {
            format!("Tube '{name}' has given out every task id it has (2^41); create another tube")
        }
        // Refusals of no IPROTO call (beanstalk's calls by id, recovery): the engine's words.
        E::NotFound(_)
        | E::NotKickable { .. }
        | E::NotTakeable { .. }
        | E::RestoreOrderLength { .. }
        | E::RestoreOrderOrdinal { .. }
        | E::Duplicate(_)
        | E::IdNotOfTube { .. }
        | E::TubeNumbering { .. } => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use tarq_engine::{task_id, Status, TubeType};

    use super::*;

    /// Fails unless a client of `style` reads `want` for `e` (a call naming tube 2, which
    /// numbers from 0).
    fn check(style: Style, e: QueueError, want: &str) {
        assert_eq!(text(style, 2, 0, &e), want, "{style:?}, {e:?}");
    }

    fn not_held(id: u64, caller: u64, hold: Hold) -> QueueError {
        QueueError::NotHeld { id, caller, hold }
    }

    #[test]
    fn the_seed_says_why_a_task_is_not_held() {
        let s = Style::Seed;
        check(s, not_held(5, 8, Hold::NoTask), "Task {5} was not found");
        let ready = Hold::Untaken(Status::Ready);
        check(s, not_held(1, 8, ready), "Task 1 not taken by anybody");
        let other = Hold::TakenBy(7);
        check(s, not_held(1, 8, other), "Task 1 taken by 7. Not you (8)");
    }

    #[test]
    fn the_tube_api_says_not_taken_whatever_the_reason() {
        for style in [Style::Tube, Style::Silent, Style::Item] {
            for hold in [Hold::NoTask, Hold::Untaken(Status::Ready), Hold::TakenBy(7)] {
                check(style, not_held(1, 8, hold), "Task was not taken");
            }
        }
    }

    #[test]
    fn the_tube_api_names_a_missing_task_as_its_caller_did() {
        let t = Style::Tube;
        let e = |id| QueueError::NotInTube { id, tube: 2 };
        check(t, e(task_id(2, 9)), "Task 9 not found");
        // An id the tube did not number (another tube's, or an old whole id): whole.
        check(
            t,
            e(task_id(3, 9)),
            &format!("Task {} not found", task_id(3, 9)),
        );
        check(t, e(99), "Task 99 not found");
        // Counted from the tube's first number.
        let from_5 = text(t, 2, 5, &e(task_id(2, 9)));
        assert_eq!(from_5, "Task 4 not found");
    }

    #[test]
    fn the_tube_api_keeps_the_originals_and_tarqs_texts() {
        let t = Style::Tube;
        let cases = [
            (
                QueueError::UnknownTubeType("lifo".into()),
                "Unknown tube type lifo",
            ),
            (
                QueueError::TubeExists("q".into()),
                "Space 'q' already exists",
            ),
            (QueueError::TubeNotFound(9), "Tube not found"),
            (
                QueueError::TubeHasTaken(1),
                "There are taken tasks in the tube",
            ),
            (
                QueueError::DefaultTubeUndroppable,
                "The tube 'default' cannot be dropped",
            ),
            (
                QueueError::TubeFull {
                    name: "lim".into(),
                    capacity: 2,
                },
                "Tube 'lim' is full: 2 tasks",
            ),
            (
                QueueError::BadTubeName { len: 0, max: 200 },
                "Tube name of 0 bytes: the limit is 200 (and it may not be empty)",
            ),
            (
                QueueError::TooManyTubes { max: 4096 },
                "Too many tubes: the limit is 4096",
            ),
            (
                QueueError::UtubeKeyTooLong { len: 257, max: 256 },
                "Utube key of 257 bytes: the limit is 256",
            ),
            (
                QueueError::DedupKeyTooLong { len: 257, max: 256 },
                "Dedup key of 257 bytes: the limit is 256",
            ),
            (
                QueueError::TouchUnsupported(TubeType::Fifo),
                "fifo queue does not support touch",
            ),
        ];
        for (e, want) in cases {
            check(t, e, want);
        }
    }

    #[test]
    fn limits_read_the_same_in_both_apis() {
        for style in [Style::Seed, Style::Tube] {
            check(
                style,
                QueueError::TooManyTasks { max: 3 },
                "Too many tasks: the queue holds 3, its limit",
            );
            check(
                style,
                QueueError::TubeNumbersSpent { name: "q".into() },
                "Tube 'q' has given out every task id it has (2^41); create another tube",
            );
        }
    }
}
