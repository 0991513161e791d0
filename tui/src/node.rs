//! `lockstep node`: one mesh node, with the console (default) or headless (JSON lines).
//!
//! The pieces live in files of their own: `node_runtime.rs` (the running node, shared by
//! every front-end), `route.rs` (which address to offer peers), `headless.rs` (the JSON-lines
//! protocol), `console/` (the terminal console). The replica itself is
//! `lockstep_node::replica`.

use std::process::ExitCode;

use crate::node_runtime::MeshArgs;
use crate::run_args::RunArgs;

#[derive(clap::Args)]
pub struct NodeArgs {
    /// Print events as JSON lines and read commands from stdin instead of opening the console.
    #[arg(long)]
    pub headless: bool,
    /// The signaling server's WebSocket URL, e.g. `ws://127.0.0.1:8787/ws?room=demo`.
    #[arg(long)]
    pub signal: String,
    #[command(flatten)]
    pub mesh: MeshArgs,
    /// The run this node starts when it starts one (console `s`, headless `start` defaults).
    #[command(flatten)]
    pub run: RunArgs,
}

pub fn run(args: NodeArgs) -> anyhow::Result<ExitCode> {
    let defaults = args.run.run_config()?;
    defaults.validate().map_err(|why| anyhow::anyhow!("invalid run settings: {why}"))?;
    if args.headless {
        crate::headless::run(&args.signal, &args.mesh, defaults)
    } else {
        crate::console::run_node(&args.signal, &args.mesh, defaults)
    }
}
