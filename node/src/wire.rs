//! The mesh's binary wire protocol (the seed's, extended where it was silent).
//!
//! Every message is little-endian and starts with an `i32`: a non-negative value is a gradient
//! message's step; negative sentinels are control messages. `docs/PROTOCOL.md` lists them.
//!
//! | first `i32` | message |
//! |---|---|
//! | `≥ 0` | gradient: `[i32 step][u32 whash][u32 phash][f32 loss][f32 grad…]` |
//! | `-2` | checkpoint push: `[u32 len][checkpoint bytes]` |
//! | `-3` | run config: `[u32 protocol][u64 run][run settings]` (`RunConfig::encode`: `[u32 c][u32 t][u32 b][u32 layers][u32 heads][u32 steps][f32 lr][u64 seed][sync settings][u64 corpus]`; `run` since protocol 10: the run's log; `corpus`, the digest of the text it trains on, since 11) — told to observers; members read the run from the log |
//! | `-5` | fragment: `[u32 id][u16 index][u16 count][payload]`, payload ≤ 48 KB − 12 |
//! | `-6` | mid-run resume: `[u32 len][checkpoint bytes]` (weights, step, optimizer, sampler) |
//! | `-7` | repair request: `[u32 step][u64 peer]` |
//! | `-8` | repair response: `[u64 peer][gradient message]` (the original header and bytes) |
//! | `-9` | peer info: `[u16 n][backend name, n bytes UTF-8][verdict]`; verdict: `[u8 0][u32 cases]` admitted, `[u8 1][text case][text detail]` rejected, `[u8 2][text why]` not loadable (text: `[u16 m][m bytes UTF-8]`) |
//! | `-10` | ping: `[u64 nonce]` |
//! | `-11` | pong: `[u64 nonce]` (the ping's nonce, echoed) |
//! | `-12` | epoch: `[u32 count][u64 pusher]` (the checkpoint push the sender's messages now follow) |
//! | `-13` | removed: `[u32 step][u8 kind][…]` (the leader took the receiver out of the run, not to return): kind 0 kicked `[u16 n][the user's words, n bytes UTF-8]`, 1 too slow `[u32 windows]`, 2 an audit's verdict `[verdict]` (`wire/audit.rs`) |
//! | `-14` | packed gradient (`int8`): `[u32 step][u32 whash][u32 phash][f32 loss][u32 weight][u64 state][u32 len][u8 block byte × ⌈len/32⌉][i8 quant × len]` (weight: the inner steps it stands for in elastic windows, else 1; never 0; state, since protocol 12: [`state_digest`] of the error-feedback residual the values were packed with, what an auditor asks for with `-22`) |
//! | `-26` | f32 gradient with a private state: `[u32 step][u32 whash][u32 phash][f32 loss][u32 weight][u64 state][f32 grad…]` (since protocol 16: an `outer:H` window's pseudo-gradient in f32, naming its inner optimizer's state as `-14` does; weight 1, state never 0) |
//! | `-18` | packed gradient (`int4`): as `-14`, with the quants two to a byte: `[u8 (q[2i] & 15) \| (q[2i+1] << 4)] × ⌈len/2⌉` (4-bit two's complement, each in `[-7, 7]`; an odd length's last high nibble is 0) |
//! | `-15` | leaving: nothing more (the sender quits on purpose: the leader takes it out of the run's configuration) |
//! | `-19` | agreement: `[u64 run][a Raft message, raft-rs's protobuf encoding]` (the run's log: `session/agreement.rs`) |
//! | `-20` | catch up: `[u32 applied]` (the sender's weights are behind what the log committed: it asks the leader for a resume) |
//! | `-21` | accusation: `[u32 step][u64 target][evidence]` (the sender's recomputation of `target`'s contribution to `step` departs from it: the leader checks it; evidence as in `wire/audit.rs`) |
//! | `-22` | state request: `[u32 step][the part asked for]` (an auditor asks for the private state, or some chunks of it, the receiver's packed contribution to `step` was made with: `wire/state.rs`) |
//! | `-23` | state: `[u32 step][the state served]` (the answer to `-22`: every chunk's digest, of which the contribution named the digest, and the chunks asked for; nothing when it is no longer kept: `wire/state.rs`) |
//! | `-24` | trace request: `[u32 step][trace]` (a leader disputing the receiver's contribution to `step` sends the definition's trace — `-25`'s `[u32 ops]` and each op's `[u32 chunks][u64 digest × chunks]` — and asks for the receiver's step compared with it as it runs again; since protocol 17, which retired the op and chunk fields of 13–16) |
//! | `-27` | weights request: `[u32 step][u32 chunks][u64 digest × chunks]` (the guard's disputes, since protocol 19: the leader found the receiver's contribution to `step` computed from weights other than its own, checked its own against the definition's update, and sends their digests, 1,024 weights a chunk, `wire/state.rs`'s chunk digests) |
//! | `-28` | weights: `[u32 step][u8 0]` or `[u8 1][u32 chunk][u32 word…]` (the answer to `-27`: the first chunk of the weights the sender's contribution to `step` was computed from whose digest is not the leader's, and its words; marker 0 when they are no longer kept or none parts) |
//! | `-29` | header (chunk owners, since protocol 20): `[u64 author][u32 step][u32 whash][u32 phash][f32 loss][u32 weight][u64 state][u8 encoding (0 f32, 1 int8, 2 int4)][u32 len][u64 piece digest × 64]` (a contribution without its values: what a member of a group with chunk owners sends every other, and what a member holding only it answers a repair request `-7` with; its digest is the contribution's, `Header::digest`) |
//! | `-30` | chunk: `[u32 step][u64 author][u8 first piece][u8 end piece][u8 encoding (1 int8, 2 int4)][packed body as -14's or -18's, from its len on]` (pieces `first..end` of the author's contribution, sent to the owner who sums them; each piece checked against the author's header) |
//! | `-31` | chunk sum: `[u32 step][u64 record][u16 owner][u16 owners][sum]` (owner `owner` of `owners`' sum of its chunk of the contributions the step record whose digest is `record` names; the sum as `sync::owners::ChunkSum::encode` writes it: `[u32 start][u32 len][u8 bits][grid byte × blocks][by × blocks][len values of bits bits]`) |
//! | `-33` | chunk request: `[u32 step][u64 author][u8 first piece][u8 end piece]` (pieces of the author's contribution, asked of anyone who holds them — its author, their owner, or the owner's successor, which holds an owner's own chunk — where an owner's sum cannot come; answered with `-30`) |
//! | `-34` | chunk held: `[u32 step][u64 author][u8 first piece][u8 end piece]` (an owner — or an owner's successor, of that owner's own chunk — holds these pieces of the author's contribution, checked against its header: told to the leader, which names a contribution in a record only once every owner holds its chunk) |
//! | `-35` | fingerprints (chunk owners, since protocol 21): `[u32 step][u64 record][u64 seed][u16 n][u64 print × n]` (the sender's fingerprint of its own terms in each of the `n` chunk sums of the step record whose digest is `record`, under the challenges of `seed`, the digest of the next step's record — `sync::owners::contribution_fingerprint`; `u64::MAX` for a chunk whose grid misrepresents its contribution: sent to every member, each of which checks every owner's sum) |
//! | `-36` | fingerprints request: `[u32 step][u64 record]` (a member whose check of the record's chunk sums still lacks the receiver's fingerprints a step after their challenges were drawn asks for them again; answered with `-35`) |
//! | `-32` | chunk sum request: `[u32 step][u64 record][u16 owner][u16 owners]` (a member whose owner's sum did not come asks for it; anyone holding it answers with `-31`) |
//! | `-25` | trace: `[u32 step][u32 ops]`, each op's `[u32 chunks][u64 digest × chunks]`, then `[u8 0]` or `[u8 1][u32 op][u32 chunk][u32 word…]` (the answer to `-24`: the trace up to and with the first op that parts from the leader's, and that op's words of its first chunk that parts; no ops and marker 0 when it cannot be made) |
//!
//! `-4` (rosters), `-16` (standing by) and `-17` (follow) belonged to the home-made agreement of
//! protocols 7–9 and are retired: a decoder refuses them as unknown.
//!
//! The sync settings (`SyncConfig::encode`, since protocol 4) are `[u8 mode (0 every-step; 1
//! + overlap for outer, + 128 with elastic windows)][u32 H][u8 compression (0 none, 1 int8, 2 int4)][f32 outer lr][f32 outer momentum]`. A
//! gradient message is `≥ 0`, `-26`, `-14` or `-18` wherever one is embedded (`-8`).
//!
//! `-9` … `-11` are link messages: the adapter answers and reports them (backend shown in the
//! console, round-trip time); they never reach the training session and never change a weight.
//!
//! Every decoder checks lengths before reading and returns a [`WireError`]; nothing here can
//! panic on input.

