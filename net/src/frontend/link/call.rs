//! The calls a link carries, as the link protocol's own types: one [`Call`] for each core
//! command that may run on another node, with its fields spelled out here. The core's
//! [`Command`] is the loop's internal request and changes with it; a `Call` changes only with
//! the link protocol (and [`LINK_VERSION`](super::wire::LINK_VERSION) with it, which
//! `net/tests/link_wire.rs` holds to its recorded bytes). Commands that never leave their
//! node (a reserve over several tubes, every tube's figures, a move, a user change) have no
//! `Call`: [`Call::of`] refuses them by name. The fields' own types are the engine's data
//! (options, statuses, ids), whose encoding is the journal's as well.

use serde::{Deserialize, Serialize};
use tarq_engine::{Micros, PutOptions, ReleaseOptions, Status, TaskId, TubeIx};
use tarq_engine::{TubeOptions, TubePut, TubeType};

use crate::core::{Command, On, Pause};

/// Which API a call speaks (the core's [`On`]): the seed's on tube `default`, or the tube
/// API on a tube.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Api {
    Seed,
    Tube(TubeIx),
}

/// A command forwarded to the node that runs it. Payloads and names borrow the frame.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Call<'a> {
    Put {
        #[serde(borrow, with = "serde_bytes")]
        data: &'a [u8],
        opts: PutOptions,
    },
    PutIn {
        tube: TubeIx,
        #[serde(borrow, with = "serde_bytes")]
        data: &'a [u8],
        #[serde(borrow)]
        opts: TubePut<'a>,
        wait: Micros,
    },
    Take {
        api: Api,
        timeout: Option<Micros>,
    },
    Ack {
        api: Api,
        id: TaskId,
    },
    Release {
        api: Api,
        id: TaskId,
        opts: ReleaseOptions,
    },
    Touch {
        tube: TubeIx,
        id: TaskId,
        delta: Option<Micros>,
    },
    Peek {
        tube: TubeIx,
        id: TaskId,
    },
    Bury {
        tube: TubeIx,
        id: TaskId,
    },
    Kick {
        tube: TubeIx,
        count: u64,
    },
    Delete {
        tube: TubeIx,
        id: TaskId,
    },
    ReleaseAll {
        tube: TubeIx,
    },
    Truncate {
        tube: TubeIx,
    },
    DropTube {
        tube: TubeIx,
    },
    CreateTube {
        #[serde(borrow)]
        name: &'a str,
        kind: TubeType,
        opts: TubeOptions,
        if_not_exists: bool,
        partitions: u16,
    },
    TakeTask {
        id: TaskId,
    },
    BuryTaken {
        id: TaskId,
        pri: i64,
    },
    TouchTtr {
        id: TaskId,
    },
    DeleteJob {
        id: TaskId,
    },
    PeekFirst {
        tube: TubeIx,
        status: Status,
    },
    TaskFigures {
        id: TaskId,
    },
    TubeFigures {
        tube: TubeIx,
    },
    KickAny {
        tube: TubeIx,
        count: u64,
    },
    KickTask {
        id: TaskId,
    },
    TubeStats {
        tube: TubeIx,
    },
    /// `left`: the pause's time left (each node has its own monotonic clock), `seconds` as
    /// it was asked.
    Pause {
        tube: TubeIx,
        left: Micros,
        seconds: u32,
    },
    Snapshot,
    Watch {
        tube: TubeIx,
    },
    DropCheck {
        tube: TubeIx,
    },
    ListTasks {
        tube: TubeIx,
        status: Status,
        after: Option<TaskId>,
        limit: u32,
    },
}

impl From<On> for Api {
    fn from(on: On) -> Api {
        match on {
            On::Seed => Api::Seed,
            On::Tube(t) => Api::Tube(t),
        }
    }
}

impl From<Api> for On {
    fn from(api: Api) -> On {
        match api {
            Api::Seed => On::Seed,
            Api::Tube(t) => On::Tube(t),
        }
    }
}

