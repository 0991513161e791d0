//! What an audit by recomputation found, in bytes: the evidence an accusation carries (wire
//! `-21`), the verdict the run's log commits (entry kind 4) and a removal for it tells the
//! removed member (`-13`, kind 2) — one encoding for the three (`docs/PROTOCOL.md`).
//!
//! | part | bytes |
//! |---|---|
//! | evidence, a word | `[u8 0][u32 word][u32 the definition's bits][u32 the member's bits]` (word 0: the loss, `1 + i`: value `i`) |
//! | evidence, a digest | `[u8 1][u64 the record's digest][u64 the definition's]` (the contribution itself no longer held) |
//! | evidence, a false accusation | `[u8 2][u64 the member it accused]` |
//! | evidence, a state | `[u8 3][u64 the state the step leaves, by digest][u64 the one its next contribution named]` |
//! | evidence, a state withheld | `[u8 4]` (asked for the state its contribution named, `-22`, it served none, or another) |
//! | evidence, an op | `[u8 5][u32 op][u32 code][u64 buffer][u64 word][u32 the definition's bits][u32 the member's bits]` (a dispute narrowed the step to op `op`, of code `code`: word `word` of `buffer` as it wrote it) |
//! | verdict | `[u32 step][u64 target][u64 found by][evidence]` |

use super::PeerId;

/// Where a contribution departs from the definition, or why an accusation was false.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// Word `word` of the contribution (0: its loss; `1 + i`: value `i`): the definition's
    /// bits (recomputed from the committed weights and the member's own batch) and the member's.
    Word { word: u32, expected: u32, claimed: u32 },
    /// The contribution's digest: the commit record named `named`, the definition gives
    /// `recomputed` (the contribution itself was no longer held where it was checked).
    Digest { named: u64, recomputed: u64 },
    /// The target accused `accused`, whose contribution the leader's recomputation found to be
    /// the definition's.
    FalseAccusation { accused: PeerId },
    /// The private state the member's next contribution named (by digest) is not the one its
    /// contribution to this step leaves: the definition's residual after it (`expected`, from
    /// the recomputed values, the state served and the group's grid) and the one named.
    State { expected: u64, claimed: u64 },
    /// Asked for the state its contribution named, the member served none, or another (the
    /// leader asked it too).
    Withheld,
    /// A dispute narrowed the departure to one op of the member's step (its own backend run
    /// again on the step's weights and batch, traced, against the definition's): the op's
    /// position in the step and its code (`lockstep_luts::ops::OPS`), the word of the buffer
    /// it wrote first, the definition's bits and the member's.
    Op { op: u32, code: u32, buffer: u64, word: u64, expected: u32, claimed: u32 },
    /// The guard's disputes: the weights the member computed its contribution to this step
    /// from are not the group's — word `word` of them, as the definition's update of the step
    /// before leaves it (run again by the leader from the state before it and the committed
    /// mean), and as the member held it (its answer to `-27`).
    Weights { word: u64, expected: u32, claimed: u32 },
    /// The same, where the member did not say where its weights part (no answer, or none that
    /// shows it): the weight hash the definition's update gives and the one its contribution
    /// named.
    WeightHash { expected: u32, claimed: u32 },
    /// Its contribution named a probe hash other than the one every healthy backend reports:
    /// its own backend computes the fixed probe wrong.
    Probe { expected: u32, claimed: u32 },
    /// Chunk owners (`docs/OWNERS.md`, "How an owner is checked"): the contributors'
    /// fingerprints of chunk `chunk` did not add up to its owner's sum here. An accusation only
    /// (either the owner or a contributor lied): the leader settles it by recomputing the sum.
    SumCheck { chunk: u16 },
    /// The owner's sum of chunk `chunk`, recomputed by the leader from the chunks its authors
    /// committed to: word `word` of it (`0..blocks`: a block's grid byte; `blocks..2·blocks`:
    /// whose exponent each block's grid is; then the values) as the chunks give it and as the
    /// owner sent it.
    SumWrong { chunk: u16, word: u32, expected: i64, claimed: i64 },
    /// A contributor's fingerprint of chunk `chunk`: its own chunk (checked against its header)
    /// on the owner's grid gives `expected`, it sent `claimed` (`sync::owners::GRID_WRONG`: it
    /// said the grid misrepresents it).
    Fingerprint { chunk: u16, expected: u64, claimed: u64 },
}

