//! The packaged corpus: real prose in the FineWeb-Edu parquet layout, read from a directory or
//! over HTTP, into the [`Corpus`] a node's batches are drawn from.
//!
//! `scripts/corpus.sh` builds it (`docs/DATA.md`): a directory holding `manifest.json`, the
//! training shards `train_NNNNN.parquet` and `heldout.parquet`, held out by document. Each
//! file's `text` column is read whole, row group by row group; a file over HTTP is read by
//! explicit ranges (its footer, then each row group's `text` chunk) through the same reader as
//! `/data`, so any server with range support serves it (`lockstep signal --corpus`, nginx).
//! The training documents are joined in the manifest's file order and the files' row order, so
//! a directory and a URL of the same files give the same corpus, bit for bit (its digest).
//!
//! Which corpus a command trains on ([`CorpusChoice`]): `auto` (the default) is the packaged
//! corpus when it has been built, else the built-in 35 KB text with a note naming the command
//! that builds the real one; `builtin`, a directory, or an `http://` URL name one outright, and
//! one that cannot be read is an error, never a silent fallback.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lockstep_node::data::Corpus;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use serde::Deserialize;

use lockstep_signaling::data::{push_texts, DataConfig, DataService};

/// The manifest's name in a corpus directory.
pub const MANIFEST: &str = "manifest.json";
/// The held-out file's name.
pub const HELDOUT: &str = "heldout.parquet";
/// The command that builds the packaged corpus (the console's first line names it when the
/// corpus is missing).
pub const BUILD_COMMAND: &str = "scripts/corpus.sh";
/// The environment variable that moves the packaged corpus's directory.
pub const DIR_VARIABLE: &str = "LOCKSTEP_CORPUS";

/// Where the packaged corpus lives: `$LOCKSTEP_CORPUS`, else
/// `$XDG_CACHE_HOME/lockstep/corpus`, else `~/.cache/lockstep/corpus` (what
/// `scripts/corpus.sh` writes).
pub fn default_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(DIR_VARIABLE).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("lockstep").join("corpus")
}

/// Whether `dir` holds a built corpus (its manifest).
pub fn is_built(dir: &Path) -> bool {
    dir.join(MANIFEST).is_file()
}

/// Why a corpus could not be read.
#[derive(Debug)]
pub enum CorpusError {
    /// No `manifest.json` where the corpus should be.
    NotBuilt { dir: PathBuf },
    /// The manifest is not the JSON `scripts/corpus.sh` writes.
    Manifest { at: String, why: String },
    /// A file could not be read (or fetched).
    Read { file: String, why: String },
    /// A file holds no `text` column of strings, or is not parquet.
    Parquet { file: String, why: String },
    /// The text read is not what the manifest says (a partly written or tampered corpus).
    Mismatch { file: String, why: String },
    /// The location is neither a directory nor an `http://` URL.
    Location(String),
}

impl std::fmt::Display for CorpusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CorpusError::NotBuilt { dir } => {
                write!(f, "no packaged corpus in {} (`{BUILD_COMMAND}` builds it)", dir.display())
            }
            CorpusError::Manifest { at, why } => write!(f, "{at}: not a corpus manifest: {why}"),
            CorpusError::Read { file, why } => write!(f, "cannot read {file}: {why}"),
            CorpusError::Parquet { file, why } => write!(f, "{file}: {why}"),
            CorpusError::Mismatch { file, why } => write!(f, "{file} is not the file its manifest names: {why}"),
            CorpusError::Location(what) => write!(f, "`{what}` is neither a directory nor an http:// URL"),
        }
    }
}

impl std::error::Error for CorpusError {}

/// `manifest.json`: what `scripts/corpus.sh` wrote.
#[derive(Clone, Debug, Deserialize)]
pub struct Manifest {
    pub packages: Vec<String>,
    pub documents: usize,
    pub train_documents: usize,
    pub heldout_documents: usize,
    pub train_bytes: usize,
    pub heldout_bytes: usize,
    pub files: Vec<ManifestFile>,
}

/// One parquet file of the corpus.
#[derive(Clone, Debug, Deserialize)]
pub struct ManifestFile {
    pub name: String,
    pub rows: usize,
    pub bytes: u64,
}

