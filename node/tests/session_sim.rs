//! The session core on a simulated network: seeded reordering across links (each link stays
//! FIFO, like a reliable ordered data channel), seeded loss, a cut link, churn, a late joiner,
//! a leader that leaves, partitions, sleeps, a checkpoint push, corrupted weights and a wrong
//! probe hash. Every scenario must end bit-identical, or stopped by the guard — never forked —
//! and every step anyone applied must be one the group committed.
//!
//! The trainer here is a toy (16 weights, a gradient that depends on the weights, the node and
//! the step), standing in for the model in a unit test of the sans-I/O core; everything the
//! session decides — the Raft log, records, averaging order, guard, repair, resume — is the real
//! thing.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use lockstep_luts::hash::fnv1a32_f32;
use lockstep_luts::rng::SplitMix64;
use lockstep_node::audit::{Departure, Trace, Traced, Urgency, TRACE_CHUNK_WORDS};
use lockstep_node::config::{ModelConfig, RunConfig};
use lockstep_node::session::{
    AgreementTiming, DropReason, Event, Failure, Ignored, Input, LeaderAction, Output, Problem, Recomputed, Session,
    SessionConfig, StepDeadline, Stop, Task, WeightsChecked, SHUN_LAPSES_ELECTIONS,
};
use lockstep_node::sync::{self, Compression, Exchange, Packed, SyncConfig, SyncMode, Values};
use lockstep_node::wire::{
    state_chunk_digests, state_digest, words_digest, Epoch, Evidence, Gradient, Message, PeerId, Removal, ServedState,
    StatePart, TraceAnswer, MESH_PROTOCOL_VERSION,
};

const PHASH: u32 = 0xdf23_2627;
/// The op code a toy step's one op has in its trace (the products').
const MATMUL: u32 = 1;
const LEN: usize = 2 * lockstep_node::wire::STATE_CHUNK + 16;

fn settings(steps: u32) -> RunConfig {
    settings_with(steps, SyncConfig::SEED)
}

fn settings_with(steps: u32, sync: SyncConfig) -> RunConfig {
    RunConfig {
        model: ModelConfig { width: 16, context: 16, layers: 1, heads: 2 },
        batch: 2,
        steps,
        lr: 0.1,
        seed: 7,
        sync,
        corpus: 0,
    }
}

/// The Raft clock of the simulations: 10 ms ticks (one a simulated tick), heartbeats every
/// 20 ms, elections after 150–300 ms of silence.
const TIMING: AgreementTiming = AgreementTiming { tick_ms: 10, heartbeat_ticks: 2, election_ticks: 15 };

/// The run's int8 settings.
fn int8() -> SyncConfig {
    SyncConfig { compression: Compression::Int8, ..SyncConfig::SEED }
}

/// `outer:4` with int8 in elastic windows (the toy trains the same way; the session weighs the
/// contributions).
fn elastic() -> SyncConfig {
    SyncConfig { mode: SyncMode::Outer { inner_steps: 4 }, elastic: true, ..int8() }
}

/// The toy trainer: weights, a gradient, an update, a checkpoint.
#[derive(Clone, Debug, PartialEq)]
struct Toy {
    step: u32,
    weights: Vec<f32>,
}

impl Toy {
    fn fresh(seed: u64) -> Toy {
        let mut rng = SplitMix64::new(seed);
        Toy { step: 0, weights: (0..LEN).map(|_| rng.next_signed_unit()).collect() }
    }

    fn gradient(&self, me: PeerId, step: u32) -> Vec<f32> {
        self.weights
            .iter()
            .enumerate()
            .map(|(i, w)| w * 0.25 + ((me as usize * 31 + step as usize * 7 + i) % 13) as f32 * 0.01 - 0.06)
            .collect()
    }

    /// The gradient a backend computes: the definition's, or with value `wrong`'s lowest bit
    /// flipped.
    fn computed(&self, me: PeerId, step: u32, wrong: Option<usize>) -> Vec<f32> {
        let mut grad = self.gradient(me, step);
        if let Some(i) = wrong {
            grad[i] = f32::from_bits(grad[i].to_bits() ^ 1);
        }
        grad
    }

    /// A toy step's trace: one op (the gradient product, buffer 1), its words' chunk digests.
    fn trace(grad: &[f32]) -> Trace {
        let words: Vec<u32> = grad.iter().map(|g| g.to_bits()).collect();
        Trace { ops: vec![words.chunks(TRACE_CHUNK_WORDS).map(words_digest).collect()] }
    }

    fn apply(&mut self, gradient: &[f32]) {
        self.apply_at(gradient, 0.1);
    }

    fn apply_at(&mut self, gradient: &[f32], lr: f32) {
        for (w, g) in self.weights.iter_mut().zip(gradient) {
            *w -= lr * g;
        }
        self.step += 1;
    }

    fn hash(&self) -> u32 {
        fnv1a32_f32(&self.weights)
    }

    fn encode(&self) -> Vec<u8> {
        let mut bytes = self.step.to_le_bytes().to_vec();
        for w in &self.weights {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        bytes
    }

    fn decode(bytes: &[u8]) -> Option<Toy> {
        if bytes.len() != 4 + 4 * LEN {
            return None;
        }
        let step = u32::from_le_bytes(bytes[..4].try_into().ok()?);
        let weights = bytes[4..].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        Some(Toy { step, weights })
    }
}

struct Node {
    session: Session,
    toy: Toy,
    /// `int8`: what this node's contributions left untaken (its own; a restore clears it),
    /// and the values and packing of the contribution in flight.
    residual: Vec<f32>,
    packed: Option<(Vec<f32>, Packed)>,
    alive: bool,
    /// Gradients asked for, in order: each is computed from the weights as they were when it
    /// was asked for, like a real backend that starts at once and answers later.
    computing: VecDeque<Gradient>,
    /// Weight hash after each applied step.
    hashes: BTreeMap<u32, u32>,
    /// Every step applied, in order, with the epoch it was applied in and its weight hash (a
    /// restore does not rewrite it).
    log: Vec<(Epoch, u32, u32)>,
    events: Vec<Event>,
    /// Report this probe hash instead of the healthy one.
    phash: u32,
    /// A rogue: send this value everywhere in the contribution (int8: a block exponent of
    /// this many powers of two) instead of the honest one, with the honest hashes.
    poison: Option<f32>,
    /// Elastic windows: windows this node ended early, and their steps.
    hurried: u32,
    hurried_at: BTreeSet<u32>,
    /// What it says computes on it; an observer cannot compute.
    computes: bool,
    /// Says it computes, is asked to, never answers.
    lazy: bool,
    /// The state before a step taken tentatively (weights, residual, packing), until the step
    /// stands or is undone.
    undo: Option<Undo>,
    /// Steps taken tentatively, and how many of them were undone.
    tentative: u32,
    undone: u32,
    /// `outer:H`: a window was computed since the last apply (a real replica's weights are then
    /// mid-window: no checkpoint may be taken of them).
    mid_window: bool,
    /// The weights each recent step was computed from (what an audit of it recomputes from).
    computed_from: BTreeMap<u32, Toy>,
    /// A rogue of a subtler kind: its f32 contributions scaled by this factor (finite, in bounds:
    /// only an audit can see it).
    scale: Option<f32>,
    /// Packed runs: the residual each recent contribution was packed with (what it serves an
    /// auditor).
    states: BTreeMap<u32, Vec<f32>>,
    /// A rogue that doubles its residual before each packed contribution (each consistent with
    /// the state it names, which its past did not leave).
    forge: bool,
    /// A rogue that serves no state when asked.
    withhold: bool,
    /// Its recomputations take turns as its computes do (not done at once): its worker is busy
    /// while assignments come.
    slow_audits: bool,
    /// How many turns each of its slow recomputations takes (each under way takes its own turns,
    /// as the threads of several workers do).
    audit_turns: u32,
    /// Its recomputations under way: the turns each has left, and its answer.
    auditing: VecDeque<(u32, Input)>,
    /// Serves no state to this member, for the first step it asks of, so many times (an
    /// audit's requests; their answers lost to it alone).
    withhold_from: Option<(PeerId, u32, Option<u32>)>,
    /// States asked of it: (whole, some chunks, the digests alone).
    asked: (u32, u32, u32),
    /// A rogue (leader) that never hears an accusation against itself.
    deaf: bool,
    /// A wrong backend: value `i` of every gradient it computes has its lowest bit flipped —
    /// in its contributions and in its trace of a step alike (what a dispute narrows to).
    wrong_value: Option<usize>,
    /// Answers no trace request (a dispute ends on the contribution's evidence).
    untraced: bool,
    /// Its routine audits never end (a worker the machine never leaves a spare cycle); its
    /// checks of accusations do.
    routine_never_ends: bool,
    /// Trace requests it answered (each a run of its step).
    traces_served: u32,
    /// The guard's disputes: the toy before each recent update, and the mean it applied.
    updates: BTreeMap<u32, (Toy, Vec<f32>)>,
    /// A hidden state gone wrong (as an optimizer's moments, which no contribution names): its
    /// updates step at this rate, and its check of them runs them so too.
    hidden_lr: Option<f32>,
}

/// A node's state before a step taken tentatively: weights, residual, packing in flight.
type Undo = (Toy, Vec<f32>, Option<(Vec<f32>, Packed)>);

/// The network: one FIFO queue per directed link.
struct Net {
    rng: SplitMix64,
    nodes: BTreeMap<PeerId, Node>,
    links: BTreeMap<(PeerId, PeerId), VecDeque<Message>>,
    /// Directed links that drop everything.
    cut: BTreeSet<(PeerId, PeerId)>,
    /// Directed links whose messages wait, undelivered, until released (a netns cut under
    /// SCTP's retransmissions: what was sent arrives after the cut heals).
    held: BTreeSet<(PeerId, PeerId)>,
    /// Links released from a hold: what waited in them arrives at once (SCTP's retransmission
    /// flushes the backlog), then they carry as any other.
    draining: BTreeSet<(PeerId, PeerId)>,
    /// Per-mille chance that a contribution, repair or Raft message is lost.
    loss_per_mille: u64,
    now_ms: u64,
    delivered: u64,
    /// Contributions delivered whole (not repairs), headers, chunks and chunk sums (chunk
    /// owners' share).
    delivered_kinds: [u64; 4],
    /// Nodes suspended (as by SIGSTOP): they compute, receive, send and tick nothing; what is
    /// sent to them waits in the links.
    hung: BTreeSet<PeerId>,
    deadline: StepDeadline,
    /// The sync settings of runs started here.
    sync: SyncConfig,
    /// What a suspended node learns the moment it wakes (its links died while it slept).
    on_wake: BTreeMap<PeerId, Vec<Input>>,
    /// Elastic windows: the leaders' slow-member rule (`SessionConfig::slow_windows`).
    slow_windows: u32,
    /// Elastic windows: nodes that finish a window only once told to end it, after one step.
    slow: BTreeSet<PeerId>,
    /// Whether nodes joined from now on compute behind the commit (`SessionConfig::compute_ahead`).
    compute_ahead: bool,
    /// Audits by recomputation of nodes joined from now on (`SessionConfig::audit_rate`).
    audit_rate: u32,
    /// Contributions lost on every link, (author, step): whole, repaired or by chunks — as if
    /// they never left their author — and when the first was lost.
    lost: BTreeSet<(PeerId, u32)>,
    lost_at: Option<u64>,
    /// How much of a state their routine audits ask for (`SessionConfig::audit_state_part`).
    audit_state_part: u32,
    /// How many audits each runs at once (`SessionConfig::audit_workers`).
    audit_workers: u32,
}

impl Net {
    fn new(seed: u64) -> Net {
        Net {
            rng: SplitMix64::new(seed),
            nodes: BTreeMap::new(),
            links: BTreeMap::new(),
            cut: BTreeSet::new(),
            held: BTreeSet::new(),
            draining: BTreeSet::new(),
            loss_per_mille: 0,
            now_ms: 0,
            delivered: 0,
            delivered_kinds: [0; 4],
            hung: BTreeSet::new(),
            deadline: StepDeadline::default(),
            sync: SyncConfig::SEED,
            on_wake: BTreeMap::new(),
            slow_windows: 0,
            slow: BTreeSet::new(),
            compute_ahead: true,
            audit_rate: 0,
            audit_state_part: 1000,
            audit_workers: 1,
            lost: BTreeSet::new(),
            lost_at: None,
        }
    }

    /// Adds a node and connects it to every live node.
    fn join(&mut self, id: PeerId) {
        self.join_as(id, true);
    }

    /// Adds a node that can compute, or an observer (`computes` false).
    fn join_as(&mut self, id: PeerId, computes: bool) {
        let config = SessionConfig {
            me: id,
            expected_phash: PHASH,
            repair_after_ms: 50,
            deadline: self.deadline,
            slow_windows: self.slow_windows,
            computes,
            agreement: TIMING,
            compute_ahead: self.compute_ahead,
            audit_rate: self.audit_rate,
            audit_state_part: self.audit_state_part,
            audit_workers: self.audit_workers,
        };
        let node = Node {
            session: Session::new(config),
            toy: Toy::fresh(0),
            residual: vec![0.0; LEN],
            packed: None,
            alive: true,
            computing: VecDeque::new(),
            hashes: BTreeMap::new(),
            log: Vec::new(),
            events: Vec::new(),
            phash: PHASH,
            poison: None,
            hurried: 0,
            hurried_at: BTreeSet::new(),
            computes,
            lazy: false,
            undo: None,
            tentative: 0,
            undone: 0,
            mid_window: false,
            computed_from: BTreeMap::new(),
            scale: None,
            states: BTreeMap::new(),
            forge: false,
            withhold: false,
            withhold_from: None,
            slow_audits: false,
            audit_turns: 1,
            auditing: VecDeque::new(),
            asked: (0, 0, 0),
            deaf: false,
            wrong_value: None,
            untraced: false,
            routine_never_ends: false,
            traces_served: 0,
            updates: BTreeMap::new(),
            hidden_lr: None,
        };
        let others: Vec<PeerId> = self.live();
        self.nodes.insert(id, node);
        for other in others {
            self.connect(other, id);
        }
    }

    /// A channel opens between `a` and `b`; each hears what the other computes on (`-9`).
    fn connect(&mut self, a: PeerId, b: PeerId) {
        let computes = |net: &Net, id: PeerId| net.nodes[&id].computes;
        let (ca, cb) = (computes(self, a), computes(self, b));
        for (me, other, computes) in [(a, b, cb), (b, a, ca)] {
            let inputs = [Input::Connected(other), Input::PeerInfo { peer: other, computes }];
            if self.hung.contains(&me) {
                // A suspended node learns it in order when it wakes (after the links it lost).
                self.on_wake.entry(me).or_default().extend(inputs);
            } else {
                for input in inputs {
                    self.input(me, input);
                }
            }
        }
    }

    fn live(&self) -> Vec<PeerId> {
        self.nodes.iter().filter(|(_, n)| n.alive).map(|(id, _)| *id).collect()
    }

    fn kill(&mut self, id: PeerId) {
        self.nodes.get_mut(&id).unwrap().alive = false;
        self.links.retain(|(from, to), _| *from != id && *to != id);
        for other in self.live() {
            self.input(other, Input::Disconnected(id));
        }
    }

    /// Suspends `id` (as SIGSTOP does): it ticks, computes, sends and receives nothing.
    fn hang(&mut self, id: PeerId) {
        self.hung.insert(id);
    }

    /// Wakes `id`: its first tick sees the gap, then it learns what happened to its links.
    fn wake(&mut self, id: PeerId) {
        self.hung.remove(&id);
        self.input(id, Input::Tick { now_ms: self.now_ms });
        for input in self.on_wake.remove(&id).unwrap_or_default() {
            self.input(id, input);
        }
    }

    /// The links between `a` and `b` die (WebRTC gave up on them): what was in them is lost,
    /// each side is told — a suspended side when it wakes.
    fn sever(&mut self, a: PeerId, b: PeerId) {
        self.links.remove(&(a, b));
        self.links.remove(&(b, a));
        for (me, other) in [(a, b), (b, a)] {
            if self.hung.contains(&me) {
                self.on_wake.entry(me).or_default().push(Input::Disconnected(other));
            } else {
                self.input(me, Input::Disconnected(other));
            }
        }
    }

    /// The links between `a` and `b` are open again (the mesh re-offered them).
    fn reconnect(&mut self, a: PeerId, b: PeerId) {
        self.connect(a, b);
    }