mod audit;
mod codec;
mod frames;
mod gradient;
mod owners;
mod reader;
mod state;

pub use audit::{AuditVerdict, Evidence};
pub use codec::{decode, encode};
pub use frames::{frames, Reassembler};
use gradient::{is_gradient_sentinel, put_gradient, read_gradient};
pub use gradient::{piece_digest, Gradient};
use owners::{put_chunk, put_header, put_sum, read_chunk, read_header, read_sum};
pub use owners::{Chunk, Header, SumMessage};
use reader::Reader;
pub use state::{
    chunk_range, chunks_of, state_chunk_digests, state_digest, state_digest_of, NotServed, ServedState, StatePart,
    STATE_CHUNK,
};

use crate::config::RunConfig;
pub use crate::sync::Values;
use crate::sync::{Compression, Packed, SyncConfig, SyncError};
pub use crate::verdict::Verdict;
use lockstep_luts::units::BLOCK;

/// The mesh protocol version carried in the run config (21: the owners' fingerprints, `-35`,
/// and evidence kinds 9–11; 20: chunk owners — `-29`, `-30` and
/// `-31`, the step rule byte's high bit — and a contribution's digest made of its pieces'
/// digests; 19: the guard's disputes, `-27` and
/// `-28`, and evidence kinds 6–8 — a member computing from weights other than the group's, or
/// with a wrong probe, is named and removed instead of stopping the run; 18: the run config's
/// step rule; 17: `-24` and `-25` carry only the
/// form protocol 15 sends — a trace asked for against the leader's, its answer — without the op
/// and chunk fields that named the whole trace or one chunk's words, and the run config's
/// compression byte may name `topk:K` (16 + log₂ K); 16: an f32 `outer:H` window names its
/// inner optimizer's state, `-26`, an overlapped window its steps run ahead and the weights
/// they began from, and both are audited; 15: a trace asked for against the
/// leader's, `-24` and `-25` with op `0xfffffffe`; 14: a state is named by its chunks'
/// digests, and an auditor asks for some chunks of it, `-22` and `-23` changed; 13: disputes narrowed to one op, `-24`
/// and `-25`, evidence kind 5; 12: a packed contribution commits to
/// the residual it was packed with, `-22` and `-23` serve it to an auditor; 11: audits by recomputation, `-21`,
/// removals for an audit's verdict and the log's verdict entries; 10: agreement through a Raft log, `-19`
/// and `-20`, rosters and the quorum's messages retired, a run config names its log; 9: packed
/// gradients carry their weight,
/// for elastic windows; 8: every sum of the step is a lane sum,
/// `docs/VERIFICATION.md` §9, so a version 7 node computes other bits from the same weights and
/// batch; 7 brought quorum rosters counted over the members that follow the leader (`-17`),
/// `-15` for quitters and `-16` for nodes without a quorum).
pub const MESH_PROTOCOL_VERSION: u32 = 21;
/// Largest wire frame: WebRTC data channels refuse messages over 64 KiB.
pub const FRAGMENT_BYTES: usize = 48 * 1024;
const FRAGMENT_HEADER: usize = 4 + 4 + 2 + 2;
/// Largest reassembled message (a checkpoint of a model far beyond the default fits).
pub const MAX_MESSAGE_BYTES: usize = 512 * 1024 * 1024;

