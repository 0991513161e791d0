//! Training text: the built-in corpus, and the interface other sources plug into.
//!
//! The built-in corpus (`node/corpus/builtin.txt`, public-domain English prose and verse) is
//! embedded in the binary and used whenever nothing else is reachable. It is cut into 1 KiB
//! chunks; every tenth chunk is held out for evaluation, the rest is training text. A batch is
//! `batch` windows of `seq + 1` bytes at offsets drawn from a seeded SplitMix64, so the data a
//! node sees is a pure function of its seed and step.

use lockstep_luts::rng::SplitMix64;

/// The built-in corpus.
pub const BUILTIN_CORPUS: &str = include_str!("../corpus/builtin.txt");
const CHUNK: usize = 1024;

/// One step's inputs and next-token targets, `batch × seq` bytes each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub tokens: Vec<u8>,
    pub targets: Vec<u8>,
}

/// Where a batch came from, for the node's events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    Builtin,
    /// A remote source (e.g. the signaling server's `/data`), with a description.
    Remote(String),
    /// The remote source failed or was too slow; the built-in corpus stood in.
    Fallback {
        reason: String,
    },
}

/// A source of training batches. Implementations must be deterministic given their state, so
/// a checkpoint (which stores `state()`) resumes the same stream.
pub trait DataSource: Send {
    fn next_batch(&mut self, batch: usize, seq: usize) -> (Batch, Origin);
    /// The sampler state to store in a checkpoint.
    fn state(&self) -> u64;
    fn restore(&mut self, state: u64);
    fn describe(&self) -> String;
}

/// The built-in corpus split into training and held-out text.
pub struct Corpus {
    pub train: Vec<u8>,
    pub heldout: Vec<u8>,
}

impl Corpus {
    pub fn builtin() -> Corpus {
        Corpus::from_text(BUILTIN_CORPUS.as_bytes())
    }

    pub fn from_text(text: &[u8]) -> Corpus {
        let mut train = Vec::new();
        let mut heldout = Vec::new();
        for (i, chunk) in text.chunks(CHUNK).enumerate() {
            if i % 10 == 9 {
                heldout.extend_from_slice(chunk);
            } else {
                train.extend_from_slice(chunk);
            }
        }
        Corpus { train, heldout }
    }
}

/// Draws `batch` windows from `text` with `rng`.
pub fn sample(text: &[u8], rng: &mut SplitMix64, batch: usize, seq: usize) -> Batch {
    assert!(text.len() > seq + 1, "text of {} bytes is too short for windows of {}", text.len(), seq + 1);
    let mut out = Batch { tokens: Vec::with_capacity(batch * seq), targets: Vec::with_capacity(batch * seq) };
    for _ in 0..batch {
        let start = rng.below((text.len() - seq - 1) as u64) as usize;
        out.tokens.extend_from_slice(&text[start..start + seq]);
        out.targets.extend_from_slice(&text[start + 1..start + seq + 1]);
    }
    out
}

/// The data seed of mesh node `peer` in a run seeded `run_seed`: every node of a group samples
/// its own batches, deterministically, so one process can replay a group's gradient streams.
pub fn node_data_seed(run_seed: u64, peer: u64) -> u64 {
    run_seed ^ peer.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Batches from the built-in corpus's training text.
pub struct BuiltinSource {
    corpus: Corpus,
    /// The sampler; its state is the source's (what a checkpoint carries).
    rng: SplitMix64,
}

impl BuiltinSource {
    pub fn new(seed: u64) -> Self {
        Self { corpus: Corpus::builtin(), rng: SplitMix64::new(seed ^ 0x6461_7461_0000_0000) }
    }
}

impl DataSource for BuiltinSource {
    fn next_batch(&mut self, batch: usize, seq: usize) -> (Batch, Origin) {
        let out = sample(&self.corpus.train, &mut self.rng, batch, seq);
        (out, Origin::Builtin)
    }

    fn state(&self) -> u64 {
        self.rng.state()
    }

    fn restore(&mut self, state: u64) {
        self.rng = SplitMix64::new(state);
    }

    fn describe(&self) -> String {
        format!("built-in corpus ({} training bytes, {} held out)", self.corpus.train.len(), self.corpus.heldout.len())
    }
}

/// Fixed held-out batches for evaluation: the same windows every time.
pub fn heldout_batches(batches: usize, batch: usize, seq: usize) -> Vec<Batch> {
    let corpus = Corpus::builtin();
    let mut rng = SplitMix64::new(0x6576_616c);
    (0..batches).map(|_| sample(&corpus.heldout, &mut rng, batch, seq)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_is_real_text_split_nine_to_one() {
        let corpus = Corpus::builtin();
        assert!(BUILTIN_CORPUS.len() > 30_000);
        assert!(BUILTIN_CORPUS.is_ascii());
        let total = corpus.train.len() + corpus.heldout.len();
        assert_eq!(total, BUILTIN_CORPUS.len());
        assert!(corpus.heldout.len() * 12 > total && corpus.heldout.len() * 8 < total);
    }

    #[test]
    fn batches_are_shifted_windows_and_resumable() {
        let mut source = BuiltinSource::new(5);
        let (first, origin) = source.next_batch(3, 16);
        assert_eq!(origin, Origin::Builtin);
        assert_eq!(first.tokens.len(), 48);
        assert_eq!(&first.tokens[1..16], &first.targets[..15]);
        let saved = source.state();
        let (second, _) = source.next_batch(3, 16);
        let mut resumed = BuiltinSource::new(999);
        resumed.restore(saved);
        assert_eq!(resumed.next_batch(3, 16).0, second);
        assert_eq!(heldout_batches(2, 2, 8), heldout_batches(2, 2, 8));
    }
}