    /// Feeds one input and executes the outputs in order, as an adapter must.
    fn input(&mut self, id: PeerId, input: Input) {
        let mut queue = VecDeque::from([input]);
        while let Some(input) = queue.pop_front() {
            let node = self.nodes.get_mut(&id).unwrap();
            if !node.alive {
                return;
            }
            for output in node.session.handle(input) {
                let node = self.nodes.get_mut(&id).unwrap();
                match output {
                    Output::Send { to, message } => {
                        self.links.entry((id, to)).or_default().push_back(message);
                    }
                    Output::Configure(settings) => {
                        node.mid_window = false;
                        node.computing.clear();
                        node.residual = vec![0.0; LEN];
                        node.packed = None;
                        node.toy = Toy::fresh(settings.seed);
                        queue.push_front(Input::Configured { weights: LEN });
                    }
                    Output::Compute { step, .. } => {
                        node.mid_window = node.session.run().is_some_and(|r| r.sync.mode.steps_per_sync() > 1);
                        if node.lazy {
                            continue; // asked, never answers
                        }
                        node.computed_from.insert(step, node.toy.clone());
                        node.computed_from.retain(|&s, _| s + 8 > step);
                        let mut grad = node.toy.computed(id, step, node.wrong_value);
                        if let Some(factor) = node.scale {
                            grad.iter_mut().for_each(|g| *g *= factor);
                        }
                        let values = match node.session.run().map(|r| r.sync.compression) {
                            Some(Compression::Int8) if node.poison.is_some() => {
                                let mut packed = sync::pack(&grad).unwrap();
                                packed.exponents[0] = 250; // 127 · 2^117
                                Values::Int8(packed)
                            }
                            _ if node.poison.is_some() => Values::F32(vec![node.poison.unwrap(); LEN]),
                            Some(compression) if compression != Compression::None => {
                                if node.forge {
                                    node.residual.iter_mut().for_each(|r| *r *= 2.0);
                                }
                                node.states.insert(step, node.residual.clone());
                                node.states.retain(|&s, _| s + 8 > step);
                                let x: Vec<f32> = grad.iter().zip(&node.residual).map(|(g, r)| g + r).collect();
                                let packed = sync::pack_as(&x, compression).unwrap();
                                node.packed = Some((x, packed.clone()));
                                Values::packed_as(compression, packed)
                            }
                            _ => Values::F32(grad),
                        };
                        let state = match values {
                            Values::F32(_) => 0,
                            _ => node.states.get(&step).map_or(0, |r| state_digest(r)),
                        };
                        // Elastic windows: a whole window stands for its H inner steps.
                        let weight = match node.session.run().map(|r| r.sync) {
                            Some(sync) if sync.elastic => sync.mode.steps_per_sync(),
                            _ => 1,
                        };
                        let gradient = Gradient {
                            step,
                            whash: node.toy.hash(),
                            phash: node.phash,
                            loss: 1.0 / step as f32,
                            values,
                            weight,
                            state,
                        };
                        node.computing.push_back(gradient);
                    }
                    Output::Hurry { step } => {
                        // The window still under way ends early: it stands for fewer steps (a
                        // count of the node's and the step's, below H = 4).
                        let slow = self.slow.contains(&id);
                        if let Some(gradient) = node.computing.iter_mut().find(|g| g.step == step) {
                            gradient.weight = if slow { 1 } else { 1 + ((id + u64::from(step)) % 3) as u32 };
                            node.hurried += 1;
                            node.hurried_at.insert(step);
                        }
                    }
                    Output::Apply { step, mean, grid, ours, tentative, .. } => {
                        node.mid_window = false;
                        node.undo = tentative.then(|| (node.toy.clone(), node.residual.clone(), node.packed.clone()));
                        node.updates.insert(step, (node.toy.clone(), mean.clone()));
                        node.updates.retain(|&s, _| s + 4 > step);
                        if let Some((x, packed)) = node.packed.take() {
                            node.residual = if ours { sync::residual(&x, &packed, &grid) } else { x };
                        }
                        node.toy.apply_at(&mean, node.hidden_lr.unwrap_or(0.1));
                        assert_eq!(node.toy.step, step, "node {id} applied step {step} out of order");
                        if tentative {
                            // Nothing of it counts before it stands.
                            node.tentative += 1;
                        } else {
                            node.hashes.insert(step, node.toy.hash());
                            node.log.push((node.session.epoch(), step, node.toy.hash()));
                        }
                    }
                    Output::Confirm { step } => {
                        assert!(node.undo.take().is_some(), "node {id} confirmed step {step}, never taken tentatively");
                        // The weights moved on since (a compute does not move a toy's weights):
                        // the step's hash is the one the weights had when it was taken.
                        assert_eq!(node.toy.step, step, "node {id} confirmed step {step} at {}", node.toy.step);
                        node.hashes.insert(step, node.toy.hash());
                        node.log.push((node.session.epoch(), step, node.toy.hash()));
                    }
                    Output::Rollback { step } => {
                        let (toy, residual, packed) =
                            node.undo.take().unwrap_or_else(|| panic!("node {id} undid step {step}, never taken"));
                        assert_eq!(node.toy.step, step, "node {id} undid step {step} at {}", node.toy.step);
                        (node.toy, node.residual, node.packed) = (toy, residual, packed);
                        node.updates.remove(&step);
                        // Back inside the window the undone step closed.
                        node.mid_window = node.session.run().is_some_and(|r| r.sync.mode.steps_per_sync() > 1);
                        // What is computing stands on the undone weights (an adapter drops it).
                        node.computing.clear();
                        node.undone += 1;
                    }
                    Output::SendSnapshot { to } => {
                        assert!(!node.mid_window, "node {id} took a checkpoint mid-window, off a step boundary");
                        let bytes = node.toy.encode();
                        self.links.entry((id, to)).or_default().push_back(Message::Resume(bytes));
                    }
                    Output::Restore { bytes } => match Toy::decode(&bytes) {
                        Some(toy) => {
                            // What was being computed belongs to the weights before.
                            node.computing.clear();
                            node.mid_window = false;
                            node.residual = vec![0.0; LEN];
                            node.packed = None;
                            let step = toy.step;
                            node.updates.clear();
                            node.toy = toy;
                            node.hashes.retain(|s, _| *s <= step);
                            node.hashes.insert(step, node.toy.hash());
                            queue.push_front(Input::Restored { step, weights: LEN });
                        }
                        None => queue.push_front(Input::Failed {
                            task: Task::Restore,
                            error: Failure::new(std::io::Error::other("bad checkpoint")),
                        }),
                    },
                    Output::Audit { urgency: Urgency::Routine, .. } if node.routine_never_ends => {}
                    Output::Audit { step, target, private, trace, .. } => {
                        // The toy's contribution of `target` from the weights the step started from
                        // (honest auditors recompute it as the definition says); packed, plus the
                        // residual it named, as `sync::repack` does.
                        let sync = node.session.run().map_or(SyncConfig::SEED, |r| r.sync);
                        let outcome = match (node.computed_from.get(&step), private) {
                            (Some(toy), None) => Ok(Recomputed {
                                loss: 1.0 / step as f32,
                                values: Values::F32(toy.gradient(target, step)),
                                next_state: None,
                                next_words: None,
                                trace: trace.then(|| Arc::new(Toy::trace(&toy.gradient(target, step)))),
                            }),
                            (Some(toy), Some(private)) => {
                                let (state, grid) = (&private.residual, &private.grid);
                                let part: Option<Vec<_>> = private.checked.as_ref().map(|c| {
                                    c.iter().map(|&c| lockstep_node::wire::chunk_range(c, state.len())).collect()
                                });
                                let gradient = toy.gradient(target, step);
                                let again =
                                    sync::repack(gradient, state, &sync, step - 1, grid, part.as_deref()).unwrap();
                                Ok(Recomputed {
                                    loss: 1.0 / step as f32,
                                    values: again.values,
                                    next_state: again.next_state.as_deref().map(state_chunk_digests),
                                    // Of a part, the residual left is right in its chunks alone.
                                    next_words: again.next_state.filter(|_| part.is_none()).map(Arc::new),
                                    trace: trace.then(|| Arc::new(Toy::trace(&toy.gradient(target, step)))),
                                })
                            }
                            (None, _) => Err(Failure::new(std::io::Error::other("weights gone"))),
                        };
                        let audited = Input::Audited { step, target, outcome };
                        let node = self.nodes.get_mut(&id).unwrap();
                        if node.slow_audits {
                            node.auditing.push_back((node.audit_turns, audited));
                        } else {
                            queue.push_back(audited);
                        }
                    }
                    Output::ServeTrace { to, step, definition } => {
                        // Its backend's step again, from the weights the step started from,
                        // compared with the leader's as it goes: its trace up to the op where
                        // they part (the toy's step is one op), and that chunk.
                        if node.untraced {
                            continue;
                        }
                        node.traces_served += 1;
                        let grad = node.computed_from.get(&step).map(|toy| toy.computed(id, step, node.wrong_value));
                        let answer = match grad {
                            Some(grad) => {
                                let ours = Toy::trace(&grad);
                                let parted = definition
                                    .ops
                                    .first()
                                    .and_then(|their| ours.ops[0].iter().zip(their).position(|(a, b)| a != b));
                                let words = parted.map(|chunk| {
                                    let words: Vec<u32> = grad.iter().map(|g| g.to_bits()).collect();
                                    let from = chunk * TRACE_CHUNK_WORDS;
                                    let to = (from + TRACE_CHUNK_WORDS).min(words.len());
                                    (0, chunk as u32, words[from..to].to_vec())
                                });
                                TraceAnswer { trace: ours, words }
                            }
                            None => TraceAnswer::default(),
                        };
                        self.links.entry((id, to)).or_default().push_back(Message::Trace { step, answer });
                    }
                    Output::Settle { step, target, theirs } => {
                        // The definition's step against the target's trace, as `trace_ops` compares.
                        let outcome = match node.computed_from.get(&step) {
                            None => Err(Failure::new(std::io::Error::other("weights gone"))),
                            Some(toy) => {
                                let grad = toy.gradient(target, step);
                                let ours = Toy::trace(&grad);
                                Ok(if theirs.ops.len() != 1 {
                                    Traced::Unlike { ours: 1, theirs: theirs.ops.len() }
                                } else if ours == *theirs {
                                    Traced::Agrees
                                } else {
                                    let chunk =
                                        ours.ops[0].iter().zip(&theirs.ops[0]).position(|(a, b)| a != b).unwrap();
                                    let words: Vec<u32> = grad.iter().map(|g| g.to_bits()).collect();
                                    let from = chunk * TRACE_CHUNK_WORDS;
                                    let to = (from + TRACE_CHUNK_WORDS).min(words.len());
                                    Traced::Departs(Departure {
                                        op: 0,
                                        name: "matmul",
                                        code: MATMUL,
                                        chunk,
                                        words: words[from..to].to_vec(),
                                        places: vec![(1, from as u64, (to - from) as u64)],
                                    })
                                })
                            }
                        };
                        queue.push_back(Input::Settled { step, target, outcome });
                    }
                    Output::ServeState { to, step, part, routine } => {
                        // The leader's check of an accusation waits for what it asked: its
                        // answer never waits for the link's spare time.
                        assert!(
                            !routine || node.session.leader() != Some(to),
                            "a state for the leader sent as routine"
                        );
                        match &part {
                            StatePart::Whole => node.asked.0 += 1,
                            StatePart::Chunks(c) if !c.is_empty() => node.asked.1 += 1,
                            StatePart::Chunks(_) => node.asked.2 += 1,
                        }
                        let digests_alone = matches!(&part, StatePart::Chunks(c) if c.is_empty());
                        let lost = node
                            .withhold_from
                            .is_some_and(|(from, _, of)| from == to && of.is_none_or(|s| s == step) && !digests_alone);
                        if lost {
                            node.withhold_from =
                                node.withhold_from.and_then(|(p, n, _)| (n > 1).then_some((p, n - 1, Some(step))));
                        }
                        if !node.withhold && !lost {
                            let served = match node.states.get(&step) {
                                Some(state) => ServedState::of(state, &state_chunk_digests(state), &part),
                                None => ServedState::default(),
                            };
                            self.links.entry((id, to)).or_default().push_back(Message::State { step, served });
                        }
                    }
                    Output::CheckWeights { step } => {
                        // As the replica does: the state the update before `step` began from
                        // against the weights the step before was computed from, then that
                        // update again from it and its mean (a fresh model's weights before the
                        // first) against the weights the contribution to `step` was computed from.
                        let seed = node.session.run().map_or(0, |r| r.seed);
                        let first = lockstep_node::session::first_departure;
                        let agreed = node.computed_from.get(&(step - 1)).map(|t| t.weights.clone());
                        let held = node.computed_from.get(&step).map(|t| t.weights.clone());
                        let outcome = match (node.updates.get(&(step - 1)), held) {
                            (Some((before, mean)), Some(held)) => {
                                let moved = agreed.as_ref().and_then(|a| first(a, &before.weights));
                                let mut toy = before.clone();
                                toy.apply_at(mean, node.hidden_lr.unwrap_or(0.1));
                                let departs = moved.or_else(|| first(&toy.weights, &held));
                                let digests = Arc::new(state_chunk_digests(&toy.weights));
                                Ok(WeightsChecked { departs, definition: Arc::new(toy.weights), digests })
                            }
                            (None, Some(held)) if step == 1 => {
                                let fresh = Toy::fresh(seed).weights;
                                let departs = first(&fresh, &held);
                                let digests = Arc::new(state_chunk_digests(&fresh));
                                Ok(WeightsChecked { departs, definition: Arc::new(fresh), digests })
                            }
                            _ => Err(Failure::new(std::io::Error::other("the update is gone"))),
                        };
                        queue.push_back(Input::WeightsChecked { step, outcome });
                    }
                    Output::ServeWeights { to, step, digests } => {
                        let words = node.computed_from.get(&step).and_then(|held| {
                            let ours = state_chunk_digests(&held.weights);
                            let chunk = (0..ours.len()).find(|&i| digests.get(i) != Some(&ours[i]))?;
                            let range = lockstep_node::wire::chunk_range(chunk as u32, held.weights.len());
                            Some((chunk as u32, held.weights[range].iter().map(|w| w.to_bits()).collect()))
                        });
                        self.links.entry((id, to)).or_default().push_back(Message::Weights { step, words });
                    }
                    Output::Event(event) => node.events.push(event),
                }
            }
        }
    }

    /// One random event: deliver the head of a link (each queued message as likely to be
    /// picked as any other, so a link with more to carry moves faster, as links do in
    /// parallel), finish a random computation, or let time pass. Returns false when nothing is
    /// left to do but ticking.
    fn turn(&mut self) -> bool {
        let links: Vec<(PeerId, PeerId)> = self
            .links
            .iter()
            .filter(|((from, to), q)| !q.is_empty() && !self.hung.contains(from) && !self.hung.contains(to))
            .filter(|(k, _)| !self.held.contains(*k))
            .flat_map(|(k, q)| std::iter::repeat_n(*k, q.len()))
            .collect();
        let computing: Vec<PeerId> = self
            .nodes
            .iter()
            .filter(|(id, n)| n.alive && !n.computing.is_empty() && !self.hung.contains(id))
            // A slow node's window ends only when another member's contribution ends it.
            .filter(|(id, n)| !self.slow.contains(id) || n.hurried_at.contains(&n.computing[0].step))
            .map(|(id, _)| *id)
            .collect();
        let auditing: Vec<(PeerId, usize)> = self
            .nodes
            .iter()
            .filter(|(id, n)| n.alive && !self.hung.contains(id))
            .flat_map(|(id, n)| (0..n.auditing.len()).map(|at| (*id, at)))
            .collect();
        let choices = links.len() + computing.len() + auditing.len();
        if choices == 0 || self.rng.below(8) == 0 {
            self.now_ms += 10;
            let awake: Vec<PeerId> = self.live().into_iter().filter(|id| !self.hung.contains(id)).collect();
            for id in awake {
                self.input(id, Input::Tick { now_ms: self.now_ms });
            }
            return choices > 0;
        }
        let pick = self.rng.below(choices as u64) as usize;
        if pick < links.len() {
            let (from, to) = links[pick];
            if self.draining.remove(&(from, to)) {
                let backlog = std::mem::take(self.links.get_mut(&(from, to)).unwrap());
                for message in backlog {
                    self.deliver(from, to, message);
                }
                return true;
            }
            let message = self.links.get_mut(&(from, to)).unwrap().pop_front().unwrap();
            self.deliver(from, to, message);
        } else if pick < links.len() + computing.len() {
            let id = computing[pick - links.len()];
            let node = self.nodes.get_mut(&id).unwrap();
            let gradient = node.computing.pop_front().unwrap();
            self.input(id, Input::Computed(gradient));
        } else {
            let (id, at) = auditing[pick - links.len() - computing.len()];
            let node = self.nodes.get_mut(&id).unwrap();
            node.auditing[at].0 -= 1;
            if node.auditing[at].0 == 0 {
                let (_, audited) = node.auditing.remove(at).unwrap();
                self.input(id, audited);
            }
        }
        true
    }

    /// A message reaches the end of its link: lost (a cut, seeded loss, a deaf leader's
    /// accusation) or taken.
    fn deliver(&mut self, from: PeerId, to: PeerId, message: Message) {
        let of = match &message {
            Message::Gradient(g) => Some((from, g.step)),
            Message::RepairResponse { peer, gradient } => Some((*peer, gradient.step)),
            Message::Chunk(c) => Some((c.author, c.step)),
            _ => None,
        };
        if of.is_some_and(|k| self.lost.contains(&k)) {
            self.lost_at.get_or_insert(self.now_ms);
            return;
        }
        let lossy = message.is_step_message() || matches!(message, Message::Raft { .. });
        if self.cut.contains(&(from, to)) || (lossy && self.rng.below(1000) < self.loss_per_mille) {
            return;
        }
        if self.nodes[&to].deaf && matches!(message, Message::Accusation { target, .. } if target == to) {
            return;
        }
        self.delivered += 1;
        let kind = match &message {
            Message::Gradient(_) => Some(0),
            Message::Header { .. } => Some(1),
            Message::Chunk(_) => Some(2),
            Message::ChunkSum(_) => Some(3),
            _ => None,
        };
        if let Some(kind) = kind {
            self.delivered_kinds[kind] += 1;
        }
        self.input(to, Input::Received { from, message });
    }

    /// Runs until every live node finished or stopped (or `limit` turns), calling `hook` each
    /// turn with the highest step applied anywhere.
    fn run(&mut self, limit: usize, mut hook: impl FnMut(&mut Net, u32)) {
        for _ in 0..limit {
            let done = self.live().iter().all(|id| {
                let n = &self.nodes[id];
                let s = &n.session;
                !n.computes || n.lazy || s.finished() || s.stopped().is_some()
            });
            if done {
                return;
            }
            let top = self.nodes.values().filter(|n| n.alive).map(|n| n.session.applied()).max().unwrap_or(0);
            hook(self, top);
            self.turn();
        }
        panic!("the scenario did not settle: {}", self.describe());
    }