impl Manifest {
    fn parse(at: &str, bytes: &[u8]) -> Result<Manifest, CorpusError> {
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(|e| CorpusError::Manifest { at: at.into(), why: e.to_string() })?;
        let plain = |name: &str| {
            !name.is_empty()
                && name.ends_with(".parquet")
                && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        };
        if let Some(bad) = manifest.files.iter().find(|f| !plain(&f.name) || f.name.starts_with('.')) {
            return Err(CorpusError::Manifest {
                at: at.into(),
                why: format!("`{}` is not a plain parquet file name", bad.name),
            });
        }
        if !manifest.files.iter().any(|f| f.name == HELDOUT) {
            return Err(CorpusError::Manifest { at: at.into(), why: format!("it names no {HELDOUT}") });
        }
        if !manifest.files.iter().any(|f| f.name != HELDOUT) {
            return Err(CorpusError::Manifest { at: at.into(), why: "it names no training file".into() });
        }
        Ok(manifest)
    }
}

/// Where a corpus is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CorpusLocation {
    Dir(PathBuf),
    /// An `http://` base URL: `{url}/manifest.json` and the files beside it.
    Url(String),
}

impl std::fmt::Display for CorpusLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CorpusLocation::Dir(dir) => write!(f, "{}", dir.display()),
            CorpusLocation::Url(url) => f.write_str(url),
        }
    }
}

/// Which corpus a command trains on (`--corpus`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CorpusChoice {
    /// The packaged corpus if built, else the built-in text (with a note).
    Auto,
    Builtin,
    At(CorpusLocation),
}

impl std::str::FromStr for CorpusChoice {
    type Err = CorpusError;

    fn from_str(text: &str) -> Result<Self, CorpusError> {
        Ok(match text {
            "auto" | "" => CorpusChoice::Auto,
            "builtin" => CorpusChoice::Builtin,
            url if url.starts_with("http://") => {
                CorpusChoice::At(CorpusLocation::Url(url.trim_end_matches('/').into()))
            }
            url if url.contains("://") => return Err(CorpusError::Location(url.into())),
            dir => CorpusChoice::At(CorpusLocation::Dir(PathBuf::from(dir))),
        })
    }
}

/// A corpus to train on, and what a user should be told about the choice (the console's first
/// log line when the packaged corpus is missing).
pub struct Chosen {
    pub corpus: Arc<Corpus>,
    pub note: Option<String>,
}

impl CorpusChoice {
    /// The built corpus directory this choice trains on, for a server to hand to members
    /// elsewhere: the one named, or with `Auto` the packaged one; none for the built-in text, a
    /// URL or a directory without a corpus.
    pub fn served_dir(&self) -> Option<PathBuf> {
        match self {
            CorpusChoice::At(CorpusLocation::Dir(dir)) => Some(dir.clone()),
            CorpusChoice::Auto => Some(default_dir()),
            CorpusChoice::Builtin | CorpusChoice::At(CorpusLocation::Url(_)) => None,
        }
        .filter(|dir| is_built(dir))
    }

    /// Reads the chosen corpus. `Auto` falls back to the built-in text only when the packaged
    /// corpus was never built; a corpus that is there but cannot be read is an error.
    pub fn load(&self) -> Result<Chosen, CorpusError> {
        match self {
            CorpusChoice::Builtin => Ok(Chosen { corpus: Arc::new(Corpus::builtin()), note: None }),
            CorpusChoice::At(location) => Ok(Chosen { corpus: Arc::new(load(location)?), note: None }),
            CorpusChoice::Auto => match load(&CorpusLocation::Dir(default_dir())) {
                Ok(corpus) => Ok(Chosen { corpus: Arc::new(corpus), note: None }),
                Err(CorpusError::NotBuilt { dir }) => Ok(Chosen {
                    corpus: Arc::new(Corpus::builtin()),
                    note: Some(format!(
                        "training on the built-in 35 KB corpus, which a long run memorises: no packaged corpus in {} \
                         (`{BUILD_COMMAND}` builds it, ~23 MB of Debian documentation)",
                        dir.display()
                    )),
                }),
                Err(other) => Err(other),
            },
        }
    }
}

/// Reads the corpus at `location`.
pub fn load(location: &CorpusLocation) -> Result<Corpus, CorpusError> {
    match location {
        CorpusLocation::Dir(dir) => load_dir(dir),
        CorpusLocation::Url(url) => {
            let url = url.clone();
            let panicked = CorpusError::Read { file: url.clone(), why: "the reader panicked".into() };
            // Its own thread and runtime: callers may be inside a runtime already.
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| {
                    CorpusError::Read { file: url.clone(), why: format!("cannot start a runtime: {e}") }
                })?;
                runtime.block_on(load_url(&url))
            })
            .join()
            .unwrap_or(Err(panicked))
        }
    }
}

fn corpus_name(manifest: &Manifest) -> String {
    format!("packaged corpus [{}]", manifest.packages.join(", "))
}

