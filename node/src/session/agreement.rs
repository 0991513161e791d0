//! The run's agreement: a Raft group, TiKV's raft-rs `RawNode` — sans-I/O like the session
//! (`tick`, `step`, `ready`), so it lives inside the core and the simulations drive it.
//!
//! One run is one Raft group and one log (`log.rs`): its first entry is the run's settings;
//! then every decision the members must share — each step's commit record, each checkpoint push,
//! each change of who votes and who learns. Raft ids are the members' own ids. The group's
//! settings: pre-vote and check-quorum on (a member that wakes from a sleep cannot unseat a
//! healthy leader, and a leader that no longer hears a majority steps down), a fixed election
//! timeout per member drawn from its id (raft-rs would draw it from a thread-local random
//! generator; ours keeps simulations reproducible and still breaks ties between members), and
//! proposals only from the leader itself (a `MsgPropose` from the network is refused: no member
//! can slip an entry into the log through the leader).
//!
//! The log is kept in memory, and a process that restarts is a new member (a new id): a Raft
//! member must never come back having forgotten its log. The log keeps its last
//! [`KEPT_ENTRIES`] entries; a member further behind is sent a snapshot, whose data is the
//! log's state (`LogState`) — the weights travel beside it, as a resume (wire `-6`).

use std::panic::AssertUnwindSafe;

use protobuf::Message as _;
use raft::prelude::{
    ConfChange, ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType, Message as RaftMessage,
    MessageType, Snapshot,
};
use raft::storage::MemStorage;
use raft::{Config, RaftState, RawNode, StateRole, Storage};

use super::log::{LogEntry, LogError, LogState, StepRecord};
use crate::wire::{Epoch, PeerId};

/// Log entries kept below the last one applied (a member further behind gets a snapshot).
pub const KEPT_ENTRIES: u64 = 256;

/// How a member's Raft clock runs, in ticks of the session's [`AgreementTiming::tick_ms`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgreementTiming {
    /// Milliseconds per Raft tick.
    pub tick_ms: u64,
    /// The leader's heartbeat, in ticks.
    pub heartbeat_ticks: usize,
    /// The shortest election timeout, in ticks; each member's is this plus up to as much again,
    /// drawn from its id.
    pub election_ticks: usize,
}

impl Default for AgreementTiming {
    /// 100 ms ticks, a heartbeat every 300 ms, elections after 3–6 s of silence: a WAN link's
    /// 4 MiB send buffer drains in under a second at 50 Mbit/s, so a heartbeat queued behind
    /// a contribution still arrives in time.
    fn default() -> Self {
        AgreementTiming { tick_ms: 100, heartbeat_ticks: 3, election_ticks: 30 }
    }
}

impl AgreementTiming {
    /// `me`'s election timeout in ticks.
    pub fn election_ticks_of(&self, me: PeerId) -> usize {
        let spread = lockstep_luts::rng::SplitMix64::new(me).below(self.election_ticks as u64 + 1) as usize;
        self.election_ticks + spread
    }

    /// The longest election timeout any member may have, in ms.
    pub fn longest_election_ms(&self) -> u64 {
        2 * self.election_ticks as u64 * self.tick_ms
    }
}

/// A change of the run's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Add as a learner, or demote a voter to one.
    Learner(PeerId),
    /// Add as a voter, or promote a learner.
    Voter(PeerId),
    Remove(PeerId),
}

/// What the log committed, in order, for the session to act on.
#[derive(Clone, Debug, PartialEq)]
pub enum Committed {
    /// The run's first entry.
    Run(crate::config::RunConfig),
    Step {
        record: StepRecord,
        index: u64,
        term: u64,
    },
    Push {
        epoch: Epoch,
        digest: u64,
    },
    /// The configuration changed: who votes, who learns.
    Members {
        voters: Vec<PeerId>,
        learners: Vec<PeerId>,
        index: u64,
    },
    /// An audit's verdict (`audit.rs`).
    Verdict(crate::wire::AuditVerdict),
    /// A snapshot replaced the log below `index`: this is the state it amounts to.
    State {
        state: LogState,
        index: u64,
    },
}

