//! What a run's members agree on: the entries of its Raft log and the state they build, in
//! bytes (`docs/PROTOCOL.md`, "The log"). Pure data; `agreement.rs` moves it through Raft.
//!
//! | entry kind | bytes after the kind byte |
//! |---|---|
//! | `1` run | `[u32 protocol][run settings]` (`RunConfig::encode`): the log's first entry |
//! | `2` step | `[u32 step][u32 whash][u32 n][u64 peer, u64 digest, u32 weight × n]`: a step's (or outer sync's) commit record |
//! | `3` push | `[u32 count][u64 pusher][u64 digest]`: a checkpoint push every member restores |
//! | `4` verdict | an audit's verdict (`wire/audit.rs`): every member takes the member it names out of the run, with its evidence |
//!
//! The state a snapshot carries (what a member that missed the log's start must know):
//! `[u32 protocol][run settings][u32 epoch count][u64 pusher][u32 step][u32 whash]` — the run,
//! the push it descends from and the last step committed with the weight hash it was computed
//! from.
//!
//! Every decoder checks lengths and returns a [`LogError`]; nothing here panics on input.

use crate::config::RunConfig;
use crate::wire::{AuditVerdict, Epoch, PeerId, MESH_PROTOCOL_VERSION};

const RUN: u8 = 1;
const STEP: u8 = 2;
const PUSH: u8 = 3;
const VERDICT: u8 = 4;
/// Contributions a record may name (a room is far smaller).
const MAX_CONTRIBUTIONS: usize = 4096;

/// One entry of a run's log.
#[derive(Clone, Debug, PartialEq)]
pub enum LogEntry {
    /// The run's settings: the first entry of its log (a new run is a new log).
    Run(RunConfig),
    /// One step's commit record: applied by every member once committed, never before.
    Step(StepRecord),
    /// A checkpoint push by the leader: every member restores the checkpoint with this digest
    /// (whose bytes the leader sends beside the log, wire `-2`) and enters `epoch`.
    Push { epoch: Epoch, digest: u64 },
    /// An audit's verdict: every member takes its target out of the run for good, saying why.
    Verdict(AuditVerdict),
}

/// A step's (or outer sync's) commit record: which contributions the step sums, in the order
/// they are summed, and the weights they were all computed from. The weights it results in
/// are the next record's `whash` (the result of a step is known only once it is applied, and
/// nobody applies it before its record is committed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRecord {
    pub step: u32,
    /// The weight hash every contribution carried: the group's weights after `step − 1`.
    pub whash: u32,
    /// The step's roster, ascending by peer: each member's contribution by digest, and the
    /// weight it carries in the mean.
    pub contributions: Vec<Named>,
}

/// A contribution as a record names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Named {
    pub peer: PeerId,
    pub digest: u64,
    pub weight: u32,
}

impl StepRecord {
    /// The roster: the peers whose contributions are summed, in order.
    pub fn roster(&self) -> Vec<PeerId> {
        self.contributions.iter().map(|c| c.peer).collect()
    }

    /// The record's digest, what an owner's chunk sum names it by (`-31`): `wire::digests_digest`
    /// of the words `step`, `whash`, then each contribution's peer, digest and weight in order.
    pub fn digest(&self) -> u64 {
        let mut words = vec![u64::from(self.step), u64::from(self.whash)];
        for named in &self.contributions {
            words.extend([named.peer, named.digest, u64::from(named.weight)]);
        }
        crate::wire::digests_digest(&words)
    }
}

/// What the log's committed entries amount to: the state a snapshot carries.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogState {
    pub run: RunConfig,
    pub epoch: Epoch,
    /// The last step committed (0: none yet since the run began or the last push).
    pub step: u32,
    /// The weight hash its contributions were computed from.
    pub whash: u32,
}