const CHECKPOINT_PUSH: i32 = -2;
const RUN_CONFIG: i32 = -3;
const FRAGMENT: i32 = -5;
const RESUME: i32 = -6;
const REPAIR_REQUEST: i32 = -7;
const REPAIR_RESPONSE: i32 = -8;
const PEER_INFO: i32 = -9;
const PING: i32 = -10;
const PONG: i32 = -11;
const EPOCH: i32 = -12;
const REMOVED: i32 = -13;
const PACKED_GRADIENT: i32 = -14;
const LEAVING: i32 = -15;
const PACKED4_GRADIENT: i32 = -18;
const RAFT: i32 = -19;
const CATCH_UP: i32 = -20;
const ACCUSATION: i32 = -21;
const STATE_REQUEST: i32 = -22;
const STATE: i32 = -23;
const TRACE_REQUEST: i32 = -24;
const TRACE: i32 = -25;
const F32_STATE_GRADIENT: i32 = -26;
const WEIGHTS_REQUEST: i32 = -27;
const WEIGHTS: i32 = -28;
const HEADER: i32 = -29;
const CHUNK: i32 = -30;
const CHUNK_SUM: i32 = -31;
const SUM_REQUEST: i32 = -32;
const CHUNK_REQUEST: i32 = -33;
const CHUNK_HELD: i32 = -34;
const FINGERPRINTS: i32 = -35;
const FINGERPRINTS_REQUEST: i32 = -36;
/// The most chunk sums a fingerprints message may cover (the owners of a step).
pub const MAX_PRINTS: usize = 4096;
/// Longest backend name or verdict text field in a peer-info message.
pub const MAX_INFO_TEXT: usize = 1024;
/// The verdict's kind byte in a peer-info message.
const VERDICT_ADMITTED: u8 = 0;
const VERDICT_REJECTED: u8 = 1;
const VERDICT_NOT_LOADABLE: u8 = 2;

