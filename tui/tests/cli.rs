//! The real `lockstep` binary, run as a user would: verdicts, exit codes, bench output.

use std::path::PathBuf;
use std::process::{Command, Output};

fn lockstep(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockstep")).args(args).output().expect("lockstep runs")
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

fn fixture(name: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_BIN_EXE_lockstep")).parent().expect("target/<profile>").join("examples");
    let path = dir.join(format!("lib{name}.so"));
    assert!(path.is_file(), "{} is missing: run `cargo build --workspace --all-targets` first", path.display());
    path.display().to_string()
}

#[test]
fn gate_admits_cpu() {
    let out = lockstep(&["gate", "cpu", "--verbose"]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("ADMITTED: backend `cpu`"), "{shown}");
    assert!(shown.contains("pass  all-int8-products"), "{shown}");
    let probe = shown.lines().find(|l| l.starts_with("probe hash:")).expect("probe line");
    // "probe hash: 0x… (reference 0x…)": the two must agree.
    let hashes: Vec<&str> = probe.split([' ', ')']).filter(|w| w.starts_with("0x")).collect();
    assert_eq!(hashes.len(), 2, "{probe}");
    assert_eq!(hashes[0], hashes[1], "{probe}");
}

#[test]
fn gate_rejects_a_wrong_plugin_by_path() {
    let out = lockstep(&["gate", &fixture("flaw_round_half_away")]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(shown.contains("FAIL  rounding-ties"), "{shown}");
    assert!(shown.contains("REJECTED: backend `flaw-round-half-away`"), "{shown}");
}

#[test]
fn gate_explains_files_it_cannot_load() {
    let out = lockstep(&["gate", &fixture("bad_abi_major")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("ABI major version 2"), "{}", text(&out));
    let out = lockstep(&["gate", "/definitely/not/here.so"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("cannot read plugin /definitely/not/here.so"), "{}", text(&out));
}

#[test]
fn bench_gemm_prints_json_lines() {
    let out = lockstep(&["bench", "gemm", "--json", "--shapes", "64x48x40,33x17x100", "--min-ms", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    let impls: Vec<&str> = rows.iter().map(|r| r["impl"].as_str().unwrap()).collect();
    for needed in ["reference", "cpu", "sgemm-f32"] {
        assert!(impls.contains(&needed), "{impls:?}");
    }
    for row in &rows {
        assert!(row["gops"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["threads"].as_u64().unwrap() >= 1);
        let shape = row["shape"].as_str().unwrap();
        assert!(shape == "64x48x40" || shape == "33x17x100", "{shape}");
    }
    let out = lockstep(&["bench", "gemm", "--shapes", "12x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("not MxNxK"), "{}", text(&out));
}
