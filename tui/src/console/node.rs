//! What the console knows of this node and its group, which every pane may read: who is here,
//! the run, this node's backend. The panes own the rest (`panes/`); `state.rs` changes both.

use std::collections::BTreeMap;

use lockstep_node::config::RunConfig;
use lockstep_node::session::Stop;
use lockstep_node::verdict::Verdict;
use lockstep_node::wire::PeerId;

/// A peer's connection as the console sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Joining,
    Open,
    Left,
}

/// A member's place in the run's configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    /// Not in it (or no run).
    #[default]
    None,
    Voter,
    /// Follows the log, votes once it keeps up.
    Learner,
    /// Cannot compute: watches the run, never in its configuration.
    Observer,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PeerRow {
    pub backend: Option<String>,
    pub verdict: Option<Verdict>,
    pub link: Link,
    /// Last step whose weight and probe hashes matched (the guard passed), or the mismatch.
    pub agreed_at: Option<u32>,
    pub weight_mismatch: bool,
    pub probe_mismatch: bool,
    pub in_roster: bool,
    /// Its place in the run's configuration, as the log last said.
    pub role: Role,
    pub rtt_ms: Option<f64>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub repairs: u32,
}

impl PeerRow {
    fn new(link: Link) -> Self {
        PeerRow {
            backend: None,
            verdict: None,
            link,
            agreed_at: None,
            weight_mismatch: false,
            probe_mismatch: false,
            in_roster: false,
            role: Role::None,
            rtt_ms: None,
            bytes_in: 0,
            bytes_out: 0,
            repairs: 0,
        }
    }
}

/// The run's health.
#[derive(Clone, Debug, PartialEq)]
pub enum RunState {
    /// No run yet.
    Idle,
    /// A start was asked for; waiting for the group.
    Starting,
    Running,
    Finished,
    /// This node reaches no majority of the run's voters: nothing commits on its side until it
    /// does (it goes on by itself when the partition heals); the text says whom it reaches.
    NoMajority(String),
    /// The session stopped this node's run (the guard, a removal, a failed compute).
    Stopped(Stop),
}

#[derive(Clone, Debug)]
pub struct Node {
    pub me: Option<PeerId>,
    pub group: String,
    pub host: Option<PeerId>,
    pub leader: Option<PeerId>,
    /// Everyone we know of, us included.
    pub peers: BTreeMap<PeerId, PeerRow>,
    /// The signaling server is gone (the mesh trains on; joins wait for it).
    pub signal_lost: bool,
    /// What `s` starts.
    pub start_settings: RunConfig,
    pub run: Option<RunConfig>,
    pub run_state: RunState,
    pub step: u32,
    pub backend: String,
    pub verdict: Verdict,
    /// The hot-swap in progress, as one line.
    pub swap: Option<String>,
    /// Seconds since the console started.
    pub now: f64,
}

impl Node {
    pub fn new(backend: &str, verdict: &Verdict, start_settings: RunConfig) -> Self {
        Node {
            me: None,
            group: "connecting…".into(),
            host: None,
            leader: None,
            peers: BTreeMap::new(),
            signal_lost: false,
            start_settings,
            run: None,
            run_state: RunState::Idle,
            step: 0,
            backend: backend.to_string(),
            verdict: verdict.clone(),
            swap: None,
            now: 0.0,
        }
    }

    pub fn is_leader(&self) -> bool {
        self.me.is_some() && self.me == self.leader
    }

    pub fn is_host(&self) -> bool {
        self.me.is_some() && self.me == self.host
    }

    pub fn running(&self) -> bool {
        matches!(self.run_state, RunState::Running | RunState::Starting | RunState::NoMajority(_))
    }

    pub fn peer(&mut self, id: PeerId) -> &mut PeerRow {
        self.peers.entry(id).or_insert_with(|| PeerRow::new(Link::Joining))
    }

    pub fn open_channels(&self) -> usize {
        self.peers.values().filter(|p| p.link == Link::Open).count()
    }

    /// Members in the current step (at least this node).
    pub fn in_roster(&self) -> usize {
        self.peers.values().filter(|p| p.in_roster).count().max(1)
    }
}