/// Why bytes are not a log entry or state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogError {
    Truncated,
    Trailing(usize),
    UnknownKind(u8),
    /// Written by a node of another mesh protocol.
    Protocol(u32),
    Invalid(String),
}

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogError::Truncated => f.write_str("a log entry cut short"),
            LogError::Trailing(n) => write!(f, "{n} unexpected bytes after a log entry"),
            LogError::UnknownKind(kind) => write!(f, "unknown log entry kind {kind}"),
            LogError::Protocol(p) => write!(f, "a log of mesh protocol {p} (this node speaks {MESH_PROTOCOL_VERSION})"),
            LogError::Invalid(why) => write!(f, "a malformed log entry: {why}"),
        }
    }
}

impl std::error::Error for LogError {}

struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], LogError> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or(LogError::Truncated)?;
        self.0 = rest;
        Ok(*head)
    }

    fn u32(&mut self) -> Result<u32, LogError> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, LogError> {
        self.take().map(u64::from_le_bytes)
    }

    fn run(&mut self) -> Result<RunConfig, LogError> {
        let protocol = self.u32()?;
        if protocol != MESH_PROTOCOL_VERSION {
            return Err(LogError::Protocol(protocol));
        }
        RunConfig::decode(&self.take()?).map_err(|e| LogError::Invalid(e.to_string()))
    }

    fn finish(&self) -> Result<(), LogError> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(LogError::Trailing(n)),
        }
    }
}

fn put_run(out: &mut Vec<u8>, run: &RunConfig) {
    out.extend_from_slice(&MESH_PROTOCOL_VERSION.to_le_bytes());
    out.extend_from_slice(&run.encode());
}