impl<'a> Call<'a> {
    /// The call for `cmd`; a pause's deadline is given as the time left after `now` (this
    /// node's monotonic clock). `Err`: the command never leaves its node.
    pub fn of(cmd: &Command<'a>, now: Micros) -> Result<Call<'a>, &'static str> {
        use Command as C;
        Ok(match *cmd {
            C::Put { data, opts } => Call::Put { data, opts },
            C::PutIn {
                tube,
                data,
                opts,
                wait,
            } => Call::PutIn {
                tube,
                data,
                opts,
                wait,
            },
            C::Take { on, timeout } => Call::Take {
                api: on.into(),
                timeout,
            },
            C::Ack { on, id } => Call::Ack { api: on.into(), id },
            C::Release { on, id, opts } => Call::Release {
                api: on.into(),
                id,
                opts,
            },
            C::Touch { tube, id, delta } => Call::Touch { tube, id, delta },
            C::Peek { tube, id } => Call::Peek { tube, id },
            C::Bury { tube, id } => Call::Bury { tube, id },
            C::Kick { tube, count } => Call::Kick { tube, count },
            C::Delete { tube, id } => Call::Delete { tube, id },
            C::ReleaseAll { tube } => Call::ReleaseAll { tube },
            C::Truncate { tube } => Call::Truncate { tube },
            C::DropTube { tube } => Call::DropTube { tube },
            C::CreateTube {
                name,
                kind,
                opts,
                if_not_exists,
                partitions,
            } => Call::CreateTube {
                name,
                kind,
                opts,
                if_not_exists,
                partitions,
            },
            C::TakeTask { id } => Call::TakeTask { id },
            C::BuryTaken { id, pri } => Call::BuryTaken { id, pri },
            C::TouchTtr { id } => Call::TouchTtr { id },
            C::DeleteJob { id } => Call::DeleteJob { id },
            C::PeekFirst { tube, status } => Call::PeekFirst { tube, status },
            C::TaskFigures { id } => Call::TaskFigures { id },
            C::TubeFigures { tube } => Call::TubeFigures { tube },
            C::KickAny { tube, count } => Call::KickAny { tube, count },
            C::KickTask { id } => Call::KickTask { id },
            C::TubeStats { tube } => Call::TubeStats { tube },
            C::Pause { tube, pause } => Call::Pause {
                tube,
                left: pause.until.saturating_sub(now),
                seconds: pause.seconds,
            },
            C::Snapshot => Call::Snapshot,
            C::Watch { tube } => Call::Watch { tube },
            C::DropCheck { tube } => Call::DropCheck { tube },
            C::ListTasks {
                tube,
                status,
                after,
                limit,
            } => Call::ListTasks {
                tube,
                status,
                after,
                limit,
            },
            C::TakeAny { .. } => return Err("a reserve over several tubes"),
            C::AllTubeStats => return Err("every tube's figures"),
            C::Move { .. } => return Err("a move"),
            C::PutUser { .. } | C::DropUser { .. } => return Err("a user change"),
        })
    }

    /// How long the call may wait where it runs before it is answered
    /// (`Command::waits_at_most`).
    pub fn waits_at_most(&self) -> Option<Micros> {
        self.command(0).waits_at_most()
    }

