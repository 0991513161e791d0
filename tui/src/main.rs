//! `lockstep`: the command-line entry point and composition root.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod gate;

#[derive(Parser)]
#[command(
    name = "lockstep",
    version,
    about = "Train one model on many machines, bit-identically, through verified INT8 units."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the exact gate on a backend plugin (a built-in name such as `cpu`, or a path).
    Gate(gate::GateArgs),
    /// Measure throughput.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCommand,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Gate(args) => gate::run(args),
        Command::Bench { what } => bench::run(what),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}
