//! Front-ends: one per wire protocol. A front-end turns its frames into the server's
//! front-end-neutral [`Command`](crate::core::Command)s and the
//! [`Outcome`](crate::core::Outcome)s back into its replies; the loop, sessions,
//! parked takes, the journal and the stats are the server's and shared by all. Adding a
//! protocol is a codec crate (bytes only, like `tarq-iproto`), a translation table here, and a
//! [`ReplyTo`] variant carrying what its replies need (the IPROTO sync, say).

pub mod beanstalk;
pub mod iproto;

use crate::core::Outcome;

/// How to answer a command: the front-end of the asking connection and what its reply needs.
/// Kept by a parked take, so it is answered in its own protocol whenever it is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyTo {
    Iproto(iproto::Reply),
    Beanstalk(beanstalk::Reply),
}

/// Encodes `outcome` as the reply `to` asks for, appended to `out`.
pub fn encode(out: &mut Vec<u8>, to: ReplyTo, outcome: &Outcome<'_>) {
    match to {
        ReplyTo::Iproto(r) => iproto::encode(out, r, outcome),
        ReplyTo::Beanstalk(r) => beanstalk::encode(out, r, outcome),
    }
}