    /// The command to run; a pause ends `left` after `now` (the running node's clock).
    pub fn command(self, now: Micros) -> Command<'a> {
        use Command as C;
        match self {
            Call::Put { data, opts } => C::Put { data, opts },
            Call::PutIn {
                tube,
                data,
                opts,
                wait,
            } => C::PutIn {
                tube,
                data,
                opts,
                wait,
            },
            Call::Take { api, timeout } => C::Take {
                on: api.into(),
                timeout,
            },
            Call::Ack { api, id } => C::Ack { on: api.into(), id },
            Call::Release { api, id, opts } => C::Release {
                on: api.into(),
                id,
                opts,
            },
            Call::Touch { tube, id, delta } => C::Touch { tube, id, delta },
            Call::Peek { tube, id } => C::Peek { tube, id },
            Call::Bury { tube, id } => C::Bury { tube, id },
            Call::Kick { tube, count } => C::Kick { tube, count },
            Call::Delete { tube, id } => C::Delete { tube, id },
            Call::ReleaseAll { tube } => C::ReleaseAll { tube },
            Call::Truncate { tube } => C::Truncate { tube },
            Call::DropTube { tube } => C::DropTube { tube },
            Call::CreateTube {
                name,
                kind,
                opts,
                if_not_exists,
                partitions,
            } => C::CreateTube {
                name,
                kind,
                opts,
                if_not_exists,
                partitions,
            },
            Call::TakeTask { id } => C::TakeTask { id },
            Call::BuryTaken { id, pri } => C::BuryTaken { id, pri },
            Call::TouchTtr { id } => C::TouchTtr { id },
            Call::DeleteJob { id } => C::DeleteJob { id },
            Call::PeekFirst { tube, status } => C::PeekFirst { tube, status },
            Call::TaskFigures { id } => C::TaskFigures { id },
            Call::TubeFigures { tube } => C::TubeFigures { tube },
            Call::KickAny { tube, count } => C::KickAny { tube, count },
            Call::KickTask { id } => C::KickTask { id },
            Call::TubeStats { tube } => C::TubeStats { tube },
            Call::Pause {
                tube,
                left,
                seconds,
            } => C::Pause {
                tube,
                pause: Pause {
                    until: now.saturating_add(left),
                    seconds,
                },
            },
            Call::Snapshot => C::Snapshot,
            Call::Watch { tube } => C::Watch { tube },
            Call::DropCheck { tube } => C::DropCheck { tube },
            Call::ListTasks {
                tube,
                status,
                after,
                limit,
            } => C::ListTasks {
                tube,
                status,
                after,
                limit,
            },
        }
    }
}

/// `cmd` as a link would carry it, kept to run later on this node (a call held for a move
/// or a placement read): `now` 0, so a pause keeps its deadline as it is.
pub fn encode_command(cmd: &Command<'_>) -> Result<Vec<u8>, String> {
    let call = Call::of(cmd, 0).map_err(|what| format!("{what} cannot be kept to run later"))?;
    rmp_serde::to_vec(&call).map_err(|e| e.to_string())
}

/// A command kept by [`encode_command`].
pub fn decode_command(bytes: &[u8]) -> Result<Command<'_>, String> {
    let call: Call<'_> = rmp_serde::from_slice(bytes).map_err(|e| e.to_string())?;
    Ok(call.command(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_comes_back_as_the_command_it_was_and_a_pause_keeps_its_time_left() {
        let opts = TubePut::default();
        let cmds = [
            Command::PutIn {
                tube: 3,
                data: b"x",
                opts,
                wait: 5,
            },
            Command::Take {
                on: On::Seed,
                timeout: Some(7),
            },
            Command::Release {
                on: On::Tube(2),
                id: 9,
                opts: ReleaseOptions::default(),
            },
            Command::ListTasks {
                tube: 1,
                status: Status::Ready,
                after: Some(4),
                limit: 10,
            },
        ];
        for cmd in cmds {
            let bytes = encode_command(&cmd).unwrap();
            assert_eq!(decode_command(&bytes).unwrap(), cmd);
        }
        let pause = Command::Pause {
            tube: 1,
            pause: Pause {
                until: 1_500,
                seconds: 2,
            },
        };
        let call = Call::of(&pause, 1_000).unwrap();
        let Command::Pause { pause: p, .. } = call.command(40_000) else {
            panic!("a pause");
        };
        assert_eq!((p.until, p.seconds), (40_500, 2));
        assert!(Call::of(&Command::AllTubeStats, 0).is_err());
    }
}