/// `[u16 len][UTF-8]`; longer texts are cut at a character boundary (the fields are
/// informational).
fn put_text(out: &mut Vec<u8>, text: &str) {
    let mut end = text.len().min(MAX_INFO_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&text.as_bytes()[..end]);
}

/// A member's id: its own, drawn at random when its process starts and carried in its join
/// request (`docs/PROTOCOL.md`); never 0. It is also the member's id in the run's Raft group.
pub type PeerId = u64;

/// The digest of words (a chunk of what an op wrote, [`Trace`]): [`WordHash`] over
/// their count, then the words two to a 64-bit word (the first in the low half).
pub fn words_digest(words: &[u32]) -> u64 {
    let mut h = WordHash(WordHash::BASIS);
    h.word(words.len() as u64);
    for pair in words.chunks(2) {
        h.word(u64::from(pair[0]) | u64::from(pair.get(1).copied().unwrap_or(0)) << 32);
    }
    h.0
}

/// The digest of digests (an op's, from its chunks' [`words_digest`]s).
pub fn digests_digest(digests: &[u64]) -> u64 {
    let mut h = WordHash(WordHash::BASIS);
    h.word(digests.len() as u64);
    digests.iter().for_each(|&d| h.word(d));
    h.0
}

/// The word hash behind [`Gradient::digest`]: FNV-1a's step on 64-bit words (xor the word, then
/// multiply by FNV-1a 64's prime), from FNV-1a 64's offset basis — one multiply per 8 bytes,
/// where byte-serial FNV-1a takes eight (a contribution of the default model is 3.5 MB, hashed
/// once on arrival).
#[derive(Clone, Copy, Debug)]
struct WordHash(u64);

