//! Training through the real CPU plugin: bit-identity across runs and thread counts, resume
//! equivalence through a checkpoint, refusal of damaged checkpoints, the float reference's
//! agreement in quality, and the safetensors export read back by Python.

use lockstep_backends::UnitsGemm;
use lockstep_backends::{resolve_plugin, Plugin};
use lockstep_node::checkpoint::{self, CheckpointError};
use lockstep_node::config::{ModelConfig, RunConfig};
use lockstep_node::data::CorpusSource;
use lockstep_node::gemm::{FloatGemm, Gemm};
use lockstep_node::sync::{Compression, OuterOptimizer, StepRule, SyncConfig, SyncMode};
use lockstep_node::trainer::Trainer;

fn small_run(steps: u32) -> RunConfig {
    RunConfig {
        model: ModelConfig { width: 32, context: 32, layers: 2, heads: 2 },
        batch: 8,
        steps,
        lr: 0.005,
        seed: 11,
        sync: SyncConfig::SEED,
        corpus: 0,
    }
}

fn units(threads: u32) -> Box<dyn Gemm + Send> {
    let path = resolve_plugin("cpu").unwrap_or_else(|e| panic!("{e}"));
    let plugin = Plugin::load(&path).unwrap_or_else(|e| panic!("{e}"));
    Box::new(UnitsGemm::new(plugin.instantiate(threads).unwrap()))
}

fn trainer(run: RunConfig, gemm: Box<dyn Gemm + Send>) -> Trainer {
    Trainer::new(run, gemm, Box::new(CorpusSource::builtin(run.seed))).unwrap()
}

/// `outer:4` with int8 contributions, DiLoCo's outer optimizer, no overlap.
fn outer4_int8(elastic: bool) -> SyncConfig {
    SyncConfig {
        mode: SyncMode::Outer { inner_steps: 4 },
        compression: Compression::Int8,
        outer: OuterOptimizer::DEFAULT,
        overlap: 0,
        elastic,
        rule: StepRule::Adam,
        exchange: lockstep_node::sync::Exchange::Mesh,
    }
}

fn hashes(trainer: &mut Trainer, steps: u32) -> Vec<u32> {
    (0..steps).map(|_| trainer.step().unwrap().weight_hash).collect()
}

/// The CPU plugin's products with its own executor hidden: the host runs every other op.
struct ProductsOnly(Box<dyn Gemm + Send>);