/// Why the agreement refused something or stopped.
#[derive(Clone, Debug, PartialEq)]
pub enum AgreementError {
    /// Bytes that are not a Raft message, or a message that is not for us from its sender.
    Malformed(String),
    /// A message this node never takes from the network (a proposal, a local message).
    Refused(&'static str),
    /// A committed entry that is not one of ours (another protocol, or garbage).
    Entry(LogError),
    /// raft-rs gave up (it panics on states it deems impossible): this node cannot go on in the
    /// run.
    Broken(String),
}

impl std::fmt::Display for AgreementError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgreementError::Malformed(why) => write!(f, "a malformed agreement message: {why}"),
            AgreementError::Refused(what) => write!(f, "an agreement message refused: {what}"),
            AgreementError::Entry(e) => write!(f, "a committed log entry that does not read: {e}"),
            AgreementError::Broken(why) => write!(f, "the agreement core stopped: {why}"),
        }
    }
}

impl std::error::Error for AgreementError {}

/// What one round of `poll` yields.
#[derive(Debug, Default)]
pub struct Polled {
    /// Encoded Raft messages to send, in order.
    pub messages: Vec<(PeerId, Vec<u8>)>,
    pub committed: Vec<Committed>,
    /// Committed entries that did not read (reported, skipped).
    pub errors: Vec<AgreementError>,
}

/// raft-rs's in-memory storage, with the log's state as the snapshot's data.
struct LogStore {
    memory: MemStorage,
    snapshot: Snapshot,
}

impl Storage for LogStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.memory.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: raft::GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.memory.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.memory.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.memory.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.memory.last_index()
    }

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot.get_data().is_empty() {
            return Err(raft::Error::Store(raft::StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(self.snapshot.clone())
    }
}

/// One member's part of a run's Raft group.
pub struct Agreement {
    run: u64,
    me: PeerId,
    node: RawNode<LogStore>,
    /// The state the committed entries amount to (none before the run's entry or a snapshot).
    state: Option<LogState>,
}

impl std::fmt::Debug for Agreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agreement")
            .field("run", &self.run)
            .field("me", &self.me)
            .field("term", &self.term())
            .field("leader", &self.leader())
            .field("commit", &self.commit_index())
            .finish()
    }
}

/// Runs `f` on raft-rs, turning its panics into an error.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, AgreementError> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".to_string());
        AgreementError::Broken(why)
    })
}

fn members_of(conf: &ConfState) -> (Vec<PeerId>, Vec<PeerId>) {
    let mut voters: Vec<PeerId> = conf.get_voters().to_vec();
    voters.extend(conf.get_voters_outgoing().iter().filter(|v| !conf.get_voters().contains(v)));
    let mut learners: Vec<PeerId> = conf.get_learners().to_vec();
    learners.extend(conf.get_learners_next());
    voters.sort_unstable();
    learners.sort_unstable();
    (voters, learners)
}

impl Agreement {
    fn new(me: PeerId, run: u64, timing: AgreementTiming, memory: MemStorage) -> Result<Agreement, AgreementError> {
        let election = timing.election_ticks_of(me);
        let config = Config {
            id: me,
            election_tick: election,
            heartbeat_tick: timing.heartbeat_ticks,
            // One fixed timeout per member (see the module docs).
            min_election_tick: election,
            max_election_tick: election + 1,
            check_quorum: true,
            pre_vote: true,
            max_size_per_msg: 1024 * 1024,
            max_inflight_msgs: 256,
            ..Config::default()
        };
        config.validate().map_err(|e| AgreementError::Broken(e.to_string()))?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let store = LogStore { memory, snapshot: Snapshot::default() };
        let node = RawNode::new(&config, store, &logger).map_err(|e| AgreementError::Broken(e.to_string()))?;
        Ok(Agreement { run, me, node, state: None })
    }

    /// The run's starter: the group's one voter, leading at once, its log opening with its own
    /// place as a voter (the configuration it began with is not an entry, and every member
    /// must learn it from the log) and the run's entry.
    pub fn bootstrap(
        me: PeerId,
        run: u64,
        timing: AgreementTiming,
        settings: crate::config::RunConfig,
    ) -> Result<Agreement, AgreementError> {
        let memory = MemStorage::new_with_conf_state((vec![me], Vec::<u64>::new()));
        let mut agreement = Agreement::new(me, run, timing, memory)?;
        guarded(|| agreement.node.campaign())?.map_err(|e| AgreementError::Broken(e.to_string()))?;
        if !agreement.change(Change::Voter(me))? || !agreement.propose(&LogEntry::Run(settings))? {
            return Err(AgreementError::Broken("a new run's leader could not open its log".into()));
        }
        Ok(agreement)
    }