impl Evidence {
    /// Whether the guard's disputes found it (the weights a contribution was computed from, or
    /// its probe), not a recomputation of the contribution's values.
    pub fn is_the_guards(&self) -> bool {
        matches!(self, Evidence::Weights { .. } | Evidence::WeightHash { .. } | Evidence::Probe { .. })
    }

    /// Whether the owners' fingerprints found it (a chunk's sum or a fingerprint), not a
    /// recomputation of a contribution.
    pub fn is_the_fingerprints(&self) -> bool {
        matches!(self, Evidence::SumCheck { .. } | Evidence::SumWrong { .. } | Evidence::Fingerprint { .. })
    }

    /// An op's name from its code (`?` for a code this build does not know).
    pub fn op_name(code: u32) -> &'static str {
        lockstep_luts::ops::OPS.get(code as usize).map_or("?", |spec| spec.name)
    }
}

impl std::fmt::Display for Evidence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Evidence::Word { word: 0, expected, claimed } => write!(
                f,
                "its loss: the definition gives {expected:#010x} ({}), it sent {claimed:#010x} ({})",
                f32::from_bits(expected),
                f32::from_bits(claimed)
            ),
            Evidence::Word { word, expected, claimed } => write!(
                f,
                "value {} of its contribution: the definition gives {expected:#010x} ({}), it sent {claimed:#010x} ({})",
                word - 1,
                f32::from_bits(expected),
                f32::from_bits(claimed)
            ),
            Evidence::Digest { named, recomputed } => write!(
                f,
                "its contribution's digest: the record named {named:#018x}, the definition gives {recomputed:#018x}"
            ),
            Evidence::FalseAccusation { accused } => {
                write!(f, "it accused node {accused}, whose contribution the leader recomputed and found right")
            }
            Evidence::State { expected, claimed } => write!(
                f,
                "the residual its next contribution named: the step leaves {expected:#018x}, it named {claimed:#018x}"
            ),
            Evidence::Withheld => write!(f, "it did not serve the residual its contribution named"),
            Evidence::Op { op, code, buffer, word, expected, claimed } => write!(
                f,
                "its step departs at op #{op} ({}): word {word} of buffer {buffer}: the definition gives {expected:#010x} ({}), it computed {claimed:#010x} ({})",
                Evidence::op_name(code),
                f32::from_bits(expected),
                f32::from_bits(claimed)
            ),
            Evidence::Weights { word, expected, claimed } => write!(
                f,
                "it computed from weights other than the group's: word {word}: the definition's update gives {expected:#010x} ({}), it held {claimed:#010x} ({})",
                f32::from_bits(expected),
                f32::from_bits(claimed)
            ),
            Evidence::WeightHash { expected, claimed } => write!(
                f,
                "it computed from weights other than the group's: the definition's update gives the weight hash {expected:#010x}, it named {claimed:#010x}"
            ),
            Evidence::Probe { expected, claimed } => write!(
                f,
                "its backend computes the probe wrong: every healthy backend gives {expected:#010x}, it gave {claimed:#010x}"
            ),
            Evidence::SumCheck { chunk } => {
                write!(f, "the contributors' fingerprints of chunk {chunk} do not add up to its owner's sum")
            }
            Evidence::SumWrong { chunk, word, expected, claimed } => write!(
                f,
                "its sum of chunk {chunk}: word {word} of it is {expected} by the chunks its authors committed to, it sent {claimed}"
            ),
            Evidence::Fingerprint { chunk, expected, claimed } if claimed == crate::sync::owners::GRID_WRONG => write!(
                f,
                "its fingerprint of chunk {chunk}: it said the owner's grid misrepresents its chunk, which gives {expected:#018x} on it"
            ),
            Evidence::Fingerprint { chunk, expected, claimed } => write!(
                f,
                "its fingerprint of chunk {chunk}: its own chunk gives {expected:#018x}, it sent {claimed:#018x}"
            ),
        }
    }
}

