//! Writes `luts/mul_lut.bin` from the generator in `lockstep_luts::table`.
//!
//! Usage: `cargo run -p lockstep-luts --bin generate-luts [OUT]` (default: the crate's own
//! `mul_lut.bin`). The library stays pure; this binary is the only place that writes the file.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let out = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mul_lut.bin"));
    let bytes = lockstep_luts::table::generate_mul_lut();
    match std::fs::write(&out, &bytes) {
        Ok(()) => {
            println!("wrote {} ({} bytes)", out.display(), bytes.len());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: cannot write {}: {error}", out.display());
            ExitCode::FAILURE
        }
    }
}