    /// A member the run's leader reached: an empty log, filled by the leader (entries or a
    /// snapshot); it votes only once the log says it does.
    pub fn join(me: PeerId, run: u64, timing: AgreementTiming) -> Result<Agreement, AgreementError> {
        Agreement::new(me, run, timing, MemStorage::new())
    }

    /// Which run's log this is.
    pub fn run(&self) -> u64 {
        self.run
    }

    pub fn term(&self) -> u64 {
        self.node.raft.term
    }

    /// The leader as this member knows it.
    pub fn leader(&self) -> Option<PeerId> {
        Some(self.node.raft.leader_id).filter(|&id| id != raft::INVALID_ID)
    }

    pub fn is_leader(&self) -> bool {
        self.node.raft.state == StateRole::Leader
    }

    /// The leader's own term has an entry committed: everything before it in its log is too,
    /// so what it proposes next cannot be overtaken by an older leader's proposals.
    pub fn leads_with_a_committed_term(&self) -> bool {
        self.is_leader() && self.node.raft.commit_to_current_term()
    }

    pub fn commit_index(&self) -> u64 {
        self.node.raft.raft_log.committed
    }

    /// The log's state so far (none before the run's entry or a snapshot reached us).
    pub fn state(&self) -> Option<&LogState> {
        self.state.as_ref()
    }

    /// Voters and learners, ascending.
    pub fn members(&self) -> (Vec<PeerId>, Vec<PeerId>) {
        members_of(&self.node.raft.prs().conf().to_conf_state())
    }

    pub fn is_voter(&self, peer: PeerId) -> bool {
        self.node.raft.prs().conf().voters().contains(peer)
    }

    /// In the configuration at all (a voter or a learner).
    pub fn is_member(&self, peer: PeerId) -> bool {
        self.node.raft.prs().get(peer).is_some()
    }

    /// (Leader) whether `peer`'s log has everything up to `index`.
    pub fn has_replicated(&self, peer: PeerId, index: u64) -> bool {
        self.node.raft.prs().get(peer).is_some_and(|p| p.matched >= index)
    }

    /// (Leader) whether a configuration change is proposed and not yet applied.
    pub fn changing(&self) -> bool {
        self.node.raft.has_pending_conf()
    }

    /// The index of the log's last entry.
    pub fn last_index(&self) -> u64 {
        self.node.raft.raft_log.last_index()
    }

    /// The first step record after the committed entries, itself not committed yet, where only
    /// configuration changes (or a new leader's empty entry) stand between: what the weights may
    /// take tentatively while the record is replicated. Another leader may still replace it.
    pub fn next_uncommitted_step(&self) -> Option<(StepRecord, u64, u64)> {
        let log = &self.node.raft.raft_log;
        let first = log.committed + 1;
        for index in first..=log.last_index().min(first + 8) {
            let entries = log.entries(index, 1, raft::GetEntriesContext::empty(false)).ok()?;
            let entry = entries.first()?;
            match entry.get_entry_type() {
                EntryType::EntryNormal if entry.get_data().is_empty() => {}
                EntryType::EntryNormal => {
                    return match LogEntry::decode(entry.get_data()) {
                        Ok(LogEntry::Step(record)) => Some((record, index, entry.get_term())),
                        _ => None,
                    };
                }
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {}
            }
        }
        None
    }

    /// The step records a leader's append message would add that this log does not hold yet;
    /// `None` for any other message (or one that does not parse: `step` refuses those). The
    /// session looks at them before the message is taken (`session/appends.rs`).
    pub fn appended_records(&self, bytes: &[u8]) -> Option<Vec<StepRecord>> {
        let message = RaftMessage::parse_from_bytes(bytes).ok()?;
        if message.get_msg_type() != MessageType::MsgAppend {
            return None;
        }
        let records = message
            .get_entries()
            .iter()
            .filter(|e| e.get_entry_type() == EntryType::EntryNormal && !e.get_data().is_empty())
            .filter(|e| !self.holds_entry(e.get_index(), e.get_term()))
            .filter_map(|e| match LogEntry::decode(e.get_data()) {
                Ok(LogEntry::Step(record)) => Some(record),
                _ => None,
            })
            .collect();
        Some(records)
    }

