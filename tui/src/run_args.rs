//! The run settings on the command line: one `--NAME VALUE` flag per setting of the table
//! (`lockstep_node::settings`), for every command that trains or starts a run. The flags, their
//! help, their defaults and their checks all come from the table; nothing here names a setting
//! but `steps`, which `train --resume` reads to extend a run.

use clap::{Arg, ArgMatches, Command};
use lockstep_node::config::RunConfig;
use lockstep_node::settings::{self, Setting, SETTINGS};

/// The run a command starts from when no flag says otherwise.
pub trait Defaults {
    fn base() -> RunConfig;
}

/// `RunConfig::DEFAULT`: the defaults of `train`, `node`, `demo` and `bench train`.
#[derive(Clone, Debug, Default)]
pub struct Standard;

impl Defaults for Standard {
    fn base() -> RunConfig {
        RunConfig::DEFAULT
    }
}

/// The settings given on the command line (the rest keep `D`'s defaults).
#[derive(Clone, Debug)]
pub struct RunArgs<D = Standard> {
    given: Vec<(&'static str, String)>,
    defaults: std::marker::PhantomData<D>,
}

impl<D: Defaults> RunArgs<D> {
    /// The default run with the given settings.
    pub fn run_config(&self) -> anyhow::Result<RunConfig> {
        let run = settings::with(D::base(), self.given.iter().map(|(n, v)| (*n, v.as_str())))?;
        Ok(run)
    }

    /// The value given for the setting `name`, if one was.
    pub fn given(&self, name: &str) -> Option<&str> {
        self.given.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }
}

fn flag(setting: &'static Setting, base: &RunConfig) -> Arg {
    let default = (setting.show)(base);
    Arg::new(setting.name)
        .long(setting.name)
        .value_name("VALUE")
        .help(format!("{} [default: {default}]", setting.help.trim()))
        // Checked as the command line is read, with the setting's own reason.
        .value_parser(move |text: &str| {
            let mut scratch = RunConfig::DEFAULT;
            (setting.set)(&mut scratch, text).map(|()| text.to_string())
        })
}

impl<D> clap::FromArgMatches for RunArgs<D> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let given =
            SETTINGS.iter().filter_map(|s| matches.get_one::<String>(s.name).map(|v| (s.name, v.clone()))).collect();
        Ok(RunArgs { given, defaults: std::marker::PhantomData })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl<D: Defaults> clap::Args for RunArgs<D> {
    fn augment_args(command: Command) -> Command {
        let base = D::base();
        SETTINGS.iter().fold(command, |command, s| command.arg(flag(s, &base)))
    }

    fn augment_args_for_update(command: Command) -> Command {
        Self::augment_args(command)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    /// Every setting of the table is a flag, read into the run; a bad value is refused as the
    /// command line is read, with the setting's reason.
    #[test]
    fn every_setting_is_a_flag() {
        let cli =
            Cli::try_parse_from(["t", "--sync", "outer:8", "--compress", "int8", "--steps", "64", "--outer-lr", "0.5"])
                .unwrap();
        let run = cli.run.run_config().unwrap();
        assert_eq!(run.sync.to_string(), "outer:8 int8");
        assert_eq!((run.steps, run.sync.outer.lr, run.batch), (64, 0.5, RunConfig::DEFAULT.batch));
        assert_eq!(cli.run.given("steps"), Some("64"));
        assert_eq!(cli.run.given("lr"), None);
        let e = Cli::try_parse_from(["t", "--sync", "often"]).err().unwrap().to_string();
        assert!(e.contains("--sync") && e.contains("is not a sync mode"), "{e}");
        let help = Cli::try_parse_from(["t", "--help"]).err().unwrap().to_string();
        for s in SETTINGS {
            assert!(help.contains(&format!("--{}", s.name)), "{}: {help}", s.name);
        }
        assert!(help.contains("[default: every-step]"), "{help}");
    }
}

/// `--corpus`: the text a command trains on (`lockstep_mesh::corpus::CorpusChoice`). Read
/// once however often it is asked for (the demo's three nodes share one copy).
#[derive(clap::Args, Clone, Debug)]
pub struct CorpusArg {
    /// The training text: `auto` (the packaged corpus when `scripts/corpus.sh` has built it,
    /// else the built-in 35 KB text), `builtin`, a corpus directory, or `http://HOST:PORT/corpus`
    /// (a signaling server's, or any server with byte ranges).
    #[arg(long = "corpus", default_value = "auto", value_name = "auto|builtin|DIR|URL")]
    pub choice: String,
    #[arg(skip)]
    loaded: std::sync::Arc<std::sync::OnceLock<std::sync::Arc<lockstep_node::data::Corpus>>>,
}

impl CorpusArg {
    /// The corpus, read on the first call; `say` hears which corpus it is, and (first) how to
    /// build the packaged one when it is missing.
    pub fn load(&self, say: &mut dyn FnMut(String)) -> anyhow::Result<std::sync::Arc<lockstep_node::data::Corpus>> {
        if let Some(corpus) = self.loaded.get() {
            return Ok(corpus.clone());
        }
        let choice: lockstep_mesh::corpus::CorpusChoice = self.choice.parse()?;
        let chosen = choice.load()?;
        if let Some(note) = chosen.note {
            say(note);
        }
        say(format!("corpus: {}", chosen.corpus.describe()));
        Ok(self.loaded.get_or_init(|| chosen.corpus).clone())
    }
}
