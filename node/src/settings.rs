//! **The table of run settings**: every setting of a [`RunConfig`] declared once — its name
//! (the command line's `--name`, the headless JSON's key with `_` for `-`), what it means, and
//! where it lives in the config. The command line, the headless `start` command, the benches and
//! the `run-started` event read and show settings through this table only; the wire and
//! checkpoints carry the whole config in one encoding (`RunConfig::encode`).
//!
//! A new setting is a field of `RunConfig` (or of `SyncConfig`), a line here, and its place in
//! the encoding. `RunConfig::corpus` is not a setting: a run takes the digest of the text the node
//! that starts it trains on. A new sync mode is a `SyncMode` of `sync.rs` (which parses and prints it): the
//! `sync` line below takes it as it is.

use crate::config::RunConfig;
use crate::sync::{Compression, Exchange, StepRule, SyncMode};

/// One run setting.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// `--name` on the command line; `name` with `_` for `-` in JSON.
    pub name: &'static str,
    /// What it means (the command line's help).
    pub help: &'static str,
    /// Its value in `run`, as text that [`Setting::set`] reads back.
    pub show: fn(&RunConfig) -> String,
    /// Sets it from text; says why the text is not a value of it.
    pub set: fn(&mut RunConfig, &str) -> Result<(), String>,
}

impl Setting {
    /// Its key in JSON.
    pub fn json_key(&self) -> String {
        self.name.replace('-', "_")
    }
}

/// Why a setting was not taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettingError {
    /// No setting has this name.
    Unknown(String),
    /// The text is not a value of the setting.
    Value { name: &'static str, value: String, why: String },
}

impl std::fmt::Display for SettingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SettingError::Unknown(name) => write!(f, "`{name}` is not a run setting"),
            SettingError::Value { name, value, why } => write!(f, "{name} `{value}`: {why}"),
        }
    }
}

impl std::error::Error for SettingError {}

