//! Checkpoints: the seed's `.pt` layout (magic, version, config dims, step, flat f32 weights),
//! extended with the tokenizer's identity, the optimizer and data-sampler state (needed for a
//! bit-identical resume) and an integrity checksum. `docs/CHECKPOINTS.md` is the byte-level
//! description. Also the safetensors export.

use std::path::Path;

use lockstep_luts::hash::fnv1a64;

use crate::adam::Adam;
use crate::config::{ConfigError, ModelConfig, RunConfig, TOKENIZER_NAME, VOCAB};
use crate::params::Layout;
use crate::sync::{SyncConfig, SyncError, SyncState};
use crate::trainer::TrainState;

pub const MAGIC: &[u8; 8] = b"LOCKSTEP";
/// Version 5 stores the run settings as one block (`RunConfig::encode`, the run config
/// message's bytes, the step rule last) and the sync tensors as a counted list; version 4 (the
/// block without the step rule), version 3 (nor the corpus's digest), version 2 (the sync settings after the optimizer,
/// two tensors) and version 1 (every-step, uncompressed) still load.
pub const VERSION: u32 = 5;

/// Why a checkpoint was refused. Nothing is applied from a refused file.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckpointError {
    Io(String),
    BadMagic,
    UnsupportedVersion(u32),
    /// The file ends before `needed` bytes (it has `have`).
    Truncated {
        needed: usize,
        have: usize,
    },
    Tokenizer(String),
    Vocab(u32),
    Dims(String),
    /// The stored run settings are not a usable run.
    Settings(ConfigError),
    /// The stored sync settings or tensors do not read.
    Sync(SyncError),
    Checksum {
        stored: u64,
        computed: u64,
    },
    TrailingBytes(usize),
}

impl std::fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckpointError::Io(e) => write!(f, "cannot read checkpoint: {e}"),
            CheckpointError::BadMagic => write!(f, "not a lockstep checkpoint (bad magic)"),
            CheckpointError::UnsupportedVersion(v) => {
                write!(f, "checkpoint version {v} is not supported (this build reads {VERSION})")
            }
            CheckpointError::Truncated { needed, have } => {
                write!(f, "checkpoint is truncated: {have} bytes, at least {needed} needed")
            }
            CheckpointError::Tokenizer(name) => write!(f, "checkpoint tokenizer `{name}` is not `{TOKENIZER_NAME}`"),
            CheckpointError::Vocab(v) => write!(f, "checkpoint vocabulary size {v} is not {VOCAB}"),
            CheckpointError::Dims(why) => write!(f, "checkpoint dimensions are wrong: {why}"),
            CheckpointError::Settings(why) => write!(f, "checkpoint run settings are refused: {why}"),
            CheckpointError::Sync(why) => write!(f, "checkpoint sync settings are refused: {why}"),
            CheckpointError::Checksum { stored, computed } => {
                write!(f, "checkpoint checksum mismatch (stored {stored:#018x}, computed {computed:#018x}): the file is corrupt")
            }
            CheckpointError::TrailingBytes(n) => write!(f, "checkpoint has {n} unexpected trailing bytes"),
        }
    }
}

impl std::error::Error for CheckpointError {}