impl WordHash {
    const BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn word(&mut self, word: u64) {
        self.0 = (self.0 ^ word).wrapping_mul(Self::PRIME);
    }

    /// f32 bits two to a word (the first in the low half), the last one padded with zeros.
    fn f32s(&mut self, values: &[f32]) {
        for pair in values.chunks(2) {
            let high = pair.get(1).map_or(0, |v| u64::from(v.to_bits()));
            self.word(u64::from(pair[0].to_bits()) | high << 32);
        }
    }

    /// Bytes as little-endian words, the last one padded with zeros.
    fn bytes(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.word(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            let mut last = [0u8; 8];
            last[..tail.len()].copy_from_slice(tail);
            self.word(u64::from_le_bytes(last));
        }
    }
}

/// Which checkpoint push a node's state descends from: how many pushes it has restored and
/// who sent the last (0 for none). Ordered: a later push is greater, and of two pushes made at
/// once the one from the larger peer id (so every node picks the same one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Epoch {
    pub count: u32,
    pub pusher: PeerId,
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "push {} (by node {})", self.count, self.pusher)
    }
}

/// Every mesh message.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Gradient(Gradient),
    CheckpointPush(Vec<u8>),
    /// The run's settings, with the mesh protocol the sender speaks and the run's log (`run`,
    /// 0 before protocol 10): what an observer is told of the run.
    RunConfig {
        protocol: u32,
        run_id: u64,
        run: RunConfig,
    },
    Fragment {
        id: u32,
        index: u16,
        count: u16,
        payload: Vec<u8>,
    },
    Resume(Vec<u8>),
    RepairRequest {
        step: u32,
        peer: PeerId,
    },
    RepairResponse {
        peer: PeerId,
        gradient: Gradient,
    },
    /// What computes on the sender: its backend's name and gate verdict (link message).
    PeerInfo {
        backend: String,
        verdict: Verdict,
    },
    /// Round-trip measurement (link message); answered with a `Pong` carrying the same nonce.
    Ping {
        nonce: u64,
    },
    /// The leader took the receiver out of the run at `step`, not to return.
    Removed {
        step: u32,
        why: Removal,
    },
    Pong {
        nonce: u64,
    },
    /// Every message the sender sends after this one comes from state of this epoch (sent
    /// when a channel opens and whenever the sender's epoch changes; channels are ordered).
    Epoch(Epoch),
    /// The sender quits on purpose: the leader takes it out of the run's configuration.
    Leaving,
    /// A message of the run's Raft group (`run`: which run's log), raft-rs's protobuf bytes.
    Raft {
        run: u64,
        bytes: Vec<u8>,
    },
    /// The sender's weights are behind the log (it holds `applied` steps): it asks the leader
    /// for a resume.
    CatchUp {
        applied: u32,
    },
    /// The sender recomputed `target`'s contribution to `step` and it departs, as `evidence`
    /// shows: the leader checks it by recomputing it too.
    Accusation {
        step: u32,
        target: PeerId,
        evidence: Evidence,
    },
    /// An auditor asks for the private state the receiver's contribution to `step` was made
    /// with (its residual: [`Gradient::state`] names it), or a part of it.
    StateRequest {
        step: u32,
        part: StatePart,
    },
    /// The answer to a [`Message::StateRequest`]: every chunk's digest and the part asked
    /// for, or nothing when it is no longer kept.
    State {
        step: u32,
        served: ServedState,
    },
    /// A leader disputing the receiver's contribution to `step` sends the definition's trace
    /// of the step and asks for the receiver's, compared op by op with it (`docs/TRUST.md`,
    /// "Disputes"): its trace up to the first op that parts from the definition's and that op's
    /// words of the first chunk that does, in one answer.
    TraceRequest {
        step: u32,
        definition: Trace,
    },
    /// The answer to a [`Message::TraceRequest`].
    Trace {
        step: u32,
        answer: TraceAnswer,
    },
    /// The guard's disputes (`docs/TRUST.md`): the leader found the receiver's contribution to
    /// `step` computed from weights other than its own, which it checked against the
    /// definition's update; it sends their chunks' digests and asks where the receiver's part.
    WeightsRequest {
        step: u32,
        digests: Vec<u64>,
    },
    /// The answer to a [`Message::WeightsRequest`]: the first chunk of the sender's weights
    /// whose digest is not the leader's, and its words (`None`: no longer kept, or none parts).
    Weights {
        step: u32,
        words: Option<(u32, Vec<u32>)>,
    },
    /// Chunk owners: `author`'s contribution without its values (the sender's own, or a
    /// repair).
    Header {
        author: PeerId,
        header: Header,
    },
    /// Chunk owners: pieces of a contribution, for the owner who sums them.
    Chunk(Chunk),
    /// Chunk owners: an owner's sum of its chunk of a step record's contributions.
    ChunkSum(SumMessage),
    /// Chunk owners: owner `owner` of `owners`' sum for the record whose digest is `record`,
    /// asked of anyone who holds it.
    SumRequest {
        step: u32,
        record: u64,
        owner: u16,
        owners: u16,
    },
    /// Chunk owners: the sender holds pieces `first..end` of `author`'s contribution to `step`
    /// (told to the leader).
    ChunkHeld {
        step: u32,
        author: PeerId,
        first: u8,
        end: u8,
    },
    /// Chunk owners: pieces `first..end` of `author`'s contribution to `step`, asked of anyone
    /// who holds them.
    ChunkRequest {
        step: u32,
        author: PeerId,
        first: u8,
        end: u8,
    },
    /// Chunk owners: the sender's fingerprint of its terms in each chunk sum of the record of
    /// `step` whose digest is `record`, under the challenges `seed` (the next record's digest)
    /// draws (`sync::owners::GRID_WRONG` where the sum's grid misrepresents its contribution).
    Fingerprints {
        step: u32,
        record: u64,
        seed: u64,
        prints: Vec<u64>,
    },
    /// Chunk owners: the receiver's fingerprints of the record of `step` whose digest is
    /// `record`, asked for again.
    FingerprintsRequest {
        step: u32,
        record: u64,
    },
}

