//! A move's decisions, as a state machine with no I/O: [`MoveMachine::on`] takes what
//! happened (the new owner answered, a page was read, etcd answered, time passed) and returns
//! what to do (send a page, freeze, commit, withdraw the claim, hand over, give up). The
//! server (`moving.rs`) does those things — reads pages from the core, writes them to the link,
//! asks etcd — and feeds back what came of them. The order of the steps lives here alone, so
//! it is tested here alone: each step, and every sequence of inputs a generated test can
//! think of against the promises a move makes (nothing committed before the last page is
//! durable there, frozen before that last copy began, nothing after the end).
//!
//! The phases, as `moving.rs` tells them: the new owner accepts ([`Input::Accepted`]); the
//! tasks there were are copied a few pages at a time (`Bulk`, kept to `--move-rate`); what
//! changed meanwhile is copied again in rounds while the partition serves (`CatchUp`); once
//! few changes are left, or after [`MAX_ROUNDS`], the partition freezes and the last changes
//! go (`Final`); then the commit in etcd, and the hand-over. A commit whose answer is lost is
//! decided by withdrawing the move's claim, asked again until etcd answers.

use tarq_engine::Micros;

/// Pages sent and not yet answered.
pub const WINDOW: usize = 4;
/// Changes few enough to send frozen (the partition's clients wait for them).
pub const FREEZE_AT: usize = 4096;
/// Catch-up rounds while serving before the partition freezes whatever changed.
pub const MAX_ROUNDS: u32 = 4;
/// How long after an unanswered withdrawal etcd is asked again (µs).
pub const ASK_AGAIN: Micros = 50_000;

/// Where a move is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the new owner to accept (and claim the copy in etcd).
    Prepare,
    /// The tasks there were when it began, copied while the partition serves.
    Bulk,
    /// What changed meanwhile, sent again while it serves.
    CatchUp,
    /// Frozen: the last changes.
    Final,
    /// The commit is in etcd's hands: `token` names the request.
    Commit { token: u64 },
    /// etcd's answer to the commit was lost: the claim is withdrawn (`release`: that
    /// request's token, while etcd has it; else it is asked at `check_at`), and etcd's answer
    /// says whether the commit happened.
    Unknown {
        release: Option<u64>,
        check_at: Micros,
    },
    /// Handed over or given up: nothing more.
    Ended,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// The new owner accepted the move.
    Accepted,
    /// A page was answered: it is durable there.
    PageAnswered,
    /// The new owner refused, its link failed, it answered what a move does not expect, or
    /// the partition could not be read: why.
    Failed(String),
    /// The page asked for was sent: `items` tasks and gone ids; `last` when the phase has no
    /// more after it.
    Sent { items: u64, last: bool },
    /// The phase had no page left to send.
    Exhausted,
    /// The changes since the last look, asked for by [`Output::CollectChanges`]: how many,
    /// and whether the whole partition changed (truncated or dropped).
    Changes { count: usize, whole: bool },
    /// The commit's request was made as `token`, or could not be (this node no longer leads:
    /// why).
    CommitAsked(Result<u64, String>),
    /// etcd answered the commit.
    Committed(Fate),
    /// The withdrawal of the claim was asked as `token`.
    WithdrawAsked(u64),
    /// etcd answered the withdrawal of the claim.
    Withdrawn(Fate),
    /// Time passed.
    Tick,
}

/// What etcd said of a commit, or of the withdrawal that decides a lost commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// The partition is the new owner's.
    There,
    /// It is not, and now never will be (after a withdrawal).
    Here,
    /// No answer: it may or may not have happened.
    Lost(String),
    /// Refused (the claim gone, this set no longer the owner, another term): why.
    Refused(String),
}

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Read the phase's next page and send it ([`Input::Sent`] or [`Input::Exhausted`]).
    SendPage,
    /// Take the changes noted since the last look ([`Input::Changes`]).
    CollectChanges,
    /// Freeze the partition: it hands out and changes nothing until the move ends.
    Freeze,
    /// Ask etcd to commit ([`Input::CommitAsked`]).
    Commit,
    /// Ask etcd to withdraw the move's claim ([`Input::WithdrawAsked`]).
    Withdraw,
    /// The partition is the new owner's: hand it over.
    HandOver,
    /// The move is over before its commit: the partition stays and thaws. Why.
    GiveUp(String),
}