    /// Whether the log holds an entry of `term` at `index` (false once a leader of a later term
    /// replaced or cut it — the entry there may be committed since, as another). One compacted
    /// away (no term known) is held where it was committed.
    pub fn holds_entry(&self, index: u64, term: u64) -> bool {
        let log = &self.node.raft.raft_log;
        match log.term(index) {
            Ok(t) if t != 0 => t == term,
            _ => index <= log.committed,
        }
    }

    /// One tick of the Raft clock.
    pub fn tick(&mut self) -> Result<(), AgreementError> {
        guarded(|| {
            self.node.tick();
        })
    }

    /// A message from `from`, as the wire carried it.
    pub fn step(&mut self, from: PeerId, bytes: &[u8]) -> Result<(), AgreementError> {
        let message = RaftMessage::parse_from_bytes(bytes).map_err(|e| AgreementError::Malformed(e.to_string()))?;
        if message.from != from || message.to != self.me {
            return Err(AgreementError::Malformed(format!(
                "a message from {} to {} over the link from {from}",
                message.from, message.to
            )));
        }
        match message.get_msg_type() {
            MessageType::MsgPropose => return Err(AgreementError::Refused("a proposal (only the leader proposes)")),
            MessageType::MsgHup
            | MessageType::MsgBeat
            | MessageType::MsgUnreachable
            | MessageType::MsgSnapStatus
            | MessageType::MsgCheckQuorum => return Err(AgreementError::Refused("a local message")),
            _ => {}
        }
        match guarded(|| self.node.step(message))? {
            // A response from a member no longer in the configuration, a stale one: harmless.
            Ok(()) | Err(raft::Error::StepPeerNotFound) => Ok(()),
            Err(e) => Err(AgreementError::Malformed(e.to_string())),
        }
    }

    /// (Leader) appends `entry` to the log; false if this member does not lead.
    pub fn propose(&mut self, entry: &LogEntry) -> Result<bool, AgreementError> {
        if !self.is_leader() {
            return Ok(false);
        }
        let bytes = entry.encode();
        Ok(guarded(|| self.node.propose(Vec::new(), bytes))?.is_ok())
    }

    /// (Leader) proposes one configuration change; false if this member does not lead or a
    /// change is already under way (one at a time).
    pub fn change(&mut self, change: Change) -> Result<bool, AgreementError> {
        if !self.is_leader() || self.changing() {
            return Ok(false);
        }
        let (peer, kind) = match change {
            Change::Learner(p) => (p, ConfChangeType::AddLearnerNode),
            Change::Voter(p) => (p, ConfChangeType::AddNode),
            Change::Remove(p) => (p, ConfChangeType::RemoveNode),
        };
        let mut single = ConfChangeSingle::default();
        single.set_change_type(kind);
        single.node_id = peer;
        let mut cc = ConfChangeV2::default();
        cc.set_changes(vec![single].into());
        Ok(guarded(|| self.node.propose_conf_change(Vec::new(), cc))?.is_ok())
    }

    /// `peer`'s link is gone: what raft-rs sends it is lost (a snapshot under way is sent again
    /// once it answers).
    pub fn unreachable(&mut self, peer: PeerId) {
        if self.is_member(peer) {
            let _ = guarded(|| {
                self.node.report_unreachable(peer);
                self.node.report_snapshot(peer, raft::SnapshotStatus::Failure);
            });
        }
    }

    /// (Leader) hands the lead to `to` (a voter): for a leader that quits.
    pub fn transfer_lead(&mut self, to: PeerId) -> Result<(), AgreementError> {
        guarded(|| self.node.transfer_leader(to))
    }

    /// Everything raft-rs has ready: messages to send, entries to keep, committed entries to
    /// apply (configuration changes are applied here; the rest go to the session, in order).
    pub fn poll(&mut self) -> Result<Polled, AgreementError> {
        let mut polled = Polled::default();
        while self.node.has_ready() {
            let mut ready = self.node.ready();
            self.take_messages(ready.take_messages(), &mut polled);
            if !ready.snapshot().is_empty() {
                let snapshot = ready.snapshot().clone();
                self.install(snapshot, &mut polled)?;
            }
            let committed = ready.take_committed_entries();
            self.apply(committed, &mut polled)?;
            self.node
                .mut_store()
                .memory
                .wl()
                .append(ready.entries())
                .map_err(|e| AgreementError::Broken(e.to_string()))?;
            if let Some(hard) = ready.hs() {
                self.node.mut_store().memory.wl().set_hardstate(hard.clone());
            }
            self.take_messages(ready.take_persisted_messages(), &mut polled);
            let mut light = guarded(|| self.node.advance(ready))?;
            if let Some(commit) = light.commit_index() {
                self.node.mut_store().memory.wl().mut_hard_state().set_commit(commit);
            }
            self.take_messages(light.take_messages(), &mut polled);
            let committed = light.take_committed_entries();
            self.apply(committed, &mut polled)?;
            guarded(|| self.node.advance_apply())?;
        }
        self.keep_snapshot();
        Ok(polled)
    }