impl Gemm for ProductsOnly {
    fn gemm_nt(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<(), lockstep_node::compute_error::ComputeError> {
        self.0.gemm_nt(m, n, k, a, b, c)
    }

    fn label(&self) -> String {
        format!("{} (products only)", self.0.label())
    }

    fn units(&self) -> bool {
        true
    }
}

/// Evaluation and the forward pass run on the backend's executor when it has one (buffers made
/// for the call), on the host otherwise: the same bits.
#[test]
fn evaluation_on_the_device_equals_evaluation_on_the_host() {
    let run = small_run(6);
    let mut t = trainer(run, units(2));
    hashes(&mut t, 6);
    let weights = t.weights().unwrap().to_vec();
    let model = t.model();
    let batch =
        lockstep_node::data::heldout_batches(&lockstep_node::data::Corpus::builtin(), 2, run.batch, run.model.context);
    let (mut device, mut host) = (units(2), ProductsOnly(units(2)));
    for b in &batch {
        let on_device = model.loss(device.as_mut(), &weights, &b.tokens, &b.targets, run.batch, run.model.context);
        let on_host = model.loss(&mut host, &weights, &b.tokens, &b.targets, run.batch, run.model.context);
        assert_eq!(on_device.unwrap().to_bits(), on_host.unwrap().to_bits());
        let logits =
            |g: &mut dyn Gemm| model.forward(g, &weights, &b.tokens, run.batch, run.model.context).unwrap().logits;
        let (d, h) = (logits(device.as_mut()), logits(&mut host));
        assert!(d.iter().zip(&h).all(|(x, y)| x.to_bits() == y.to_bits()), "logits differ");
    }
    // The trainer's own evaluation (the device path) agrees too.
    let mean = |g: &mut dyn Gemm| -> f32 {
        let mut total = 0.0f32;
        for b in &batch {
            total += model.loss(g, &weights, &b.tokens, &b.targets, run.batch, run.model.context).unwrap();
        }
        total / batch.len() as f32
    };
    let expected = mean(&mut host);
    assert_eq!(t.heldout_loss(2).unwrap().to_bits(), expected.to_bits());
}

#[test]
fn same_seed_same_hash_at_every_step_across_runs_and_threads() {
    // Big enough that the plugin really splits work across threads (≥ 2^20 MACs per call).
    let run = RunConfig {
        model: ModelConfig { width: 64, context: 64, layers: 1, heads: 2 },
        batch: 8,
        steps: 12,
        lr: 0.005,
        seed: 3,
        sync: SyncConfig::SEED,
        corpus: 0,
    };
    let one = hashes(&mut trainer(run, units(1)), 12);
    let two = hashes(&mut trainer(run, units(2)), 12);
    let again = hashes(&mut trainer(run, units(1)), 12);
    assert_eq!(one, two, "thread count changed the weights");
    assert_eq!(one, again, "a second run diverged");
    assert_eq!(one.iter().collect::<std::collections::HashSet<_>>().len(), 12, "weights did not change every step");
    let other_seed = hashes(&mut trainer(RunConfig { seed: 4, ..run }, units(1)), 1);
    assert_ne!(other_seed[0], one[0]);
}

#[test]
fn save_load_resume_equals_straight_run() {
    let run = small_run(200);
    let mut straight = trainer(run, units(0));
    let straight_hashes = hashes(&mut straight, 200);

    let mut first = trainer(run, units(0));
    let first_hashes = hashes(&mut first, 100);
    assert_eq!(first_hashes[..], straight_hashes[..100]);
    let dir = std::env::temp_dir().join(format!("lockstep-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("half.ckpt");
    checkpoint::save(&path, &first.state().unwrap()).unwrap();
    drop(first);

    let state = checkpoint::load(&path, Some(run.model)).unwrap();
    assert_eq!(state.step, 100);
    // The settings, weights, optimizer and data position come from the file; the data stream is
    // the file's run seed's, its source built by the caller from the file's run (as `lockstep
    // train --resume` does): batch i of a stream is a function of (seed, i).
    let mut resumed = trainer(RunConfig { lr: 0.5, ..state.run }, units(0));
    resumed.restore(state).unwrap();
    let resumed_hashes = hashes(&mut resumed, 100);
    assert_eq!(resumed_hashes[..], straight_hashes[100..]);
    assert_eq!(resumed.weight_hash(), straight.weight_hash());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint of version 1 or 2, in their layouts (`docs/CHECKPOINTS.md`, "Older versions").
fn legacy_checkpoint(state: &lockstep_node::trainer::TrainState, version: u32) -> Vec<u8> {
    let run = &state.run;
    let mut out = b"LOCKSTEP".to_vec();
    let mut put = |bytes: &[u8]| out.extend_from_slice(bytes);
    put(&version.to_le_bytes());
    put(&10u32.to_le_bytes());
    put(b"byte-level");
    put(&256u32.to_le_bytes());
    for dim in [run.model.width, run.model.context, run.model.layers, run.model.heads, run.batch] {
        put(&(dim as u32).to_le_bytes());
    }
    put(&run.steps.to_le_bytes());
    put(&run.lr.to_le_bytes());
    put(&run.seed.to_le_bytes());
    put(&state.step.to_le_bytes());
    put(&state.data_state.to_le_bytes());
    put(&(state.weights.len() as u64).to_le_bytes());
    let floats = |values: &[f32]| values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    put(&floats(&state.weights));
    put(&state.adam.t.to_le_bytes());
    put(&state.adam.beta1_power.to_le_bytes());
    put(&state.adam.beta2_power.to_le_bytes());
    put(&floats(&state.adam.m));
    put(&floats(&state.adam.v));
    if version == 2 {
        put(&run.sync.encode());
        for tensor in [&state.sync.outer_momentum, &state.sync.residual] {
            put(&(tensor.len() as u64).to_le_bytes());
            put(&floats(tensor));
        }
    }
    let sum = lockstep_luts::hash::fnv1a64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

#[test]
fn damaged_checkpoints_are_refused_and_change_nothing() {
    let run = small_run(10);
    let mut t = trainer(run, Box::new(FloatGemm::default()));
    hashes(&mut t, 3);
    let good = checkpoint::encode(&t.state().unwrap());
    let before = t.state().unwrap();
    let refused = |bytes: &[u8], expected: Option<ModelConfig>| checkpoint::decode(bytes, expected).unwrap_err();

    assert_eq!(checkpoint::decode(&good, Some(run.model)).unwrap(), before);

    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    assert_eq!(refused(&bad_magic, None), CheckpointError::BadMagic);
    assert_eq!(refused(b"LOCK", None), CheckpointError::BadMagic);

    let mut bad_version = good.clone();
    bad_version[8] = 6;
    assert_eq!(refused(&bad_version, None), CheckpointError::UnsupportedVersion(6));

    // Files of versions 1 (no sync settings: every step, f32) and 2 (the sync settings and two
    // tensors after the optimizer) still load: written here byte by byte as
    // `docs/CHECKPOINTS.md` describes them.
    for version in [1u32, 2] {
        let old = legacy_checkpoint(&before, version);
        assert_eq!(checkpoint::decode(&old, Some(run.model)).unwrap(), before, "version {version}");
        let error = refused(&old[..old.len() - 9], None);
        assert!(matches!(error, CheckpointError::Truncated { .. }), "version {version}: {error:?}");
    }

    // Version 3: the run's block without the corpus's digest (which reads as 0, not known).
    let block = before.run.encode();
    let at = good.windows(block.len()).position(|w| w == block).expect("the run's block");
    let older = |version: u32, len: usize| {
        let mut file = [&good[..at + len], &good[at + RunConfig::ENCODED_LEN..good.len() - 8]].concat();
        file[8..12].copy_from_slice(&version.to_le_bytes());
        let sum = lockstep_luts::hash::fnv1a64(&file);
        file.extend_from_slice(&sum.to_le_bytes());
        checkpoint::decode(&file, Some(run.model))
    };
    let read = older(3, RunConfig::ENCODED_LEN_V3).expect("a version 3 file");
    assert_eq!(read.run.corpus, 0);
    assert_eq!(read.weights, before.weights);
    // Version 4: the block without the step rule (Adam's, the only one then).
    assert_eq!(older(4, RunConfig::ENCODED_LEN_V4).expect("a version 4 file"), before);

    for cut in [20, good.len() / 2, good.len() - 1] {
        let error = refused(&good[..cut], None);
        assert!(matches!(error, CheckpointError::Truncated { .. }), "cut at {cut}: {error:?}");
        assert!(error.to_string().contains("truncated"));
    }

    let mut flipped = good.clone();
    let middle = good.len() / 2;
    flipped[middle] ^= 0x40;
    assert!(matches!(refused(&flipped, None), CheckpointError::Checksum { .. }));

    // Wrong dimensions for the running model: a valid file of another shape.
    let other = RunConfig { model: ModelConfig { width: 16, context: 32, layers: 2, heads: 2 }, ..run };
    let other_bytes = checkpoint::encode(&trainer(other, Box::new(FloatGemm::default())).state().unwrap());
    let error = refused(&other_bytes, Some(run.model));
    assert!(matches!(error, CheckpointError::Dims(_)), "{error:?}");

    // Wrong vocabulary: rewrite the field and the checksum, so only the vocabulary is wrong.
    let mut wrong_vocab = good.clone();
    let vocab_at = 8 + 4 + 4 + "byte-level".len();
    wrong_vocab[vocab_at..vocab_at + 4].copy_from_slice(&512u32.to_le_bytes());
    let body = wrong_vocab.len() - 8;
    let sum = lockstep_luts::hash::fnv1a64(&wrong_vocab[..body]);
    wrong_vocab[body..].copy_from_slice(&sum.to_le_bytes());
    assert_eq!(refused(&wrong_vocab, None), CheckpointError::Vocab(512));

    // A refused load leaves the running trainer as it was.
    for bytes in [&bad_magic, &flipped, &other_bytes] {
        if let Ok(state) = checkpoint::decode(bytes, Some(run.model)) {
            t.restore(state).unwrap();
        }
    }
    assert_eq!(t.state().unwrap(), before);
    assert!(t.restore(checkpoint::decode(&other_bytes, None).unwrap()).is_err());
    assert_eq!(t.state().unwrap(), before);

    // A well-formed checkpoint whose settings are not a sane run (a hostile push: lr = 1e30,
    // or a step past its own run's end) is refused with the reason, and changes nothing.
    for (lr, step) in [(1e30f32, before.step), (f32::NAN, before.step), (3e-3, before.run.steps + 1)] {
        let mut hostile = before.clone();
        hostile.run.lr = lr;
        hostile.step = step;
        // The decoder or the restore refuses it (the decoder checks what it can alone).
        let why = match checkpoint::decode(&checkpoint::encode(&hostile), Some(run.model)) {
            Err(e) => e.to_string(),
            Ok(decoded) => t.restore(decoded).unwrap_err().to_string(),
        };
        assert!(why.contains("learning rate") || why.contains("past the checkpoint's own run length"), "{why}");
        assert_eq!(t.state().unwrap(), before);
    }
    // A group continues only from a checkpoint that trains its way: same batch and sync.
    let mut other_batch = before.run;
    other_batch.batch += 1;
    assert!(t.check_continues(&other_batch).unwrap_err().to_string().contains("batch"));
    let mut other_sync = before.run;
    other_sync.sync.compression = lockstep_node::sync::Compression::Int8;
    assert!(t.check_continues(&other_sync).unwrap_err().to_string().contains("sync"));
    let mut other_lr = before.run;
    other_lr.lr = 1e-3;
    other_lr.steps = 40;
    assert_eq!(t.check_continues(&other_lr), Ok(()), "lr and length may change");
}

/// `outer:H` with int8 as a group of one, through the real CPU plugin: the same bits at any
/// thread count, and a checkpoint taken at an outer step (weights, inner Adam, outer momentum,
/// residual) continues exactly as the straight run.
#[test]
fn outer_steps_with_int8_are_thread_count_free_and_resume_exactly() {
    let sync = outer4_int8(false);
    let run = RunConfig { sync, ..small_run(24) };
    let outer_hashes =
        |t: &mut Trainer, syncs: u32| -> Vec<u32> { (0..syncs).map(|_| t.step().unwrap().weight_hash).collect() };
    let mut one = trainer(run, units(1));
    let straight = outer_hashes(&mut one, 6);
    assert_eq!(one.step_count(), 24);
    let mut two = trainer(run, units(2));
    assert_eq!(outer_hashes(&mut two, 6), straight, "thread count changed the weights");
    assert_eq!(straight.iter().collect::<std::collections::HashSet<_>>().len(), 6);
    // Not the every-step run's weights, nor an uncompressed outer run's.
    let mut seed = trainer(small_run(24), units(1));
    assert_ne!(hashes(&mut seed, 4)[3], straight[0]);
    let mut f32_outer =
        trainer(RunConfig { sync: SyncConfig { compression: Compression::None, ..sync }, ..run }, units(1));
    assert_ne!(outer_hashes(&mut f32_outer, 1)[0], straight[0]);

    let mut first = trainer(run, units(1));
    outer_hashes(&mut first, 3);
    let state = first.state().unwrap();
    assert_eq!(
        (state.sync.outer_momentum.len(), state.sync.residual.len()),
        (state.weights.len(), state.weights.len())
    );
    assert!(state.sync.residual.iter().any(|r| *r != 0.0) && state.sync.outer_momentum.iter().any(|m| *m != 0.0));
    let bytes = checkpoint::encode(&state);
    let loaded = checkpoint::decode(&bytes, Some(run.model)).unwrap();
    assert_eq!(loaded, state);
    let mut resumed = trainer(small_run(24), units(1)); // the run's settings come from the file
    resumed.restore(loaded).unwrap();
    assert_eq!(outer_hashes(&mut resumed, 3), straight[3..]);
}

#[test]
fn units_trainer_tracks_the_float_reference() {
    let run = small_run(300);
    let mut with_units = trainer(run, units(0));
    let mut float = trainer(run, Box::new(FloatGemm::default()));
    hashes(&mut with_units, 300);
    hashes(&mut float, 300);
    let units_loss = with_units.heldout_loss(8).unwrap();
    let float_loss = float.heldout_loss(8).unwrap();
    let ln_vocab = 256f32.ln();
    assert!(units_loss < 0.6 * ln_vocab && float_loss < 0.6 * ln_vocab, "units {units_loss}, float {float_loss}");
    let gap = (units_loss - float_loss).abs() / float_loss;
    assert!(gap < 0.05, "units {units_loss} vs float {float_loss}: {:.1}% apart", gap * 100.0);
}

#[test]
fn safetensors_export_reads_back_in_python() {
    let run = small_run(10);
    let mut t = trainer(run, Box::new(FloatGemm::default()));
    hashes(&mut t, 2);
    let state = t.state().unwrap();
    let bytes = checkpoint::safetensors(&state);
    let dir = std::env::temp_dir().join(format!("lockstep-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    // Python's standard library parses the header and checks every tensor's bytes against the
    // flat weight order the docs describe.
    let script = r#"
import json, struct, sys
data = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n])
meta = header.pop("__metadata__")
body = data[8 + n:]
total = 0
for name, t in header.items():
    a, b = t["data_offsets"]
    count = 1
    for d in t["shape"]:
        count *= d
    assert t["dtype"] == "F32" and b - a == 4 * count, name
    total += count
assert total * 4 == len(body)
emb = header["tok_emb"]
first = struct.unpack("<f", body[emb["data_offsets"][0]:emb["data_offsets"][0] + 4])[0]
print(meta["tokenizer"], meta["step"], len(header), total, struct.pack("<f", first).hex())
"#;
    let out = std::process::Command::new("python3").arg("-c").arg(script).arg(&path).output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).unwrap();
    let fields: Vec<&str> = printed.split_whitespace().collect();
    let layout = lockstep_node::params::Layout::new(run.model);
    assert_eq!(fields[0], "byte-level");
    assert_eq!(fields[1], "2");
    assert_eq!(fields[2], layout.tensors.len().to_string());
    assert_eq!(fields[3], layout.len.to_string());
    let first_bytes: String = state.weights[0].to_le_bytes().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(fields[4], first_bytes);
}

/// Elastic windows through the real trainer: a window told to end after 2 of its 4 inner steps
/// contributes 2 steps' worth, weighs 2, and moves its step count and data stream to the
/// window's end (the next window trains on the batches every member's next window starts
/// at); a window not told runs its 4.
#[test]
fn an_elastic_window_ends_where_it_is_told_and_moves_to_the_next() {
    let run = RunConfig { sync: outer4_int8(true), ..small_run(12) };
    let mut t = trainer(run, units(1));
    t.hurry().store(2, std::sync::atomic::Ordering::Relaxed);
    let short = t.contribute().unwrap();
    assert_eq!((short.weight, t.step_count(), t.data_state()), (2, 4, 4));
    let mut full = trainer(run, units(1));
    let whole = full.contribute().unwrap();
    assert_eq!((whole.weight, full.step_count(), full.data_state()), (4, 4, 4));
    assert_ne!(short.values, whole.values, "two steps are not four");
    // The next window, not told, runs its 4 from the window's end.
    let mean = lockstep_node::sync::reduce(&[&short.values], &[short.weight]);
    t.finish_sync(&mean.mean, &mean.grid, true).unwrap();
    t.hurry().store(u32::MAX, std::sync::atomic::Ordering::Relaxed);
    assert_eq!((t.contribute().unwrap().weight, t.step_count(), t.data_state()), (4, 8, 8));
}
