//! `lockstep`: the command-line entry point and composition root. The commands a person
//! trains with are `lockstep-tui`'s; the benches, `chaos` and `bisect` are
//! `lockstep-harness`'s.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lockstep_harness::{bench, bisect, chaos};
use lockstep_tui::{backend, demo, gate, gate_child, infer, node, signal, train};

#[derive(Parser)]
#[command(
    name = "lockstep",
    version,
    about = "Train one model on many machines, bit-identically, through verified INT8 units."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// GPU plugins: use the adapter whose name contains this (default: the best one).
    #[arg(long, global = true, env = "LOCKSTEP_GPU_ADAPTER")]
    gpu_adapter: Option<String>,
    /// GPU plugins: the workgroup tile `TMxTNxWXxWYxKB` (it decides which invocation computes
    /// an output, never a bit; benchmarks sweep it).
    #[arg(long, global = true, env = "LOCKSTEP_GPU_TILE", value_parser = backend::parse_tile)]
    gpu_tile: Option<[u32; 5]>,
    /// Seconds a plugin's gate may take (it runs in a child process, which is killed after
    /// this and the plugin rejected).
    #[arg(long, global = true, default_value_t = gate_child::DEFAULT_TIMEOUT_S)]
    gate_timeout: u64,
}

#[derive(Subcommand)]
enum Command {
    /// Three local nodes and a signaling server in this process, with the console on the
    /// leader: the quickest way to watch a group train.
    Demo(demo::DemoArgs),
    /// Run the exact gate on a backend plugin (a built-in name such as `cpu`, or a path).
    Gate(gate::GateArgs),
    /// Train on this machine alone (no network).
    Train(train::TrainArgs),
    /// Replay steps on backends with every op recomputed by the reference: the first op where
    /// a backend departs from the definition, with the bits (divergence localisation).
    Bisect(bisect::BisectArgs),
    /// Join a training group as one mesh node, with the console (`--headless`: JSON lines on
    /// stdin/stdout).
    Node(node::NodeArgs),
    /// Run the signaling server (WebSocket introductions, static files).
    Signal(signal::SignalArgs),
    /// Generate text from a checkpoint.
    Generate(infer::GenerateArgs),
    /// Write the single-file HTML inference kit for a checkpoint.
    Kit(infer::KitArgs),
    /// A randomized fault campaign on real processes: suspensions, kills, cut halves, a dead
    /// signaling server, quits and joins; checks that no two nodes hold different weights for
    /// one step and that the run moves on after each episode (`docs/PERFORMANCE.md`).
    Chaos(chaos::ChaosArgs),
    /// Measure throughput.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCommand,
    },
    /// The gate's child process (run by this program itself, see `gate_child.rs`).
    #[command(hide = true)]
    GateChild(gate::ChildArgs),
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    backend::choose_device(backend::DeviceChoice { adapter: cli.gpu_adapter.clone(), tile: cli.gpu_tile });
    backend::choose_gate_timeout(std::time::Duration::from_secs(cli.gate_timeout));
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Gate(args) => gate::run(args),
        Command::Bench { what } => bench::run(what),
        Command::Chaos(args) => chaos::run(args),
        Command::Train(args) => train::run(args),
        Command::Bisect(args) => bisect::run(args),
        Command::Generate(args) => infer::generate_command(args),
        Command::Signal(args) => signal::run(args),
        Command::Node(args) => node::run(args),
        Command::Kit(args) => infer::kit_command(args),
        Command::GateChild(args) => gate::child_main(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// Keeps freed memory in glibc's heap instead of returning large blocks to the kernel: a
/// training step allocates and frees the same large buffers every time, and re-faulting them
/// cost more than a tenth of a step. Performance only; no effect on any result.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_allocator() {
    extern "C" {
        fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
    }
    const M_TRIM_THRESHOLD: std::ffi::c_int = -1;
    const M_MMAP_THRESHOLD: std::ffi::c_int = -3;
    // SAFETY: mallopt only adjusts allocator tunables; called once, before any threads start.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator() {}