impl LogEntry {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            LogEntry::Run(run) => {
                out.push(RUN);
                put_run(&mut out, run);
            }
            LogEntry::Step(record) => {
                out.push(STEP);
                out.extend_from_slice(&record.step.to_le_bytes());
                out.extend_from_slice(&record.whash.to_le_bytes());
                out.extend_from_slice(&(record.contributions.len() as u32).to_le_bytes());
                for c in &record.contributions {
                    out.extend_from_slice(&c.peer.to_le_bytes());
                    out.extend_from_slice(&c.digest.to_le_bytes());
                    out.extend_from_slice(&c.weight.to_le_bytes());
                }
            }
            LogEntry::Push { epoch, digest } => {
                out.push(PUSH);
                out.extend_from_slice(&epoch.count.to_le_bytes());
                out.extend_from_slice(&epoch.pusher.to_le_bytes());
                out.extend_from_slice(&digest.to_le_bytes());
            }
            LogEntry::Verdict(verdict) => {
                out.push(VERDICT);
                verdict.encode(&mut out);
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<LogEntry, LogError> {
        let (&kind, rest) = bytes.split_first().ok_or(LogError::Truncated)?;
        let mut r = Bytes(rest);
        let entry = match kind {
            RUN => LogEntry::Run(r.run()?),
            STEP => {
                let step = r.u32()?;
                let whash = r.u32()?;
                let n = r.u32()? as usize;
                if n > MAX_CONTRIBUTIONS {
                    return Err(LogError::Invalid(format!("a record of {n} contributions")));
                }
                let mut contributions = Vec::with_capacity(n);
                for _ in 0..n {
                    contributions.push(Named { peer: r.u64()?, digest: r.u64()?, weight: r.u32()? });
                }
                if !contributions.windows(2).all(|w| w[0].peer < w[1].peer) {
                    return Err(LogError::Invalid("a record's roster is not ascending".into()));
                }
                LogEntry::Step(StepRecord { step, whash, contributions })
            }
            PUSH => LogEntry::Push { epoch: Epoch { count: r.u32()?, pusher: r.u64()? }, digest: r.u64()? },
            VERDICT => LogEntry::Verdict(AuditVerdict::decode(&mut r.0).ok_or(LogError::Truncated)?),
            other => return Err(LogError::UnknownKind(other)),
        };
        r.finish()?;
        Ok(entry)
    }
}

impl LogState {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_run(&mut out, &self.run);
        out.extend_from_slice(&self.epoch.count.to_le_bytes());
        out.extend_from_slice(&self.epoch.pusher.to_le_bytes());
        out.extend_from_slice(&self.step.to_le_bytes());
        out.extend_from_slice(&self.whash.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<LogState, LogError> {
        let mut r = Bytes(bytes);
        let state = LogState {
            run: r.run()?,
            epoch: Epoch { count: r.u32()?, pusher: r.u64()? },
            step: r.u32()?,
            whash: r.u32()?,
        };
        r.finish()?;
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> StepRecord {
        StepRecord {
            step: 3,
            whash: 0x0102_0304,
            contributions: vec![
                Named { peer: 5, digest: 0x0a0b, weight: 1 },
                Named { peer: 9, digest: u64::MAX, weight: 4 },
            ],
        }
    }

    #[test]
    fn golden_bytes() {
        let bytes = LogEntry::Step(record()).encode();
        let mut expected = vec![2, 3, 0, 0, 0, 4, 3, 2, 1, 2, 0, 0, 0];
        expected.extend_from_slice(&[5, 0, 0, 0, 0, 0, 0, 0, 0x0b, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
        expected.extend_from_slice(&[9, 0, 0, 0, 0, 0, 0, 0]);
        expected.extend_from_slice(&[0xff; 8]);
        expected.extend_from_slice(&[4, 0, 0, 0]);
        assert_eq!(bytes, expected);
        let push = LogEntry::Push { epoch: Epoch { count: 2, pusher: 7 }, digest: 1 }.encode();
        assert_eq!(push, vec![3, 2, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        let run = LogEntry::Run(RunConfig::DEFAULT).encode();
        assert_eq!(run[..5], [1, 21, 0, 0, 0]);
        assert_eq!(run[5..], RunConfig::DEFAULT.encode());
    }

    #[test]
    fn entries_and_state_round_trip() {
        for entry in [
            LogEntry::Run(RunConfig::DEFAULT),
            LogEntry::Step(record()),
            LogEntry::Step(StepRecord { step: 1, whash: 0, contributions: vec![] }),
            LogEntry::Push { epoch: Epoch { count: 1, pusher: 3 }, digest: 99 },
            LogEntry::Verdict(AuditVerdict {
                step: 4,
                target: 9,
                found_by: 2,
                evidence: crate::wire::Evidence::Digest { named: 1, recomputed: 2 },
            }),
        ] {
            assert_eq!(LogEntry::decode(&entry.encode()), Ok(entry));
        }
        let state = LogState { run: RunConfig::DEFAULT, epoch: Epoch { count: 4, pusher: 2 }, step: 77, whash: 5 };
        assert_eq!(LogState::decode(&state.encode()), Ok(state));
    }

    #[test]
    fn malformed_entries_are_errors() {
        assert_eq!(LogEntry::decode(&[]), Err(LogError::Truncated));
        assert_eq!(LogEntry::decode(&[9]), Err(LogError::UnknownKind(9)));
        let good = LogEntry::Step(record()).encode();
        for cut in 0..good.len() {
            assert!(LogEntry::decode(&good[..cut]).is_err(), "{cut} bytes");
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(LogEntry::decode(&long), Err(LogError::Trailing(1)));
        // Peers out of order (the roster is the summing order: it must be the one order).
        let mut swapped = record();
        swapped.contributions.reverse();
        assert!(matches!(LogEntry::decode(&LogEntry::Step(swapped).encode()), Err(LogError::Invalid(_))));
        // A log of another protocol is refused by its number.
        let mut old = LogEntry::Run(RunConfig::DEFAULT).encode();
        old[1] = 10;
        assert_eq!(LogEntry::decode(&old), Err(LogError::Protocol(10)));
    }
}
