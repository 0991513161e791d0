//! Training text: a corpus (the packaged one, or the built-in fallback), and the interface
//! other sources plug into.
//!
//! A [`Corpus`] is training text and held-out text, each the concatenation of whole documents.
//! The packaged corpus (`docs/DATA.md`: about 23 MB of Debian documentation prose in the
//! FineWeb-Edu parquet layout) is read by the adapters (`lockstep_mesh::corpus`) and
//! handed in as documents, held out by document. The built-in corpus (`node/corpus/builtin.txt`,
//! 35 KB of public-domain English prose and verse) is embedded in the binary: the offline
//! fallback, and the small tests' text; it is cut into 1 KiB chunks, every tenth held out.
//! A batch is `batch` windows of `seq + 1` bytes at offsets drawn from a seeded SplitMix64, so
//! the data a node sees is a pure function of its seed and step.

use std::sync::Arc;

use lockstep_luts::hash::{fnv1a64_continue, OFFSET_BASIS_64};
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
    /// The local corpus (the packaged one or the built-in fallback).
    Corpus,
    /// A remote source (e.g. the signaling server's `/data`), with a description.
    Remote(String),
    /// The remote source failed or was too slow; the built-in corpus stood in.
    Fallback { reason: String },
}

/// A source of training batches. Implementations must be deterministic given their state, so
/// a checkpoint (which stores `state()`) resumes the same stream.
pub trait DataSource: Send {
    fn next_batch(&mut self, batch: usize, seq: usize) -> (Batch, Origin);
    /// The sampler state to store in a checkpoint.
    fn state(&self) -> u64;
    fn restore(&mut self, state: u64);
    /// Puts the stream where it would be after `batches` batches drawn from its start, if the
    /// source can (the built-in corpus: its batches are a function of (seed, position)); a
    /// source that cannot keeps its own stream (a remote one: whatever the server sends next).
    /// A member that joins a group at step `s` calls it with `s`, so its batches are the ones
    /// it would have drawn had it trained from the start (`docs/TRUST.md`).
    fn seek(&mut self, _batches: u64) {}
    /// Whether its batches are a function of (seed, position) ([`DataSource::seek`] puts it
    /// anywhere): only then can another member recompute a contribution trained on it (audits).
    fn positional(&self) -> bool {
        false
    }
    fn describe(&self) -> String;
    /// `batches` fixed held-out batches, the same windows every time: the text the source's
    /// corpus holds out (the built-in corpus's for a source without one).
    fn heldout_batches(&self, batches: usize, batch: usize, seq: usize) -> Vec<Batch> {
        heldout_batches(&Corpus::builtin(), batches, batch, seq)
    }
}

/// Training and held-out text, each whole documents joined by a blank line. Read-only once
/// made, so its digest is taken once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corpus {
    /// What it is, for the events and the benches' tables (e.g. "packaged corpus").
    name: String,
    train: Vec<u8>,
    heldout: Vec<u8>,
    /// FNV-1a 64 of the training text, a zero byte and the held-out text.
    digest: u64,
}

/// Between two documents of a corpus's text.
const DOCUMENT_SEPARATOR: &[u8] = b"\n\n";

impl Corpus {
    pub fn builtin() -> Corpus {
        Corpus::from_text("built-in corpus", BUILTIN_CORPUS.as_bytes())
    }

    /// One text cut into 1 KiB chunks, every tenth held out (the built-in corpus's split).
    pub fn from_text(name: &str, text: &[u8]) -> Corpus {
        let mut train = Vec::new();
        let mut heldout = Vec::new();
        for (i, chunk) in text.chunks(CHUNK).enumerate() {
            if i % 10 == 9 {
                heldout.extend_from_slice(chunk);
            } else {
                train.extend_from_slice(chunk);
            }
        }
        Corpus::new(name, train, heldout)
    }

    fn new(name: &str, train: Vec<u8>, heldout: Vec<u8>) -> Corpus {
        let digest = [&train[..], &[0], &heldout[..]].into_iter().fold(OFFSET_BASIS_64, fnv1a64_continue);
        Corpus { name: name.to_string(), train, heldout, digest }
    }