impl Message {
    /// Whether it belongs to a step — a contribution, its header, chunks or sums, a repair or a
    /// request for one: what the session takes only in its sender's epoch (a push between
    /// makes it another run's), and what a link's loss costs a step.
    pub fn is_step_message(&self) -> bool {
        matches!(
            self,
            Message::Gradient(_)
                | Message::RepairRequest { .. }
                | Message::RepairResponse { .. }
                | Message::Header { .. }
                | Message::Chunk(_)
                | Message::ChunkSum(_)
                | Message::SumRequest { .. }
                | Message::ChunkRequest { .. }
                | Message::ChunkHeld { .. }
                | Message::Fingerprints { .. }
                | Message::FingerprintsRequest { .. }
        )
    }
}

/// A step's ops as one backend computed them (`docs/TRUST.md`, "Disputes"): for each op, in
/// order, the digests of the words it wrote (its written ranges in the order it names them,
/// concatenated), `TRACE_CHUNK_WORDS` (`audit.rs`) at a time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    pub ops: Vec<Vec<u64>>,
}

impl Trace {
    /// Op `i`'s digest: the digest of its chunks' digests.
    pub fn op_digest(&self, i: usize) -> u64 {
        digests_digest(&self.ops[i])
    }
}

/// A [`Message::Trace`]'s content, the answer to a [`Message::TraceRequest`]: this side's
/// trace up to and with the first op that parts from the definition's (every op where none
/// does), and that op's words of its first chunk that parts — `(op, chunk, words)`, `None` where
/// none does. An empty trace and no words: the step can no longer be traced. (Until mesh
/// protocol 17 a request could ask for the whole trace or for one chunk's words alone; no
/// leader sent either since protocol 15, which asks once against the definition's trace.)
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceAnswer {
    pub trace: Trace,
    pub words: Option<(u32, u32, Vec<u32>)>,
}