    fn describe(&self) -> String {
        if std::env::var_os("SIM_EVENTS").is_some() {
            for (id, n) in &self.nodes {
                eprintln!("node {id} events:");
                for e in &n.events {
                    if std::env::var_os("SIM_IGNORED").is_some()
                        || !matches!(e, Event::Ignored { .. } | Event::RepairRequested { .. })
                    {
                        eprintln!("  {e:?}");
                    }
                }
            }
        }
        self.nodes
            .iter()
            .map(|(id, n)| {
                format!(
                    "node {id}: alive {} applied {} leader {:?} term {} commit {} members {:?} stopped {:?} finished {} \
                     last events {:?}",
                    n.alive,
                    n.session.applied(),
                    n.session.leader(),
                    n.session.term(),
                    n.session.commit_index(),
                    n.session.configuration(),
                    n.session.stopped(),
                    n.session.finished(),
                    n.events.iter().rev().take(4).collect::<Vec<_>>()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A network of `ids`, all connected, with node 1 starting a run of `steps`.
    fn started(seed: u64, ids: &[PeerId], steps: u32) -> Net {
        Net::started_with(seed, ids, steps, SyncConfig::SEED)
    }

    /// [`Net::started`] with a deadline a simulated step reaches in seconds (floor 1 s, ceiling
    /// 4 s): the fault scenarios suspend and cut for a few deadlines.
    fn with_short_deadline(seed: u64, ids: &[PeerId], steps: u32) -> Net {
        Net::with_short_deadline_on(seed, ids, steps, SyncConfig::SEED)
    }

    /// [`Net::with_short_deadline`] with the run's sync settings.
    fn with_short_deadline_on(seed: u64, ids: &[PeerId], steps: u32, sync: SyncConfig) -> Net {
        let mut net = Net::new(seed);
        net.sync = sync;
        net.deadline = StepDeadline { floor_ms: 1_000, ceiling_ms: 4_000, factor: 4 };
        for id in ids {
            net.join(*id);
        }
        net.start(1, steps);
        net
    }

    fn started_with(seed: u64, ids: &[PeerId], steps: u32, sync: SyncConfig) -> Net {
        let mut net = Net::new(seed);
        net.sync = sync;
        for id in ids {
            net.join(*id);
        }
        net.start(1, steps);
        net
    }

    fn start(&mut self, leader: PeerId, steps: u32) {
        self.input(leader, Input::Start(settings_with(steps, self.sync)));
    }

    /// The invariant: at every step, every node that ever applied it (dead ones included:
    /// nobody applies a step before its record is committed) held the same weights; if not,
    /// some node's guard stopped the run.
    fn assert_identical_or_guarded(&self) -> bool {
        let mut by_step: BTreeMap<(Epoch, u32), BTreeSet<u32>> = BTreeMap::new();
        for node in self.nodes.values() {
            for (epoch, step, hash) in &node.log {
                by_step.entry((*epoch, *step)).or_default().insert(*hash);
            }
        }
        let forked = by_step.values().any(|hashes| hashes.len() > 1);
        let guarded = self.nodes.values().any(|n| n.events.iter().any(|e| matches!(e, Event::GuardStopped(_))));
        assert!(!forked || guarded, "silent fork: {by_step:?}\n{}", self.describe());
        !forked
    }

    fn count(&self, pred: impl Fn(&Event) -> bool) -> usize {
        self.nodes.values().map(|n| n.events.iter().filter(|e| pred(e)).count()).sum()
    }
}

/// What one process averaging the same gradient streams in roster order gives.
fn single_process(peers: &[PeerId], steps: u32) -> Vec<u32> {
    let mut toy = Toy::fresh(settings(steps).seed);
    let mut hashes = Vec::new();
    for step in 1..=steps {
        let grads: Vec<Vec<f32>> = peers.iter().map(|p| toy.gradient(*p, step)).collect();
        let mut sum = grads[0].clone();
        for g in &grads[1..] {
            for (s, v) in sum.iter_mut().zip(g) {
                *s += v;
            }
        }
        let avg: Vec<f32> = sum.iter().map(|s| s / peers.len() as f32).collect();
        toy.apply(&avg);
        hashes.push(toy.hash());
    }
    hashes
}

/// The same with int8 contributions: each peer packs its gradient plus its residual, the group
/// sums exactly, each peer keeps what was not taken. Written out here, apart from the session.
fn single_process_int8(peers: &[PeerId], steps: u32) -> Vec<u32> {
    single_process_packed(peers, steps, sync::pack, &plain_mean)
}

/// The same with int4 blocks.
fn single_process_int4(peers: &[PeerId], steps: u32) -> Vec<u32> {
    single_process_packed(peers, steps, sync::pack4, &plain_mean)
}

/// The same with `topk:8` (of the toy's one chunk of 2,064 values).
fn single_process_top8(peers: &[PeerId], steps: u32) -> Vec<u32> {
    single_process_packed(peers, steps, |x| sync::pack_topk(x, 8), &plain_mean)
}

/// The group's grid and mean of one step's packed contributions, unweighted.
fn plain_mean(_step: u32, packed: &[&Packed]) -> (Vec<u8>, Vec<f32>) {
    let (grid, sum) = sync::sum_direct(packed);
    let mean = sync::mean(&sum, &grid, packed.len());
    (grid, mean)
}

/// One step's grid and mean from its packed contributions (the step, the contributions).
type MeanOf<'a> = &'a dyn Fn(u32, &[&Packed]) -> (Vec<u8>, Vec<f32>);

/// The one-process group with packed contributions, each step's grid and mean from `mean_of`.
fn single_process_packed(
    peers: &[PeerId],
    steps: u32,
    pack: fn(&[f32]) -> Result<Packed, sync::NonFinite>,
    mean_of: MeanOf<'_>,
) -> Vec<u32> {
    let mut toy = Toy::fresh(settings(steps).seed);
    let mut residuals = vec![vec![0f32; LEN]; peers.len()];
    let mut hashes = Vec::new();
    for step in 1..=steps {
        let xs: Vec<Vec<f32>> = peers
            .iter()
            .zip(&residuals)
            .map(|(p, r)| toy.gradient(*p, step).iter().zip(r).map(|(g, r)| g + r).collect())
            .collect();
        let packed: Vec<Packed> = xs.iter().map(|x| pack(x).unwrap()).collect();
        let refs: Vec<&Packed> = packed.iter().collect();
        let (grid, mean) = mean_of(step, &refs);
        for ((r, x), p) in residuals.iter_mut().zip(&xs).zip(&packed) {
            *r = sync::residual(x, p, &grid);
        }
        toy.apply(&mean);
        hashes.push(toy.hash());
    }
    hashes
}

/// Elastic windows with int8: as [`single_process_int8`], each step's contributions weighted as
/// `weights` says (step → each peer's weight, in `peers`' order), summed exactly with the
/// weights and divided by their total — written out here, apart from `sync::reduce`.
fn single_process_weighted(peers: &[PeerId], steps: u32, weights: &BTreeMap<u32, Vec<u32>>) -> Vec<u32> {
    let weighted_mean = |step: u32, refs: &[&Packed]| {
        let grid = sync::group_grid(refs.iter().copied());
        let w = &weights[&step];
        // The weights in lowest terms: over their greatest common divisor.
        let gcd = (1..=4).rev().find(|d| w.iter().all(|x| x % d == 0)).unwrap();
        let total: u32 = w.iter().map(|x| x / gcd).sum();
        let mut sum = [0i64; LEN];
        for (p, &wi) in refs.iter().zip(w) {
            let mut terms = vec![0i32; LEN];
            sync::on_grid(p, &grid, 0..LEN, &mut terms);
            for (s, t) in sum.iter_mut().zip(terms) {
                *s += i64::from(wi / gcd) * i64::from(t);
            }
        }
        let mean: Vec<f32> = sum
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let e = i32::from(grid[i / 32]) - 133;
                if s == 0 {
                    0.0
                } else {
                    (s as f64 * 2f64.powi(e) / f64::from(total)) as f32
                }
            })
            .collect();
        (grid, mean)
    };
    single_process_packed(peers, steps, sync::pack, &weighted_mean)
}

/// Elastic windows: each roster member's weight at each step, as `id`'s applies reported them.
fn weights_applied(net: &Net, id: PeerId) -> BTreeMap<u32, Vec<(PeerId, u32)>> {
    net.nodes[&id]
        .events
        .iter()
        .filter_map(|e| match e {
            Event::StepApplied { step, weights, .. } => Some((*step, weights.clone())),
            _ => None,
        })
        .collect()
}

/// `toy` trained on to step `last` by nodes 1, 2 and 3, averaged in roster order.
fn trained_on(mut toy: Toy, last: u32) -> Toy {
    for step in toy.step + 1..=last {
        let grads: Vec<Vec<f32>> = [1, 2, 3].iter().map(|p| toy.gradient(*p, step)).collect();
        let avg: Vec<f32> = (0..LEN).map(|i| (grads[0][i] + grads[1][i] + grads[2][i]) / 3.0).collect();
        toy.apply(&avg);
    }
    toy
}

fn hashes_of(net: &Net, id: PeerId) -> Vec<u32> {
    net.nodes[&id].hashes.values().copied().collect()
}

/// The steps `id` applied with each record's roster, as its events say.
fn rosters_of(net: &Net, id: PeerId) -> BTreeMap<u32, Vec<PeerId>> {
    net.nodes[&id]
        .events
        .iter()
        .filter_map(|e| match e {
            Event::StepApplied { step, peers, .. } => Some((*step, peers.clone())),
            _ => None,
        })
        .collect()
}

/// Whether `id` said it reaches no majority.
fn said_no_majority(net: &Net, id: PeerId) -> bool {
    net.nodes[&id].events.iter().any(|e| matches!(e, Event::NoMajority { .. }))
}

/// Every live computing node finished, on the weights `reference` finished on.
fn assert_all_finished_equal(net: &Net, ids: &[PeerId], last: u32, what: &str) {
    let reference = net.nodes[&ids[0]].hashes.get(&last).copied();
    assert!(reference.is_some(), "{what}: node {} did not apply step {last}\n{}", ids[0], net.describe());
    for id in ids {
        assert!(net.nodes[id].session.finished(), "{what}: node {id}\n{}", net.describe());
        assert_eq!(net.nodes[id].hashes.get(&last).copied(), reference, "{what}: node {id}");
    }
}

#[test]
fn three_nodes_with_reordering_match_one_process_averaging_in_roster_order() {
    let int4 = SyncConfig { compression: Compression::Int4, ..SyncConfig::SEED };
    let top8 = SyncConfig { compression: Compression::TopK(8), ..SyncConfig::SEED };
    // Chunk owners sum the same integers: the same bits as every member summing everything.
    let owners = |sync: SyncConfig| SyncConfig { exchange: Exchange::Owners, ..sync };
    for (sync, seeds) in [
        (SyncConfig::SEED, 0..25),
        (int8(), 0..10),
        (int4, 0..10),
        (top8, 0..10),
        (owners(int8()), 0..10),
        (owners(int4), 0..10),
        (owners(top8), 0..10),
    ] {
        for seed in seeds {
            let mut net = Net::new(seed);
            net.sync = sync;
            for id in [30, 10, 20] {
                net.join(id);
            }
            net.start(20, 12);
            net.run(40_000, |_, _| {});
            assert!(net.assert_identical_or_guarded());
            let expected = match sync.compression {
                Compression::None => single_process(&[10, 20, 30], 12),
                Compression::Int8 => single_process_int8(&[10, 20, 30], 12),
                Compression::Int4 => single_process_int4(&[10, 20, 30], 12),
                Compression::TopK(_) => single_process_top8(&[10, 20, 30], 12),
            };
            for id in [10, 20, 30] {
                assert_eq!(hashes_of(&net, id), expected, "{sync} seed {seed} node {id}\n{}", net.describe());
                assert!(net.nodes[&id].session.finished());
            }
            // With owners, contributions go whole at the first step only (nobody knows its
            // owners): from then on as headers, each chunk to its owner, and the owners' sums
            // (a few more where a step was asked for again).
            let [whole, headers, chunks, sums] = net.delivered_kinds;
            let what = format!("{sync} seed {seed}: {:?}", net.delivered_kinds);

            if sync.exchange == Exchange::Owners {
                assert!(whole == 6 && headers >= 11 * 6 && chunks >= 11 * 9 && sums >= 11 * 6, "{what}");
                // Every owner's sum checked by the fingerprints, and right: those of steps 2–10
                // (the first went whole; the fingerprints of step 11 go out as step 12 ends the
                // run, and the last has no record after it to draw challenges from).
                for id in [10, 20, 30] {
                    let stats = net.nodes[&id].session.audit_stats();
                    let counts = (stats.sums_checked, stats.sums_failed, stats.sums_unchecked);
                    assert_eq!(counts, (9 * 3, 0, 0), "{what}: node {id}");
                }
            } else {
                assert!(whole == 12 * 6 && headers + chunks + sums == 0, "{what}");
            }

            // One log: every step's record was committed in the one term the starter leads.
            let terms: BTreeSet<u64> = net.nodes[&10]
                .events
                .iter()
                .filter_map(|e| match e {
                    Event::StepApplied { term, .. } => Some(*term),
                    _ => None,
                })
                .collect();
            assert_eq!(terms.len(), 1, "seed {seed}: {terms:?}");
        }
    }
    // The two encodings really are different arithmetic.
    assert_ne!(single_process(&[10, 20, 30], 12), single_process_int8(&[10, 20, 30], 12));
    assert_ne!(single_process_int4(&[10, 20, 30], 12), single_process_int8(&[10, 20, 30], 12));
    assert_ne!(single_process_top8(&[10, 20, 30], 12), single_process_int8(&[10, 20, 30], 12));
}

/// Elastic windows (`outer:4`, int8): a member beaten to the end of a window by another's
/// contribution is told to end its own ([`Output::Hurry`]) and sends a lighter contribution;
/// with messages reordered, every node applies the same weights and ends where one process
/// summing the same weighted contributions ends.
#[test]
fn elastic_windows_weigh_each_contribution_and_match_one_process() {
    let elastic = elastic();
    let mut unequal = 0;
    for seed in 0..10 {
        let mut net = Net::new(seed);
        net.sync = elastic;
        for id in [30, 10, 20] {
            net.join(id);
        }
        net.start(20, 48); // 12 windows of 4
        net.run(40_000, |_, _| {});
        assert!(net.assert_identical_or_guarded());
        let weights = weights_applied(&net, 10);
        assert_eq!(weights.len(), 12, "seed {seed}");
        for id in [20, 30] {
            assert_eq!(weights_applied(&net, id), weights, "seed {seed}: node {id} weighed another way");
        }
        let by_step: BTreeMap<u32, Vec<u32>> = weights
            .iter()
            .map(|(step, w)| {
                assert_eq!(w.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [10, 20, 30], "roster order");
                (*step, w.iter().map(|(_, w)| *w).collect())
            })
            .collect();
        assert!(by_step.values().all(|w| w.contains(&4)), "seed {seed}: {by_step:?}");
        unequal += by_step.values().filter(|w| w.iter().any(|&x| x != w[0])).count();
        let expected = single_process_weighted(&[10, 20, 30], 12, &by_step);
        for id in [10, 20, 30] {
            assert_eq!(hashes_of(&net, id), expected, "seed {seed} node {id}");
            assert!(net.nodes[&id].session.finished());
        }
        assert!(net.nodes.values().map(|n| n.hurried).sum::<u32>() > 0, "seed {seed}: nobody was hurried");
    }
    assert!(unequal > 20, "only {unequal} steps weighed their contributions unequally");
    let equal: BTreeMap<u32, Vec<u32>> = (1..=12).map(|s| (s, vec![4, 4, 4])).collect();
    assert_eq!(single_process_weighted(&[10, 20, 30], 12, &equal), single_process_int8(&[10, 20, 30], 12));
}

/// Elastic windows with the leader's slow-member rule (3 windows): a member whose windows
/// always end after one of four steps is told at each sync it applies that it is behind; once
/// the leader has seen three such syncs, it takes the member out of the run for good, saying
/// why; the others finish the run, identical.
#[test]
fn a_member_much_slower_than_the_group_is_told_then_taken_out_by_the_leaders_rule() {
    for seed in 0..10 {
        let mut net = Net::new(1200 + seed);
        net.sync = elastic();
        net.slow_windows = 3;
        net.slow.insert(30);
        for id in [10, 20, 30] {
            net.join(id);
        }
        net.start(10, 48);
        net.run(80_000, |_, _| {});
        assert!(net.assert_identical_or_guarded());
        let slow = &net.nodes[&30];
        let behind: Vec<u32> = slow
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Behind { step, steps: 1, of: 4 } => Some(*step),
                _ => None,
            })
            .collect();
        // (Its first window may miss the first step's deadline: it ends its windows only when
        // hurried, and contributions that reach it before its model is built are not kept.)
        assert!(behind.len() >= 2, "seed {seed}: told at each slow window it applied: {behind:?}\n{}", net.describe());
        let slow_removal = Removal::Slow { windows: 3 };
        let dropped = net.nodes[&10].events.iter().find_map(|e| match e {
            Event::Dropped { peer: 30, step, why: DropReason::Removed(why) } if *why == slow_removal => Some(*step),
            _ => None,
        });
        assert!(
            dropped.is_some_and(|s| s >= 3 && s <= behind[behind.len() - 1] + 2),
            "seed {seed}: {dropped:?}\n{}",
            net.describe()
        );
        assert!(
            matches!(slow.session.stopped(), Some(Stop::Removed { why, .. }) if *why == slow_removal),
            "seed {seed}: {:?}",
            slow.session.stopped()
        );
        assert_eq!(hashes_of(&net, 10), hashes_of(&net, 20), "seed {seed}");
        assert_eq!(net.nodes[&10].hashes.len(), 12, "seed {seed}");
    }
}

#[test]
fn a_cut_link_is_bridged_by_repairs() {
    for seed in 0..10 {
        let mut net = Net::new(100 + seed);
        for id in [1, 2, 3] {
            net.join(id);
        }
        net.cut.insert((2, 3)); // node 2 can never reach node 3 directly
        net.start(1, 10);
        net.run(80_000, |_, _| {});
        assert!(net.assert_identical_or_guarded());
        assert_eq!(hashes_of(&net, 3), single_process(&[1, 2, 3], 10), "seed {seed}\n{}", net.describe());
        let repaired = net.nodes[&3].events.iter().filter(|e| matches!(e, Event::Repaired { peer: 2, .. })).count();
        assert_eq!(repaired, 10, "node 3 repairs node 2's contribution at every step");
    }
}

#[test]
fn seeded_loss_ends_identical() {
    for seed in 0..15 {
        let mut net = Net::new(200 + seed);
        for id in [1, 2, 3, 4] {
            net.join(id);
        }
        net.loss_per_mille = 150;
        net.start(2, 8);
        net.run(400_000, |_, _| {});
        assert!(net.assert_identical_or_guarded(), "seed {seed}");
        assert_eq!(net.count(|e| matches!(e, Event::GuardStopped(_))), 0, "seed {seed}");
        assert_all_finished_equal(&net, &[1, 2, 3, 4], 8, &format!("seed {seed}"));
    }
    // Chunk owners under the same loss: lost headers, chunks, sums and the acks of what is held
    // are asked for again (or summed here), and every node ends where one process ends; lost
    // fingerprints are asked for again, and no sum's check fails.
    let (mut checked, mut unchecked) = (0, 0);
    for seed in 0..15 {
        let mut net = Net::new(270 + seed);
        net.sync = SyncConfig { exchange: Exchange::Owners, ..int8() };
        for id in [1, 2, 3, 4] {
            net.join(id);
        }
        net.loss_per_mille = 150;
        net.start(2, 12);
        net.run(400_000, |_, _| {});
        assert!(net.assert_identical_or_guarded(), "seed {seed}");
        assert_all_finished_equal(&net, &[1, 2, 3, 4], 12, &format!("owners seed {seed}"));
        let full = rosters_of(&net, 1).values().all(|r| r.len() == 4);
        if full {
            assert_eq!(hashes_of(&net, 1), single_process_int8(&[1, 2, 3, 4], 12), "owners seed {seed}");
        }
        for node in net.nodes.values() {
            let stats = node.session.audit_stats();
            assert_eq!(stats.sums_failed, 0, "owners seed {seed}");
            (checked, unchecked) = (checked + stats.sums_checked, unchecked + stats.sums_unchecked);
        }
        assert_eq!(net.count(|e| matches!(e, Event::Verdict(_))), 0, "owners seed {seed}");
    }
    // (Most are checked: at 15% loss a contributor's fingerprints are lost twice for a few.)
    assert!(checked > 10 * unchecked, "{checked} sums checked, {unchecked} unchecked");
    // Elastic windows under the same loss: a lost contribution is repaired with its weight,
    // and every node applies the weights its record names.
    for seed in 0..15 {
        let mut net = Net::new(250 + seed);
        net.sync = elastic();
        for id in [1, 2, 3, 4] {
            net.join(id);
        }
        net.loss_per_mille = 150;
        net.start(2, 32);
        net.run(400_000, |_, _| {});
        assert!(net.assert_identical_or_guarded(), "seed {seed}");
        let weights = weights_applied(&net, 4);
        assert_eq!(weights.len(), 8, "seed {seed}");
        for id in [1, 2, 3] {
            assert_eq!(weights_applied(&net, id), weights, "seed {seed}: node {id}");
        }
    }
}

/// Once node 1 (the leader) stopped, the others cannot finish without it: they may go.
fn let_the_others_go_once_the_leader_stopped(net: &mut Net, _top: u32) {
    if net.nodes[&1].session.stopped().is_some() {
        for id in [2, 3] {
            if net.nodes[&id].alive {
                net.kill(id);
            }
        }
    }
}

/// What `id`'s guard stopped the run with, if it did.
fn guard_failure(net: &Net, id: PeerId) -> Option<lockstep_node::session::GuardFailure> {
    net.nodes[&id].events.iter().find_map(|e| match e {
        Event::GuardStopped(f) => Some(f.clone()),
        _ => None,
    })
}

#[test]
fn flipped_weights_stop_the_run_within_a_step_naming_the_node() {
    let mut net = Net::started(7, &[1, 2, 3], 20);
    let mut flipped = false;
    net.run(80_000, |net, top| {
        if top == 5 && !flipped {
            let node = net.nodes.get_mut(&3).unwrap();
            node.toy.weights[4] = f32::from_bits(node.toy.weights[4].to_bits() ^ 1);
            flipped = true;
        }
        let_the_others_go_once_the_leader_stopped(net, top);
    });
    let failure = guard_failure(&net, 1).unwrap_or_else(|| panic!("the leader did not stop:\n{}", net.describe()));
    assert_eq!(failure.weight_mismatch, vec![3]);
    assert!(failure.step <= 7, "stopped at step {}", failure.step);
    assert!(net.nodes.values().all(|n| n.hashes.len() <= 6), "nobody applied a step after the flip");
}

#[test]
fn a_wrong_probe_hash_stops_the_run_naming_the_node() {
    let mut net = Net::new(8);
    for id in [1, 2, 3] {
        net.join(id);
    }
    net.nodes.get_mut(&2).unwrap().phash = 0x1234_5678;
    net.start(1, 5);
    net.run(80_000, let_the_others_go_once_the_leader_stopped);
    let failure = guard_failure(&net, 1).expect("the leader stopped");
    assert_eq!((failure.step, failure.probe_mismatch), (1, vec![2]));
    assert!(net.nodes.values().all(|n| n.hashes.is_empty()), "nobody applied step 1");
}

/// An audited run of 20 steps on four nodes in which `fault` strikes node `id` once, when
/// the group applied step 5.
fn struck_at_step_5(seed: u64, id: PeerId, fault: impl Fn(&mut Node)) -> Net {
    let mut net = audited(seed, 1000, 20);
    let mut struck = false;
    net.run(300_000, |net, top| {
        if top == 5 && !struck {
            fault(net.nodes.get_mut(&id).unwrap());
            struck = true;
        }
    });
    assert!(struck, "seed {seed}: the fault struck");
    net
}

/// Flips the lowest bit of a toy's weight `i`.
fn flip_weight(node: &mut Node, i: usize) {
    node.toy.weights[i] = f32::from_bits(node.toy.weights[i].to_bits() ^ 1);
}

/// What node `id` said of its own weights (the guard's disputes: it stepped aside), if it did.
fn named_itself(net: &Net, id: PeerId) -> Option<Evidence> {
    net.nodes[&id].events.iter().find_map(|e| match e {
        Event::Accused { target, by, evidence, .. } if *target == id && *by == id => Some(*evidence),
        _ => None,
    })
}

/// Nodes `ids` finished all 20 steps, alike, and their guard never stopped the run.
fn finished_alike(net: &Net, ids: &[PeerId], seed: u64) {
    for id in ids {
        let node = &net.nodes[id];
        assert!(node.session.finished(), "seed {seed}: node {id}\n{}", net.describe());
        assert!(guard_failure(net, *id).is_none(), "seed {seed}: node {id}'s guard never stops the run");
        assert_eq!(node.hashes.len(), 20, "seed {seed}");
        assert_eq!(node.hashes, net.nodes[&ids[0]].hashes, "seed {seed}");
    }
    // (A node apart applied its own weights until it stopped.)
    net.assert_identical_or_guarded();
}

/// The guard's disputes: with audits on, a member whose weights were flipped is no longer a
/// stop for the group. The leader checks its own weights against the definition's update, asks
/// the member where its part, and convicts it through the log naming the word and both values;
/// the others train to the end, identical, and never stop.
#[test]
fn a_members_flipped_weights_are_named_to_the_word_and_the_others_train_on() {
    for seed in 7..60 {
        let net = struck_at_step_5(seed, 3, |node| flip_weight(node, 4));
        let verdict = verdict_of(&net, 2).unwrap_or_else(|| panic!("seed {seed}: no verdict\n{}", net.describe()));
        assert_eq!(verdict.target, 3, "seed {seed}");
        assert_eq!(verdict.found_by, 1, "seed {seed}: the leader");
        match verdict.evidence {
            // The flipped weight is the first that parts (by its lowest bit where the flip came
            // after the member's update, by more where an update followed it).
            Evidence::Weights { word: 4, expected, claimed } => assert_ne!(expected, claimed, "seed {seed}"),
            other => panic!("seed {seed}: {other:?}"),
        }
        finished_alike(&net, &[1, 2, 4], seed);
        assert!(net.nodes[&3].session.stopped().is_some(), "seed {seed}: the flipped member is out");
    }
}

/// The guard's disputes where the leader's own weights are the ones apart: its check against
/// the definition finds them, it names itself (the word and both values), stops and hands the
/// lead on; the others agree with each other and train to the end under a new leader.
#[test]
fn a_leaders_own_flipped_weights_are_named_and_the_lead_handed_on() {
    for seed in 11..60 {
        let net = struck_at_step_5(seed, 1, |node| flip_weight(node, 9));
        let named = named_itself(&net, 1);
        assert!(
            matches!(named, Some(Evidence::Weights { word: 9, expected, claimed }) if expected ^ 1 == claimed),
            "seed {seed}: {named:?}\n{}",
            net.describe()
        );
        assert_eq!(guard_failure(&net, 1).map(|f| f.weight_mismatch), Some(vec![1]), "seed {seed}");
        finished_alike(&net, &[2, 3, 4], seed);
    }
}

/// The guard's disputes where the leader's check cannot see what is wrong — a hidden state
/// its update reads (an optimizer's moments, which no contribution names) — so its weights
/// pass its own check: more of the step's contributions name other weights than ours, and the
/// leader takes itself to be the one apart, says so with the weight hash most of them named,
/// and hands the lead on; nobody else is accused.
#[test]
fn a_leader_outnumbered_by_the_weights_its_members_name_hands_the_lead_on() {
    for seed in 21..80 {
        let net = struck_at_step_5(seed, 1, |node| node.hidden_lr = Some(0.1000001));
        let named = named_itself(&net, 1);
        assert!(matches!(named, Some(Evidence::WeightHash { .. })), "seed {seed}: {named:?}\n{}", net.describe());
        assert_eq!(guard_failure(&net, 1).map(|f| f.weight_mismatch), Some(vec![1]), "seed {seed}");
        assert_eq!(net.count(|e| matches!(e, Event::Verdict(_))), 0, "seed {seed}: nobody convicted");
        finished_alike(&net, &[2, 3, 4], seed);
    }
}

/// With audits on, a wrong probe hash is its member's own evidence: convicted at once (the
/// expected hash and its own), the others train on.
#[test]
fn a_wrong_probe_hash_is_convicted_and_the_others_train_on() {
    let mut net = Net::new(8);
    net.audit_rate = 1000;
    for id in [1, 2, 3, 4] {
        net.join(id);
    }
    net.nodes.get_mut(&2).unwrap().phash = 0x1234_5678;
    net.start(1, 6);
    net.run(200_000, |_, _| {});
    let verdict = verdict_of(&net, 3).unwrap_or_else(|| panic!("no verdict\n{}", net.describe()));
    assert_eq!((verdict.target, verdict.evidence), (2, Evidence::Probe { expected: PHASH, claimed: 0x1234_5678 }));
    for id in [1, 3, 4] {
        assert!(net.nodes[&id].session.finished(), "node {id}\n{}", net.describe());
        assert_eq!(net.nodes[&id].hashes.len(), 6);
        assert_eq!(net.nodes[&id].hashes, net.nodes[&1].hashes);
    }
}

#[test]
fn a_late_joiner_learns_is_resumed_votes_and_is_bit_identical_from_then_on() {
    for (sync, seed) in
        [SyncConfig::SEED, int8(), elastic()].into_iter().flat_map(|s| (0..10).map(move |seed| (s, seed)))
    {
        // (A run of `outer:H` counts its steps in inner steps: 16 syncs are 16·H of them.)
        let mut net = Net::started_with(300 + seed, &[1, 2], 16 * sync.mode.steps_per_sync(), sync);
        let mut joined = false;
        net.run(80_000, |net, top| {
            if top == 5 && !joined {
                net.join(9);
                joined = true;
            }
        });
        assert!(net.assert_identical_or_guarded());
        let leader = hashes_of(&net, 1);
        let joiner = &net.nodes[&9];
        assert!(joiner.events.iter().any(|e| matches!(e, Event::Resumed { .. })), "seed {seed}");
        let first = *joiner.hashes.keys().next().expect("the joiner trained");
        assert!(joiner.hashes.len() >= 8, "seed {seed}: joined at {first}");
        for (step, hash) in &joiner.hashes {
            assert_eq!(leader[*step as usize - 1], *hash, "seed {seed} step {step}");
        }
        assert!(
            rosters_of(&net, 1).values().any(|r| r.contains(&9)),
            "seed {seed}: its contributions count\n{}",
            net.describe()
        );
        // It joined as a learner and votes once it kept up.
        let voters = net.nodes[&1].events.iter().rev().find_map(|e| match e {
            Event::Members { voters, .. } => Some(voters.clone()),
            _ => None,
        });
        assert_eq!(voters, Some(vec![1, 2, 9]), "seed {seed}");
    }
}

#[test]
fn a_follower_that_dies_mid_run_drops_out_and_the_rest_continue() {
    // With chunk owners the dead follower owned a chunk, its own part of it held by its
    // successor: the others sum that chunk themselves from the values they ask for.
    let owners = SyncConfig { exchange: Exchange::Owners, ..int8() };
    for (sync, seed) in [SyncConfig::SEED, int8(), owners].into_iter().flat_map(|s| (0..10).map(move |seed| (s, seed)))
    {
        let mut net = Net::with_short_deadline_on(400 + seed, &[1, 2, 3], 12, sync);
        let mut killed = false;
        net.run(80_000, |net, top| {
            if top == 4 && !killed {
                net.kill(3);
                killed = true;
            }
        });
        assert!(net.assert_identical_or_guarded());
        assert_eq!(hashes_of(&net, 1), hashes_of(&net, 2), "seed {seed}");
        assert_eq!(net.nodes[&1].hashes.len(), 12);
    }
}

#[test]
fn the_leader_dying_hands_the_run_to_an_elected_successor() {
    let owners = SyncConfig { exchange: Exchange::Owners, ..int8() };
    for (sync, seed) in
        [SyncConfig::SEED, int8(), elastic(), owners].into_iter().flat_map(|s| (0..10).map(move |seed| (s, seed)))
    {
        let mut net = Net::with_short_deadline_on(500 + seed, &[1, 2, 3], 12 * sync.mode.steps_per_sync(), sync);
        let mut killed = false;
        net.run(80_000, |net, top| {
            if top == 5 && !killed {
                net.kill(1);
                killed = true;
            }
        });
        assert!(net.assert_identical_or_guarded(), "seed {seed}");
        let successor = net.nodes[&3].session.leader();
        assert!(successor == Some(2) || successor == Some(3), "seed {seed}: {successor:?}");
        assert_eq!(net.nodes[&2].session.leader(), successor);
        assert_eq!(hashes_of(&net, 2), hashes_of(&net, 3), "seed {seed}");
        assert_eq!(net.nodes[&2].hashes.len(), 12, "seed {seed}:\n{}", net.describe());
    }
}

/// A leader killed right after its record of a step reached the others, its own contribution
/// to the step lost on every link (`appends.rs`): nobody appended the record — a member
/// appends a record naming the leader's whole contribution only once it holds it — so the
/// survivors elect a leader of their own, which records the step again without the dead
/// leader's, and they finish equal. (Before, the record committed and nobody could take it:
/// they elected one another for ever, the campaign's seeds 192 and 490.) The mesh at the first
/// step and a later one, and chunk owners' first step (whole: nobody knows its owners yet).
#[test]
fn a_leader_killed_with_its_own_contribution_lost_leaves_no_record_nobody_can_take() {
    let owners = SyncConfig { exchange: Exchange::Owners, ..int8() };
    let cases = [(SyncConfig::SEED, 1), (SyncConfig::SEED, 3), (owners, 1)];
    for ((sync, step), seed) in cases.into_iter().flat_map(|c| (0..8).map(move |seed| (c, seed))) {
        let what = format!("{:?} step {step} seed {seed}", sync.exchange);
        let mut net = Net::with_short_deadline_on(2700 + seed, &[1, 2, 3], 8, sync);
        net.lost.insert((1, step));
        let mut killed = false;
        net.run(200_000, |net, _| {
            if !killed && net.lost_at.is_some_and(|at| net.now_ms >= at + 200) {
                net.kill(1);
                killed = true;
            }
        });
        assert!(killed, "{what}");
        assert_all_finished_equal(&net, &[2, 3], 8, &what);
        let rosters = rosters_of(&net, 2);
        assert!(!rosters[&step].contains(&1), "{what}: {rosters:?}");
        assert_eq!(rosters, rosters_of(&net, 3), "{what}");
    }
}

/// A member that quits on purpose says so; a leader that quits hands the lead on first. The
/// member leaves the configuration at once (its vote no longer counts), the rest finish.
#[test]
fn a_member_or_the_leader_quitting_leaves_the_configuration_and_the_rest_finish() {
    for (quitter, seed) in [(3, 0), (3, 1), (1, 2), (1, 3), (1, 4)] {
        let mut net = Net::started(550 + seed, &[1, 2, 3], 30);
        let mut quit_at = None;
        net.run(120_000, |net, top| {
            if top == 5 && quit_at.is_none() {
                net.input(quitter, Input::Quit);
                quit_at = Some(net.now_ms);
            }
            // Gone once it holds no vote (or after a grace), as the adapter does.
            let grace = quit_at.is_some_and(|t| net.now_ms > t + 1_000);
            if net.nodes[&quitter].alive && (grace || quit_at.is_some() && net.nodes[&quitter].session.out_of_run()) {
                net.kill(quitter);
            }
        });
        let what = format!("quitter {quitter} seed {seed}");
        assert!(net.assert_identical_or_guarded(), "{what}");
        let rest: Vec<PeerId> = [1, 2, 3].into_iter().filter(|p| *p != quitter).collect();
        assert_all_finished_equal(&net, &rest, 30, &what);
        let voters = net.nodes[&rest[0]].session.configuration().0;
        assert!(!voters.contains(&quitter), "{what}: {voters:?}");
        let left = net.nodes[&rest[0]].events.iter().any(|e| *e == Event::PeerLeaving(quitter));
        assert!(left, "{what}");
    }
}

#[test]
fn a_checkpoint_push_restores_every_replica() {
    for seed in 0..10 {
        let mut net = Net::started(600 + seed, &[1, 2, 3], 20);
        let checkpoint = Toy { step: 3, weights: (0..LEN).map(|i| i as f32 * 0.125).collect() };
        let mut pushed = false;
        net.run(80_000, |net, top| {
            if top == 9 && !pushed {
                net.input(1, Input::PushCheckpoint { bytes: checkpoint.encode() });
                pushed = true;
            }
        });
        assert!(net.assert_identical_or_guarded(), "seed {seed}");
        for id in [1, 2, 3] {
            assert!(
                net.nodes[&id].events.iter().any(|e| matches!(e, Event::CheckpointRestored { from: 1, step: 3 })),
                "seed {seed} node {id}:\n{}",
                net.describe()
            );
        }
        let from_checkpoint = trained_on(checkpoint.clone(), 20);
        for id in [1, 2, 3] {
            assert_eq!(net.nodes[&id].toy, from_checkpoint, "seed {seed} node {id}");
        }
    }
}

#[test]
fn duplicates_outsiders_and_wrong_versions_are_ignored_and_counted() {
    let mut net = Net::new(9);
    for id in [1, 2] {
        net.join(id);
    }
    // A message from a peer that is not connected, and Raft bytes that do not read.
    net.input(2, Input::Received { from: 77, message: Message::RepairRequest { step: 1, peer: 1 } });
    net.start(1, 4);
    net.input(1, Input::Received { from: 2, message: Message::Raft { run: 5, bytes: vec![0xff; 9] } });
    // Deliver every contribution twice.
    let mut duplicated = BTreeSet::new();
    for _ in 0..40_000 {
        let done = [1, 2].iter().all(|id| net.nodes[id].session.finished());
        if done {
            break;
        }
        for (link, queue) in net.links.iter_mut() {
            if let Some(Message::Gradient(g)) = queue.front().cloned() {
                if duplicated.insert((*link, g.step)) {
                    queue.push_back(Message::Gradient(g));
                }
            }
        }
        net.turn();
    }
    let duplicated = duplicated.len();
    assert!(duplicated > 0);
    assert!(net.assert_identical_or_guarded());
    assert_eq!(hashes_of(&net, 1), single_process(&[1, 2], 4));
    assert!(net.nodes[&2].session.ignored() >= 1);
    assert!(net.count(|e| matches!(e, Event::Ignored { .. })) >= 2);
    // A run config of another protocol, to an observer, is refused by its number.
    let mut watcher = Session::new(SessionConfig {
        me: 5,
        expected_phash: PHASH,
        repair_after_ms: 50,
        deadline: StepDeadline::default(),
        slow_windows: 0,
        computes: false,
        agreement: TIMING,
        compute_ahead: true,
        audit_rate: 0,
        audit_state_part: 1000,
        audit_workers: 1,
    });
    watcher.handle(Input::Connected(1));
    let other = Message::RunConfig { protocol: MESH_PROTOCOL_VERSION + 1, run_id: 3, run: settings(3) };
    watcher.handle(Input::Received { from: 1, message: other });
    assert!(watcher.run().is_none());
    assert_eq!(watcher.ignored(), 1);
}

#[test]
fn churn_with_loss_ends_identical() {
    for (sync, seed) in [SyncConfig::SEED, int8()].into_iter().flat_map(|s| (0..20).map(move |seed| (s, seed))) {
        let mut net = Net::new(700 + seed);
        net.sync = sync;
        net.deadline = StepDeadline { floor_ms: 1_000, ceiling_ms: 4_000, factor: 4 };
        for id in [1, 2, 3, 4] {
            net.join(id);
        }
        net.loss_per_mille = 50;
        net.start(1, 400);
        // A second of simulated time between two changes: the group adapts its configuration
        // to each before the next (two of four voters gone at once is no majority, by design).
        let mut done = BTreeSet::new();
        let mut began: Option<u64> = None;
        net.run(1_600_000, |net, top| {
            if top >= 3 && began.is_none() {
                began = Some(net.now_ms);
            }
            let Some(began) = began else { return };
            let plan: [(u64, &str, PeerId); 4] = [(0, "kill", 3), (1, "join", 8), (2, "kill", 1), (3, "join", 9)];
            for (at, what, id) in plan {
                if net.now_ms >= began + at * 1_000 && done.insert(at) {
                    match what {
                        "kill" => net.kill(id),
                        _ => net.join(id),
                    }
                }
            }
        });
        assert!(net.assert_identical_or_guarded(), "seed {seed}");
        assert_eq!(net.count(|e| matches!(e, Event::GuardStopped(_))), 0, "seed {seed}");
        assert_all_finished_equal(&net, &[2, 4, 8, 9], 400, &format!("{sync} seed {seed}"));
    }
}

/// A checkpoint pushed while the group trains on — one saved a step or two ago, or another
/// run's at the step the group is at: contributions of the steps after it are still in flight
/// (and being computed) when the replicas restore, under step numbers the restored run uses
/// again. None of them may count, on any node.
#[test]
fn a_push_during_training_discards_what_was_in_flight() {
    for seed in 0..60 {
        let foreign = seed % 2 == 0;
        let mut net = Net::started(900 + seed, &[1, 2, 3], 24);
        let mut saved: Option<Toy> = None;
        let mut pushed: Option<Toy> = None;
        net.run(120_000, |net, _| {
            let leader = net.nodes[&1].session.applied();
            if leader == 8 && saved.is_none() {
                saved = Some(net.nodes[&1].toy.clone());
            }
            if leader == 9 + (seed as u32 % 4) / 2 && pushed.is_none() {
                let checkpoint = match foreign {
                    true => Toy { step: leader, weights: (0..LEN).map(|i| i as f32 * -0.0625).collect() },
                    false => saved.clone().unwrap(),
                };
                net.input(1, Input::PushCheckpoint { bytes: checkpoint.encode() });
                pushed = Some(checkpoint);
            }
        });
        assert_eq!(net.count(|e| matches!(e, Event::GuardStopped(_))), 0, "seed {seed}:\n{}", net.describe());
        let expected = trained_on(pushed.unwrap(), 24);
        for id in [1, 2, 3] {
            assert_eq!(net.nodes[&id].toy, expected, "seed {seed} node {id}:\n{}", net.describe());
        }
    }
}

/// Pushes have authority: the leader and a follower push different checkpoints at the same
/// moment; the follower's is refused on its own node (naming the leader), the leader's is
/// restored everywhere, and the run goes on from it bit-identically. A push that a follower
/// sends anyway (a rogue speaking the wire) is refused and named on every node.
#[test]
fn only_the_leaders_push_counts() {
    for seed in 0..30 {
        let mut net = Net::started(1300 + seed, &[1, 2, 3], 20);
        let ours = |scale: f32| Toy { step: 5, weights: (0..LEN).map(|i| i as f32 * scale).collect() };
        let (from_1, from_3) = (ours(0.125), ours(-0.03125));
        let mut pushed = false;
        net.run(120_000, |net, top| {
            if top == 7 && !pushed {
                net.input(1, Input::PushCheckpoint { bytes: from_1.encode() });
                net.input(3, Input::PushCheckpoint { bytes: from_3.encode() });
                pushed = true;
            }
        });
        assert_eq!(net.count(|e| matches!(e, Event::GuardStopped(_))), 0, "seed {seed}:\n{}", net.describe());
        let expected = trained_on(from_1.clone(), 20);
        for id in [1, 2, 3] {
            assert_eq!(net.nodes[&id].toy, expected, "seed {seed} node {id}:\n{}", net.describe());
            assert_eq!(net.nodes[&id].session.epoch(), Epoch { count: 1, pusher: 1 }, "seed {seed} node {id}");
        }
        let refused_locally = net.nodes[&3]
            .events
            .iter()
            .any(|e| *e == Event::Problem(Problem::NotLeader { action: LeaderAction::Push, leader: Some(1) }));
        assert!(refused_locally, "seed {seed}: {}", net.describe());
    }
    let mut net = Net::started(1400, &[1, 2, 3], 10);
    let mut sent = false;
    net.run(120_000, |net, top| {
        if top == 4 && !sent {
            for to in [1, 2] {
                let bytes = Toy { step: 1, weights: vec![9.0; LEN] }.encode();
                net.links.entry((3, to)).or_default().push_back(Message::CheckpointPush(bytes));
            }
            sent = true;
        }
    });
    for id in [1, 2] {
        assert!(net.nodes[&id].events.iter().any(|e| matches!(e, Event::PushRefused { from: 3, .. })), "node {id}");
        assert!(!net.nodes[&id].events.iter().any(|e| matches!(e, Event::CheckpointRestored { .. })), "node {id}");
        assert_eq!(net.nodes[&id].hashes.len(), 10, "node {id}: {}", net.describe());
    }
    assert_eq!(hashes_of(&net, 1), hashes_of(&net, 2));
}

/// A member suspended long enough to miss a step's deadline: the leader goes on without it,
/// and waits for it again once it has kept up (or once it is resumed, when it fell too far
/// behind); it finishes equal, summed again in the last steps.
#[test]
fn a_silent_member_is_dropped_at_the_step_deadline_and_waited_for_again_once_it_keeps_up() {
    for seed in 0..10 {
        let mut net = Net::with_short_deadline(900 + seed, &[1, 2, 3], 40);
        let (mut hung, mut woke) = (false, false);
        net.run(400_000, |net, top| {
            if top == 4 && !hung {
                net.hang(3);
                hung = true;
            }
            if top == 12 && !woke {
                net.wake(3);
                woke = true;
            }
        });
        assert!(net.assert_identical_or_guarded(), "seed {seed}");
        let leader = &net.nodes[&1];
        let dropped = leader.events.iter().find_map(|e| match e {
            Event::Dropped { peer: 3, step, why: DropReason::Deadline { .. } } => Some(*step),
            _ => None,
        });
        let dropped = dropped.unwrap_or_else(|| panic!("seed {seed}: node 3 was never dropped\n{}", net.describe()));
        assert!((5..=6).contains(&dropped), "seed {seed}: dropped at step {dropped}");
        assert_all_finished_equal(&net, &[1, 2, 3], 40, &format!("seed {seed}"));
        // Summed again in the last steps.
        assert!(rosters_of(&net, 1)[&40].contains(&3), "seed {seed}");
    }
}

/// A member whose contributions are not finite or absurdly large (with the right hashes, so the
/// guard cannot see it): each is refused on arrival on every node, named, never summed; the
/// leader stops waiting for the member, so the group trains on.
#[test]
fn a_non_finite_or_huge_contribution_is_refused_on_arrival_and_the_group_trains_on() {
    for (case, (poison, sync)) in
        [(f32::NAN, SyncConfig::SEED), (1e30, SyncConfig::SEED), (1.0, int8())].into_iter().enumerate()
    {
        let mut net = Net::started_with(990 + case as u64, &[1, 2, 3], 12, sync);
        let mut poisoned = false;
        net.run(200_000, |net, top| {
            if top == 4 && !poisoned {
                net.nodes.get_mut(&3).unwrap().poison = Some(poison);
                poisoned = true;
            }
        });
        let events = |id: PeerId| &net.nodes[&id].events;
        for id in [1, 2] {
            assert!(net.nodes[&id].session.stopped().is_none(), "case {case}: {}", net.describe());
            assert_eq!(net.nodes[&id].hashes.len(), 12, "case {case}: node {id}\n{}", net.describe());
            assert!(
                events(id).iter().any(|e| matches!(e, Event::ContributionRefused { peer: 3, .. })),
                "case {case}: node {id} names the sender"
            );
        }
        assert_eq!(hashes_of(&net, 1), hashes_of(&net, 2), "case {case}");
        let refused = |e: &Event| matches!(e, Event::Dropped { peer: 3, why: DropReason::Refused { .. }, .. });
        assert!(events(1).iter().any(refused), "case {case}");
        assert!(net.nodes[&1].toy.weights.iter().all(|w| w.is_finite() && w.abs() < 1e3), "case {case}");
    }
}

#[test]
fn a_kicked_member_is_told_why_and_stays_out() {
    for seed in 0..5 {
        let mut net = Net::started(950 + seed, &[1, 2, 3], 16);
        let mut kicked = false;
        net.run(100_000, |net, top| {
            if top == 3 && !kicked {
                net.input(1, Input::Kick { peer: 3, why: "the host asked".into() });
                kicked = true;
            }
        });
        assert!(net.assert_identical_or_guarded(), "seed {seed}");
        assert_eq!(net.nodes[&1].hashes.len(), 16);
        assert_eq!(hashes_of(&net, 1), hashes_of(&net, 2));
        let told = net.nodes[&3].events.iter().find_map(|e| match e {
            Event::Removed { why, .. } => Some(why.clone()),
            _ => None,
        });
        assert_eq!(told, Some(Removal::Kicked("the host asked".into())), "seed {seed}");
        assert!(told.unwrap().to_string().contains("the host asked"));
        assert!(net.nodes[&3].hashes.len() < 16, "seed {seed}: the kicked node trained on");
        assert!(!net.nodes[&1].session.configuration().1.contains(&3), "seed {seed}: out of the configuration");
        net.input(2, Input::Kick { peer: 1, why: "no".into() });
        let refused = Event::Problem(Problem::NotLeader { action: LeaderAction::Kick, leader: Some(1) });
        assert_eq!(net.nodes[&2].events.last(), Some(&refused));
    }
}

/// A compute failure reaches the session as a type: the node stops contributing, says why
/// (`Stop::Compute`, the replica's error kept whole), and a failed configure is reported the
/// same way without stopping anything.
#[test]
fn a_failed_compute_stops_the_node_and_says_why() {
    let mut session = Session::new(SessionConfig {
        me: 2,
        expected_phash: PHASH,
        repair_after_ms: 50,
        deadline: StepDeadline::default(),
        slow_windows: 0,
        computes: true,
        agreement: TIMING,
        compute_ahead: true,
        audit_rate: 0,
        audit_state_part: 1000,
        audit_workers: 1,
    });
    // It starts a run alone (the leader of a group of one).
    let asked = session.handle(Input::Start(settings(10)));
    assert!(asked.contains(&Output::Configure(settings(10))), "{asked:?}");
    let error = Failure::new(std::io::Error::other("the backend's device was lost"));
    let reported = session.handle(Input::Failed { task: Task::Configure, error: error.clone() });
    assert_eq!(
        reported,
        vec![Output::Event(Event::Problem(Problem::Failed { task: Task::Configure, error: error.clone() }))]
    );
    assert!(session.stopped().is_none(), "a failed configure stops nothing");
    session.handle(Input::Start(settings(10)));
    let asked = session.handle(Input::Configured { weights: LEN });
    assert!(asked.contains(&Output::Compute { step: 1, cap: u32::MAX }), "{asked:?}");
    let stopped = session.handle(Input::Failed { task: Task::Compute { step: 1 }, error: error.clone() });
    let stop = Stop::Compute { step: 1, error };
    assert_eq!(stopped, vec![Output::Event(Event::Problem(Problem::Stopped(stop.clone())))]);
    assert_eq!(session.stopped(), Some(&stop));
    assert!(stop.to_string().contains("computing step 1 failed") && stop.to_string().contains("device was lost"));
    let later = session.handle(Input::Tick { now_ms: 1_000 });
    assert!(!later.iter().any(|o| matches!(o, Output::Compute { .. })), "{later:?}");
}

/// No step anyone applied, at any time, was applied with two different weights: every node's
/// whole history of applies (restores do not erase it) agrees step by step.
fn assert_one_group_per_step(net: &Net, what: &str) {
    let mut by_step: BTreeMap<(Epoch, u32), BTreeSet<u32>> = BTreeMap::new();
    for node in net.nodes.values() {
        for (epoch, step, hash) in &node.log {
            by_step.entry((*epoch, *step)).or_default().insert(*hash);
        }
    }
    let forked: Vec<_> = by_step.iter().filter(|(_, h)| h.len() > 1).collect();
    assert!(forked.is_empty(), "{what}: two groups committed one step: {forked:?}\n{}", net.describe());
}

/// Severs or restores every link between two sides.
fn split(net: &mut Net, a: &[PeerId], b: &[PeerId], cut: bool) {
    for x in a {
        for y in b {
            if cut {
                net.sever(*x, *y);
            } else {
                net.reconnect(*x, *y);
            }
        }
    }
}

/// A network split into two parts that cannot reach each other: the majority goes on (under a
/// new leader, when the leader is cut off), the minority commits nothing and says it reaches no
/// majority; when the cut heals, the minority catches up equal to the run.
#[test]
fn two_parts_that_cannot_reach_each_other_commit_on_the_majority_side_only() {
    for seed in 0..8 {
        let mut net = Net::with_short_deadline(1200 + seed, &[1, 2, 3, 4, 5], 200);
        let (going, minority): (Vec<PeerId>, Vec<PeerId>) =
            if seed % 2 == 0 { (vec![1, 2, 4], vec![3, 5]) } else { (vec![2, 4, 5], vec![1, 3]) };
        let (mut cut_at, mut healed) = (None, false);
        let mut minority_top = 0;
        net.run(800_000, |net, top| {
            if top == 5 && cut_at.is_none() {
                split(net, &going, &minority, true);
                cut_at = Some(top);
            }
            if cut_at.is_some() && !healed {
                minority_top = minority.iter().map(|id| net.nodes[id].session.applied()).max().unwrap();
            }
            if cut_at.is_some() && top >= 20 && !healed {
                split(net, &going, &minority, false);
                healed = true;
            }
        });
        assert_one_group_per_step(&net, &format!("seed {seed}"));
        assert!(minority.iter().any(|id| said_no_majority(&net, *id)), "seed {seed}\n{}", net.describe());
        // While cut, the minority applied at most what was committed before the cut.
        assert!(minority_top <= 6, "seed {seed}: the minority went on to step {minority_top}");
        for id in &going {
            assert!(!said_no_majority(&net, *id), "seed {seed}: node {id}\n{}", net.describe());
        }
        assert_all_finished_equal(&net, &[1, 2, 3, 4, 5], 200, &format!("seed {seed}"));
    }
}

/// Two even halves of four: neither is a majority, so neither commits; healed, the group elects
/// a leader and goes on, every node equal.
#[test]
fn two_even_halves_commit_nothing_until_healed() {
    for seed in 0..6 {
        let mut net = Net::with_short_deadline(1250 + seed, &[1, 2, 3, 4], 200);
        let (left, right) = ([1, 3], [2, 4]);
        let (mut cut_at, mut healed, mut top_cut) = (None, false, 0);
        net.run(800_000, |net, top| {
            if top == 5 && cut_at.is_none() {
                split(net, &left, &right, true);
                cut_at = Some(net.now_ms);
            }
            if cut_at.is_some() && !healed {
                top_cut = top;
            }
            if cut_at.is_some_and(|t| net.now_ms > t + 3_000) && !healed {
                split(net, &left, &right, false);
                healed = true;
            }
        });
        assert_one_group_per_step(&net, &format!("seed {seed}"));
        assert!(top_cut <= 6, "seed {seed}: a half went on to step {top_cut}");
        for id in [1, 2, 3, 4] {
            assert!(said_no_majority(&net, id), "seed {seed}: node {id}\n{}", net.describe());
        }
        assert_all_finished_equal(&net, &[1, 2, 3, 4], 200, &format!("seed {seed}"));
    }
}

/// A follower suspended past the life of its links: the group goes on without it; when it
/// wakes it sees every peer leave, says it reaches no majority, commits nothing alone, never
/// leads, and catches up equal to the group once the mesh re-offers its links.
#[test]
fn a_follower_asleep_past_its_links_catches_up_equal() {
    for seed in 0..8 {
        let mut net = Net::with_short_deadline(1300 + seed, &[1, 2, 3], 200);
        let (mut hung, mut severed, mut woke, mut back) = (false, false, None, false);
        let mut alone_top = 0;
        net.run(800_000, |net, top| {
            if top == 4 && !hung {
                net.hang(3);
                hung = true;
            }
            if hung && top >= 8 && !severed {
                net.sever(3, 1);
                net.sever(3, 2);
                severed = true;
            }
            if top >= 12 && severed && woke.is_none() {
                net.wake(3);
                woke = Some(net.now_ms);
                alone_top = net.nodes[&3].session.applied();
            }
            if let Some(t) = woke {
                if !back {
                    alone_top = alone_top.max(net.nodes[&3].session.applied());
                }
                if net.now_ms > t + 1_000 && !back {
                    net.reconnect(3, 1);
                    net.reconnect(3, 2);
                    back = true;
                }
            }
        });
        assert_one_group_per_step(&net, &format!("seed {seed}"));
        let events = &net.nodes[&3].events;
        assert!(events.iter().any(|e| matches!(e, Event::Slept { .. })), "seed {seed}: {events:?}");
        let alone = events.iter().find_map(|e| match e {
            Event::NoMajority { reach, voters, .. } => Some((reach.clone(), voters.clone())),
            _ => None,
        });
        assert_eq!(alone, Some((vec![3], vec![1, 2, 3])), "seed {seed}\n{}", net.describe());
        // A leader heard again ends it, even the one it followed before, in the same term.
        let alone_at = events.iter().position(|e| matches!(e, Event::NoMajority { .. })).unwrap();
        let heard = events[alone_at..].iter().any(|e| matches!(e, Event::Leader { .. }));
        assert!(heard, "seed {seed}: no leader said after the minority ended: {:?}", &events[alone_at..]);
        assert!(alone_top <= 5, "seed {seed}: alone, node 3 applied up to step {alone_top}");
        assert!(!events.iter().any(|e| matches!(e, Event::Leader { peer: 3, .. })), "seed {seed}: node 3 never leads");
        assert_all_finished_equal(&net, &[1, 2, 3], 200, &format!("seed {seed}"));
    }
}

/// A leader hung (connected, sending nothing): the others elect a new leader within two
/// election timeouts; the old one, woken, learns it no longer leads, commits nothing of its
/// own, and catches up equal.
#[test]
fn a_hung_leader_is_replaced_within_two_election_timeouts() {
    for (seed, links_die) in (0..10).map(|s| (s, s % 2 == 1)) {
        let mut net = Net::with_short_deadline(1400 + seed, &[1, 2, 3, 4], 200);
        let (mut hung_at, mut woke, mut back) = (None, None, false);
        let mut replaced_ms = None;
        net.run(800_000, |net, top| {
            let replaced = net.nodes[&2].events.iter().any(|e| matches!(e, Event::Leader { peer, .. } if *peer != 1));
            if hung_at.is_some() && replaced_ms.is_none() && replaced {
                replaced_ms = Some(net.now_ms);
            }
            if top == 4 && hung_at.is_none() {
                net.hang(1);
                hung_at = Some(net.now_ms);
            }
            if hung_at.is_some_and(|t| net.now_ms > t + 3_000) && woke.is_none() {
                if links_die {
                    for id in [2, 3, 4] {
                        net.sever(1, id);
                    }
                }
                net.wake(1);
                woke = Some(net.now_ms);
            }
            if links_die && woke.is_some_and(|t| net.now_ms > t + 1_500) && !back {
                for id in [2, 3, 4] {
                    net.reconnect(1, id);
                }
                back = true;
            }
        });
        let what = format!("seed {seed}, links die {links_die}");
        assert_one_group_per_step(&net, &what);
        let took = replaced_ms.unwrap_or(u64::MAX).saturating_sub(hung_at.unwrap());
        assert!(took <= 2 * TIMING.longest_election_ms(), "{what}: replaced {took} ms after the hang");
        assert_all_finished_equal(&net, &[1, 2, 3, 4], 200, &what);
    }
}

/// A leader that slept briefly (less than an election timeout) says so and leads on: no new
/// leader, nobody dropped.
#[test]
fn a_leader_that_slept_briefly_leads_on() {
    for seed in 0..5 {
        let mut net = Net::with_short_deadline(1500 + seed, &[1, 2, 3], 200);
        let mut hung_at = None;
        net.run(800_000, |net, top| {
            if top == 4 && hung_at.is_none() {
                net.hang(1);
                hung_at = Some(net.now_ms);
            }
            if hung_at.is_some_and(|t| net.now_ms >= t + 100) && net.hung.contains(&1) {
                net.wake(1);
            }
        });
        assert_one_group_per_step(&net, &format!("seed {seed}"));
        let new_leader = |e: &Event| matches!(e, Event::Leader { peer, .. } if *peer != 1);
        assert_eq!(net.count(|e| new_leader(e) || matches!(e, Event::Dropped { .. })), 0, "seed {seed}");
        for id in [1, 2, 3] {
            assert_eq!(net.nodes[&id].hashes.len(), 200, "seed {seed}");
        }
    }
}

/// A three-way split leaves no side a majority: nobody commits; when the links come back the
/// group elects a leader and catches everyone up.
#[test]
fn with_no_majority_anywhere_nobody_commits_until_healed() {
    for seed in 0..6 {
        let mut net = Net::with_short_deadline(1700 + seed, &[1, 2, 3, 4, 5], 200);
        let sides: [&[PeerId]; 3] = [&[1, 2], &[3, 4], &[5]];
        let (mut cut_at, mut healed, mut top_cut, mut top_during) = (None, false, 0, 0);
        net.run(800_000, |net, top| {
            let cut = |net: &mut Net, on: bool| {
                for (i, a) in sides.iter().enumerate() {
                    for b in &sides[i + 1..] {
                        split(net, a, b, on);
                    }
                }
            };
            // Cut once all five vote (each side is then a minority).
            let voters = net.nodes[&1].session.configuration().0.len();
            if top >= 4 && voters == 5 && cut_at.is_none() {
                cut(net, true);
                cut_at = Some(net.now_ms);
                top_cut = top;
            }
            if cut_at.is_some() && !healed {
                top_during = top_during.max(top);
            }
            if cut_at.is_some_and(|t| net.now_ms > t + 3_000) && !healed {
                cut(net, false);
                healed = true;
            }
        });
        assert_one_group_per_step(&net, &format!("seed {seed}"));
        assert!(top_cut > 0, "seed {seed}: all five voted");
        assert!(top_during <= top_cut + 1, "seed {seed}: cut at {top_cut}, a side committed up to {top_during}");
        for id in [1, 2, 3, 4, 5] {
            assert!(said_no_majority(&net, id), "seed {seed}: node {id}\n{}", net.describe());
        }
        assert_all_finished_equal(&net, &[1, 2, 3, 4, 5], 200, &format!("seed {seed}"));
    }
}

/// Two of three voters crash for good: the survivor cannot tell that from a cut, reaches no
/// majority and says so; it commits nothing, and a newcomer gets nothing from it (Raft does not
/// shrink a configuration without a majority: the run must be restarted from a checkpoint).
#[test]
fn a_survivor_of_a_majority_crash_commits_nothing_and_says_so() {
    let mut net = Net::with_short_deadline(1800, &[1, 2, 3], 60);
    let (mut killed, mut until) = (false, None);
    net.run(400_000, |net, top| {
        if top == 5 && !killed {
            net.kill(2);
            net.kill(3);
            net.join(4);
            killed = true;
            until = Some(net.now_ms + 5_000);
        }
        if until.is_some_and(|t| net.now_ms > t) && net.nodes[&1].alive {
            net.kill(1);
            net.kill(4);
        }
    });
    assert_one_group_per_step(&net, "majority crash");
    assert!(said_no_majority(&net, 1), "{}", net.describe());
    assert!(net.nodes[&1].session.applied() <= 6);
    assert_eq!(net.nodes[&4].session.applied(), 0);
}

/// A member whose peer info says it cannot compute is an observer: never in the run's
/// configuration or a record, told the run and sent one resume; the group trains as if it were
/// not there.
#[test]
fn an_observer_never_enters_the_configuration_and_costs_nothing() {
    for seed in 0..5 {
        let mut net = Net::new(1900 + seed);
        net.deadline = StepDeadline { floor_ms: 1_000, ceiling_ms: 4_000, factor: 4 };
        for id in [1, 2] {
            net.join(id);
        }
        net.join_as(7, false);
        net.start(1, 20);
        net.run(100_000, |_, _| {});
        assert!(net.assert_identical_or_guarded());
        assert_eq!(hashes_of(&net, 1), single_process(&[1, 2], 20), "seed {seed}");
        let (voters, learners) = net.nodes[&1].session.configuration();
        assert!(!voters.contains(&7) && !learners.contains(&7), "seed {seed}");
        assert_eq!(net.count(|e| matches!(e, Event::Dropped { .. })), 0, "seed {seed}");
        assert!(net.nodes[&1].events.contains(&Event::Observer(7)));
        let watched = &net.nodes[&7];
        assert!(watched.events.iter().any(|e| matches!(e, Event::RunStarted { leader: 1, .. })), "seed {seed}");
        assert!(watched.hashes.is_empty(), "an observer computes and applies nothing");
    }
}

/// A member that says it computes but never answers: in a group of two and a group of four it
/// costs the group a step deadline at the run's start (where everyone is waited for) and one
/// after its first resume, never votes and is never summed; the others train on as they would
/// without it.
#[test]
fn a_member_that_never_computes_costs_one_deadline() {
    for (ids, seed) in [(&[1, 2][..], 0), (&[1, 2][..], 1), (&[1, 2, 3, 4][..], 2), (&[1, 2, 3, 4][..], 3)] {
        let run = |lazy: bool| {
            let mut net = Net::new(2000 + seed);
            net.deadline = StepDeadline { floor_ms: 1_000, ceiling_ms: 4_000, factor: 4 };
            for id in ids {
                net.join(*id);
            }
            net.join(9);
            net.nodes.get_mut(&9).unwrap().lazy = lazy;
            if !lazy {
                net.kill(9);
            }
            net.start(1, 60);
            net.run(400_000, |_, _| {});
            net
        };
        let (lazy, alone) = (run(true), run(false));
        assert!(lazy.assert_identical_or_guarded());
        // Waited for at the start, and after its first resume: never again.
        let drops = lazy.count(|e| matches!(e, Event::Dropped { peer: 9, .. }));
        assert!((1..=2).contains(&drops), "seed {seed}: {drops} drops in {} ms\n{}", lazy.now_ms, lazy.describe());
        assert!(!lazy.nodes[&1].session.configuration().0.contains(&9), "seed {seed}: it never votes");
        // Never in a record.
        assert!(lazy.nodes[&1]
            .events
            .iter()
            .all(|e| !matches!(e, Event::StepApplied { peers, .. } if peers.contains(&9))));
        assert_eq!(hashes_of(&lazy, 1), hashes_of(&alone, 1), "seed {seed}: the same steps, the same weights");
    }
}

/// A seeded campaign of overlapping faults on the simulated network (100 episodes) — suspensions (some past
/// the links' life), cut halves, kills with newcomers — in `every-step` (f32, int8 or `topk:64`)
/// and `outer:2` int8:
/// never two weights for one step, and once everything heals every live member finishes equal.
#[test]
fn a_seeded_fault_campaign_never_forks_and_always_finishes() {
    // Beyond the first hundred, seeds that once failed with chunk owners (forced for them): a
    // leader re-elected while it held a step taken tentatively from its own record of an
    // earlier term, which a leader between had replaced in the log (220: the entry cut; 536:
    // a configuration change in its place, committed) — it proposed nothing, for ever; a
    // member that caught up by itself and then took the resume it had asked for (892): the
    // step after was computed again from a reset residual, unlike the contribution the record
    // named, and its residual was taken on a grid below its own exponents.
    const ONCE_FAILED: [u64; 3] = [220, 536, 892];
    let seeds: Vec<u64> = match std::env::var("SIM_SEEDS") {
        Ok(list) => list.split(',').filter_map(|s| s.parse().ok()).collect(),
        Err(_) => (0..100).chain(ONCE_FAILED).collect(),
    };
    let (mut taken_ahead, mut undone) = (0, 0);
    for seed in seeds {
        let mut rng = SplitMix64::new(5000 + seed);
        // Every-step's contributions f32, int8 or `topk:64` picks (error feedback's residual,
        // the pick's whole chunks) by turns — the packed ones every other time summed by chunk
        // owners; `outer:2` int8 for odd seeds.
        let exchange = if seed % 12 >= 6 || ONCE_FAILED.contains(&seed) { Exchange::Owners } else { Exchange::Mesh };
        let sync = match seed % 6 {
            0 => SyncConfig::SEED,
            2 => SyncConfig { exchange, ..int8() },
            4 => SyncConfig { compression: Compression::TopK(64), exchange, ..SyncConfig::SEED },
            _ => SyncConfig { mode: SyncMode::Outer { inner_steps: 2 }, ..int8() },
        };
        let nodes: Vec<PeerId> = if rng.below(2) == 0 { vec![1, 2, 3] } else { vec![1, 2, 3, 4] };
        let mut net = Net::new(5000 + seed);
        net.sync = sync;
        // One seed in ten waits for each commit before computing on (`--no-compute-ahead`).
        net.compute_ahead = seed % 10 != 9;
        net.deadline = StepDeadline { floor_ms: 1_000, ceiling_ms: 4_000, factor: 4 };
        for id in &nodes {
            net.join(*id);
        }
        net.start(1, 300 * sync.mode.steps_per_sync());
        // Faults at random times in the first seconds, each healed after up to 2 s (a long
        // suspension: its links die while the node sleeps).
        let mut plan: Vec<(u64, u64, u8, PeerId)> = (0..3)
            .map(|_| {
                let at = 300 + rng.below(3_000);
                let kind = rng.below(4) as u8;
                (at, at + 200 + rng.below(2_000), kind, nodes[rng.below(nodes.len() as u64) as usize])
            })
            .collect();
        plan.sort();
        if std::env::var_os("SIM_EVENTS").is_some() {
            eprintln!("seed {seed}: {} nodes, plan (at, until, kind, who) {plan:?}", nodes.len());
        }
        let mut started = vec![false; plan.len()];
        let mut healed = vec![false; plan.len()];
        // The sides each cut split the group into (kept to heal the same links).
        let mut sides: Vec<(Vec<PeerId>, Vec<PeerId>)> = vec![(Vec::new(), Vec::new()); plan.len()];
        let mut killed = 0;
        const NEWCOMER: PeerId = 10;
        net.run(400_000, |net, _| {
            for (i, &(at, until, kind, who)) in plan.iter().enumerate() {
                // A fault on a node that died before it began does not happen; one under way
                // still heals.
                if net.now_ms >= at && !started[i] && !net.nodes[&who].alive {
                    started[i] = true;
                    healed[i] = true;
                }
                if net.now_ms >= at && !started[i] {
                    let alive = |p: &PeerId| net.nodes[p].alive;
                    sides[i] = (
                        nodes.iter().copied().filter(|p| *p <= who && alive(p)).collect(),
                        nodes.iter().copied().filter(|p| *p > who && alive(p)).collect(),
                    );
                    started[i] = true;
                    match kind {
                        0 => net.hang(who),
                        1 => {
                            net.hang(who);
                            let others: Vec<PeerId> =
                                nodes.iter().copied().filter(|p| *p != who && net.nodes[p].alive).collect();
                            for p in others {
                                net.sever(who, p);
                            }
                        }
                        2 => split(net, &sides[i].0, &sides[i].1, true),
                        // Never a majority gone for good: one kill, then a newcomer.
                        _ if killed == 0 && nodes.len() >= 3 => {
                            killed += 1;
                            net.kill(who);
                        }
                        _ => net.hang(who),
                    }
                }
                if net.now_ms >= until && started[i] && !healed[i] {
                    healed[i] = true;
                    match kind {
                        1 if net.nodes[&who].alive => {
                            net.wake(who);
                            let others: Vec<PeerId> =
                                nodes.iter().copied().filter(|p| *p != who && net.nodes[p].alive).collect();
                            for p in others {
                                net.reconnect(who, p);
                            }
                        }
                        2 => {
                            let (a, b) = sides[i].clone();
                            let a: Vec<PeerId> = a.into_iter().filter(|p| net.nodes[p].alive).collect();
                            let b: Vec<PeerId> = b.into_iter().filter(|p| net.nodes[p].alive).collect();
                            split(net, &a, &b, false);
                        }
                        _ => {
                            if net.hung.contains(&who) {
                                net.wake(who);
                            }
                        }
                    }
                }
            }
            if killed == 1 && !net.nodes.contains_key(&NEWCOMER) {
                net.join(NEWCOMER);
            }
        });
        let what = format!("seed {seed} ({sync}, {} nodes): {plan:?}", nodes.len());
        assert_one_group_per_step(&net, &what);
        assert_eq!(net.count(|e| matches!(e, Event::GuardStopped(_))), 0, "{what}");
        // Nobody here is wrong: faults never convict a member (no audits run; the owners'
        // fingerprints check every sum).
        assert_eq!(net.count(|e| matches!(e, Event::Verdict(_))), 0, "{what}");
        let failed: u32 = net.nodes.values().map(|n| n.session.audit_stats().sums_failed).sum();
        assert_eq!(failed, 0, "{what}: a right sum's fingerprints always add up");
        let live: Vec<PeerId> = net.live();
        assert_all_finished_equal(&net, &live, 300, &what);
        let ahead: u32 = net.nodes.values().map(|n| n.tentative).sum();
        assert!(net.compute_ahead || ahead == 0, "{what}: {ahead} steps taken ahead with compute ahead off");
        taken_ahead += ahead;
        undone += net.nodes.values().map(|n| n.undone).sum::<u32>();
    }
    eprintln!("campaign: {taken_ahead} steps taken ahead of their commit, {undone} undone");
    if std::env::var_os("SIM_SEEDS").is_none() {
        // Both ways a step taken ahead ends are played: it stands (nearly always), and another
        // leader's record replaces it (27 times in these seeds).
        assert!(taken_ahead > 10_000 && undone > 0, "{taken_ahead} taken ahead, {undone} undone");
    }
}

/// Four members auditing one another at `rate` (per mille), every step, f32.
fn audited(seed: u64, rate: u32, steps: u32) -> Net {
    let mut net = Net::new(seed);
    net.audit_rate = rate;
    for id in [1, 2, 3, 4] {
        net.join(id);
    }
    net.start(1, steps);
    net
}

/// Four members summing by chunk owners for 20 steps, `fault` struck once at member `id` when the
/// group applied step 5; the run, and the other members.
fn owners_struck_at_step_5(seed: u64, id: PeerId, fault: fn(&mut Session)) -> (Net, Vec<PeerId>) {
    let net = owners_run_struck_at_step_5(seed, |net| fault(&mut net.nodes.get_mut(&id).unwrap().session));
    (net, [1, 2, 3, 4].into_iter().filter(|&member| member != id).collect())
}

/// Four members summing by chunk owners for 20 steps, `strike` run once when the group applied
/// step 5.
fn owners_run_struck_at_step_5(seed: u64, mut strike: impl FnMut(&mut Net)) -> Net {
    let mut net = Net::new(seed);
    net.sync = SyncConfig { exchange: Exchange::Owners, ..int8() };
    for member in [1, 2, 3, 4] {
        net.join(member);
    }
    net.start(1, 20);
    let mut struck = false;
    net.run(400_000, |net, top| {
        if top == 5 && !struck {
            strike(net);
            struck = true;
        }
    });
    net
}

/// The owners' fingerprints (`docs/OWNERS.md`, "How an owner is checked"): an owner whose sums
/// are off by one in a value — sent and applied by itself alike, so every replica agrees and the
/// weight-hash guard sees nothing — is found by the members' checks of the contributors'
/// fingerprints once the next record commits; the leader recomputes the chunk's sum from its
/// authors' pieces and the verdict (the word, both values) commits through the log. A wrong
/// leader is shunned by the members whose checks failed, and the next leader settles it. The
/// others train on to the end, equal.
#[test]
fn a_wrong_owners_sum_is_found_by_the_fingerprints_and_removed_through_the_log() {
    for (seed, wrong) in (1301..1341u64).map(|s| (s, 1 + s % 4)) {
        let (net, others) = owners_struck_at_step_5(seed, wrong, Session::play_wrong_owner);
        for &id in &others {
            let verdict = verdict_of(&net, id).unwrap_or_else(|| panic!("seed {seed}: no verdict\n{}", net.describe()));
            assert_eq!(verdict.target, wrong, "seed {seed}: {verdict}");
            assert!(matches!(verdict.evidence, Evidence::SumWrong { .. }), "seed {seed}: {verdict}");
            // Found within a step or two of the first wrong sum.
            assert!((6..=8).contains(&verdict.step), "seed {seed}: {verdict}");
            let failed = net.nodes[&id].session.audit_stats().sums_failed;
            assert!(failed >= 1, "seed {seed}: node {id} checked and found it");
        }
        // Every other member ends equal and no guard stops the run (one may fall behind while
        // the removed owner's chunk of the next step is summed from its authors' pieces, and
        // resume).
        assert_all_finished_equal(&net, &others, 20, &format!("seed {seed}"));
        assert!(others.iter().all(|&id| guard_failure(&net, id).is_none()), "seed {seed}");
        assert!(net.nodes[&wrong].session.stopped().is_some(), "seed {seed}: the wrong owner is out");
    }
}

/// A contributor that lies in its fingerprints makes an honest owner's sum fail every check:
/// the leader's recomputation finds the sum right and the liar's fingerprint not its own chunk's,
/// and convicts the liar, never the owner.
#[test]
fn a_false_fingerprint_names_its_sender_not_the_owner() {
    for (seed, liar) in (1401..1421u64).map(|s| (s, 1 + s % 4)) {
        let (net, others) = owners_struck_at_step_5(seed, liar, Session::play_false_fingerprints);
        for &id in &others {
            let verdict = verdict_of(&net, id).unwrap_or_else(|| panic!("seed {seed}: no verdict\n{}", net.describe()));
            assert_eq!(verdict.target, liar, "seed {seed}: {verdict}");
            match verdict.evidence {
                Evidence::Fingerprint { chunk: 0, expected, claimed } => {
                    assert_eq!(claimed, (expected + 1) % lockstep_node::sync::owners::FINGERPRINT_PRIME, "seed {seed}")
                }
                other => panic!("seed {seed}: {other:?}"),
            }
        }
        assert_eq!(
            net.count(|e| matches!(e, Event::Verdict(v) if v.target != liar)),
            0,
            "seed {seed}: the owner is right"
        );
        assert_all_finished_equal(&net, &others, 20, &format!("seed {seed}"));
        assert!(net.nodes[&liar].session.stopped().is_some(), "seed {seed}: the liar is out");
    }
}

/// A contributor that withholds its fingerprints (sends none, answers no request) leaves the
/// members' checks of its steps incomplete — and would shield a wrong owner. The leader does not
/// depend on them: a step after asking again it computes the missing fingerprints from the
/// contributor's chunks (asked of it and the chunks' holders) and checks the sums with them.
/// Alone, the withholding costs nothing and names nobody; beside a wrong owner, the leader's
/// check finds the wrong sum and the owner is convicted as ever.
#[test]
fn withheld_fingerprints_are_computed_by_the_leader_and_a_wrong_owner_is_still_found() {
    for seed in 1501..1513u64 {
        // Members 2–4 withhold by turns; with every other seed, the next one is a wrong owner.
        let withholder = 2 + seed % 3;
        let wrong = (seed % 2 == 0).then_some(2 + (seed + 1) % 3);
        let net = owners_run_struck_at_step_5(seed, |net| {
            net.nodes.get_mut(&withholder).unwrap().session.play_withheld_fingerprints();
            if let Some(wrong) = wrong {
                net.nodes.get_mut(&wrong).unwrap().session.play_wrong_owner();
            }
        });
        let what = format!("seed {seed}: withholder {withholder}, wrong {wrong:?}\n{}", net.describe());
        let recomputed: Vec<u32> = net.nodes[&1]
            .events
            .iter()
            .filter_map(|e| match e {
                Event::PrintsRecomputed { step, author } if *author == withholder => Some(*step),
                _ => None,
            })
            .collect();
        assert!(!recomputed.is_empty(), "the leader computed the withheld fingerprints: {what}");
        let leader = net.nodes[&1].session.audit_stats();
        assert_eq!(leader.sums_failed > 0, wrong.is_some(), "{what}");
        let others: Vec<PeerId> = [1, 2, 3, 4].into_iter().filter(|p| Some(*p) != wrong).collect();
        match wrong {
            None => {
                assert_eq!(net.count(|e| matches!(e, Event::Verdict(_))), 0, "nobody is convicted: {what}");
                // Every step the leader applied from owners' sums is checked but the last ones
                // (no record after them to draw challenges from, or recomputed too late).
                assert!(leader.sums_checked >= 4 * 14 && leader.sums_unchecked <= 4 * 3, "{leader:?}: {what}");
            }
            Some(wrong) => {
                for &id in &others {
                    let verdict = verdict_of(&net, id).unwrap_or_else(|| panic!("no verdict: {what}"));
                    assert_eq!(verdict.target, wrong, "{verdict}: {what}");
                    assert!(matches!(verdict.evidence, Evidence::SumWrong { .. }), "{verdict}: {what}");
                }
                assert!(net.nodes[&wrong].session.stopped().is_some(), "the wrong owner is out: {what}");
            }
        }
        assert_all_finished_equal(&net, &others, 20, &what);
    }
}

/// Audits by recomputation: a member whose contributions are finite, in bounds and carry the
/// right hashes — scaled by 1.001, or sign-flipped — passes every check on arrival and the
/// guard; the members the committed records assign recompute it, the leader checks the
/// accusation by recomputing it too, and the verdict commits through the log with its evidence
/// (the first differing value, both bits): every member names the same member, which is told
/// and stops, and the others train on to the end, equal.
#[test]
fn a_rogue_contribution_is_recomputed_named_and_removed_through_the_log() {
    for (seed, factor) in [(1201, 1.001f32), (1202, -1.0), (1203, 1.001), (1204, -1.0)] {
        let mut net = audited(seed, 500, 40);
        let mut rogue = false;
        net.run(400_000, |net, top| {
            if top == 3 && !rogue {
                net.nodes.get_mut(&3).unwrap().scale = Some(factor);
                rogue = true;
            }
        });
        let what = format!("seed {seed} ×{factor}\n{}", net.describe());
        let verdict = |id: PeerId| {
            net.nodes[&id].events.iter().find_map(|e| match e {
                Event::Verdict(v) => Some(*v),
                _ => None,
            })
        };
        let named = verdict(1).unwrap_or_else(|| panic!("nobody was named: {what}"));
        assert_eq!(named.target, 3, "{what}");
        // Named within a few syncs of the first wrong contribution (step 4 or 5).
        assert!(named.step <= 12, "named at step {}: {what}", named.step);
        let Evidence::Word { word, expected, claimed } = named.evidence else { panic!("{named:?}") };
        assert!(word >= 1, "a value, not the loss: {named:?}");
        assert_eq!(f32::from_bits(claimed), f32::from_bits(expected) * factor, "{named:?}");
        for id in [2, 4] {
            assert_eq!(verdict(id), Some(named), "node {id}: {what}");
        }
        let told = net.nodes[&3]
            .events
            .iter()
            .any(|e| matches!(e, Event::Removed { why: Removal::Audit(v), .. } if *v == named));
        assert!(told, "the rogue is told why: {what}");
        assert!(matches!(net.nodes[&3].session.stopped(), Some(Stop::Removed { .. })), "{what}");
        assert_all_finished_equal(&net, &[1, 2, 4], 40, &what);
        assert!(!net.nodes[&1].session.configuration().0.contains(&3), "out of the configuration: {what}");
        // Never summed after its verdict.
        for (step, roster) in rosters_of(&net, 1) {
            assert!(step <= named.step + 2 || !roster.contains(&3), "step {step}: {roster:?}: {what}");
        }
    }
}

/// Disputes: before the verdict, the leader narrows the departure to one op of the target's
/// step — the target runs its step again on its own backend and sends its trace (`-24`/`-25`),
/// the leader runs the definition's against it, asks for the words of the first chunk where
/// they part and names the op, buffer and word with both values. A wrong backend is named so;
/// a rogue whose step's ops are honest (it scales what they give) and one that answers no
/// trace request keep the contribution's evidence. Meanwhile the target is not summed.
#[test]
fn a_dispute_narrows_a_wrong_backend_to_its_op_and_keeps_a_rogues_contribution_evidence() {
    enum Kind {
        Backend,
        Scale,
        Silent,
    }
    let kinds = [(1401, Kind::Backend), (1402, Kind::Backend), (1405, Kind::Backend), (1406, Kind::Backend)];
    for (seed, kind) in kinds.into_iter().chain([(1403, Kind::Scale), (1404, Kind::Silent), (1407, Kind::Scale)]) {
        let mut net = audited(seed, 500, 40);
        let mut wrong = false;
        net.run(400_000, |net, top| {
            if top == 3 && !wrong {
                let node = net.nodes.get_mut(&3).unwrap();
                match kind {
                    Kind::Backend => node.wrong_value = Some(5),
                    Kind::Scale => node.scale = Some(1.001),
                    Kind::Silent => (node.scale, node.untraced) = (Some(1.001), true),
                }
                wrong = true;
            }
        });
        let what = format!("seed {seed}\n{}", net.describe());
        let named = verdict_of(&net, 1).unwrap_or_else(|| panic!("nobody was named: {what}"));
        assert_eq!(named.target, 3, "{what}");
        assert!(named.step <= 12, "named at step {}: {what}", named.step);
        match kind {
            Kind::Backend => {
                let Evidence::Op { op, code, buffer, word, expected, claimed } = named.evidence else {
                    panic!("narrowed to an op: {named:?}: {what}")
                };
                assert_eq!((op, code, buffer, word), (0, MATMUL, 1, 5), "{named:?}");
                assert_eq!(claimed, expected ^ 1, "{named:?}");
            }
            Kind::Scale | Kind::Silent => {
                let Evidence::Word { expected, claimed, .. } = named.evidence else { panic!("{named:?}: {what}") };
                assert_eq!(f32::from_bits(claimed), f32::from_bits(expected) * 1.001, "{named:?}");
            }
        }
        for id in [2, 4] {
            assert_eq!(verdict_of(&net, id), Some(named), "node {id}: {what}");
        }
        let leader = net.nodes.iter().find(|(_, n)| n.events.iter().any(|e| matches!(e, Event::Disputing { .. })));
        let (&leader, node) = leader.unwrap_or_else(|| panic!("a dispute: {what}"));
        let began = node.events.iter().find_map(|e| match e {
            Event::Disputing { step, target: 3, .. } => Some(*step),
            _ => None,
        });
        let began = began.unwrap_or_else(|| panic!("node {leader} disputed node 3: {what}"));
        // The target ran its step again once for the dispute: asked against the definition's
        // trace, it answered its trace and its words in one message.
        if let Kind::Backend | Kind::Scale = kind {
            assert_eq!(net.nodes[&3].traces_served, 1, "{what}");
        }
        assert_all_finished_equal(&net, &[1, 2, 4], 40, &what);
        // Not summed once disputed: the leader proposed no record with it after the dispute
        // began (a record under way may still name it).
        for (step, roster) in rosters_of(&net, 1) {
            assert!(step <= began + 3 || !roster.contains(&3), "step {step}: {roster:?}: {what}");
        }
    }
}

/// A check does not wait behind a routine recomputation: the leader's routine audits never end
/// here (a worker starved of spare cycles), yet the others' accusations of a ×1.001 member are
/// checked at once — the routine audit given up and counted skipped — and it is named within a
/// few syncs. (Before, the check waited for a worker that never came free: nobody was named.)
#[test]
fn a_check_does_not_wait_behind_a_routine_audit_that_never_ends() {
    for seed in [1501, 1502, 1503] {
        let mut net = audited(seed, 1000, 40);
        let mut leader = None;
        net.run(400_000, |net, top| {
            if top == 3 && leader.is_none() {
                let (&id, node) = net.nodes.iter_mut().find(|(_, n)| n.session.is_leader()).expect("a leader");
                node.routine_never_ends = true;
                leader = Some(id);
                let rogue = if id == 3 { 4 } else { 3 };
                net.nodes.get_mut(&rogue).unwrap().scale = Some(1.001);
            }
        });
        let what = format!("seed {seed}\n{}", net.describe());
        let leader = leader.expect("a leader at step 3");
        let rogue = if leader == 3 { 4 } else { 3 };
        let named = verdict_of(&net, leader).unwrap_or_else(|| panic!("nobody was named: {what}"));
        assert_eq!(named.target, rogue, "{what}");
        assert!(named.step <= 12, "named at step {}: {what}", named.step);
        let skipped = net.nodes[&leader].session.audit_stats().skipped;
        assert!(skipped >= 1, "the leader's routine audit was given up for the check: {what}");
    }
}

/// Honest members audited at every step: each assignment recomputes the same bits, nobody is
/// accused, and the audits' counts add up.
#[test]
fn honest_members_audited_every_step_are_never_accused() {
    for seed in [1301, 1302, 1303] {
        let mut net = audited(seed, 1000, 30);
        net.run(400_000, |_, _| {});
        let what = format!("seed {seed}\n{}", net.describe());
        assert_all_finished_equal(&net, &[1, 2, 3, 4], 30, &what);
        let mut audited = 0;
        for (id, node) in &net.nodes {
            assert!(
                !node.events.iter().any(|e| matches!(e, Event::Accused { .. } | Event::Verdict(_))),
                "node {id}: {what}"
            );
            let stats = node.session.audit_stats();
            assert_eq!(stats.audited, stats.matched, "node {id}: {stats:?}");
            assert_eq!(stats.accused, 0);
            let events = node.events.iter().filter(|e| matches!(e, Event::Audited { .. })).count() as u32;
            assert_eq!(events, stats.matched, "node {id}");
            audited += stats.audited + stats.skipped;
        }
        // Every member of every step's roster was assigned one audit (those the worker was busy
        // for were skipped and counted).
        assert!(audited >= 4 * 25, "{audited} audits: {what}");
    }
}

/// A group of four with audits at `rate` per mille, packed with `compression`, routine audits
/// checking a part of each state.
fn audited_packed(seed: u64, rate: u32, steps: u32, compression: Compression) -> Net {
    // Routine audits ask for one chunk of the toy's three; checks, for the whole.
    audited_packed_asking(seed, rate, steps, compression, 334)
}

/// [`audited_packed`], routine audits asking for `part` of a state (in a thousand).
fn audited_packed_asking(seed: u64, rate: u32, steps: u32, compression: Compression, part: u32) -> Net {
    let mut net = Net::new(seed);
    net.audit_rate = rate;
    net.audit_state_part = part;
    net.sync = SyncConfig { compression, ..SyncConfig::SEED };
    for id in [1, 2, 3, 4] {
        net.join(id);
    }
    net.start(1, steps);
    net
}

/// The verdict node `id` heard, if any.
fn verdict_of(net: &Net, id: PeerId) -> Option<lockstep_node::wire::AuditVerdict> {
    net.nodes[&id].events.iter().find_map(|e| match e {
        Event::Verdict(v) => Some(*v),
        _ => None,
    })
}

/// Packed contributions audited: each is recomputed from the residual it names (served on
/// request, `-22`/`-23`). A member whose values are wrong is named by the first differing
/// value; one whose residual is forged (its contributions consistent with the state each
/// names) by the broken link — the state its next contribution named is not the one its
/// audited contribution left; one that serves no state by withholding, confirmed by the
/// leader's own request. Each is removed through the log on every member, the others train on
/// to the end, equal.
#[test]
fn packed_rogues_are_named_by_their_values_their_broken_link_or_their_silence() {
    #[derive(Clone, Copy, Debug)]
    enum Kind {
        Scale(f32),
        Forge,
        Withhold,
    }
    let cases = [
        (1401, Compression::Int8, Kind::Scale(-1.0)),
        (1402, Compression::Int8, Kind::Scale(1.01)),
        (1403, Compression::Int4, Kind::Scale(-1.0)),
        (1404, Compression::Int8, Kind::Forge),
        (1405, Compression::Int4, Kind::Forge),
        (1406, Compression::Int8, Kind::Withhold),
        (1407, Compression::TopK(8), Kind::Scale(-1.0)),
        (1408, Compression::TopK(8), Kind::Forge),
    ];
    for (seed, compression, kind) in cases {
        let mut net = audited_packed(seed, 500, 40, compression);
        let mut rogue = false;
        net.run(600_000, |net, top| {
            if top == 3 && !rogue {
                let node = net.nodes.get_mut(&3).unwrap();
                match kind {
                    Kind::Scale(factor) => node.scale = Some(factor),
                    Kind::Forge => node.forge = true,
                    Kind::Withhold => node.withhold = true,
                }
                rogue = true;
            }
        });
        let what = format!("seed {seed} {compression:?} {kind:?}\n{}", net.describe());
        let named = verdict_of(&net, 1).unwrap_or_else(|| panic!("nobody was named: {what}"));
        assert_eq!(named.target, 3, "{what}");
        assert!(named.step <= 16, "named at step {}: {what}", named.step);
        match (kind, named.evidence) {
            (Kind::Scale(_), Evidence::Word { word, .. }) => assert!(word >= 1, "{named:?}"),
            (Kind::Forge, Evidence::State { expected, claimed }) => assert_ne!(expected, claimed),
            (Kind::Withhold, Evidence::Withheld) => {}
            _ => panic!("{kind:?} named by {named:?}: {what}"),
        }
        for id in [2, 4] {
            assert_eq!(verdict_of(&net, id), Some(named), "node {id}: {what}");
        }
        let Some(Stop::Removed { step: removed, .. }) = net.nodes[&3].session.stopped().cloned() else {
            panic!("not removed: {what}")
        };
        // Withholding is named once the auditor's and the leader's waits for the state ran out:
        // removed 13 to 25 steps after the step it withheld, over sixteen seeds (2026-12-07).
        let waits = if matches!(kind, Kind::Withhold) { 24 } else { 0 };
        assert!(removed <= named.step + 3 + waits, "removed at step {removed}: {what}");
        assert_all_finished_equal(&net, &[1, 2, 4], 40, &what);
        for (step, roster) in rosters_of(&net, 1) {
            assert!(step <= removed + 2 || !roster.contains(&3), "step {step}: {roster:?}: {what}");
        }
        // Nobody honest was accused.
        for id in [1, 2, 4] {
            let accused_honest =
                net.nodes[&id].events.iter().any(|e| matches!(e, Event::Accused { target, .. } if *target != 3));
            assert!(!accused_honest, "node {id}: {what}");
        }
    }
}

/// An auditor keeps the whole state its audit of a member derived (the one that member's next
/// contribution must name): when its next assignment is the same member, it starts from that
/// state without asking — no request, no bytes — and still compares the bits. Honest members
/// audited at every step with whole states are never accused and their links hold; a member
/// whose residual is forged, or whose values are scaled, is still named.
#[test]
fn an_auditor_that_audits_a_member_again_starts_from_the_state_its_last_audit_derived() {
    let mut derived = 0;
    for (seed, compression) in [(2101, Compression::Int8), (2102, Compression::Int4), (2103, Compression::Int8)] {
        let mut net = audited_packed_asking(seed, 1000, 40, compression, 1000);
        net.run(600_000, |_, _| {});
        let what = format!("seed {seed} {compression:?}\n{}", net.describe());
        assert_all_finished_equal(&net, &[1, 2, 3, 4], 40, &what);
        let (mut audited, mut asked) = (0, 0);
        for (id, node) in &net.nodes {
            let wrong = node.events.iter().find(|e| matches!(e, Event::Accused { .. } | Event::Verdict(_)));
            assert!(wrong.is_none(), "node {id}: {wrong:?}: {what}");
            let stats = node.session.audit_stats();
            assert_eq!(stats.audited, stats.matched, "node {id}: {stats:?}");
            audited += stats.audited;
            derived += stats.derived;
            asked += node.asked.0;
        }
        // Every audit but those started from a derived state asked for the whole state.
        assert!(asked < audited, "{asked} whole states served for {audited} audits: {what}");
    }
    // Four members at rate 1: an auditor's next target is the same one a third of the time.
    assert!(derived >= 100, "{derived} audits started from a derived state");
    for (seed, forge) in [(2111, true), (2112, false), (2113, true)] {
        let mut net = audited_packed_asking(seed, 1000, 40, Compression::Int8, 1000);
        let mut rogue = false;
        net.run(600_000, |net, top| {
            if top == 6 && !rogue {
                let node = net.nodes.get_mut(&3).unwrap();
                match forge {
                    true => node.forge = true,
                    false => node.scale = Some(1.01),
                }
                rogue = true;
            }
        });
        let what = format!("seed {seed} forge {forge}\n{}", net.describe());
        let named = verdict_of(&net, 1).unwrap_or_else(|| panic!("nobody was named: {what}"));
        assert_eq!(named.target, 3, "{what}");
        assert!(named.step <= 16, "named at step {}: {what}", named.step);
        assert_all_finished_equal(&net, &[1, 2, 4], 40, &what);
    }
}

/// Honest packed members audited at every step: every recomputation from the served residual
/// gives the bits sent, every link holds, nobody is accused, and no assignment is lost to a
/// worker busy with the last one's round trip.
#[test]
fn honest_packed_members_audited_every_step_are_never_accused_and_their_links_hold() {
    let cases =
        [(1501, Compression::Int8), (1502, Compression::Int4), (1503, Compression::Int8), (1504, Compression::TopK(8))];
    for (seed, compression) in cases {
        let mut net = audited_packed(seed, 1000, 30, compression);
        net.run(600_000, |_, _| {});
        let what = format!("seed {seed} {compression:?}\n{}", net.describe());
        assert_all_finished_equal(&net, &[1, 2, 3, 4], 30, &what);
        let (mut audited, mut linked) = (0, 0);
        for (id, node) in &net.nodes {
            assert!(
                !node.events.iter().any(|e| matches!(e, Event::Accused { .. } | Event::Verdict(_))),
                "node {id}: {what}"
            );
            let stats = node.session.audit_stats();
            assert_eq!(stats.audited, stats.matched, "node {id}: {stats:?}");
            audited += stats.audited;
            linked += stats.linked;
        }
        // Routine audits asked for one chunk, and for the next state's digests for its link;
        // nothing was checked whole (nobody was accused). `topk:8` draws its own chunk of 4,096
        // values whole: the toy's state is one such chunk, so it asks for the whole state.
        let asked = net.nodes.values().fold((0, 0, 0), |a, n| (a.0 + n.asked.0, a.1 + n.asked.1, a.2 + n.asked.2));
        let part_is_whole = matches!(compression, Compression::TopK(_));
        let (parts, wholes) = if part_is_whole { (asked.0, asked.1) } else { (asked.1, asked.0) };
        assert_eq!(wholes, 0, "{asked:?}: {what}");
        // A whole state this member's last audit of the same member derived is not asked for.
        let derived: u32 = net.nodes.values().map(|n| n.session.audit_stats().derived).sum();
        assert!(
            (audited..=audited + 4).contains(&(parts + derived)),
            "{asked:?}, {derived} derived, {audited} audited (some at the end unfinished): {what}"
        );
        // A part's link asks for the next state's chunk digests; a whole state's is its digest,
        // which the next contribution names.
        let digests_asked = if part_is_whole { linked } else { asked.2 };
        assert!(digests_asked >= linked && linked > 0, "{asked:?}, {linked} linked: {what}");
        // An assignment that came while the worker waited for a residual waited for it in
        // turn: none skipped, every member of 29 rosters after the first audited.
        let skipped: u32 = net.nodes.values().map(|n| n.session.audit_stats().skipped).sum();
        assert_eq!(skipped, 0, "{what}");
        assert!(audited >= 4 * 28, "{audited} audits: {what}");
        assert!(linked >= audited / 2, "{linked} links of {audited} audits: {what}");
    }
}

/// A wrong leader never proposes a verdict against itself (here it never even hears an
/// accusation against it). The member whose audit finds its contribution wrong tells every
/// member; each rechecks it and follows that leader no more; they elect another among
/// themselves, which proposes the verdict through the log: the old leader is named and
/// removed on every member, and the others finish the run, equal.
#[test]
fn a_wrong_leader_is_named_by_the_members_it_leads_and_replaced() {
    for seed in [1601, 1602, 1603, 1604] {
        let mut net = audited(seed, 500, 40);
        let mut rogue = false;
        net.run(600_000, |net, top| {
            if top == 3 && !rogue {
                let node = net.nodes.get_mut(&1).unwrap();
                node.scale = Some(1.001);
                node.deaf = true;
                rogue = true;
            }
        });
        let what = format!("seed {seed}\n{}", net.describe());
        let named = verdict_of(&net, 2).unwrap_or_else(|| panic!("nobody was named: {what}"));
        assert_eq!(named.target, 1, "{what}");
        assert!(matches!(named.evidence, Evidence::Word { .. }), "{named:?}");
        for id in [3, 4] {
            assert_eq!(verdict_of(&net, id), Some(named), "node {id}: {what}");
        }
        let shunned = [2, 3, 4]
            .iter()
            .filter(|id| net.nodes[id].events.iter().any(|e| matches!(e, Event::LeaderShunned { leader: 1, .. })))
            .count();
        assert!(shunned >= 2, "a majority of the others followed it no more: {what}");
        assert!(net.nodes[&2].session.leader().is_some_and(|l| l != 1), "another leader: {what}");
        assert_all_finished_equal(&net, &[2, 3, 4], 40, &what);
        assert!(!net.nodes[&2].session.configuration().0.contains(&1), "out of the configuration: {what}");
    }
}

/// A leader's answers to one member's request for its state and to the request again are lost,
/// to that member alone: the member calls it withheld and shuns the leader; the others, rechecking, are served and
/// confirm nothing, so nobody replaces it. The member does not wait for ever: once
/// [`SHUN_LAPSES_ELECTIONS`] election timeouts pass with no other leader, it follows the
/// leader again, says so, and finishes the run equal with the others; nobody is removed.
#[test]
fn a_member_alone_in_shunning_the_leader_follows_it_again_and_finishes_equal() {
    for seed in [1701, 1702, 1703] {
        let mut net = audited_packed(seed, 1000, 80, Compression::Int8);
        let mut set = false;
        net.run(3_000_000, |net, top| {
            if top == 3 && !set {
                net.nodes.get_mut(&1).unwrap().withhold_from = Some((2, 2, None));
                set = true;
            }
        });
        let what = format!("seed {seed}\n{}", net.describe());
        let events = &net.nodes[&2].events;
        assert!(events.iter().any(|e| matches!(e, Event::LeaderShunned { leader: 1, .. })), "{what}");
        let lapse = SHUN_LAPSES_ELECTIONS * TIMING.longest_election_ms();
        let lapsed = events.iter().find_map(|e| match e {
            Event::ShunLapsed { leader: 1, waited_ms, .. } => Some(*waited_ms),
            _ => None,
        });
        assert!(lapsed.is_some_and(|w| w >= lapse), "lapsed after {lapsed:?} ms, {lapse} due: {what}");
        for id in [1, 2, 3, 4] {
            assert_eq!(verdict_of(&net, id), None, "node {id}: {what}");
        }
        assert_all_finished_equal(&net, &[1, 2, 3, 4], 80, &what);
    }
}

/// Holds (or releases) every link between the nodes of `a` and those of `b`, both ways.
fn hold(net: &mut Net, a: &[PeerId], b: &[PeerId], held: bool) {
    for x in a {
        for y in b {
            for link in [(*x, *y), (*y, *x)] {
                if held {
                    net.held.insert(link);
                } else {
                    net.held.remove(&link);
                    net.draining.insert(link);
                }
            }
        }
    }
}

/// The leader cut off by a cut that holds what is sent both ways (delivered once it heals, as
/// SCTP does) while its audits wait for states: the others elect another leader and go on;
/// its audits are given up (silent targets), and healed, its requests reach their targets
/// after the states are gone. None of it is withholding: nobody is accused or shunned, every
/// member finishes equal. (Found by `lockstep chaos`: the old leader, its applied step within
/// three of the audited one but the log far ahead, called the new leader's "none kept"
/// withholding, shunned it alone and never trained again.)
#[test]
fn an_audit_whose_request_waited_out_a_cut_accuses_nobody() {
    let mut ended = BTreeMap::new();
    for seed in 1801..1809 {
        let mut net = audited_packed(seed, 1000, 60, Compression::Int8);
        let (mut cut, mut healed) = (false, false);
        net.run(3_000_000, |net, top| {
            if top == 5 && !cut {
                hold(net, &[1], &[2, 3, 4], true);
                cut = true;
            }
            if cut && !healed && top >= 16 {
                hold(net, &[1], &[2, 3, 4], false);
                healed = true;
            }
        });
        let what = format!("seed {seed}\n{}", net.describe());
        assert!(healed, "{what}");
        for (id, node) in &net.nodes {
            let wrong = node
                .events
                .iter()
                .find(|e| matches!(e, Event::Accused { .. } | Event::Verdict(_) | Event::LeaderShunned { .. }));
            assert!(wrong.is_none(), "node {id}: {wrong:?}: {what}");
        }
        assert_all_finished_equal(&net, &[1, 2, 3, 4], 60, &what);
        for e in &net.nodes[&1].events {
            if let Event::AuditFailed { error, .. } = e {
                *ended.entry(error.0.to_string()).or_insert(0) += 1;
            }
        }
    }
    // The cut-off leader's audits under way were given up, its targets silent.
    let silent = lockstep_node::session::Unfinished::TargetSilent.to_string();
    assert!(ended.contains_key(&silent), "the cut-off leader's audits ended: {ended:?}");
}

/// Asserts that no member of `net` accused or convicted anyone, every audit matched, and no
/// answer to a state request it made was taken for one it never asked (a skipped assignment's,
/// one a derived state served instead of, a link's after the audit's); each member's counts.
fn nobody_accused(net: &Net, what: &str) -> Vec<lockstep_node::session::AuditStats> {
    let mut all = Vec::new();
    for (id, node) in &net.nodes {
        let wrong = node.events.iter().find(|e| matches!(e, Event::Accused { .. } | Event::Verdict(_)));
        assert!(wrong.is_none(), "node {id}: {wrong:?}: {what}");
        // The answers to requests no longer waited for (skipped, derived instead) are no news.
        let unasked = |e: &&Event| matches!(e, Event::Ignored { why: Ignored::UnaskedState, .. });
        let unasked: Vec<&Event> = node.events.iter().filter(unasked).collect();
        assert!(unasked.is_empty(), "node {id}: {unasked:?}: {what}");
        let stats = node.session.audit_stats();
        assert_eq!(stats.audited, stats.matched, "node {id}: {stats:?}");
        all.push(stats);
    }
    all
}

/// Two audit workers on members with cores to spare: with workers slower than the group, an
/// assignment that finds one busy starts on the other, so more of the group's contributions are
/// recomputed and fewer assignments skipped than with one worker, on the same seeds; nobody is
/// accused, the links hold, every member finishes equal. A rogue among such members is still
/// named and removed (the leader's check, one at a time, takes a worker from a routine audit).
#[test]
fn a_second_audit_worker_reaches_assignments_one_worker_skips() {
    let slow_group = |seed: u64, compression: Compression, workers: u32| {
        let mut net = Net::new(seed);
        net.audit_rate = 1000;
        net.audit_state_part = 334;
        net.audit_workers = workers;
        net.sync = SyncConfig { compression, ..SyncConfig::SEED };
        for id in [1, 2, 3, 4] {
            net.join(id);
        }
        net.start(1, 40);
        for node in net.nodes.values_mut() {
            (node.slow_audits, node.audit_turns) = (true, 4);
        }
        net
    };
    for (seed, compression) in [(1951, Compression::Int8), (1952, Compression::Int4), (1953, Compression::None)] {
        let mut reached = [(0, 0); 2];
        for (at, workers) in [1, 2].into_iter().enumerate() {
            let mut net = slow_group(seed, compression, workers);
            net.run(1_000_000, |_, _| {});
            let what = format!("seed {seed} {compression:?}, {workers} workers\n{}", net.describe());
            assert_all_finished_equal(&net, &[1, 2, 3, 4], 40, &what);
            for stats in nobody_accused(&net, &what) {
                reached[at].0 += stats.audited;
                reached[at].1 += stats.skipped;
            }
        }
        let [(one, one_skipped), (two, two_skipped)] = reached;
        assert!(
            two > one && two_skipped < one_skipped,
            "seed {seed}: audited {one} -> {two}, skipped {one_skipped} -> {two_skipped}"
        );
    }
    for (seed, factor) in [(1961, 1.001f32), (1962, -1.0)] {
        let mut net = slow_group(seed, Compression::Int8, 2);
        net.nodes.get_mut(&3).unwrap().scale = Some(factor);
        net.run(1_000_000, |_, _| {});
        let what = format!("seed {seed} x{factor}\n{}", net.describe());
        for id in [1, 2, 4] {
            let verdict = verdict_of(&net, id).unwrap_or_else(|| panic!("node {id} heard no verdict: {what}"));
            assert_eq!(verdict.target, 3, "{what}");
        }
        assert_all_finished_equal(&net, &[1, 2, 4], 40, &what);
    }
}

/// Workers slower than the group: each recomputation takes turns as a compute does, so
/// assignments come while the worker is busy. The newest waiting one has its state asked for at
/// once, and is recomputed from it as soon as the worker is free — no second round trip — with
/// the bits its member sent: nobody accused, the links hold, every member finishes equal.
#[test]
fn an_assignment_waiting_for_the_worker_has_its_state_at_hand_when_it_starts() {
    let mut prefetched = 0;
    for (seed, compression) in [(1901, Compression::Int8), (1902, Compression::Int4), (1903, Compression::Int8)] {
        let mut net = audited_packed(seed, 1000, 40, compression);
        for node in net.nodes.values_mut() {
            node.slow_audits = true;
        }
        net.run(1_000_000, |_, _| {});
        let what = format!("seed {seed} {compression:?}\n{}", net.describe());
        assert_all_finished_equal(&net, &[1, 2, 3, 4], 40, &what);
        prefetched += nobody_accused(&net, &what).iter().map(|s| s.prefetched).sum::<u32>();
    }
    // 4 to 21 over these three seeds' runs with sixteen seed offsets (2026-12-07): how many
    // assignments wait is the schedule's; that some start with their state at hand is the rule.
    assert!(prefetched >= 3, "{prefetched} audits started with their state at hand");
}

/// A leader can find itself a learner: its predecessor demoted it (it missed deadlines) and the
/// demotion, appended on a majority but not yet known committed, was committed under it after it
/// won the election — raft-rs keeps such a leader leading (`post_conf_change`). It votes again
/// at once (the group's votes would otherwise rest on the two voters left), so a newcomer that
/// joins later sends it its contributions, as to any voter: one that sent nothing to a
/// quiet-looking learner leader was dropped at its first deadline, refused the leader's repairs,
/// and resumed again and again without ever keeping up (`lockstep chaos` seed 2015).
#[test]
fn a_leader_the_log_demoted_votes_again_and_a_newcomer_keeps_up_with_it() {
    let mut found = 0;
    for seed in 0..30 {
        let mut net = Net::with_short_deadline(6000 + seed, &[1, 2, 3, 4], 400);
        let (mut cut, mut killed, mut joined) = (false, false, false);
        let mut learner_leader = false;
        net.run(800_000, |net, top| {
            // Nothing of 2's reaches the leader: it misses deadlines there (and is demoted),
            // while it hears the leader's log and computes as before.
            if top == 4 && !cut {
                net.cut.insert((2, 1));
                cut = true;
            }
            // The moment the leader applied 2's demotion, it dies: the others hold the entry
            // and not its commit.
            if cut && !killed && net.nodes[&1].session.configuration().1.contains(&2) {
                net.kill(1);
                killed = true;
            }
            let (voters, learners) = net.nodes[&3].session.configuration();
            if killed && net.nodes[&3].session.leader() == Some(2) && learners.contains(&2) && !voters.contains(&2) {
                learner_leader = true;
            }
            if killed && !joined && top >= 60 && net.nodes[&3].session.leader().is_some() {
                net.join(9);
                joined = true;
            }
        });
        let what = format!("seed {seed}");
        assert!(net.assert_identical_or_guarded(), "{what}");
        assert!(killed && joined, "{what}:\n{}", net.describe());
        assert_all_finished_equal(&net, &[2, 3, 4, 9], 400, &what);
        if !learner_leader {
            continue;
        }
        found += 1;
        let leader = net.nodes[&3].session.leader().unwrap();
        let voters = net.nodes[&leader].session.configuration().0;
        assert!(voters.contains(&leader), "{what}: the leader {leader} votes again: {voters:?}");
        assert!(
            rosters_of(&net, 3)[&400].contains(&9),
            "{what}: the newcomer's contributions count\n{}",
            net.describe()
        );
        assert!(voters.contains(&9), "{what}: the newcomer votes: {voters:?}");
    }
    assert!(found >= 3, "a leader the log demoted in {found} of 30 seeds");
}