    /// Documents already split into training and held-out ones (the packaged corpus holds
    /// out by document, `docs/DATA.md`), each side joined in the order given.
    pub fn from_documents<T: AsRef<[u8]>>(name: &str, train: &[T], heldout: &[T]) -> Corpus {
        let join = |documents: &[T]| {
            let mut text = Vec::with_capacity(documents.iter().map(|d| d.as_ref().len() + 2).sum());
            for (i, document) in documents.iter().enumerate() {
                if i > 0 {
                    text.extend_from_slice(DOCUMENT_SEPARATOR);
                }
                text.extend_from_slice(document.as_ref());
            }
            text
        };
        Corpus::new(name, join(train), join(heldout))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The training text batches are drawn from.
    pub fn train(&self) -> &[u8] {
        &self.train
    }

    /// The held-out text evaluation draws from.
    pub fn heldout(&self) -> &[u8] {
        &self.heldout
    }

    /// FNV-1a 64 of the training text, a zero byte, and the held-out text: two nodes with the
    /// same digest draw the same batches from the same seeds.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// "packaged corpus (22.9 MB training text, 1.6 MB held out, digest 0x…)".
    pub fn describe(&self) -> String {
        let size = |bytes: usize| {
            if bytes >= 1_000_000 {
                format!("{:.1} MB", bytes as f64 / 1e6)
            } else {
                format!("{:.1} KB", bytes as f64 / 1e3)
            }
        };
        format!(
            "{} ({} training text, {} held out, digest {:#018x})",
            self.name,
            size(self.train.len()),
            size(self.heldout.len()),
            self.digest
        )
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

/// Batches from a corpus's training text. Batch `i` of a stream is drawn by a sampler seeded
/// from (the stream's seed, `i`) alone (decided 2026-12-04, `docs/TRUST.md`): it does not
/// depend on what the stream drew before, so anyone who knows a member's seed (and has the
/// corpus: its digest names it) can draw that member's batch for any step, and a member that
/// joins late draws what it would have drawn from the start. The state a checkpoint carries is
/// the position.
pub struct CorpusSource {
    corpus: Arc<Corpus>,
    seed: u64,
    /// Batches drawn so far.
    position: u64,
}

impl CorpusSource {
    pub fn new(corpus: Arc<Corpus>, seed: u64) -> Self {
        Self { corpus, seed: seed ^ 0x6461_7461_0000_0000, position: 0 }
    }

    /// A stream of the built-in corpus.
    pub fn builtin(seed: u64) -> Self {
        Self::new(Arc::new(Corpus::builtin()), seed)
    }

    /// The sampler of batch `position`.
    fn sampler(&self, position: u64) -> SplitMix64 {
        let mut mix = SplitMix64::new(self.seed ^ position.wrapping_mul(0xd1b5_4a32_d192_ed03));
        SplitMix64::new(mix.next_u64())
    }
}

impl DataSource for CorpusSource {
    fn next_batch(&mut self, batch: usize, seq: usize) -> (Batch, Origin) {
        let mut rng = self.sampler(self.position);
        self.position += 1;
        (sample(&self.corpus.train, &mut rng, batch, seq), Origin::Corpus)
    }

    fn state(&self) -> u64 {
        self.position
    }

    fn restore(&mut self, state: u64) {
        self.position = state;
    }

    fn seek(&mut self, batches: u64) {
        self.position = batches;
    }

    fn positional(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        self.corpus.describe()
    }

    fn heldout_batches(&self, batches: usize, batch: usize, seq: usize) -> Vec<Batch> {
        heldout_batches(&self.corpus, batches, batch, seq)
    }
}

/// Fixed held-out batches of `corpus` for evaluation: the same windows every time.
pub fn heldout_batches(corpus: &Corpus, batches: usize, batch: usize, seq: usize) -> Vec<Batch> {
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
        let mut source = CorpusSource::builtin(5);
        let (first, origin) = source.next_batch(3, 16);
        assert_eq!(origin, Origin::Corpus);
        assert_eq!(first.tokens.len(), 48);
        assert_eq!(&first.tokens[1..16], &first.targets[..15]);
        let saved = source.state();
        let (second, _) = source.next_batch(3, 16);
        let mut resumed = CorpusSource::builtin(5);
        resumed.restore(saved);
        assert_eq!(resumed.next_batch(3, 16).0, second);
        assert_eq!(heldout_batches(&Corpus::builtin(), 2, 2, 8), heldout_batches(&Corpus::builtin(), 2, 2, 8));
    }

    /// Batch `i` of a stream is a function of (seed, i): a stream that starts at position 5
    /// draws what one that drew five batches draws next; another seed draws other batches.
    #[test]
    fn a_batch_depends_on_the_seed_and_its_position_alone() {
        let mut from_start = CorpusSource::builtin(7);
        let drawn: Vec<Batch> = (0..8).map(|_| from_start.next_batch(2, 16).0).collect();
        let mut late = CorpusSource::builtin(7);
        late.seek(5);
        assert_eq!(late.next_batch(2, 16).0, drawn[5]);
        assert_eq!(late.next_batch(2, 16).0, drawn[6]);
        assert_eq!(late.state(), 7);
        let mut other = CorpusSource::builtin(8);
        other.seek(5);
        assert_ne!(other.next_batch(2, 16).0, drawn[5]);
        assert_ne!(drawn[0], drawn[1]);
    }
}