/// Serializes `state` (version 3).
pub fn encode(state: &TrainState) -> Vec<u8> {
    let n = state.weights.len();
    let mut out = Vec::with_capacity(128 + 12 * n);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(TOKENIZER_NAME.len() as u32).to_le_bytes());
    out.extend_from_slice(TOKENIZER_NAME.as_bytes());
    out.extend_from_slice(&(VOCAB as u32).to_le_bytes());
    out.extend_from_slice(&state.run.encode());
    out.extend_from_slice(&state.step.to_le_bytes());
    out.extend_from_slice(&state.data_state.to_le_bytes());
    out.extend_from_slice(&(n as u64).to_le_bytes());
    let floats =
        |out: &mut Vec<u8>, values: &[f32]| values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    floats(&mut out, &state.weights);
    out.extend_from_slice(&state.adam.t.to_le_bytes());
    out.extend_from_slice(&state.adam.beta1_power.to_le_bytes());
    out.extend_from_slice(&state.adam.beta2_power.to_le_bytes());
    floats(&mut out, &state.adam.m);
    floats(&mut out, &state.adam.v);
    let tensors = state.sync.tensors();
    out.extend_from_slice(&(tensors.len() as u32).to_le_bytes());
    for tensor in tensors {
        out.extend_from_slice(&(tensor.len() as u64).to_le_bytes());
        floats(&mut out, tensor);
    }
    let checksum = fnv1a64(&out);
    out.extend_from_slice(&checksum.to_le_bytes());
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, len: usize) -> Result<&[u8], CheckpointError> {
        let end = self.at.checked_add(len).filter(|&end| end <= self.bytes.len());
        let end =
            end.ok_or(CheckpointError::Truncated { needed: self.at.saturating_add(len), have: self.bytes.len() })?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u32(&mut self) -> Result<u32, CheckpointError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, CheckpointError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn f32(&mut self) -> Result<f32, CheckpointError> {
        Ok(f32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn floats(&mut self, n: usize) -> Result<Vec<f32>, CheckpointError> {
        let bytes = self.take(n.checked_mul(4).ok_or(CheckpointError::Dims("tensor size overflows".into()))?)?;
        Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect())
    }
}

/// Parses and validates a checkpoint completely; `expected` (the running model's shape), when
/// given, must match.
pub fn decode(bytes: &[u8], expected: Option<ModelConfig>) -> Result<TrainState, CheckpointError> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(MAGIC.len()).map_err(|_| CheckpointError::BadMagic)? != MAGIC {
        return Err(CheckpointError::BadMagic);
    }
    let version = r.u32()?;
    if !(1..=VERSION).contains(&version) {
        return Err(CheckpointError::UnsupportedVersion(version));
    }
    // The checksum covers everything before it; check it as soon as the file is long enough,
    // so corruption is reported as such rather than as whatever field it happened to hit.
    if bytes.len() >= 8 + 4 + 8 {
        let (body, tail) = bytes.split_at(bytes.len() - 8);
        let stored = u64::from_le_bytes(tail.try_into().expect("8 bytes"));
        let computed = fnv1a64(body);
        if stored != computed {
            // A short file also fails the checksum; say which problem it is.
            let minimum = minimum_len(bytes);
            if let Some(needed) = minimum.filter(|&needed| needed > bytes.len()) {
                return Err(CheckpointError::Truncated { needed, have: bytes.len() });
            }
            return Err(CheckpointError::Checksum { stored, computed });
        }
    }
    let name_len = r.u32()? as usize;
    if name_len > 256 {
        return Err(CheckpointError::Tokenizer(format!("<{name_len}-byte name>")));
    }
    let name = String::from_utf8_lossy(r.take(name_len)?).into_owned();
    if name != TOKENIZER_NAME {
        return Err(CheckpointError::Tokenizer(name));
    }
    let vocab = r.u32()?;
    if vocab as usize != VOCAB {
        return Err(CheckpointError::Vocab(vocab));
    }
    let mut run = if version >= 5 {
        let block = r.take(RunConfig::ENCODED_LEN)?.try_into().expect("ENCODED_LEN bytes");
        RunConfig::decode(block).map_err(CheckpointError::Sync)?
    } else if version == 4 {
        let block = r.take(RunConfig::ENCODED_LEN_V4)?.try_into().expect("ENCODED_LEN_V4 bytes");
        RunConfig::decode_v4(block).map_err(CheckpointError::Sync)?
    } else if version == 3 {
        let block = r.take(RunConfig::ENCODED_LEN_V3)?.try_into().expect("ENCODED_LEN_V3 bytes");
        RunConfig::decode_v3(block).map_err(CheckpointError::Sync)?
    } else {
        legacy_run(&mut r)?
    };
    let model = run.model;
    model.validate().map_err(CheckpointError::Settings)?;
    if let Some(expected) = expected {
        if expected != model {
            return Err(CheckpointError::Dims(format!("file has {model:?}, the running model is {expected:?}")));
        }
    }
    let step = r.u32()?;
    let data_state = r.u64()?;
    let n = r.u64()? as usize;
    let layout_len = Layout::new(model).len;
    if n != layout_len {
        return Err(CheckpointError::Dims(format!("{n} weights, the model has {layout_len}")));
    }
    let weights = r.floats(n)?;
    let t = r.u32()?;
    let beta1_power = r.f32()?;
    let beta2_power = r.f32()?;
    let m = r.floats(n)?;
    let v = r.floats(n)?;
    let mut tensors = Vec::new();
    if version >= 2 {
        let count = if version >= 3 {
            r.u32()? as usize
        } else {
            let bytes = r.take(SyncConfig::ENCODED_LEN)?.try_into().expect("ENCODED_LEN bytes");
            run.sync = SyncConfig::decode(bytes).map_err(CheckpointError::Sync)?;
            2
        };
        if count > 16 {
            return Err(CheckpointError::Dims(format!("{count} sync tensors")));
        }
        for _ in 0..count {
            let len = r.u64()? as usize;
            if len != 0 && len != n {
                return Err(CheckpointError::Dims(format!("a sync tensor of {len} values, the model has {n}")));
            }
            tensors.push(r.floats(len)?);
        }
    }
    let sync = SyncState::from_tensors(&run.sync, tensors, n).map_err(CheckpointError::Sync)?;
    run.validate().map_err(CheckpointError::Settings)?;
    // The checksum itself was verified before parsing (any file that reaches here is long
    // enough for that check to have run).
    let _checksum = r.u64()?;
    if r.at != bytes.len() {
        return Err(CheckpointError::TrailingBytes(bytes.len() - r.at));
    }
    Ok(TrainState { run, step, weights, adam: Adam { m, v, beta1_power, beta2_power, t }, data_state, sync })
}