/// A move's control state. The data it moves (the pages' positions, the changed ids, the
/// held commands) stays with the caller.
#[derive(Clone, Debug)]
pub struct MoveMachine {
    phase: Phase,
    /// The pages of the current phase are all sent.
    exported: bool,
    rounds: u32,
    in_flight: usize,
    /// While it serves, the copy keeps to `rate` tasks a second (0: unpaced): the next page
    /// goes at this instant.
    next_send: Micros,
    rate: u64,
    now: Micros,
}

impl MoveMachine {
    /// A move asked of the new owner at `now`, copying at most `rate` tasks a second while
    /// the partition serves (0: as fast as the window allows).
    pub fn new(rate: u64, now: Micros) -> MoveMachine {
        MoveMachine {
            phase: Phase::Prepare,
            exported: false,
            rounds: 0,
            in_flight: 0,
            next_send: 0,
            rate,
            now,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Catch-up rounds sent while serving.
    pub fn rounds(&self) -> u32 {
        self.rounds
    }

    /// Whether the partition is frozen (from the last changes' copy to the end).
    pub fn frozen(&self) -> bool {
        !matches!(self.phase, Phase::Prepare | Phase::Bulk | Phase::CatchUp)
    }

    /// Whether the commit is in etcd's hands or being decided: the new owner's answers no
    /// longer matter.
    #[cfg(test)]
    pub fn committing(&self) -> bool {
        matches!(self.phase, Phase::Commit { .. } | Phase::Unknown { .. })
    }

    /// The commit's request, while it is in etcd's hands.
    pub fn commit_token(&self) -> Option<u64> {
        match self.phase {
            Phase::Commit { token } => Some(token),
            _ => None,
        }
    }

    /// The withdrawal's request, while it is in etcd's hands.
    pub fn withdraw_token(&self) -> Option<u64> {
        match self.phase {
            Phase::Unknown { release, .. } => release,
            _ => None,
        }
    }

    /// When the move should be looked at again ([`Input::Tick`]): a withdrawal due, or the
    /// next page held back by the rate.
    pub fn next_deadline(&self) -> Option<Micros> {
        match self.phase {
            Phase::Unknown {
                release: None,
                check_at,
            } => Some(check_at),
            // Only a page the rate holds back: once its time has come it is sent, and a
            // deadline in the past would wake the loop every turn until answers came.
            Phase::Bulk | Phase::CatchUp
                if !self.exported && self.in_flight < WINDOW && self.next_send > self.now =>
            {
                Some(self.next_send)
            }
            _ => None,
        }
    }

    /// Takes in `input` at `now`: what to do, in order. Outputs that ask something
    /// ([`Output::SendPage`], [`Output::CollectChanges`], [`Output::Commit`],
    /// [`Output::Withdraw`]) are answered by the caller's next input, before anything else.
    pub fn on(&mut self, input: Input, now: Micros) -> Vec<Output> {
        self.now = self.now.max(now);
        let mut out = Vec::new();
        match self.phase {
            Phase::Ended => return out,
            Phase::Unknown { release, check_at } => {
                self.on_unknown(release, check_at, input, &mut out);
                return out;
            }
            _ => {}
        }
        match (self.phase, input) {
            (Phase::Prepare, Input::Accepted) => {
                self.phase = Phase::Bulk;
                self.pump(&mut out);
            }
            (Phase::Bulk | Phase::CatchUp | Phase::Final, Input::PageAnswered) => {
                self.in_flight = self.in_flight.saturating_sub(1);
                self.pump(&mut out);
            }
            // Once the commit is asked, only etcd decides the move.
            (Phase::Commit { .. }, Input::Failed(_) | Input::PageAnswered | Input::Accepted) => {}
            (_, Input::Failed(why)) => self.end(&mut out, Output::GiveUp(why)),
            (Phase::Bulk | Phase::CatchUp | Phase::Final, Input::Sent { items, last }) => {
                self.sent(items, last, &mut out);
            }
            (Phase::Bulk | Phase::CatchUp | Phase::Final, Input::Exhausted) => {
                self.exported = true;
                self.pump(&mut out);
            }
            (Phase::Bulk | Phase::CatchUp, Input::Changes { count, whole }) => {
                self.changes(count, whole, &mut out);
            }
            (Phase::Final, Input::CommitAsked(Ok(token))) => {
                self.phase = Phase::Commit { token };
            }
            (Phase::Final, Input::CommitAsked(Err(why))) => {
                self.end(&mut out, Output::GiveUp(why));
            }
            (Phase::Commit { .. }, Input::Committed(fate)) => self.committed(fate, &mut out),
            (Phase::Bulk | Phase::CatchUp, Input::Tick) => self.pump(&mut out),
            (_, Input::Tick) => {}
            (phase, input) => {
                let why = format!("a move in {phase:?} did not expect {input:?}");
                self.end(&mut out, Output::GiveUp(why));
            }
        }
        out
    }

    /// A page went out: one more in flight, and the rate's pause before the next (while
    /// serving; the frozen phase hurries).
    fn sent(&mut self, items: u64, last: bool, out: &mut Vec<Output>) {
        self.in_flight += 1;
        self.exported |= last;
        if self.rate > 0 && matches!(self.phase, Phase::Bulk | Phase::CatchUp) {
            let spent = items.saturating_mul(1_000_000) / self.rate;
            self.next_send = self.next_send.max(self.now).saturating_add(spent);
        }
        self.pump(out);
    }

    /// The changes since the last look: another catch-up round, or, with few left (or after
    /// `MAX_ROUNDS`), the freeze and the last round; a truncated or dropped partition ends
    /// the move.
    fn changes(&mut self, count: usize, whole: bool, out: &mut Vec<Output>) {
        if whole {
            let why = "the partition was truncated or dropped meanwhile".to_owned();
            return self.end(out, Output::GiveUp(why));
        }
        if count <= FREEZE_AT || self.rounds >= MAX_ROUNDS {
            // Few changes left: frozen, they are the last.
            self.phase = Phase::Final;
            out.push(Output::Freeze);
        } else {
            self.phase = Phase::CatchUp;
            self.rounds += 1;
        }
        self.exported = false;
        self.pump(out);
    }

    /// etcd answered the commit: handed over, given up, or (answer lost) found out.
    fn committed(&mut self, fate: Fate, out: &mut Vec<Output>) {
        match fate {
            Fate::There => self.end(out, Output::HandOver),
            Fate::Lost(_) => self.find_out(out, 0),
            Fate::Here => {
                let why = "etcd did not take the commit".to_owned();
                self.end(out, Output::GiveUp(why));
            }
            Fate::Refused(why) => {
                let why = format!("etcd refused the change: {why}");
                self.end(out, Output::GiveUp(why));
            }
        }
    }

    /// The commit's answer was lost: the withdrawal of the claim is asked (when due), and its
    /// answer decides the move; nothing else does.
    fn on_unknown(
        &mut self,
        release: Option<u64>,
        check_at: Micros,
        input: Input,
        out: &mut Vec<Output>,
    ) {
        match (release, input) {
            (_, Input::Failed(_) | Input::PageAnswered | Input::Accepted) => {}
            (None, Input::WithdrawAsked(token)) => {
                let release = Some(token);
                self.phase = Phase::Unknown { release, check_at };
            }
            (Some(_), Input::Withdrawn(fate)) => self.withdrawn(fate, out),
            (None, Input::Tick) if check_at <= self.now => out.push(Output::Withdraw),
            (_, Input::Tick) => {}
            (_, input) => {
                let why = format!("a move in {:?} did not expect {input:?}", self.phase);
                self.end(out, Output::GiveUp(why));
            }
        }
    }

    /// etcd answered the withdrawal that decides a lost commit.
    fn withdrawn(&mut self, fate: Fate, out: &mut Vec<Output>) {
        match fate {
            Fate::There => self.end(out, Output::HandOver),
            Fate::Here => {
                let why = "etcd did not take the commit, and now it never will".to_owned();
                self.end(out, Output::GiveUp(why));
            }
            Fate::Lost(_) => self.find_out(out, ASK_AGAIN),
            Fate::Refused(why) => self.end(out, Output::GiveUp(format!("etcd: {why}"))),
        }
    }

    /// The next steps of a copying phase: another page while the window and the rate allow;
    /// once a phase's pages are all sent and answered, the changes for the next phase (or,
    /// after the frozen one, the commit).
    fn pump(&mut self, out: &mut Vec<Output>) {
        if !matches!(self.phase, Phase::Bulk | Phase::CatchUp | Phase::Final) {
            return;
        }
        if self.in_flight >= WINDOW {
            return;
        }
        if !self.exported {
            // While the partition serves, the copy keeps to its rate (frozen, it hurries).
            let paced = matches!(self.phase, Phase::Bulk | Phase::CatchUp);
            if !paced || self.next_send <= self.now {
                out.push(Output::SendPage);
            }
            return;
        }
        if self.in_flight > 0 {
            return;
        }
        if self.phase == Phase::Final {
            out.push(Output::Commit);
        } else {
            out.push(Output::CollectChanges);
        }
    }

    /// The fate of a lost commit is asked of etcd `after` µs from now.
    fn find_out(&mut self, out: &mut Vec<Output>, after: Micros) {
        let check_at = self.now.saturating_add(after);
        self.phase = Phase::Unknown {
            release: None,
            check_at,
        };
        if check_at <= self.now {
            out.push(Output::Withdraw);
        }
    }

    fn end(&mut self, out: &mut Vec<Output>, last: Output) {
        self.phase = Phase::Ended;
        out.push(last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Answers what the machine asks, as the server would: pages of `items` each, a phase
    /// ending after `pages` of them; `changes` changed tasks at each look; commit and
    /// withdrawal tokens counted from 100. Checks the move's promises at every output.
    struct Driver {
        m: MoveMachine,
        now: Micros,
        pages_left: u32,
        pages: u32,
        items: u64,
        changes: Vec<usize>,
        token: u64,
        /// Every output, in order.
        log: Vec<Output>,
        /// Pages sent and not answered, as the new owner sees them.
        in_flight: usize,
        frozen: bool,
        committing: bool,
        ended: bool,
        /// Broken promises, if any.
        broken: Vec<String>,
    }

    impl Driver {
        fn new(rate: u64, pages: u32, items: u64, changes: Vec<usize>) -> Driver {
            Driver {
                m: MoveMachine::new(rate, 0),
                now: 0,
                pages_left: pages,
                pages,
                items,
                changes,
                token: 100,
                log: Vec::new(),
                in_flight: 0,
                frozen: false,
                committing: false,
                ended: false,
                broken: Vec::new(),
            }
        }

        /// Feeds `input`, and answers the asks that follow.
        fn feed(&mut self, input: Input) {
            let mut todo = vec![input];
            while let Some(input) = todo.pop() {
                let outs = self.m.on(input, self.now);
                for o in outs {
                    self.keep(&o);
                    self.log.push(o.clone());
                    let answer = match o {
                        Output::SendPage if self.pages_left == 0 => Some(Input::Exhausted),
                        Output::SendPage => {
                            self.pages_left -= 1;
                            self.in_flight += 1;
                            Some(Input::Sent {
                                items: self.items,
                                last: self.pages_left == 0,
                            })
                        }
                        Output::CollectChanges => {
                            let count = if self.changes.is_empty() {
                                0
                            } else {
                                self.changes.remove(0)
                            };
                            self.pages_left = if count == 0 { 0 } else { self.pages };
                            Some(Input::Changes {
                                count,
                                whole: false,
                            })
                        }
                        Output::Commit => {
                            self.token += 1;
                            Some(Input::CommitAsked(Ok(self.token)))
                        }
                        Output::Withdraw => {
                            self.token += 1;
                            Some(Input::WithdrawAsked(self.token))
                        }
                        _ => None,
                    };
                    // Asks are answered before anything else happens.
                    todo.extend(answer);
                }
            }
        }

        /// The new owner answers a page, if one is in flight.
        fn answer(&mut self) {
            if self.in_flight > 0 {
                self.in_flight -= 1;
                self.feed(Input::PageAnswered);
            }
        }

        /// Checks output `o` against the promises.
        fn keep(&mut self, o: &Output) {
            let mut broken = |what: &str| self.broken.push(format!("{what}: {o:?}"));
            if self.ended {
                broken("an output after the end");
            }
            match o {
                Output::SendPage if self.in_flight >= WINDOW => broken("a page past the window"),
                Output::SendPage if self.committing => broken("a page after the commit"),
                Output::Freeze if self.frozen => broken("frozen twice"),
                Output::Freeze => self.frozen = true,
                Output::CollectChanges if self.frozen => broken("changes collected frozen"),
                Output::Commit if !self.frozen => broken("a commit not frozen"),
                Output::Commit if self.in_flight > 0 => broken("a commit before the last page"),
                Output::Commit if self.pages_left > 0 => broken("a commit before the last page"),
                Output::Commit => self.committing = true,
                Output::Withdraw if !self.committing => broken("a withdrawal without a commit"),
                Output::HandOver if !self.committing => broken("handed over without a commit"),
                Output::HandOver | Output::GiveUp(_) => self.ended = true,
                _ => {}
            }
        }

        fn count(&self, f: impl Fn(&Output) -> bool) -> usize {
            self.log.iter().filter(|o| f(o)).count()
        }
    }
    #[test]
    fn a_move_copies_in_windows_catches_up_freezes_commits_and_hands_over() {
        let mut d = Driver::new(0, 6, 10, vec![5000, 20]);
        d.feed(Input::Accepted);
        assert_eq!(
            d.count(|o| *o == Output::SendPage),
            WINDOW,
            "a window of pages"
        );
        assert_eq!(d.m.phase(), Phase::Bulk);
        for _ in 0..6 {
            d.feed(Input::PageAnswered);
        }
        // 5,000 changes are too many to freeze for: a round while serving.
        assert_eq!(d.m.phase(), Phase::CatchUp);
        assert_eq!(d.m.rounds(), 1);
        assert!(!d.m.frozen());
        for _ in 0..6 {
            d.feed(Input::PageAnswered);
        }
        assert_eq!(d.m.phase(), Phase::Final);
        assert!(d.m.frozen());
        for _ in 0..6 {
            d.feed(Input::PageAnswered);
        }
        let token =
            d.m.commit_token()
                .expect("the commit asked once the last page is durable");
        d.feed(Input::PageAnswered); // a stray answer after the commit: nothing
        d.feed(Input::Failed("the link failed".into())); // only etcd decides now
        assert_eq!(d.m.commit_token(), Some(token));
        d.feed(Input::Committed(Fate::There));
        assert_eq!(d.log.last(), Some(&Output::HandOver));
        assert_eq!(d.count(|o| *o == Output::Freeze), 1);
        d.feed(Input::Tick);
        d.feed(Input::PageAnswered);
        assert_eq!(
            d.log.last(),
            Some(&Output::HandOver),
            "nothing after the end"
        );
    }

    #[test]
    fn a_partition_with_few_changes_freezes_at_once_and_one_that_keeps_changing_after_the_rounds() {
        let mut d = Driver::new(0, 1, 10, vec![FREEZE_AT]);
        d.feed(Input::Accepted);
        d.feed(Input::PageAnswered);
        assert_eq!(d.m.phase(), Phase::Final, "few enough: frozen");

        let mut d = Driver::new(0, 1, 10, vec![FREEZE_AT + 1; 10]);
        d.feed(Input::Accepted);
        for _ in 0..=MAX_ROUNDS {
            d.feed(Input::PageAnswered);
        }
        assert_eq!(d.m.rounds(), MAX_ROUNDS);
        assert_eq!(
            d.m.phase(),
            Phase::Final,
            "frozen after the rounds, however many"
        );
    }

    #[test]
    fn a_lost_commit_is_decided_by_withdrawing_the_claim_asked_again_until_etcd_answers() {
        let mut d = Driver::new(0, 1, 1, vec![0]);
        d.feed(Input::Accepted);
        // The bulk copy done and nothing changed: frozen, nothing left to send, committed.
        d.feed(Input::PageAnswered);
        assert_eq!(d.count(|o| *o == Output::Freeze), 1);
        assert!(d.m.commit_token().is_some());
        d.feed(Input::Committed(Fate::Lost("timed out".into())));
        let first = d.m.withdraw_token().expect("withdrawn at once");
        d.feed(Input::Withdrawn(Fate::Lost("timed out".into())));
        assert_eq!(d.m.withdraw_token(), None);
        assert_eq!(d.m.next_deadline(), Some(ASK_AGAIN), "asked again later");
        d.feed(Input::Tick);
        assert_eq!(d.m.withdraw_token(), None, "not yet");
        d.now = ASK_AGAIN;
        d.feed(Input::Tick);
        let second = d.m.withdraw_token().expect("asked again");
        assert_ne!(first, second);
        d.feed(Input::Withdrawn(Fate::Here));
        assert!(matches!(d.log.last(), Some(Output::GiveUp(why)) if why.contains("never will")));
    }

    #[test]
    fn the_copy_keeps_to_its_rate_while_serving_and_hurries_frozen() {
        // 1,000 tasks a second, pages of 100: one page every 100 ms.
        let mut d = Driver::new(1000, 3, 100, vec![10]);
        d.feed(Input::Accepted);
        assert_eq!(d.count(|o| *o == Output::SendPage), 1);
        assert_eq!(d.m.next_deadline(), Some(100_000));
        d.feed(Input::Tick);
        assert_eq!(
            d.count(|o| *o == Output::SendPage),
            1,
            "not before its time"
        );
        d.now = 100_000;
        d.feed(Input::Tick);
        assert_eq!(d.count(|o| *o == Output::SendPage), 2);
        d.now = 200_000;
        d.feed(Input::Tick);
        assert_eq!(d.count(|o| *o == Output::SendPage), 3);
        for _ in 0..3 {
            d.feed(Input::PageAnswered);
        }
        // Frozen: the last pages go at once.
        assert_eq!(d.m.phase(), Phase::Final);
        assert_eq!(d.count(|o| *o == Output::SendPage), 3 + WINDOW.min(3));
    }

    #[test]
    fn a_failure_before_the_commit_gives_up_and_a_whole_change_too() {
        let mut d = Driver::new(0, 2, 1, vec![]);
        d.feed(Input::Failed("refused: no such set".into()));
        assert_eq!(d.log, vec![Output::GiveUp("refused: no such set".into())]);
        assert_eq!(d.m.phase(), Phase::Ended);

        let mut m = MoveMachine::new(0, 0);
        m.on(Input::Accepted, 0);
        m.on(Input::Exhausted, 0);
        let out = m.on(
            Input::Changes {
                count: 1,
                whole: true,
            },
            0,
        );
        assert!(matches!(&out[..], [Output::GiveUp(why)] if why.contains("truncated")));

        let mut m = MoveMachine::new(0, 0);
        let out = m.on(Input::PageAnswered, 0);
        assert!(
            matches!(&out[..], [Output::GiveUp(why)] if why.contains("did not expect")),
            "{out:?}"
        );
    }

    /// One thing that may happen to a move under way, as the generated tests draw them.
    #[derive(Clone, Debug)]
    enum Event {
        Answer,
        Fail,
        Etcd(u8),
        Tick(u16),
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            6 => Just(Event::Answer),
            1 => Just(Event::Fail),
            2 => (0u8..4).prop_map(Event::Etcd),
            2 => (0u16..500).prop_map(Event::Tick),
        ]
    }

    fn fate(n: u8) -> Fate {
        match n {
            0 => Fate::There,
            1 => Fate::Here,
            2 => Fate::Lost("timed out".into()),
            _ => Fate::Refused("not the owner".into()),
        }
    }

    proptest! {
        /// Whatever happens in whatever order: a page is sent only within the window; the
        /// commit is asked only frozen, once every page of the frozen phase is durable there;
        /// the partition freezes once; after the commit is asked only etcd ends the move, and
        /// a hand-over follows only etcd's word that the partition is there; after the end,
        /// nothing.
        #[test]
        fn every_order_of_events_keeps_the_moves_promises(
            rate in prop_oneof![Just(0u64), 100u64..10_000],
            pages in 0u32..5,
            items in 1u64..50,
            changes in proptest::collection::vec(0usize..10_000, 0..8),
            events in proptest::collection::vec(event(), 0..120),
        ) {
            let mut d = Driver::new(rate, pages, items, changes);
            d.feed(Input::Accepted);
            for e in events {
                match e {
                    Event::Answer => d.answer(),
                    Event::Fail => {
                        let was_committing = d.m.committing();
                        d.feed(Input::Failed("the link failed".into()));
                        prop_assert!(
                            !was_committing || d.m.committing(),
                            "a failure ended a move etcd decides"
                        );
                    }
                    Event::Etcd(n) => {
                        if d.m.commit_token().is_some() {
                            d.feed(Input::Committed(fate(n)));
                        } else if d.m.withdraw_token().is_some() {
                            d.feed(Input::Withdrawn(fate(n)));
                        }
                    }
                    Event::Tick(ms) => {
                        d.now += Micros::from(ms) * 1000;
                        d.feed(Input::Tick);
                    }
                }
                prop_assert!(d.broken.is_empty(), "{:?}\n{:?}", d.broken, d.log);
            }
        }

        /// Without failures, and with etcd answering, every move ends handed over.
        #[test]
        fn a_move_nothing_fails_ends_handed_over(
            rate in prop_oneof![Just(0u64), 100u64..10_000],
            pages in 0u32..5,
            items in 1u64..50,
            changes in proptest::collection::vec(0usize..10_000, 0..8),
        ) {
            let mut d = Driver::new(rate, pages, items, changes);
            d.feed(Input::Accepted);
            for _ in 0..10_000 {
                if d.ended {
                    break;
                }
                if d.m.commit_token().is_some() {
                    d.feed(Input::Committed(Fate::There));
                } else if d.in_flight > 0 {
                    d.answer();
                } else {
                    d.now = d.m.next_deadline().unwrap_or(d.now).max(d.now);
                    d.feed(Input::Tick);
                }
            }
            prop_assert_eq!(d.log.last(), Some(&Output::HandOver), "{:?}", d.log);
            prop_assert!(d.broken.is_empty(), "{:?}", d.broken);
        }
    }
}
