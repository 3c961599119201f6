//! The record format under random and boundary input: every task, tube and dedup key encodes
//! and decodes to itself; sizes at each limit (payload at `MAX_PAYLOAD_BYTES` and one over,
//! record body at `MAX_RECORD_BODY` and one over, utube key at u16::MAX and one over) are
//! accepted or refused with a typed error, never a panic; damaged or cut records are refused
//! by the decoder, never a panic.

use proptest::prelude::*;
use tarq_engine::{
    JobCounts, RestoredTask, Status, TaskRef, TubeInfo, TubeNumbers, TubeOptions, TubeType,
};
use tarq_wal::format::{self, Change, Frame, Kind, MAX_PAYLOAD_BYTES, MAX_RECORD_BODY};
use tarq_wal::{check_payload, TooLarge};

fn status(i: u8) -> Status {
    [
        Status::Ready,
        Status::Taken,
        Status::Waiting,
        Status::Buried,
    ][i as usize % 4]
}

#[allow(clippy::type_complexity)]
fn task_parts() -> impl Strategy<
    Value = (
        (u64, u8, u64, i64),
        (Option<u64>, Option<u64>, u64, u16, u16),
        Option<Vec<u8>>,
        Vec<u8>,
    ),
> {
    (
        (any::<u64>(), 0u8..4, any::<u64>(), any::<i64>()),
        (
            any::<Option<u64>>(),
            any::<Option<u64>>(),
            any::<u64>(),
            any::<u16>(),
            any::<u16>(),
        ),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..=300)),
        proptest::collection::vec(any::<u8>(), 0..2048),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_task_record_decodes_to_the_task(
        parts in task_parts(),
        replace in any::<bool>(),
        c in (0u16..3, 0u16..3, any::<u16>(), any::<u16>()),
    ) {
        let ((id, st, runat, pri), (ttl, ttr, created, tube, deliveries), utube, data) = parts;
        let counts = JobCounts { releases: c.0, buries: c.1, kicks: c.2, timeouts: c.3 };
        let t = TaskRef {
            id,
            status: status(st),
            runat,
            pri,
            ttl,
            ttr,
            created,
            owner: None,
            data: &data,
            tube,
            deliveries,
            utube: utube.as_deref(),
            counts,
        };
        let kind = if replace { Kind::Replace } else { Kind::Put };
        let mut buf = Vec::new();
        let at = format::begin_record(&mut buf, 7, kind);
        format::encode_task(&mut buf, &t).expect("fits");
        prop_assert_eq!(buf.len() - at - 24, format::task_len(&t));
        format::end_record(&mut buf, at).expect("fits");
        let rec = format::parse_record(&buf, 0).expect("valid");
        prop_assert_eq!(rec.end, buf.len());
        let stored = match format::decode_change(rec.kind, rec.body, format::FORMAT_VERSION) {
            Ok(Change::Put(s)) if !replace => s,
            Ok(Change::Replace(s)) if replace => s,
            _ => panic!("not the record written"),
        };
        let want = RestoredTask { id, status: status(st), runat, pri, ttl, ttr, created, data: data.clone().into() };
        prop_assert_eq!(stored.task, want);
        prop_assert_eq!(stored.tube, tube);
        prop_assert_eq!(stored.deliveries, deliveries);
        prop_assert_eq!(stored.utube.as_deref(), utube.as_deref());
        prop_assert_eq!(stored.counts, counts);

        // Every cut is incomplete, every flipped byte is refused or decodes without panic.
        for cut in [0, 1, 23, 24, buf.len() - 1] {
            prop_assert_eq!(format::parse_record(&buf[..cut], 0).err(), Some(Frame::Incomplete));
        }
    }

    #[test]
    fn damaged_records_never_panic_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..512), kind in 0u8..32) {
        let _ = format::parse_record(&bytes, 0);
        if let Some(k) = [Kind::Put, Kind::Status, Kind::Remove, Kind::Commit, Kind::Replace,
            Kind::TubeCreate, Kind::TubeDrop, Kind::TubeTruncate, Kind::Dedup, Kind::Spent,
            Kind::SnapTasks]
            .get(kind as usize % 11)
        {
            for version in 1..=format::FORMAT_VERSION {
                let _ = format::decode_change(*k, &bytes, version);
            }
        }
    }

    #[test]
    fn a_tube_and_a_dedup_key_decode_to_themselves(
        ix in any::<u16>(), kind in 0usize..5, ttl in any::<Option<u64>>(), ttr in any::<Option<u64>>(),
        pri in any::<i64>(), capacity in any::<u64>(), max_deliveries in any::<u16>(),
        dedup_window in any::<u64>(), temporary in any::<bool>(), on_demand in any::<bool>(), part in any::<u16>(),
        name in "[a-z0-9_]{1,200}",
        key in proptest::collection::vec(any::<u8>(), 0..=256), id in any::<u64>(), expires in any::<u64>(),
        next in any::<u64>(), legacy_below in any::<u64>(), first in any::<u64>(),
    ) {
        let kinds = [TubeType::Fifo, TubeType::FifoTtl, TubeType::LimFifoTtl, TubeType::Utube, TubeType::UtubeTtl];
        let opts = TubeOptions { ttl, ttr, pri, capacity, max_deliveries, dedup_window, temporary, on_demand, part };
        let numbers = TubeNumbers { next, legacy_below, first };
        let info = TubeInfo { ix, name: &name, kind: kinds[kind], opts, numbers };
        let mut buf = Vec::new();
        format::encode_tube(&mut buf, &info);
        let mut body = format::Body(&buf);
        let t = body.tube(format::FORMAT_VERSION).expect("decodes");
        body.finish().expect("nothing left over");
        prop_assert_eq!((t.ix, t.name.as_str(), t.kind, t.opts, t.numbers), (ix, name.as_str(), kinds[kind], opts, numbers));
        let mut buf = Vec::new();
        format::encode_dedup(&mut buf, ix, &key, id, expires);
        let d = format::Body(&buf).dedup().expect("decodes");
        prop_assert_eq!((d.tube, &*d.key, d.id, d.expires), (ix, key.as_slice(), id, expires));
    }
}

