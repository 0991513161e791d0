//! `lockstep signal`: run the signaling server.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
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
        let config = ServerConfig {
            bind: args.bind,
            static_dir: args.static_dir,
            trusted_proxy: args.trusted_proxy,
            limits,
            data,
        };
        let server = serve(config).await.with_context(|| format!("binding {}", args.bind))?;
        println!("signal: listening on ws://{}/ws (rooms: ?room=CODE, join only: ?join=CODE)", server.local_addr);
        if !args.no_data {
            println!("signal: /data reads {}", args.data_source);
        }
        tokio::select! {
            _ = server.wait() => {}
            _ = tokio::signal::ctrl_c() => println!("signal: stopping"),
        }
        Ok(ExitCode::SUCCESS)
    })
}
