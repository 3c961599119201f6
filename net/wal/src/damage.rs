//! What a start does with files it finds damaged. Nothing is deleted: a file that cannot be
//! trusted is moved into a new folder `damaged-<UTC time>` of the data directory, out of the
//! sight of recovery, of the relays and of the snapshot retention, for an operator to look at
//! or restore. Two cases move files:
//! - a snapshot that does not load while an older snapshot and the WAL after it recover the
//!   state: left in place, it would be the file sent to replicas that join, and it would count
//!   as a kept snapshot, so the retention would remove the good one it replaced;
//! - a replica (`--replica-of`, or any node of an etcd cluster) whose log cannot be recovered
//!   whole: it moves every segment and snapshot aside, starts empty and copies its primary
//!   again, as a Kafka follower truncates at the first bad record and fetches the rest from
//!   its leader: a peer holds what the damage took, so nothing is served from a log with a
//!   hole in it, and nobody has to run `--force-recovery` by hand.

use std::time::{SystemTime, UNIX_EPOCH};

use super::format::{INPROGRESS_SUFFIX, SNAP_SUFFIX, WAL_SUFFIX};
use super::recovery::{self, Recovered};
use super::storage::Storage;
use super::WalError;

/// A replica's log set aside at start, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetAside {
    /// The folder in the data directory that holds the files now.
    pub folder: String,
    pub files: Vec<String>,
    /// The damage found, as the refusal of a start would have said it.
    pub cause: String,
}

/// Folders tried for one move when earlier ones exist (several moves within a second).
const FOLDER_ATTEMPTS: u32 = 100;

/// `damaged-20261128T170935Z`: the UTC time of the move, so folders sort by it.
pub fn folder_name(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    let (hh, mm, ss) = (rest / 3600, rest % 3600 / 60, rest % 60);
    format!("damaged-{y:04}{m:02}{d:02}T{hh:02}{mm:02}{ss:02}Z")
}

/// The proleptic Gregorian date of a day count from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`): a folder name needs no calendar crate.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Moves `names` into a new `damaged-<time>` folder (`-2`, `-3`, ... after it when that
/// exists); the folder's name.
pub(crate) fn set_aside(storage: &dyn Storage, names: &[String]) -> Result<String, WalError> {
    let base = folder_name(SystemTime::now());
    for n in 1..=FOLDER_ATTEMPTS {
        let folder = if n == 1 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        match storage.set_aside(names, &folder) {
            Ok(()) => return Ok(folder),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(WalError::io(
                    format!("moving {} into {folder}", names.join(", ")),
                    e,
                ))
            }
        }
    }
    Err(WalError::io(
        format!("moving {} aside", names.join(", ")),
        std::io::ErrorKind::AlreadyExists.into(),
    ))
}

/// Whether a failed recovery failed on damage (a replica may then start over from its
/// primary), not on a file of another version, a busy directory or an I/O error.
pub(crate) fn is_damage(e: &WalError) -> bool {
    matches!(
        e,
        WalError::Corrupt { .. } | WalError::SnapshotsDamaged { .. }
    )
}

/// A replica whose log is damaged: every segment and snapshot goes aside and recovery starts
/// from the empty directory; the report says where the files went. The primary's stream
/// fills it again (a join when the primary no longer has its whole log).
pub(crate) fn start_over(storage: &dyn Storage, damage: WalError) -> Result<Recovered, WalError> {
    let names: Vec<String> = storage
        .list()
        .map_err(|e| WalError::io("listing the data directory", e))?
        .into_iter()
        .filter(|n| {
            n.ends_with(WAL_SUFFIX) || n.ends_with(SNAP_SUFFIX) || n.ends_with(INPROGRESS_SUFFIX)
        })
        .collect();
    let folder = set_aside(storage, &names)?;
    let cause = damage.to_string();
    tracing::error!(
        damage = %cause,
        folder = %folder,
        files = names.len(),
        "this replica's log is damaged: moved it aside and copying the primary again"
    );
    // A replica keeps taken tasks taken (there are none yet): its primary's records say.
    let mut rec = recovery::recover(storage, false, true)?;
    rec.report.set_aside = Some(SetAside {
        folder,
        files: names,
        cause,
    });
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_folder_is_named_by_the_utc_time() {
        let at = |secs| UNIX_EPOCH + Duration::from_secs(secs);
        assert_eq!(folder_name(at(0)), "damaged-19700101T000000Z");
        // 2024-02-29 23:59:59, a leap day.
        assert_eq!(folder_name(at(1_709_251_199)), "damaged-20240229T235959Z");
        assert_eq!(folder_name(at(1_764_349_775)), "damaged-20251128T170935Z");
    }
}
