//! Checkpoint files written by a node: through a temporary file, so a crash never leaves half
//! a checkpoint under the real name, and a failed write leaves nothing behind.

use std::path::{Path, PathBuf};

use lockstep_node::wire::PeerId;

/// Where a checkpoint is written.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckpointTarget {
    File(PathBuf),
    /// `node<ID>-step<STEP>.ckpt` in this directory, named after the step actually saved.
    InDir(PathBuf),
}

/// A checkpoint written: its file, step and weight hash.
#[derive(Clone, Debug, PartialEq)]
pub struct Saved {
    pub path: PathBuf,
    pub step: u32,
    pub whash: u32,
}

/// Why a checkpoint was not saved (nothing is left on disk).
#[derive(Clone, Debug, PartialEq)]
pub enum SaveError {
    /// There is nothing to save before a run is configured.
    NoRun,
    /// A file operation failed: what was being done, on which path, and the system's reason.
    Io { doing: &'static str, path: PathBuf, why: String },
}

impl std::fmt::Display for SaveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SaveError::NoRun => f.write_str("no run is configured yet"),
            SaveError::Io { doing, path, why } => write!(f, "{doing} {}: {why}", path.display()),
        }
    }
}

impl std::error::Error for SaveError {}

/// Writes a snapshot of `step` for node `me`; a failure removes the partial file.
pub fn save_checkpoint(
    target: CheckpointTarget,
    me: PeerId,
    bytes: &[u8],
    step: u32,
    whash: u32,
) -> Result<Saved, SaveError> {
    if bytes.is_empty() {
        return Err(SaveError::NoRun);
    }
    let path = match target {
        CheckpointTarget::File(path) => path,
        CheckpointTarget::InDir(dir) => dir.join(format!("node{me}-step{step:06}.ckpt")),
    };
    let io = |doing: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |e: std::io::Error| SaveError::Io { doing, path, why: e.to_string() }
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    }
    let partial = path.with_extension("partial");
    let written = std::fs::write(&partial, bytes)
        .map_err(io("writing", &partial))
        .and_then(|()| std::fs::rename(&partial, &path).map_err(io("renaming to", &path)));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written.map(|()| Saved { path, step, whash })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_save_leaves_no_partial_file() {
        let dir = std::env::temp_dir().join(format!("lockstep-save-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        // The target is an existing directory: the partial file is written, the rename fails.
        let target = dir.join("taken.ckpt");
        std::fs::create_dir_all(target.join("inside")).expect("a directory in the way");
        let error = save_checkpoint(CheckpointTarget::File(target.clone()), 1, b"bytes", 3, 7).unwrap_err();
        assert!(matches!(error, SaveError::Io { doing: "renaming to", .. }), "{error:?}");
        assert!(!dir.join("taken.partial").exists(), "the partial file was left behind");
        let saved = save_checkpoint(CheckpointTarget::InDir(dir.clone()), 4, b"bytes", 12, 9).expect("saved");
        assert_eq!(saved, Saved { path: dir.join("node4-step000012.ckpt"), step: 12, whash: 9 });
        assert_eq!(std::fs::read(&saved.path).expect("written"), b"bytes");
        assert_eq!(save_checkpoint(CheckpointTarget::InDir(dir.clone()), 4, b"", 0, 0), Err(SaveError::NoRun));
        std::fs::remove_dir_all(&dir).expect("cleaned up");
    }
}