/// A verdict of the run's audits, committed through its log: `target`'s contribution to `step`
/// departs from the definition (or `target` accused falsely), as `found_by` found and the
/// leader confirmed by recomputing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuditVerdict {
    pub step: u32,
    pub target: PeerId,
    pub found_by: PeerId,
    pub evidence: Evidence,
}

impl std::fmt::Display for AuditVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.evidence.is_the_fingerprints() {
            return write!(
                f,
                "the fingerprints found node {}'s part in step {} wrong (found by node {}): {}",
                self.target, self.step, self.found_by, self.evidence
            );
        }
        if self.evidence.is_the_guards() {
            return write!(
                f,
                "the guard found node {}'s contribution to step {} wrong (settled by node {}): {}",
                self.target, self.step, self.found_by, self.evidence
            );
        }
        write!(
            f,
            "an audit found node {}'s contribution to step {} wrong (found by node {}): {}",
            self.target, self.step, self.found_by, self.evidence
        )
    }
}

const WORD: u8 = 0;
const DIGEST: u8 = 1;
const FALSE_ACCUSATION: u8 = 2;
const STATE: u8 = 3;
const WITHHELD: u8 = 4;
const OP: u8 = 5;
const WEIGHTS: u8 = 6;
const WEIGHT_HASH: u8 = 7;
const PROBE: u8 = 8;
const SUM_CHECK: u8 = 9;
const SUM_WRONG: u8 = 10;
const FINGERPRINT: u8 = 11;

impl Evidence {
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Evidence::Word { word, expected, claimed } => {
                out.push(WORD);
                for v in [word, expected, claimed] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            Evidence::Digest { named, recomputed } => {
                out.push(DIGEST);
                out.extend_from_slice(&named.to_le_bytes());
                out.extend_from_slice(&recomputed.to_le_bytes());
            }
            Evidence::FalseAccusation { accused } => {
                out.push(FALSE_ACCUSATION);
                out.extend_from_slice(&accused.to_le_bytes());
            }
            Evidence::State { expected, claimed } => {
                out.push(STATE);
                out.extend_from_slice(&expected.to_le_bytes());
                out.extend_from_slice(&claimed.to_le_bytes());
            }
            Evidence::Withheld => out.push(WITHHELD),
            Evidence::Op { op, code, buffer, word, expected, claimed } => {
                out.push(OP);
                out.extend_from_slice(&op.to_le_bytes());
                out.extend_from_slice(&code.to_le_bytes());
                out.extend_from_slice(&buffer.to_le_bytes());
                out.extend_from_slice(&word.to_le_bytes());
                out.extend_from_slice(&expected.to_le_bytes());
                out.extend_from_slice(&claimed.to_le_bytes());
            }
            Evidence::Weights { word, expected, claimed } => {
                out.push(WEIGHTS);
                out.extend_from_slice(&word.to_le_bytes());
                out.extend_from_slice(&expected.to_le_bytes());
                out.extend_from_slice(&claimed.to_le_bytes());
            }
            Evidence::WeightHash { expected, claimed } | Evidence::Probe { expected, claimed } => {
                out.push(if matches!(self, Evidence::Probe { .. }) { PROBE } else { WEIGHT_HASH });
                out.extend_from_slice(&expected.to_le_bytes());
                out.extend_from_slice(&claimed.to_le_bytes());
            }
            Evidence::SumCheck { chunk } => {
                out.push(SUM_CHECK);
                out.extend_from_slice(&chunk.to_le_bytes());
            }
            Evidence::SumWrong { chunk, word, expected, claimed } => {
                out.push(SUM_WRONG);
                out.extend_from_slice(&chunk.to_le_bytes());
                out.extend_from_slice(&word.to_le_bytes());
                out.extend_from_slice(&expected.to_le_bytes());
                out.extend_from_slice(&claimed.to_le_bytes());
            }
            Evidence::Fingerprint { chunk, expected, claimed } => {
                out.push(FINGERPRINT);
                out.extend_from_slice(&chunk.to_le_bytes());
                out.extend_from_slice(&expected.to_le_bytes());
                out.extend_from_slice(&claimed.to_le_bytes());
            }
        }
    }

    /// Reads evidence from the front of `bytes`, which it advances; `None`: cut short or of an
    /// unknown kind.
    pub fn decode(bytes: &mut &[u8]) -> Option<Evidence> {
        Some(match take::<1>(bytes)?[0] {
            WORD => Evidence::Word { word: u32_of(bytes)?, expected: u32_of(bytes)?, claimed: u32_of(bytes)? },
            DIGEST => Evidence::Digest { named: u64_of(bytes)?, recomputed: u64_of(bytes)? },
            FALSE_ACCUSATION => Evidence::FalseAccusation { accused: u64_of(bytes)? },
            STATE => Evidence::State { expected: u64_of(bytes)?, claimed: u64_of(bytes)? },
            WITHHELD => Evidence::Withheld,
            OP => Evidence::Op {
                op: u32_of(bytes)?,
                code: u32_of(bytes)?,
                buffer: u64_of(bytes)?,
                word: u64_of(bytes)?,
                expected: u32_of(bytes)?,
                claimed: u32_of(bytes)?,
            },
            WEIGHTS => Evidence::Weights { word: u64_of(bytes)?, expected: u32_of(bytes)?, claimed: u32_of(bytes)? },
            WEIGHT_HASH => Evidence::WeightHash { expected: u32_of(bytes)?, claimed: u32_of(bytes)? },
            PROBE => Evidence::Probe { expected: u32_of(bytes)?, claimed: u32_of(bytes)? },
            SUM_CHECK => Evidence::SumCheck { chunk: u16_of(bytes)? },
            SUM_WRONG => Evidence::SumWrong {
                chunk: u16_of(bytes)?,
                word: u32_of(bytes)?,
                expected: u64_of(bytes)? as i64,
                claimed: u64_of(bytes)? as i64,
            },
            FINGERPRINT => {
                Evidence::Fingerprint { chunk: u16_of(bytes)?, expected: u64_of(bytes)?, claimed: u64_of(bytes)? }
            }
            _ => return None,
        })
    }
}