fn task_with(data: &[u8], utube: Option<&[u8]>) -> TaskRef<'static> {
    // Leaked for the 'static view: a test's few buffers.
    let data: &'static [u8] = Box::leak(data.to_vec().into_boxed_slice());
    let utube = utube.map(|u| &*Box::leak(u.to_vec().into_boxed_slice()));
    TaskRef {
        id: 1,
        status: Status::Ready,
        runat: 0,
        pri: 0,
        ttl: None,
        ttr: None,
        created: 0,
        owner: None,
        data,
        tube: 0,
        deliveries: 0,
        utube,
        counts: JobCounts::default(),
    }
}

/// A Status record carries the task's counters only when one is not zero; a version 4 reader
/// takes a record without them as all zero, an older version's as none said.
#[test]
fn a_status_record_carries_counters_only_when_there_are_some() {
    let decode = |counts: &JobCounts, version| {
        let mut buf = Vec::new();
        format::encode_status(&mut buf, 9, Status::Ready, 0, 3, counts);
        let len = buf.len();
        match format::decode_change(Kind::Status, &buf, version) {
            Ok(Change::Status {
                id: 9,
                deliveries: Some(3),
                counts,
                ..
            }) => (len, counts),
            _ => panic!("not the status written"),
        }
    };
    let zero = JobCounts::default();
    let some = JobCounts {
        releases: 1,
        buries: 2,
        kicks: 3,
        timeouts: u16::MAX,
    };
    assert_eq!(decode(&zero, 4), (19, Some(zero)));
    assert_eq!(decode(&some, 4), (27, Some(some)));
    // A version 3 Status record is the 19 bytes with no counters.
    let mut v3 = Vec::new();
    format::encode_status(&mut v3, 9, Status::Ready, 0, 3, &zero);
    assert!(matches!(
        format::decode_change(Kind::Status, &v3, 3),
        Ok(Change::Status { counts: None, .. })
    ));
}

#[test]
fn payload_limit_boundaries() {
    assert_eq!(check_payload(0), Ok(()));
    assert_eq!(check_payload(MAX_PAYLOAD_BYTES), Ok(()));
    let err = check_payload(MAX_PAYLOAD_BYTES + 1).expect_err("over");
    assert_eq!(
        err,
        TooLarge {
            what: "task payload",
            len: MAX_PAYLOAD_BYTES + 1,
            max: MAX_PAYLOAD_BYTES
        }
    );
    assert!(err.to_string().contains(&MAX_PAYLOAD_BYTES.to_string()));
    // A task at the payload limit with the longest key fits one record (and a snapshot block
    // alone): the overhead constant covers every field.
    const { assert!(MAX_PAYLOAD_BYTES + format::MAX_TASK_OVERHEAD <= MAX_RECORD_BODY) };
    // Over u32 and over the record limit: refused before a byte is appended. The buffer is
    // zeroed lazily by the allocator and never touched, so this costs no real memory.
    let huge = vec![0u8; MAX_PAYLOAD_BYTES + 1];
    let t = TaskRef {
        data: &huge,
        ..task_with(b"", None)
    };
    let mut buf = Vec::new();
    assert!(format::encode_task(&mut buf, &t).is_err());
    assert!(buf.is_empty(), "nothing appended");
}

#[test]
fn utube_key_boundaries() {
    let mut buf = Vec::new();
    let at_limit = vec![b'k'; u16::MAX as usize];
    format::encode_task(&mut buf, &task_with(b"x", Some(&at_limit))).expect("u16::MAX key fits");
    let t = format::Body(&buf).task(2).expect("decodes");
    assert_eq!(t.utube.as_deref(), Some(at_limit.as_slice()));
    let over = vec![b'k'; u16::MAX as usize + 1];
    let mut buf = Vec::new();
    let err = format::encode_task(&mut buf, &task_with(b"x", Some(&over))).expect_err("over");
    assert_eq!(err.what, "utube key");
    assert!(buf.is_empty());
}

#[test]
fn record_body_boundaries() {
    // One over the limit: refused and cut back, never an assertion. (Zeroed lazily and not
    // read: refusing looks only at the length.)
    let mut head = Vec::new();
    format::begin_record(&mut head, 1, Kind::Put);
    let mut buf = vec![0u8; 24 + MAX_RECORD_BODY + 1];
    buf[..24].copy_from_slice(&head);
    let err = format::end_record(&mut buf, 0).expect_err("over");
    assert_eq!((err.len, err.max), (MAX_RECORD_BODY + 1, MAX_RECORD_BODY));
    assert!(buf.is_empty(), "the refused record is cut away");
    // A header announcing one byte over the limit is damage, not a reason to read 1 GiB.
    let mut hdr = Vec::new();
    let at = format::begin_record(&mut hdr, 1, Kind::Put);
    format::end_small_record(&mut hdr, at);
    hdr[4..8].copy_from_slice(&((MAX_RECORD_BODY + 1) as u32).to_le_bytes());
    assert!(matches!(format::parse_record(&hdr, 0), Err(Frame::Bad(_))));
    hdr[4..8].copy_from_slice(&(MAX_RECORD_BODY as u32).to_le_bytes());
    assert_eq!(format::parse_record(&hdr, 0).err(), Some(Frame::Incomplete));
}