/// Why the leader took a member out of the run for good (wire `-13`, the console, the headless
/// JSON).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Removal {
    /// A person removed it, saying why.
    Kicked(String),
    /// Elastic windows' slow-member rule: each of its last `windows` contributions stood for a
    /// quarter of the window or less (`--drop-slow-after`).
    Slow { windows: u32 },
    /// An audit's verdict, committed through the run's log.
    Audit(AuditVerdict),
}

impl std::fmt::Display for Removal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Removal::Kicked(why) => write!(f, "removed by the leader: {why}"),
            Removal::Slow { windows } => write!(
                f,
                "too slow: each of its last {windows} contributions stood for a quarter of the window or less"
            ),
            Removal::Audit(verdict) => write!(f, "{verdict}"),
        }
    }
}

const REMOVAL_KICKED: u8 = 0;
const REMOVAL_SLOW: u8 = 1;
const REMOVAL_AUDIT: u8 = 2;

/// Why bytes are not a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    /// Fewer bytes than the message needs.
    Truncated { needed: usize, have: usize },
    /// Bytes left over after a complete message.
    Trailing(usize),
    /// A first word that is neither a step nor a known sentinel.
    UnknownSentinel(i32),
    /// A field out of range (a gradient body that is not whole floats, a fragment index past
    /// its count, a declared length beyond the limit, …).
    Invalid(String),
    /// Sync settings or a packed contribution that do not read (`sync.rs` says why).
    Sync(SyncError),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Truncated { needed, have } => write!(f, "message truncated: {have} bytes, {needed} needed"),
            WireError::Trailing(n) => write!(f, "{n} unexpected bytes after the message"),
            WireError::UnknownSentinel(s) => write!(f, "unknown message type {s}"),
            WireError::Invalid(why) => write!(f, "malformed message: {why}"),
            WireError::Sync(e) => write!(f, "malformed message: {e}"),
        }
    }
}

impl std::error::Error for WireError {}

/// Whether a message jumps the queue of frames waiting for a link (the sender's writer):
/// small messages that must not wait behind megabytes of contributions — the agreement's (a
/// heartbeat held back past an election timeout unseats a healthy leader), the link's own, and
/// the audits' requests and answers ([`audit_message`]). Read from the encoded message's first
/// `i32`, before it is fragmented. Step messages stay in order with the epoch announcements
/// they belong to; a served state (`-23`), a contribution's size or more, waits its turn.
pub fn jumps_the_queue(message: &[u8]) -> bool {
    audit_message(message)
        || matches!(sentinel(message), Some(RAFT | CATCH_UP | PING | PONG | PEER_INFO | LEAVING | REMOVED))
}

/// Whether a frame is one of the audits' small requests and answers (an accusation, a state or
/// trace asked for, a trace), which the receiver may read before the frames that came ahead of
/// it: nothing in a step's order depends on them, and a disputed member — the group no longer
/// waits for it, and it falls behind the group's frames — answered its dispute only after its
/// backlog (1.5 s behind a group of 250 syncs/s on the device machine). A fragment never is (a
/// message's parts stay in one queue). The agreement's messages are read in order: a commit
/// read before the contributions it commits sends a member to catch up.
pub fn audit_message(frame: &[u8]) -> bool {
    matches!(sentinel(frame), Some(ACCUSATION | STATE_REQUEST | TRACE_REQUEST | TRACE | WEIGHTS_REQUEST | WEIGHTS))
}

/// A frame's first `i32`: a gradient's step (≥ 0) or a control message's sentinel.
fn sentinel(frame: &[u8]) -> Option<i32> {
    frame.first_chunk::<4>().map(|head| i32::from_le_bytes(*head))
}

#[cfg(test)]
mod tests;