macro_rules! settings {
    ($( $(#[doc = $help:literal])+ $name:literal => $($field:ident).+ : $ty:ty, )*) => {
        /// Every run setting, in the order the command line's help lists them.
        pub const SETTINGS: &[Setting] = &[$(
            Setting {
                name: $name,
                help: concat!($($help),+),
                show: |run| run.$($field).+.to_string(),
                set: |run, text| {
                    run.$($field).+ = text.trim().parse::<$ty>().map_err(|e| e.to_string())?;
                    Ok(())
                },
            },
        )*];
    };
}

settings! {
    /// Width `c` (embedding size).
    "width" => model.width: usize,
    /// Context length `t`.
    "context" => model.context: usize,
    /// Transformer blocks.
    "layers" => model.layers: usize,
    /// Attention heads (they divide the width).
    "heads" => model.heads: usize,
    /// Sequences per step `b`.
    "batch" => batch: usize,
    /// Run length in optimizer steps: the learning-rate schedule spans them.
    "steps" => steps: u32,
    /// Peak learning rate.
    "lr" => lr: f32,
    /// The run's seed (initial weights, and with each member's id its data stream).
    "seed" => seed: u64,
    /// When a group syncs: `every-step` (the mean gradient feeds one Adam step) or `outer:H` (H
    /// local Adam steps, then the mean pseudo-gradient feeds a Nesterov outer step); the run
    /// length must be a multiple of H.
    "sync" => sync.mode: SyncMode,
    /// What contributions are sent as: `none` (f32, averaged in roster order), `int8`
    /// (power-of-two block scales, error feedback, summed exactly), `int4` (the same in half
    /// the bytes) or `topk:K` (the K largest of each 4,096 values, K a power of two, the rest
    /// fed back; sent as int8 blocks until its sparse frame exists).
    "compress" => sync.compression: Compression,
    /// `every-step` with a packed compression: what the group's mean does — `adam` (an Adam
    /// step; the member's residual carried whole), `sign:β` (DeMo's: the residual is a
    /// momentum scaled by β before each gradient is added, and each weight moves by the
    /// learning rate against the sign of the mean) or `frozen:W` (1-bit Adam's: W steps dense
    /// with Adam, then the compression with Adam's second moment frozen).
    "step-rule" => sync.rule: StepRule,
    /// `every-step` with a packed compression: who sums the contributions — `mesh` (every
    /// member sends its whole contribution to every other, and each sums them all) or `owners`
    /// (chunk owners: a header to every member and each chunk to its owner, who sums that chunk
    /// of the step's contributions and sends the sum to everyone; `docs/OWNERS.md`).
    "exchange" => sync.exchange: Exchange,
    /// The outer optimizer's learning rate (`outer:H`).
    "outer-lr" => sync.outer.lr: f32,
    /// The outer optimizer's Nesterov momentum (`outer:H`).
    "outer-momentum" => sync.outer.momentum: f32,
    /// `outer:H`: inner steps of the next window each member runs while the group sums the last
    /// one; the group's mean is applied after them, with the member's progress kept (0: wait
    /// for the mean; below H).
    "overlap" => sync.overlap: u32,
    /// `outer:H` with int8 or int4: elastic windows (`true`): a window ends when the first
    /// member has done its H inner steps; each member contributes the steps it finished by
    /// then, and the group's mean weighs each by them (members of different speeds each do
    /// their share instead of waiting for the slowest).
    "elastic" => sync.elastic: bool,
}

/// The setting called `name` (`-` or `_` between words).
pub fn find(name: &str) -> Option<&'static Setting> {
    let name = name.replace('_', "-");
    SETTINGS.iter().find(|s| s.name == name)
}

/// Sets the setting called `name` in `run` from `value`.
pub fn set(run: &mut RunConfig, name: &str, value: &str) -> Result<(), SettingError> {
    let setting = find(name).ok_or_else(|| SettingError::Unknown(name.to_string()))?;
    (setting.set)(run, value).map_err(|why| SettingError::Value { name: setting.name, value: value.into(), why })
}

/// `base` with every `(name, value)` applied in order.
pub fn with<'a>(
    base: RunConfig,
    values: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<RunConfig, SettingError> {
    let mut run = base;
    for (name, value) in values {
        set(&mut run, name, value)?;
    }
    Ok(run)
}

/// Every setting of `run` with its value, in table order.
pub fn describe(run: &RunConfig) -> Vec<(&'static Setting, String)> {
    SETTINGS.iter().map(|s| (s, (s.show)(run))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every setting reads back what it shows, for the default run and for one where each
    /// differs from it; names are unique.
    #[test]
    fn every_setting_reads_what_it_shows() {
        let other = crate::config::tests::unlike_the_default();
        for ((setting, default), (_, shown)) in describe(&RunConfig::DEFAULT).into_iter().zip(describe(&other)) {
            assert_ne!(default, shown, "the fixture must differ from the default in `{}`", setting.name);
        }
        for run in [RunConfig::DEFAULT, other] {
            let shown: Vec<(&str, String)> = describe(&run).into_iter().map(|(s, v)| (s.name, v)).collect();
            let read = with(RunConfig::DEFAULT, shown.iter().map(|(n, v)| (*n, v.as_str()))).unwrap();
            // The corpus's digest is no setting: a run takes it from the text it is started on.
            assert_eq!(read, RunConfig { corpus: 0, ..run });
        }
        let mut names: Vec<&str> = SETTINGS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SETTINGS.len());
    }

    #[test]
    fn bad_names_and_values_are_named() {
        let mut run = RunConfig::DEFAULT;
        assert_eq!(set(&mut run, "outer_lr", "0.5"), Ok(()));
        assert_eq!(run.sync.outer.lr, 0.5);
        assert_eq!(set(&mut run, "depth", "3"), Err(SettingError::Unknown("depth".into())));
        let e = set(&mut run, "sync", "sometimes").unwrap_err();
        assert!(e.to_string().starts_with("sync `sometimes`: `sometimes` is not a sync mode"), "{e}");
        assert!(matches!(set(&mut run, "batch", "-1"), Err(SettingError::Value { name: "batch", .. })));
        assert_eq!(run.batch, RunConfig::DEFAULT.batch, "a refused value changes nothing");
        assert_eq!(find("outer-momentum").unwrap().json_key(), "outer_momentum");
    }
}