fn load_dir(dir: &Path) -> Result<Corpus, CorpusError> {
    let manifest_path = dir.join(MANIFEST);
    let bytes = match std::fs::read(&manifest_path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(CorpusError::NotBuilt { dir: dir.into() }),
        Err(e) => return Err(CorpusError::Read { file: manifest_path.display().to_string(), why: e.to_string() }),
    };
    let manifest = Manifest::parse(&manifest_path.display().to_string(), &bytes)?;
    let texts = manifest.files.iter().map(|file| read_local(&dir.join(&file.name), file)).collect::<Result<_, _>>()?;
    finish(&manifest, &dir.display().to_string(), texts)
}

/// The `text` column of one local parquet file, and the file's name for messages.
fn read_local(path: &Path, expected: &ManifestFile) -> Result<(String, Vec<String>), CorpusError> {
    let name = path.display().to_string();
    let read = |why: String| CorpusError::Read { file: name.clone(), why };
    let parquet = |why: String| CorpusError::Parquet { file: name.clone(), why };
    let file = std::fs::File::open(path).map_err(|e| read(e.to_string()))?;
    let len = file.metadata().map_err(|e| read(e.to_string()))?.len();
    if len != expected.bytes {
        return Err(CorpusError::Mismatch {
            file: name,
            why: format!("{len} bytes, the manifest says {}", expected.bytes),
        });
    }
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| parquet(e.to_string()))?;
    let text = builder.schema().index_of("text").map_err(|_| parquet("no `text` column".into()))?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), [text]);
    let reader = builder.with_projection(mask).with_batch_size(8192).build().map_err(|e| parquet(e.to_string()))?;
    let mut texts = Vec::with_capacity(expected.rows);
    for batch in reader {
        let batch = batch.map_err(|e| parquet(e.to_string()))?;
        push_texts(batch.column(0).as_ref(), &mut texts).map_err(parquet)?;
    }
    Ok((name, texts))
}

async fn load_url(url: &str) -> Result<Corpus, CorpusError> {
    let manifest_url = format!("{url}/{MANIFEST}");
    let read = |why: String| CorpusError::Read { file: manifest_url.clone(), why };
    // reqwest is built without a default TLS provider: install ring's once (as `/data` does).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(20))
        .build()
        .map_err(|e| read(format!("HTTP client: {e}")))?;
    let response = client.get(&manifest_url).send().await.map_err(|e| read(e.to_string()))?;
    if !response.status().is_success() {
        return Err(read(format!("answered {}", response.status())));
    }
    let bytes = response.bytes().await.map_err(|e| read(e.to_string()))?;
    let manifest = Manifest::parse(&manifest_url, &bytes)?;
    let service = DataService::new(DataConfig {
        base_url: url.to_string(),
        shards: manifest.files.iter().map(|f| f.name.clone()).collect(),
        ..DataConfig::default()
    })
    .map_err(|e| read(e.0))?;
    let mut texts = Vec::with_capacity(manifest.files.len());
    for file in &manifest.files {
        let name = format!("{url}/{}", file.name);
        match service.all_texts(&file.name).await {
            Ok(read) => texts.push((name, read)),
            Err(e) => return Err(CorpusError::Read { file: name, why: e.0 }),
        }
    }
    finish(&manifest, url, texts)
}

/// Checks what was read — each manifest file's texts, in the manifest's order, with the name
/// its messages use — against the manifest, and joins it: the training files' documents in
/// order, the held-out file's.
fn finish(manifest: &Manifest, at: &str, texts: Vec<(String, Vec<String>)>) -> Result<Corpus, CorpusError> {
    let mut train = Vec::new();
    let mut held = Vec::new();
    for (file, (name, read)) in manifest.files.iter().zip(texts) {
        if read.len() != file.rows {
            let why = format!("{} rows, the manifest says {}", read.len(), file.rows);
            return Err(CorpusError::Mismatch { file: name, why });
        }
        if file.name == HELDOUT {
            held = read;
        } else {
            train.extend(read);
        }
    }
    let mismatch = |why: String| CorpusError::Mismatch { file: at.to_string(), why };
    let bytes = |texts: &[String]| texts.iter().map(String::len).sum::<usize>();
    if train.len() != manifest.train_documents || held.len() != manifest.heldout_documents {
        return Err(mismatch(format!(
            "{} training and {} held-out documents, the manifest says {} and {}",
            train.len(),
            held.len(),
            manifest.train_documents,
            manifest.heldout_documents
        )));
    }
    if bytes(&train) != manifest.train_bytes || bytes(&held) != manifest.heldout_bytes {
        return Err(mismatch(format!(
            "{} training and {} held-out bytes, the manifest says {} and {}",
            bytes(&train),
            bytes(&held),
            manifest.train_bytes,
            manifest.heldout_bytes
        )));
    }
    Ok(Corpus::from_documents(&corpus_name(manifest), &train, &held))
}