    fn take_messages(&self, messages: Vec<RaftMessage>, polled: &mut Polled) {
        for message in messages {
            if let Ok(bytes) = message.write_to_bytes() {
                polled.messages.push((message.to, bytes));
            }
        }
    }

    /// A snapshot from the leader replaces our log below its index.
    fn install(&mut self, snapshot: Snapshot, polled: &mut Polled) -> Result<(), AgreementError> {
        let index = snapshot.get_metadata().get_index();
        let conf = snapshot.get_metadata().get_conf_state().clone();
        let state = LogState::decode(snapshot.get_data()).map_err(AgreementError::Entry)?;
        self.node
            .mut_store()
            .memory
            .wl()
            .apply_snapshot(snapshot)
            .map_err(|e| AgreementError::Broken(e.to_string()))?;
        self.state = Some(state);
        polled.committed.push(Committed::State { state, index });
        let (voters, learners) = members_of(&conf);
        polled.committed.push(Committed::Members { voters, learners, index });
        Ok(())
    }

    fn apply(&mut self, entries: Vec<Entry>, polled: &mut Polled) -> Result<(), AgreementError> {
        for entry in entries {
            let index = entry.get_index();
            match entry.get_entry_type() {
                EntryType::EntryNormal if entry.get_data().is_empty() => {} // a new leader's first entry
                EntryType::EntryNormal => match LogEntry::decode(entry.get_data()) {
                    Ok(decoded) => self.applied(decoded, index, entry.get_term(), polled),
                    Err(e) => polled.errors.push(AgreementError::Entry(e)),
                },
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    let applied = if entry.get_entry_type() == EntryType::EntryConfChange {
                        let mut cc = ConfChange::default();
                        cc.merge_from_bytes(entry.get_data()).map_err(|e| AgreementError::Broken(e.to_string()))?;
                        guarded(|| self.node.apply_conf_change(&cc))?
                    } else {
                        let mut cc = ConfChangeV2::default();
                        cc.merge_from_bytes(entry.get_data()).map_err(|e| AgreementError::Broken(e.to_string()))?;
                        guarded(|| self.node.apply_conf_change(&cc))?
                    };
                    // A change raft-rs refuses (it cannot be proposed by this code) leaves
                    // the configuration as it was, on every member alike.
                    if let Ok(conf) = applied {
                        self.node.mut_store().memory.wl().set_conf_state(conf.clone());
                        let (voters, learners) = members_of(&conf);
                        polled.committed.push(Committed::Members { voters, learners, index });
                    }
                }
            }
        }
        Ok(())
    }

    /// A committed entry: the log's state moves on, the session hears of it.
    fn applied(&mut self, entry: LogEntry, index: u64, term: u64, polled: &mut Polled) {
        match entry {
            LogEntry::Run(run) => {
                self.state = Some(LogState { run, epoch: Epoch::default(), step: 0, whash: 0 });
                polled.committed.push(Committed::Run(run));
            }
            LogEntry::Step(record) => {
                if let Some(state) = &mut self.state {
                    state.step = record.step;
                    state.whash = record.whash;
                }
                polled.committed.push(Committed::Step { record, index, term });
            }
            LogEntry::Push { epoch, digest } => {
                if let Some(state) = &mut self.state {
                    // No step committed since the push yet.
                    (state.epoch, state.step, state.whash) = (epoch, 0, 0);
                }
                polled.committed.push(Committed::Push { epoch, digest });
            }
            LogEntry::Verdict(verdict) => polled.committed.push(Committed::Verdict(verdict)),
        }
    }

    /// The snapshot a member far behind is sent: the state at the last entry applied; the log
    /// below [`KEPT_ENTRIES`] under it is dropped.
    fn keep_snapshot(&mut self) {
        let Some(state) = self.state else { return };
        let applied = self.node.raft.raft_log.applied;
        if applied == 0 || self.node.store().snapshot.get_metadata().get_index() == applied {
            return;
        }
        let Ok(term) = self.node.raft.raft_log.term(applied) else { return };
        let conf = self.node.raft.prs().conf().to_conf_state();
        let store = self.node.mut_store();
        let mut snapshot = Snapshot::default();
        snapshot.set_data(state.encode().into());
        let meta = snapshot.mut_metadata();
        meta.set_index(applied);
        meta.set_term(term);
        meta.set_conf_state(conf);
        store.snapshot = snapshot;
        if applied > KEPT_ENTRIES {
            let _ = store.memory.wl().compact(applied - KEPT_ENTRIES);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RunConfig;

    fn timing() -> AgreementTiming {
        AgreementTiming { tick_ms: 10, heartbeat_ticks: 1, election_ticks: 5 }
    }

    /// Delivers every message until nothing moves; returns what each member committed.
    fn settle(members: &mut [&mut Agreement]) -> Vec<Vec<Committed>> {
        let mut committed = vec![Vec::new(); members.len()];
        loop {
            let mut mail = Vec::new();
            for (i, m) in members.iter_mut().enumerate() {
                let polled = m.poll().unwrap();
                committed[i].extend(polled.committed);
                mail.extend(polled.messages.into_iter().map(|(to, bytes)| (m.me, to, bytes)));
            }
            if mail.is_empty() {
                return committed;
            }
            for (from, to, bytes) in mail {
                if let Some(m) = members.iter_mut().find(|m| m.me == to) {
                    m.step(from, &bytes).unwrap();
                }
            }
        }
    }

    #[test]
    fn a_starter_leads_at_once_and_a_learner_then_voter_follows_the_log() {
        let mut a = Agreement::bootstrap(1, 7, timing(), RunConfig::DEFAULT).unwrap();
        assert!(a.is_leader());
        let mut b = Agreement::join(2, 7, timing()).unwrap();
        settle(&mut [&mut a]);
        assert!(a.change(Change::Learner(2)).unwrap());
        assert!(!a.change(Change::Voter(2)).unwrap(), "one change at a time");
        let committed = settle(&mut [&mut a, &mut b]);
        assert!(committed[1].contains(&Committed::Run(RunConfig::DEFAULT)), "{:?}", committed[1]);
        assert_eq!(b.members(), (vec![1], vec![2]));
        assert!(a.has_replicated(2, a.commit_index()));
        assert!(a.change(Change::Voter(2)).unwrap());
        settle(&mut [&mut a, &mut b]);
        assert_eq!(b.members(), (vec![1, 2], vec![]));
        let record = StepRecord { step: 1, whash: 9, contributions: vec![] };
        assert!(a.propose(&LogEntry::Step(record.clone())).unwrap());
        assert!(!b.propose(&LogEntry::Step(record.clone())).unwrap(), "only the leader proposes");
        let committed = settle(&mut [&mut a, &mut b]);
        for c in &committed {
            assert!(c.iter().any(|c| matches!(c, Committed::Step { record: r, .. } if *r == record)), "{c:?}");
        }
        assert_eq!(b.state().map(|s| (s.step, s.whash)), Some((1, 9)));
    }

    #[test]
    fn proposals_and_spoofed_messages_from_the_network_are_refused() {
        let mut a = Agreement::bootstrap(1, 7, timing(), RunConfig::DEFAULT).unwrap();
        let mut propose = RaftMessage::default();
        propose.set_msg_type(MessageType::MsgPropose);
        propose.from = 2;
        propose.to = 1;
        let bytes = propose.write_to_bytes().unwrap();
        assert!(matches!(a.step(2, &bytes), Err(AgreementError::Refused(_))));
        assert!(matches!(a.step(3, &bytes), Err(AgreementError::Malformed(_))), "from another link");
        assert!(matches!(a.step(2, &[0xff, 0xff, 0xff]), Err(AgreementError::Malformed(_))));
    }

    #[test]
    fn every_member_has_its_own_election_timeout() {
        let t = AgreementTiming::default();
        let ticks: std::collections::BTreeSet<usize> = (1..=8u64).map(|id| t.election_ticks_of(id)).collect();
        assert!(ticks.len() >= 6, "{ticks:?}");
        assert!(ticks.iter().all(|&e| (t.election_ticks..=2 * t.election_ticks).contains(&e)));
    }
}