/// The run settings of a version 1 or 2 file: dimensions, run length, learning rate, seed (the
/// sync settings of version 2 come later in the file).
fn legacy_run(r: &mut Reader<'_>) -> Result<RunConfig, CheckpointError> {
    let mut dims = [0usize; 5];
    for dim in &mut dims {
        *dim = r.u32()? as usize;
    }
    let model = ModelConfig { width: dims[0], context: dims[1], layers: dims[2], heads: dims[3] };
    Ok(RunConfig {
        model,
        batch: dims[4],
        steps: r.u32()?,
        lr: r.f32()?,
        seed: r.u64()?,
        sync: SyncConfig::SEED,
        corpus: 0,
    })
}

/// The length a well-formed file with this header would have; a header cut short yields the
/// length needed to read it. `None` when the header is readable but invalid.
fn minimum_len(bytes: &[u8]) -> Option<usize> {
    let read = || -> Result<Option<usize>, CheckpointError> {
        let mut r = Reader { bytes, at: 12 };
        let name_len = r.u32()? as usize;
        if name_len > 256 {
            return Ok(None);
        }
        r.take(name_len)?;
        let _vocab = r.u32()?;
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        let model = if version >= 3 {
            let len = match version {
                5.. => RunConfig::ENCODED_LEN,
                4 => RunConfig::ENCODED_LEN_V4,
                _ => RunConfig::ENCODED_LEN_V3,
            };
            // The model's dimensions are the block's first words in either encoding.
            let mut block = [0u8; RunConfig::ENCODED_LEN];
            block[..len].copy_from_slice(r.take(len)?);
            match RunConfig::decode(&block) {
                Ok(run) => run.model,
                Err(_) => return Ok(None),
            }
        } else {
            let model = legacy_run(&mut r)?.model;
            r.at -= 4 + 4 + 8; // the run length, learning rate and seed are counted below
            model
        };
        if model.validate().is_err() {
            return Ok(None);
        }
        let n = Layout::new(model).len;
        // so far + [steps, lr, seed: versions 1 and 2] + step, data state, n + weights + Adam
        // scalars + m, v + the sync part at its shortest (version 2: the settings and two empty
        // tensors; version 3: the count and two empty tensors) + sum
        let (legacy, sync) = match version {
            1 => (16, 0),
            2 => (16, SyncConfig::ENCODED_LEN + 16),
            _ => (0, 4 + 16),
        };
        Ok(Some(r.at + legacy + 4 + 8 + 8 + 4 * n + 12 + 8 * n + sync + 8))
    };
    match read() {
        Ok(len) => len,
        Err(CheckpointError::Truncated { needed, .. }) => Some(needed),
        Err(_) => None,
    }
}

/// Writes `state` to `path` atomically (a temporary file, then a rename).
pub fn save(path: &Path, state: &TrainState) -> Result<(), CheckpointError> {
    let bytes = encode(state);
    let tmp = path.with_extension("tmp-write");
    std::fs::write(&tmp, &bytes).map_err(|e| CheckpointError::Io(format!("{}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(|e| CheckpointError::Io(format!("{}: {e}", path.display())))
}

/// Reads and validates a checkpoint file.
pub fn load(path: &Path, expected: Option<ModelConfig>) -> Result<TrainState, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|e| CheckpointError::Io(format!("{}: {e}", path.display())))?;
    decode(&bytes, expected)
}

/// The weights as a safetensors file (written by the `safetensors` crate): one `F32` tensor per
/// parameter, named as in `docs/MODEL.md`, and `__metadata__` with the tokenizer, the
/// vocabulary, the dimensions and the step.
pub fn safetensors(state: &TrainState) -> Vec<u8> {
    use safetensors::tensor::{Dtype, TensorView};
    let layout = Layout::new(state.run.model);
    let bytes: Vec<u8> = state.weights.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors = layout.tensors.iter().map(|tensor| {
        let data = &bytes[tensor.range.start * 4..tensor.range.end * 4];
        let view = TensorView::new(Dtype::F32, tensor.shape.to_vec(), data)
            .expect("the layout's shapes cover its ranges exactly");
        (tensor.name.to_string(), view)
    });
    let m = state.run.model;
    let metadata = [
        ("format", "lockstep".to_string()),
        ("tokenizer", TOKENIZER_NAME.to_string()),
        ("vocab", VOCAB.to_string()),
        ("step", state.step.to_string()),
        ("width", m.width.to_string()),
        ("context", m.context.to_string()),
        ("layers", m.layers.to_string()),
        ("heads", m.heads.to_string()),
    ];
    let metadata = metadata.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    safetensors::serialize(tensors, Some(metadata)).expect("named F32 tensors of a valid layout serialize")
}
