//! The loop as the front-ends see it ([`frontend::Loop`]): a connection's replies and state,
//! the core's entry point and what it reads, the clocks and the figures. Each method is the
//! loop's own, named once here.

use tarq_engine::{Micros, Queue, SessionId, Stats, TubeIx};
use tarq_ops::stats::Snapshot;

use super::Server;
use crate::config::Config;
use tarq_iproto::auth::SCRAMBLE_LEN;
use tarq_iproto::greeting::SALT_LEN;

use crate::core::{Command, Pauses, Refusal};
use crate::frontend::beanstalk::{BeanstalkState, BsConn};
use crate::frontend::http::{HttpConn, HttpState};
use crate::frontend::iproto::IprotoState;
use crate::frontend::{self, ReplyTo};
use tarq_ops::live::Live;

impl frontend::Loop for Server {
    #[inline]
    fn dispatch(&mut self, idx: usize, reply: ReplyTo, cmd: Command<'_>) {
        Server::dispatch(self, idx, reply, &cmd);
    }

    fn reply_buf(&mut self, idx: usize) -> &mut Vec<u8> {
        Server::reply_buf(self, idx)
    }

    fn reply_with_queue(&mut self, idx: usize, write: &mut dyn FnMut(&mut Vec<u8>, &Queue)) {
        Server::reply_with_queue(self, idx, write);
    }

    fn closing(&self, idx: usize) -> bool {
        self.conns[idx].closing.is_some()
    }

    fn sid(&self, idx: usize) -> SessionId {
        self.conns[idx].sid
    }

    fn queue(&self) -> &Queue {
        self.core.queue()
    }

    #[inline]
    fn tube_named(&self, name: &str) -> Option<(TubeIx, tarq_engine::TubeNumbers)> {
        Server::tube_named(self, name)
    }

    fn hold_for_placement(&mut self, idx: usize) -> bool {
        (self.router.as_mut()).is_some_and(|r| r.hold_for_placement(idx))
    }

    fn tube_figures(&self, tube: TubeIx, holders: &[u64]) -> Option<Stats> {
        self.core.tube_figures(tube, holders)
    }

    fn pauses(&self) -> &Pauses {
        self.core.pauses()
    }

    fn parked_count(&self, tube: TubeIx) -> u64 {
        let routed = (self.router.as_ref()).map_or(0, |r| r.routed_waiting_on(tube));
        self.core.parked_in(tube) as u64 + routed
    }

    fn cluster_picture(&mut self) -> Option<serde_json::Value> {
        self.with_router(|r, cx| r.cluster_picture(cx)).flatten()
    }

    fn sharded(&self) -> bool {
        self.router.is_some()
    }

    fn task_tube_name(&self, id: tarq_engine::TaskId) -> Option<String> {
        let q = self.core.queue();
        if let Some(t) = q.get(id) {
            return q.tube_info(t.tube).map(|i| i.name.to_owned());
        }
        let ix = tarq_engine::id_tube(id)?;
        (self.router.as_ref()?.tube_name_of(ix)).map(str::to_owned)
    }

    fn served(&self, id: tarq_engine::TaskId) -> Option<tarq_engine::TaskRef<'_>> {
        if !self.leads() {
            return None;
        }
        let task = self.core.queue().get(id)?;
        let here = (self.router.as_ref()).is_none_or(|r| r.serves_here(task.tube));
        here.then_some(task)
    }

    fn makes_tubes_on_demand(&self) -> bool {
        self.router.is_none()
    }

    fn create_tube_for(&mut self, idx: usize, name: &str) -> Result<TubeIx, Refusal> {
        Server::create_tube_for(self, idx, name)
    }

    fn collect_tubes(&mut self) {
        Server::collect_tubes(self);
    }

    fn now(&self) -> Micros {
        self.now
    }

    fn mono(&self) -> Micros {
        self.mono
    }

    fn snapshot(&self) -> Snapshot {
        Server::snapshot(self)
    }

    fn server_id(&self) -> u64 {
        Server::server_id(self)
    }

    fn config(&self) -> &Config {
        &self.cfg
    }

    fn beanstalk_parts(&mut self, idx: usize) -> (&mut BeanstalkState, Option<&mut BsConn>) {
        let conn = self.conns.get_mut(idx).and_then(|c| c.beanstalk_mut());
        (&mut self.beanstalk, conn)
    }

    fn beanstalk_roles(&self) -> (u64, u64, u64) {
        Server::beanstalk_roles(self)
    }

    fn batch_refusal(&mut self, first: &Command<'_>, commands: &[Command<'_>]) -> Option<Refusal> {
        Server::batch_refusal(self, first, commands)
    }

    fn release_session(&mut self, sid: SessionId) -> usize {
        Server::release_session(self, sid)
    }

    fn iproto(&mut self) -> &mut IprotoState {
        &mut self.iproto
    }

    fn who(&self, idx: usize) -> &crate::core::access::Who {
        &self.conns[idx].who
    }

    fn act_as(
        &mut self,
        idx: usize,
        who: crate::core::access::Who,
        may_call: bool,
    ) -> Result<(), crate::core::access::UserRefused> {
        Server::set_who(self, idx, who)?;
        self.conns[idx].authenticated = may_call;
        Ok(())
    }

    fn salt(&self, idx: usize) -> [u8; SALT_LEN] {
        self.conns[idx].salt()
    }

    fn auth_hash(&self) -> Option<[u8; SCRAMBLE_LEN]> {
        Server::auth_hash(self)
    }

    fn session_uuid(&self, idx: usize) -> Option<[u8; 16]> {
        self.conns[idx].session_uuid()
    }

    fn set_session(&mut self, idx: usize, sid: SessionId, uuid: [u8; 16]) {
        let c = &mut self.conns[idx];
        c.sid = sid;
        c.set_session_uuid(uuid);
    }

    fn cluster_overview(&mut self) -> rmpv::Value {
        Server::cluster_overview(self)
    }

    fn http(&mut self) -> &mut HttpState {
        &mut self.http.state
    }

    fn http_conn(&mut self, idx: usize) -> Option<&mut HttpConn> {
        self.conns.get_mut(idx).and_then(|c| c.http_mut())
    }

    fn start_stream(&mut self, idx: usize) -> Result<(), usize> {
        Server::start_stream(self, idx)
    }

    fn cluster_tubes(
        &mut self,
    ) -> Option<std::sync::Arc<std::collections::HashMap<String, frontend::http::TubeTotals>>> {
        self.with_router(|r, cx| r.cluster_tubes(cx)).flatten()
    }

    fn metrics_page(&mut self, page: &mut String) {
        Server::metrics_page(self, page);
    }

    fn live(&self) -> &Live {
        &self.http.live
    }

    fn connection_counts(&self) -> serde_json::Value {
        Server::connection_counts(self)
    }

    fn console_figures(&self) -> serde_json::Value {
        Server::console_figures(self)
    }

    fn addresses(&self) -> [Option<std::net::SocketAddr>; 3] {
        [
            self.local_addr().ok(),
            self.beanstalk_addr(),
            self.http_addr(),
        ]
    }
}