impl AuditVerdict {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.step.to_le_bytes());
        out.extend_from_slice(&self.target.to_le_bytes());
        out.extend_from_slice(&self.found_by.to_le_bytes());
        self.evidence.encode(out);
    }

    /// Reads a verdict from the front of `bytes`, which it advances.
    pub fn decode(bytes: &mut &[u8]) -> Option<AuditVerdict> {
        Some(AuditVerdict {
            step: u32_of(bytes)?,
            target: u64_of(bytes)?,
            found_by: u64_of(bytes)?,
            evidence: Evidence::decode(bytes)?,
        })
    }
}

fn take<const N: usize>(bytes: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = bytes.split_first_chunk::<N>()?;
    *bytes = rest;
    Some(*head)
}

fn u16_of(bytes: &mut &[u8]) -> Option<u16> {
    take(bytes).map(u16::from_le_bytes)
}

fn u32_of(bytes: &mut &[u8]) -> Option<u32> {
    take(bytes).map(u32::from_le_bytes)
}

fn u64_of(bytes: &mut &[u8]) -> Option<u64> {
    take(bytes).map(u64::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_and_refusals() {
        let verdict = AuditVerdict {
            step: 7,
            target: 9,
            found_by: 3,
            evidence: Evidence::Word { word: 2, expected: 0x3f80_0000, claimed: 0xbf80_0000 },
        };
        let mut bytes = Vec::new();
        verdict.encode(&mut bytes);
        let mut expected = vec![7, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0];
        expected.extend_from_slice(&[0, 0, 0x80, 0x3f, 0, 0, 0x80, 0xbf]);
        assert_eq!(bytes, expected);
        for evidence in [
            Evidence::Word { word: 0, expected: 1, claimed: 2 },
            Evidence::Digest { named: u64::MAX, recomputed: 5 },
            Evidence::FalseAccusation { accused: 12 },
            Evidence::State { expected: 1 << 40, claimed: 3 },
            Evidence::Withheld,
            Evidence::Op { op: 58, code: 1, buffer: 66, word: 1 << 33, expected: 0xbeca_d100, claimed: 0 },
            Evidence::Weights { word: 1 << 35, expected: 0x3f80_0000, claimed: 0x3f80_0001 },
            Evidence::WeightHash { expected: 0xdead_beef, claimed: 7 },
            Evidence::Probe { expected: 1, claimed: u32::MAX },
            Evidence::SumCheck { chunk: 3 },
            Evidence::SumWrong { chunk: 2, word: 1 << 20, expected: -(1 << 40), claimed: 7 },
            Evidence::Fingerprint { chunk: 1, expected: (1 << 61) - 2, claimed: u64::MAX },
        ] {
            let v = AuditVerdict { evidence, ..verdict };
            let mut bytes = Vec::new();
            v.encode(&mut bytes);
            let mut read = bytes.as_slice();
            assert_eq!(AuditVerdict::decode(&mut read), Some(v));
            assert!(read.is_empty());
            for cut in 0..bytes.len() {
                assert_eq!(AuditVerdict::decode(&mut &bytes[..cut]), None, "{cut} bytes");
            }
        }
        assert_eq!(Evidence::decode(&mut &[12u8, 0, 0, 0, 0, 0, 0, 0, 0][..]), None, "an unknown kind");
        // The fingerprints' evidence, byte for byte.
        let mut bytes = Vec::new();
        Evidence::SumWrong { chunk: 2, word: 5, expected: -1, claimed: 3 }.encode(&mut bytes);
        let mut expected = vec![10, 2, 0, 5, 0, 0, 0];
        expected.extend_from_slice(&[0xff; 8]);
        expected.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes, expected);
        let mut bytes = Vec::new();
        Evidence::SumCheck { chunk: 0x102 }.encode(&mut bytes);
        assert_eq!(bytes, [9, 2, 1]);
        assert_eq!(
            Evidence::Fingerprint { chunk: 1, expected: 5, claimed: 6 }.to_string(),
            "its fingerprint of chunk 1: its own chunk gives 0x0000000000000005, it sent 0x0000000000000006"
        );
        // The guard's evidence, byte for byte: kind, then its fields little-endian.
        let mut bytes = Vec::new();
        Evidence::Weights { word: 5, expected: 0x3f80_0000, claimed: 0x3f80_0001 }.encode(&mut bytes);
        assert_eq!(bytes, [6, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x3f, 1, 0, 0x80, 0x3f]);
        for (evidence, kind) in
            [(Evidence::WeightHash { expected: 2, claimed: 3 }, 7), (Evidence::Probe { expected: 2, claimed: 3 }, 8)]
        {
            let mut bytes = Vec::new();
            evidence.encode(&mut bytes);
            assert_eq!(bytes, [kind, 2, 0, 0, 0, 3, 0, 0, 0], "{evidence:?}");
        }
        assert_eq!(
            Evidence::Weights { word: 0, expected: 0x3f80_0000, claimed: 0x3f80_0001 }.to_string(),
            "it computed from weights other than the group's: word 0: the definition's update gives 0x3f800000 (1), it held 0x3f800001 (1.0000001)"
        );
        let matmul = lockstep_luts::ops::OPS.iter().find(|s| s.name == "matmul").expect("an op").code;
        assert_eq!(
            Evidence::Op { op: 58, code: matmul, buffer: 66, word: 0, expected: 0xbeca_d100, claimed: 0 }.to_string(),
            "its step departs at op #58 (matmul): word 0 of buffer 66: the definition gives 0xbecad100 (-0.3961258), it computed 0x00000000 (0)"
        );
        assert_eq!(
            Evidence::Word { word: 3, expected: 0x3f80_0000, claimed: 0x3f80_0001 }.to_string(),
            "value 2 of its contribution: the definition gives 0x3f800000 (1), it sent 0x3f800001 (1.0000001)"
        );
    }
}
