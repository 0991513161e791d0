//! `lockstep signal`: run the signaling server.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use lockstep_mesh::corpus;
use lockstep_signaling::data::{fineweb_shards, DataConfig, FINEWEB_EDU_10BT};
use lockstep_signaling::{serve, Limits, ServerConfig};

#[derive(clap::Args)]
pub struct SignalArgs {
    /// Address and port to listen on.
    #[arg(long, default_value = "127.0.0.1:8787")]
    bind: SocketAddr,
    /// Serve the files of this directory over HTTP GET.
    #[arg(long = "static")]
    static_dir: Option<PathBuf>,
    /// A reverse proxy whose `X-Forwarded-For` header is trusted for grouping by address.
    #[arg(long)]
    trusted_proxy: Option<IpAddr>,
    /// Members per group.
    #[arg(long, default_value_t = Limits::default().max_group_size)]
    max_group_size: usize,
    /// Seconds a join request waits for the room host.
    #[arg(long, default_value_t = Limits::default().approval_timeout.as_secs())]
    approval_timeout: u64,
    /// Base URL of the parquet shards `/data` reads (FineWeb-Edu `sample/10BT` by default).
    #[arg(long, default_value = FINEWEB_EDU_10BT)]
    data_source: String,
    /// Shard file names under the data source (default: the 14 of `sample/10BT`).
    #[arg(long, value_delimiter = ',')]
    data_shards: Vec<String>,
    /// Turn `/data` off.
    #[arg(long)]
    no_data: bool,
    /// Serve this packaged corpus (`scripts/corpus.sh`) under `/corpus/`, with byte ranges, for
    /// members started with `--corpus http://HOST:PORT/corpus`. Default: the packaged corpus's
    /// directory (`$LOCKSTEP_CORPUS`, else `~/.cache/lockstep/corpus`) when it has been built.
    #[arg(long, value_name = "DIR")]
    corpus: Option<PathBuf>,
    /// Serve no corpus.
    #[arg(long, conflicts_with = "corpus")]
    no_corpus: bool,
    /// The file holding the key that signs resume tokens (created, 32 random bytes, if
    /// missing), so members take their places back after the server restarts. Default:
    /// `$XDG_STATE_HOME/lockstep/signal.secret` (or `~/.local/state/…`).
    #[arg(long)]
    resume_secret: Option<PathBuf>,
}

/// The resume secret's file: the one given, else the user's state directory.
fn secret_path(given: Option<PathBuf>) -> Option<PathBuf> {
    given.or_else(|| {
        let state = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/state")))?;
        Some(state.join("lockstep/signal.secret"))
    })
}

/// Reads the resume secret from `path`, or makes one and keeps it there (readable by the
/// owner only).
fn load_or_create_secret(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    if let Ok(secret) = std::fs::read(path) {
        anyhow::ensure!(secret.len() >= 16, "{} holds {} bytes, too few for a secret", path.display(), secret.len());
        return Ok(secret);
    }
    let secret = lockstep_signaling::random_secret()?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let partial = path.with_extension("partial");
    {
        use std::io::Write;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&partial).with_context(|| format!("writing {}", partial.display()))?;
        file.write_all(&secret).with_context(|| format!("writing {}", partial.display()))?;
    }
    std::fs::rename(&partial, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(secret)
}

pub fn run(args: SignalArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let limits = Limits {
            max_group_size: args.max_group_size,
            approval_timeout: Duration::from_secs(args.approval_timeout),
            ..Limits::default()
        };
        let shards = if args.data_shards.is_empty() { fineweb_shards() } else { args.data_shards };
        let data =
            (!args.no_data).then(|| DataConfig { base_url: args.data_source.clone(), shards, ..DataConfig::default() });
        let corpus_dir = match (args.no_corpus, args.corpus) {
            (true, _) => None,
            (false, Some(dir)) => {
                anyhow::ensure!(
                    corpus::is_built(&dir),
                    "{} holds no {} (`{}` builds a corpus)",
                    dir.display(),
                    corpus::MANIFEST,
                    corpus::BUILD_COMMAND
                );
                Some(dir)
            }
            (false, None) => corpus::CorpusChoice::Auto.served_dir(),
        };
        let config = ServerConfig {
            bind: args.bind,
            static_dir: args.static_dir,
            corpus_dir: corpus_dir.clone(),
            trusted_proxy: args.trusted_proxy,
            limits,
            data,
            resume_secret: match secret_path(args.resume_secret) {
                Some(path) => Some(load_or_create_secret(&path)?),
                None => None,
            },
        };
        let server = serve(config).await.with_context(|| format!("binding {}", args.bind))?;
        println!("signal: listening on ws://{}/ws (rooms: ?room=CODE, join only: ?join=CODE)", server.local_addr);
        if !args.no_data {
            println!("signal: /data reads {}", args.data_source);
        }
        match &corpus_dir {
            Some(dir) => println!("signal: /corpus/ serves the packaged corpus in {}", dir.display()),
            None => println!("signal: no corpus served (`{}` builds one)", corpus::BUILD_COMMAND),
        }
        tokio::select! {
            _ = server.wait() => {}
            _ = tokio::signal::ctrl_c() => println!("signal: stopping"),
        }
        Ok(ExitCode::SUCCESS)
    })
}
