//! The real `lockstep` binary, run as a user would: verdicts, exit codes, bench output.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

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
    let _phase = crate::common::phase(module_path!());
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
    // The random phase differs from gate to gate, and `--phase` replays one.
    let phase_cases = |shown: &str| -> Vec<String> {
        shown.lines().filter(|l| l.contains("random-phase-")).map(str::to_string).collect()
    };
    let first = phase_cases(&shown);
    assert_eq!(first.len(), 7, "{shown}");
    let again = text(&lockstep(&["gate", "cpu", "--verbose"]));
    assert_ne!(phase_cases(&again), first, "two gates drew the same random phase");
    let seed = first[0].split("random-phase-").nth(1).unwrap().split('-').next().unwrap().to_string();
    let replayed = text(&lockstep(&["gate", "cpu", "--verbose", "--phase", &seed]));
    assert_eq!(phase_cases(&replayed), first, "--phase {seed}");
}

#[test]
fn gate_rejects_a_wrong_plugin_by_path() {
    let _phase = crate::common::phase(module_path!());
    let out = lockstep(&["gate", &fixture("flaw_round_half_away")]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(shown.contains("FAIL  rounding-ties"), "{shown}");
    assert!(shown.contains("REJECTED: backend `flaw-round-half-away`"), "{shown}");
}

/// The gate proved by mutants (`docs/VERIFICATION.md` §11): every mutant of the reference
/// (`lockstep_faulty_plugins::mutants::MUTANTS`: the units' rounding points, flushes, sign and
/// NaN rules, block scales and shapes, accumulation widths and orders; each op's sums, constants
/// and formulas), each a plugin process of its own, is rejected by `lockstep gate` — at the case
/// §11 names for it under the fixed phase 0x1, and under a fresh random phase too — while the
/// same plugin with no mutation is admitted (so the rejections are the mutations').
#[test]
fn the_gate_rejects_every_mutant_of_the_reference() {
    let _phase = crate::common::phase(module_path!());
    let plugin = fixture("mutant");
    let gate = |mutant: &str, phase: Option<&str>| {
        let mut args = vec!["gate", plugin.as_str()];
        args.extend(phase.map(|p| ["--phase", p]).into_iter().flatten());
        let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
            .args(&args)
            .env("LOCKSTEP_MUTANT", mutant)
            .output()
            .expect("lockstep runs");
        (out.status.code(), text(&out))
    };
    let (code, shown) = gate("none", Some("0x1"));
    assert_eq!(code, Some(0), "the unmutated control: {shown}");
    assert!(shown.contains("ADMITTED: backend `mutant`"), "{shown}");
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/VERIFICATION.md"))
        .expect("docs/VERIFICATION.md");
    let mutants = lockstep_faulty_plugins::mutants::MUTANTS;
    assert!(mutants.len() >= 30, "{} mutants", mutants.len());
    let mut undocumented = Vec::new();
    for mutant in mutants {
        let (code, shown) = gate(mutant.name, Some("0x1"));
        assert_eq!(code, Some(1), "{}: {shown}", mutant.name);
        let verdict =
            shown.lines().find(|l| l.starts_with("REJECTED")).unwrap_or_else(|| panic!("{}: {shown}", mutant.name));
        let case = verdict.split('`').nth(3).unwrap_or_else(|| panic!("{verdict}"));
        let case = case.replace(", phase 0x1)", ")").replace(" (phase 0x1)", "");
        let row = format!("| `{}` | {} | `{case}` |", mutant.name, mutant.what);
        if !doc.contains(&row) {
            undocumented.push(row);
        }
        let (code, shown) = gate(mutant.name, None);
        assert_eq!(code, Some(1), "{} under a fresh phase: {shown}", mutant.name);
    }
    assert!(undocumented.is_empty(), "docs/VERIFICATION.md §11 lacks these rows:\n{}", undocumented.join("\n"));
}

/// The fault-plugin suite: plugins that segfault, abort, write past their output or hang
/// while gated each get a REJECTED verdict naming what happened, from `lockstep gate` (exit 1,
/// never a crash of its own) and from `lockstep train`, which refuses the backend and says why
/// instead of dying with it.
#[test]
fn every_faulty_plugin_gets_a_verdict_and_the_host_survives() {
    let _phase = crate::common::phase(module_path!());
    let cases = [
        ("crash_segfault", "killed the gate's process with SIGSEGV (11)"),
        ("crash_abort", "killed the gate's process with SIGABRT (6)"),
        ("overrun_output", "wrote outside the output it was given"),
        ("hang_forever", "no verdict within 3 s: the plugin hung"),
        ("bad_panics", "REJECTED"),
        ("flaw_reversed_blocks", "REJECTED"),
        ("flaw_op_softmax", "REJECTED"),
    ];
    for (fixture_name, says) in cases {
        let plugin = fixture(fixture_name);
        let out = lockstep(&["--gate-timeout", "3", "gate", &plugin]);
        let shown = text(&out);
        assert_eq!(out.status.code(), Some(1), "{fixture_name}: {shown}");
        let verdict = shown.lines().find(|l| l.starts_with("REJECTED")).unwrap_or_else(|| panic!("{shown}"));
        assert!(verdict.contains(says), "{fixture_name}: {verdict}");
    }
    for fixture_name in ["crash_segfault", "hang_forever"] {
        let plugin = fixture(fixture_name);
        let mut args = vec!["--gate-timeout", "3", "train", "--steps", "2", "--backend", &plugin];
        args.extend_from_slice(TINY_MODEL);
        let out = lockstep(&args);
        let shown = text(&out);
        assert_eq!(out.status.code(), Some(2), "{fixture_name}: {shown}");
        assert!(shown.contains("was not admitted: REJECTED"), "{fixture_name}: {shown}");
    }
}

/// A process killed while it gates a plugin takes the gate's child with it: a hanging plugin
/// gated under a minute's limit, the parent killed with SIGKILL, and the child gone within
/// seconds instead of hanging until the limit.
#[test]
fn a_gate_child_dies_with_the_process_that_started_it() {
    let _phase = crate::common::phase(module_path!());
    let plugin = fixture("hang_forever");
    let mut parent = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["--gate-timeout", "60", "gate", &plugin])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("lockstep gate starts");
    // The children of a process, from /proc (field 4 of stat is the parent's id).
    let children_of = |pid: u32| -> Vec<u32> {
        let entries = std::fs::read_dir("/proc").expect("/proc");
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|p| {
                let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                let after_name = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
                after_name.split(' ').nth(1).and_then(|ppid| ppid.parse::<u32>().ok()) == Some(pid)
            })
            .collect()
    };
    let started = std::time::Instant::now();
    let child = loop {
        if let Some(&child) = children_of(parent.id()).first() {
            break child;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the gate's child never started");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Let it reach the plugin's hang.
    std::thread::sleep(Duration::from_millis(500));
    parent.kill().expect("SIGKILL");
    parent.wait().expect("reaped");
    let killed = std::time::Instant::now();
    let alive = || {
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for whoever adopted it to reap it.
        !stat.is_empty() && stat.rsplit_once(") ").is_none_or(|(_, rest)| !rest.starts_with('Z'))
    };
    while alive() {
        assert!(killed.elapsed() < Duration::from_secs(10), "the gate's child {child} outlived its parent");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `--in-flight-kib` below two fragments (96 KiB) or past 1 GiB is refused before anything
/// starts, saying the bounds.
#[test]
fn node_refuses_an_in_flight_budget_out_of_bounds() {
    let _phase = crate::common::phase(module_path!());
    for kib in ["95", "1048577"] {
        let out = lockstep(&["node", "--in-flight-kib", kib]);
        let shown = text(&out);
        assert_eq!(out.status.code(), Some(2), "{kib}: {shown}");
        assert!(shown.contains(&format!("{kib} is not in 96..=1048576")), "{kib}: {shown}");
    }
}

#[test]
fn gate_explains_files_it_cannot_load() {
    let _phase = crate::common::phase(module_path!());
    let out = lockstep(&["gate", &fixture("bad_abi_major")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("ABI major version 3"), "{}", text(&out));
    let out = lockstep(&["gate", "/definitely/not/here.so"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("cannot read plugin /definitely/not/here.so"), "{}", text(&out));
}

#[test]
fn bench_gemm_prints_json_lines() {
    let _phase = crate::common::phase(module_path!());
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
    // A GPU plugin's kernel row is set against its product path's ceiling, measured in the run.
    let out = lockstep(&["bench", "gemm", "--json", "--backend", "dp4a", "--shapes", "64x48x40", "--min-ms", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rows: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    let peak = rows.iter().find(|r| r["impl"] == "dp4a path peak").expect("a path peak row");
    let kernel = rows.iter().find(|r| r["impl"] == "dp4a kernel").expect("a kernel row");
    let (peak, share) = (peak["gops"].as_f64().unwrap(), kernel["of_path_peak"].as_f64().unwrap());
    assert!(peak > 0.0 && (share - kernel["gops"].as_f64().unwrap() / peak).abs() < 1e-9, "{rows:?}");
}

/// `bench train` on a tiny model: a JSON row per trainer with the fields scripts read, and the
/// breakdown names every op of the step with its count.
#[test]
fn bench_train_reports_rows_and_the_step_breakdown() {
    let _phase = crate::common::phase(module_path!());
    let mut args = vec!["bench", "train"];
    args.extend_from_slice(TINY_MODEL);
    args.extend_from_slice(&["--measure-steps", "1", "--warmup-steps", "0", "--no-torch", "--breakdown", "--json"]);
    let out = lockstep(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    let trainers: Vec<&serde_json::Value> = lines.iter().filter(|l| l.get("trainer").is_some()).collect();
    let names: Vec<&str> = trainers.iter().map(|r| r["trainer"].as_str().unwrap()).collect();
    assert!(names.contains(&"units (cpu)") && names.contains(&"float reference"), "{names:?}");
    for row in &trainers {
        assert!(row["tokens_per_s"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["loss"].as_f64().unwrap().is_finite(), "{row}");
        assert!(row["threads"].as_u64().unwrap() >= 1, "{row}");
        assert!(row["peak_memory_bytes"].as_u64().unwrap() > 0, "{row}");
        assert_eq!(row["config"], "c=32 t=32 b=4 layers=1 heads=2", "{row}");
    }
    let ops: std::collections::BTreeMap<&str, u64> =
        lines.iter().filter_map(|l| Some((l.get("breakdown_op")?.as_str()?, l["calls_per_step"].as_u64()?))).collect();
    let expected = [
        ("embed", 1),
        ("layer_norm", 3),
        ("matmul: linear forward (A·Bᵀ)", 5),
        ("matmul: attention (batched)", 6),
        ("causal_softmax", 1),
        ("gelu", 1),
        ("cross_entropy", 1),
        ("matmul: input gradient (A·B)", 5),
        ("matmul: weight gradient (Aᵀ·B)", 5),
        ("bias_grad", 5),
        ("layer_norm_backward", 3),
        ("gelu_backward", 1),
        ("causal_softmax_backward", 1),
        ("embed_backward", 1),
    ];
    assert_eq!(ops, expected.into_iter().collect(), "{stdout}");
    // Element-wise ops are set against the bytes their buffers move; products are not. GELU
    // reads x and writes y: 2 · 4 · rows · 4c bytes a step (4 × 32 tokens, width 128).
    for line in lines.iter().filter(|l| l.get("breakdown_op").is_some()) {
        let product = line["breakdown_op"].as_str().unwrap().starts_with("matmul");
        assert_eq!(line["gb_per_s"].is_null(), product, "{line}");
        assert_eq!(line["bytes_per_step"].is_null(), product, "{line}");
    }
    let gelu = lines.iter().find(|l| l["breakdown_op"] == "gelu").unwrap();
    assert_eq!(gelu["bytes_per_step"].as_f64(), Some(2.0 * 4.0 * 128.0 * 128.0), "{gelu}");
    let summary = lines.iter().find(|l| l.get("breakdown_sequence_ms").is_some()).expect("a summary line");
    assert!(summary["breakdown_sequence_ms"].as_f64().unwrap() > 0.0, "{summary}");
}

/// The tiny model's flags (for `train` and `demo`).
const TINY_MODEL: &[&str] = &["--width", "32", "--context", "32", "--layers", "1", "--heads", "2", "--batch", "4"];

/// The admission at a run's own shapes from the command line: a plugin exact on the gate's
/// products and wrong past 16 Ki outputs a product (`flaw_past_size`) is admitted by `lockstep
/// gate` and refused by `lockstep train` before it trains a step (exit 2, as for a backend the
/// gate refuses, with the op, buffer,
/// word and both values, in text and in `--json`) in every mode (`every-step` f32 and int8,
/// `outer:2` int8); an exact backend is admitted at the run's shapes with every op of one step
/// checked, and then trains.
#[test]
fn train_refuses_a_plugin_wrong_only_at_the_runs_sizes() {
    let _phase = crate::common::phase(module_path!());
    let plugin = fixture("flaw_past_size");
    let out = lockstep(&["gate", &plugin]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // In every mode: the admission runs the run's own step, whatever the sync and the packing.
    for mode in [&[][..], &["--compress", "int8"], &["--sync", "outer:2", "--compress", "int8"]] {
        let mut args = vec!["train", "--steps", "2", "--eval-batches", "0", "--backend", &plugin];
        args.extend_from_slice(TINY_MODEL);
        args.extend_from_slice(mode);
        let out = lockstep(&args);
        let shown = text(&out);
        assert_eq!(out.status.code(), Some(2), "{mode:?}: {shown}");
        assert!(shown.contains("may not train this run: refused at the run's own shapes: op #"), "{mode:?}: {shown}");
        assert!(!shown.contains("step      1"), "{mode:?}: it trained nothing: {shown}");
    }
    let mut args = vec!["train", "--steps", "2", "--eval-batches", "0", "--backend", &plugin];
    args.extend_from_slice(TINY_MODEL);
    args.push("--json");
    let out = lockstep(&args);
    let refused: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(refused["event"], "refused-at-run-shapes", "{refused}");
    assert_eq!(
        (refused["op"].as_str(), refused["actual_bits"].as_str()),
        (Some("matmul"), Some("0x00000000")),
        "{refused}"
    );
    assert!(refused["word"].as_u64().unwrap() >= 16 * 1024 && refused["buffer"].is_u64(), "{refused}");
    let mut args = vec!["train", "--steps", "2", "--eval-batches", "0", "--backend", "cpu", "--json"];
    args.extend_from_slice(TINY_MODEL);
    let out = lockstep(&args);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let admitted: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert_eq!(admitted["event"], "admitted-at-run-shapes", "{admitted}");
    assert!(admitted["ops"].as_u64().unwrap() > 30, "every op of a step: {admitted}");
    assert_eq!(stdout.lines().filter(|l| l.contains("\"whash\"")).count(), 2, "then it trains: {stdout}");
}
/// `train` on the tiny model, JSON lines, no evaluation.
const TINY: &[&str] = &["--eval-batches", "0", "--json"];

/// Runs `lockstep train` on the tiny model and returns its JSON lines (steps and swaps).
fn train_json(extra: &[&str]) -> Vec<serde_json::Value> {
    train_json_on(lockstep, extra)
}

/// `train` on the tiny model through `run` (the binary here, or elsewhere), its JSON lines.
fn train_json_on(run: fn(&[&str]) -> Output, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["train"];
    args.extend_from_slice(TINY_MODEL);
    args.extend_from_slice(TINY);
    args.extend_from_slice(extra);
    let out = run(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

fn step_hashes(lines: &[serde_json::Value]) -> Vec<String> {
    lines.iter().filter_map(|l| l["whash"].as_str().map(str::to_string)).collect()
}

/// Divergence localisation (`lockstep bisect`): from a checkpoint, each backend replays the
/// next steps with every op recomputed by the reference. The CPU mirror follows the definition
/// and lands on the hashes a plain resumed run gives; a plugin whose softmax uses the platform's
/// `exp` is named at the first softmax of the first step, with both words' bits; a plugin that
/// goes wrong after 200 calls (admitted by the gate) is named at a product several steps later;
/// one that crashes in its gate is refused, and bisect says so.
#[test]
fn bisect_names_the_first_op_where_a_backend_departs() {
    let _phase = crate::common::phase(module_path!());
    let dir = std::env::temp_dir().join(format!("lockstep-bisect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let ckpt = dir.join("agreed.ckpt");
    let ckpt_arg = ckpt.to_str().expect("a UTF-8 path");
    train_json(&["--steps", "20", "--until", "2", "--backend", "cpu", "--ckpt-out", ckpt_arg]);
    let resumed = step_hashes(&train_json(&["--resume", ckpt_arg, "--until", "14", "--backend", "cpu"]));
    assert_eq!(resumed.len(), 12);
    let (softmax, drift) = (fixture("flaw_op_softmax"), fixture("drift_after_admission"));
    let args = ["bisect", "--ckpt", ckpt_arg, "--replay", "12", "--json", "--backend", "cpu", "--backend"];
    let out = lockstep(&[&args[..], &[softmax.as_str(), "--backend", drift.as_str()]].concat());
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    assert_eq!(lines.len(), 3, "{shown}");
    assert_eq!(lines[0]["followed"], true, "{shown}");
    let replayed: Vec<String> =
        lines[0]["steps"].as_array().unwrap().iter().map(|s| s["whash"].as_str().unwrap().to_string()).collect();
    assert_eq!(replayed, resumed);
    let departed = &lines[1];
    assert_eq!((departed["followed"].as_bool(), departed["step"].as_u64()), (Some(false), Some(3)), "{shown}");
    assert_eq!(departed["op"], "causal_softmax", "{shown}");
    assert_ne!(departed["expected_bits"], departed["actual_bits"]);
    assert!(departed["differing"].as_u64().unwrap() >= 1);
    let late = &lines[2];
    assert_eq!((late["followed"].as_bool(), late["op"].as_str()), (Some(false), Some("matmul")), "{shown}");
    assert!(late["step"].as_u64().unwrap() > 3, "{shown}");
    // Text: the departing op named with both values.
    let out = lockstep(&["bisect", "--ckpt", ckpt_arg, "--backend", &softmax]);
    assert_eq!(out.status.code(), Some(1));
    let shown = text(&out);
    assert!(shown.contains("DEPARTS at step 3, op #") && shown.contains("(causal_softmax)"), "{shown}");
    assert!(shown.contains("the definition gives 0x") && shown.contains("the backend 0x"), "{shown}");
    // A plugin that crashed in its gate is not loaded here: a clear refusal, exit 2.
    let out = lockstep(&["bisect", "--ckpt", ckpt_arg, "--backend", &fixture("crash_segfault")]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(2), "{shown}");
    assert!(shown.contains("is not examined in this process") && shown.contains("SIGSEGV"), "{shown}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gpu_backends_train_to_the_cpu_hash_at_every_step() {
    let _phase = crate::common::phase(module_path!());
    let cpu = step_hashes(&train_json(&["--steps", "8", "--backend", "cpu"]));
    assert_eq!(cpu.len(), 8);
    for gpu in ["lut", "dp4a"] {
        let hashes = step_hashes(&train_json(&["--steps", "8", "--backend", gpu]));
        assert_eq!(hashes, cpu, "--backend {gpu}");
    }
}

/// `tc` where the driver has no int8 cooperative matrices (the system's lavapipe, Mesa 22.3):
/// refused with what the adapter lacks (`auto` tries it first: the test above).
#[test]
fn tc_is_refused_cleanly_without_cooperative_matrices() {
    let _phase = crate::common::phase(module_path!());
    let out = lockstep(&["gate", "tc"]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(2), "{shown}");
    assert!(shown.contains("no adapter offers exact int8 tensor cores"), "{shown}");
    assert!(shown.contains("Mesa 22.3") && shown.contains("reports no int8 cooperative matrix"), "{shown}");
}

/// The `lockstep` binary run on the lavapipe with int8 cooperative matrices
/// (`scripts/vulkan-coopmat.sh`): a copy whose program interpreter is that directory's dynamic
/// loader (trixie's C library is what its Mesa needs), so the gate's child process — the same
/// file — runs there too; only that driver is visible.
fn lockstep_on_the_cooperative_driver(args: &[&str]) -> Output {
    let driver = lockstep_faulty_plugins::coopmat::CoopmatDriver::unpacked();
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_lockstep"));
    let copy = std::env::temp_dir().join(format!("lockstep-coopmat-{}", std::process::id()));
    if !copy.exists() {
        std::fs::copy(&exe, &copy).unwrap();
        let patched = Command::new("patchelf")
            .arg("--set-interpreter")
            .arg(driver.loader())
            .arg(&copy)
            .output()
            .expect("patchelf runs (scripts/test.sh installs it)");
        assert!(patched.status.success(), "{}", text(&patched));
    }
    Command::new(&copy)
        .args(args)
        .env("LD_LIBRARY_PATH", driver.lib())
        .env("VK_DRIVER_FILES", driver.icd())
        .env("LOCKSTEP_PLUGIN_DIR", exe.parent().unwrap())
        .output()
        .expect("the patched lockstep runs")
}

/// `tc` on cooperative matrices: the gate admits it through the real binary (in its child
/// process), and it trains to the CPU mirror's weight hash at every step.
#[test]
fn tc_on_cooperative_matrices_is_admitted_and_trains_to_the_cpu_hash_at_every_step() {
    let _phase = crate::common::phase(module_path!());
    let out = lockstep_on_the_cooperative_driver(&["gate", "tc", "--verbose"]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("ADMITTED: backend `tc`"), "{shown}");
    assert!(shown.contains("Mesa 26") && shown.contains("int8 cooperative matrices 8x8x8"), "{shown}");
    let cpu = step_hashes(&train_json(&["--steps", "8", "--backend", "cpu"]));
    let tc = step_hashes(&train_json_on(lockstep_on_the_cooperative_driver, &["--steps", "8", "--backend", "tc"]));
    assert_eq!(cpu.len(), 8);
    assert_eq!(tc, cpu, "--backend tc");
    std::fs::remove_file(std::env::temp_dir().join(format!("lockstep-coopmat-{}", std::process::id()))).ok();
}

/// `lockstep train --backend lut` with the default model and batch trains and evaluates on
/// lavapipe, whose largest storage binding (128 MiB) once held the training program's buffers
/// but not a second set for the evaluation: the held-out loss now runs on the training
/// program's buffers. Its bits are the CPU mirror's, step and held-out loss alike. (One step and
/// one held-out batch: lavapipe takes most of a minute for a step of the default model.)
#[test]
fn lut_trains_and_evaluates_the_default_model_within_one_binding_of_lavapipe() {
    let _phase = crate::common::phase(module_path!());
    let cpu = one_step_and_heldout("cpu", &[]);
    assert_eq!(cpu.0.len(), 1);
    assert_eq!(one_step_and_heldout("lut", &[]), cpu);
}

/// A model whose step needs more than one storage binding of lavapipe (c=64, t=256, 16 heads,
/// b=8: 40.6 M words of buffers, the attention probabilities alone 8.4 M a layer, against
/// 33.5 M words in lavapipe's largest binding) trains and evaluates on `lut` with cpu's bits:
/// its buffers spread over the arena's pages (`arena.wgsl`).
#[test]
fn lut_trains_a_model_larger_than_one_binding_of_lavapipe() {
    let _phase = crate::common::phase(module_path!());
    let model = ["--width", "64", "--context", "256", "--layers", "2", "--heads", "16", "--batch", "8"];
    let cpu = one_step_and_heldout("cpu", &model);
    assert_eq!(cpu.0.len(), 1);
    assert_eq!(one_step_and_heldout("lut", &model), cpu);
}

/// One step of `lockstep train` with `model`'s flags on `backend`, and one held-out batch: the
/// step's weight hash and the held-out loss's bits.
fn one_step_and_heldout(backend: &str, model: &[&str]) -> (Vec<String>, String) {
    let mut args = vec!["train", "--backend", backend, "--steps", "1", "--eval-batches", "1", "--json"];
    args.extend_from_slice(model);
    let out = lockstep(&args);
    assert_eq!(out.status.code(), Some(0), "--backend {backend}: {}", text(&out));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    let heldout = lines.iter().find_map(|l| l["heldout_loss_bits"].as_str()).expect("a held-out loss line");
    (step_hashes(&lines), heldout.to_string())
}

/// The training state kept on the backend's device (ABI 2: the CPU mirror and the GPU plugins
/// keep weights and Adam's moments there, run Adam and hash there) gives the bits of the state
/// kept on the host (an ABI 1 plugin: products only, Adam and the hash on the host), also across
/// a checkpoint taken from the device and resumed on another backend.
#[test]
fn state_kept_on_the_device_trains_to_the_hashes_of_state_kept_on_the_host() {
    let _phase = crate::common::phase(module_path!());
    let host_kept = fixture("abi_1_products_only");
    let on_host = step_hashes(&train_json(&["--steps", "8", "--backend", &host_kept]));
    assert_eq!(on_host.len(), 8);
    for device in ["cpu", "dp4a"] {
        assert_eq!(step_hashes(&train_json(&["--steps", "8", "--backend", device])), on_host, "--backend {device}");
    }
    // Four steps on dp4a, saved (brought back from the GPU), resumed on the host-kept backend
    // and on lut for the last four.
    let dir = std::env::temp_dir().join(format!("lockstep-resident-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let ckpt = dir.join("half.ckpt");
    let ckpt_arg = ckpt.to_str().expect("a UTF-8 path");
    let first =
        step_hashes(&train_json(&["--steps", "8", "--until", "4", "--backend", "dp4a", "--ckpt-out", ckpt_arg]));
    assert_eq!(first[..], on_host[..4]);
    for backend in [host_kept.as_str(), "lut"] {
        let mut args = vec!["train", "--resume", ckpt_arg, "--backend", backend];
        args.extend_from_slice(TINY);
        let out = lockstep(&args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let lines: Vec<serde_json::Value> =
            String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
        assert_eq!(step_hashes(&lines)[..], on_host[4..], "resumed on {backend}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hot_swaps_at_step_boundaries_leave_the_hashes_of_an_unswapped_run() {
    let _phase = crate::common::phase(module_path!());
    let plain = step_hashes(&train_json(&["--steps", "9", "--backend", "cpu"]));
    let lines = train_json(&["--steps", "9", "--backend", "cpu", "--swap", "3:dp4a", "--swap", "6:lut"]);
    assert_eq!(step_hashes(&lines), plain);
    let swaps: Vec<(&str, u64, bool)> = lines
        .iter()
        .filter(|l| l.get("swap").is_some())
        .map(|l| (l["swap"].as_str().unwrap(), l["after_step"].as_u64().unwrap(), l["ok"].as_bool().unwrap()))
        .collect();
    assert_eq!(swaps, [("dp4a", 3, true), ("lut", 6, true)]);
    // A swap to a plugin the gate refuses keeps the old backend and says why.
    let wrong = fixture("flaw_round_half_away");
    let swap = format!("2:{wrong}");
    let lines = train_json(&["--steps", "4", "--backend", "cpu", "--swap", &swap]);
    let refused = lines.iter().find(|l| l.get("swap").is_some()).expect("a swap line");
    assert_eq!(refused["ok"], false);
    assert!(refused["why"].as_str().unwrap().contains("was not admitted"), "{refused}");
    assert_eq!(step_hashes(&lines), step_hashes(&train_json(&["--steps", "4", "--backend", "cpu"])));
}

#[test]
fn the_live_audit_stops_a_backend_that_drifts_after_admission() {
    let _phase = crate::common::phase(module_path!());
    let drifting = fixture("drift_after_admission");
    let mut args = vec!["train"];
    args.extend_from_slice(TINY_MODEL);
    args.extend_from_slice(TINY);
    args.extend_from_slice(&["--steps", "40", "--audit-every", "1", "--threads", "1", "--backend", &drifting]);
    let out = lockstep(&args);
    let shown = text(&out);
    assert_ne!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("live audit failed, the run stops"), "{shown}");
    assert!(shown.contains("differs from the CPU reference"), "{shown}");
    // It stopped at the first audited step after the drift began, not at the end.
    let steps = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("\"whash\"")).count();
    assert!(steps < 40, "{shown}");
    // The same run with an honest backend passes every audit.
    let lines = train_json(&["--steps", "5", "--audit-every", "1", "--backend", "cpu"]);
    assert!(lines.iter().filter(|l| l.get("whash").is_some()).all(|l| l["audited"].is_string()), "{lines:?}");
}

#[test]
fn the_automatic_choice_reports_every_verdict() {
    let _phase = crate::common::phase(module_path!());
    let mut args = vec!["train"];
    args.extend_from_slice(TINY_MODEL);
    args.extend_from_slice(&TINY[..TINY.len() - 1]);
    args.extend_from_slice(&["--steps", "1"]);
    let out = lockstep(&args);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    // dp4a is tried first, then tc, lut, cpu; each gets a verdict until one is admitted.
    let order: Vec<&str> = shown.lines().filter_map(|l| l.strip_prefix("auto: ")).collect();
    let tried: Vec<&str> = order.iter().filter_map(|l| Some(l.split_once(": ")?.0)).collect();
    assert!(["dp4a", "tc", "lut", "cpu"].starts_with(&tried), "{shown}");
    let chosen = order.iter().find_map(|l| l.strip_prefix("chose `")).expect("a choice").trim_end_matches('`');
    assert!(["dp4a", "tc", "lut", "cpu"].contains(&chosen), "{shown}");
    assert!(order.iter().any(|l| l.starts_with(&format!("{chosen}: ADMITTED"))), "{shown}");
}

#[test]
fn bench_exchange_reports_throughput_and_the_step_breakdown() {
    let _phase = crate::common::phase(module_path!());
    let out = lockstep(&["bench", "exchange", "--json", "--mb", "2", "--trials", "1", "--nodes", "2", "--steps", "4"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rows: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    let transports: Vec<&str> = rows.iter().filter_map(|r| r["transport"].as_str()).collect();
    assert_eq!(
        transports,
        ["tcp", "naive data channel", "mesh data channel", "naive data channel", "mesh data channel"]
    );
    assert!(rows.iter().filter(|r| r.get("mb_per_s").is_some()).all(|r| r["mb_per_s"].as_f64().unwrap() > 0.0));
    let step = rows.iter().find(|r| r["nodes"] == 2).expect("a 2-node breakdown");
    for key in ["step_ms", "compute_ms", "exchange_ms", "hash_guard_ms", "hash_guard_percent"] {
        assert!(step[key].as_f64().is_some_and(|v| v >= 0.0), "{key}: {step}");
    }
    assert!(step["compute_ms"].as_f64().unwrap() > 0.0);
}

/// `bench audit` on real processes: a ×1.001 member named and removed (syncs counted from its
/// first wrong contribution), nobody falsely accused, an honest group of two CPU kinds audited
/// with no accusation, and the audits' share of its throughput from alternated pairs.
#[test]
fn bench_audit_reports_syncs_to_removal_false_accusations_and_the_cost() {
    let _phase = crate::common::phase(module_path!());
    let keep = std::env::temp_dir().join(format!("lockstep-bench-audit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&keep);
    let out = lockstep(&[
        "bench",
        "audit",
        "--json",
        "--runs",
        "1",
        "--kinds",
        "scale:1.001",
        "--rate",
        "1",
        "--honest-steps",
        "10",
        "--pairs",
        "1",
        "--honest-backends",
        "cpu,cpu@portable",
        // Spare cycles may never come on a CI machine other tests keep busy.
        "--own-priority",
        "--keep",
        keep.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let row = &summary["kinds"][0];
    assert_eq!(
        (row["kind"].as_str(), row["runs"].as_u64(), row["false_accusations"].as_u64()),
        (Some("scale:1.001"), Some(1), Some(0))
    );
    let syncs = row["syncs_to_removal"][0].as_u64().unwrap_or_else(|| panic!("named and removed: {summary}"));
    assert!(syncs >= 1, "{summary}");
    // Where the syncs went: accused no later than removed, and removed no later counted from
    // the first contribution found wrong than from its first wrong one.
    let accused = row["syncs_to_accusation"][0].as_u64().expect("accused");
    let from_found = row["syncs_from_found_to_removal"][0].as_u64().expect("found");
    assert!(accused <= syncs && from_found <= syncs, "{summary}");
    // Every member's reports of the run, kept: the verdict among them.
    let run = keep.join("scale-1.001-0");
    let reports: Vec<_> = std::fs::read_dir(&run).expect("the run's reports").map(|e| e.unwrap().path()).collect();
    assert_eq!(reports.len(), 4, "{reports:?}");
    let verdicts = reports.iter().filter(|p| std::fs::read_to_string(p).unwrap().contains(r#""event":"verdict""#));
    assert!(verdicts.count() >= 3, "the honest members report the verdict");
    let honest = &summary["honest"];
    assert_eq!(honest["accusations"], 0, "{summary}");
    assert!(honest["audited_contributions"].as_u64().unwrap() >= 10, "{summary}");
    assert!(honest["audits_share_of_throughput"].as_f64().is_some(), "{summary}");
    assert_eq!(honest["pairs_shares"].as_array().map(Vec::len), Some(1));
    assert_eq!(summary["honest_backends"], serde_json::json!(["cpu", "cpu@portable", "cpu", "cpu@portable"]));
    assert_eq!(summary["own_priority"], true, "{summary}");
    let _ = std::fs::remove_dir_all(&keep);
}

#[test]
fn the_headless_demo_trains_three_nodes_to_one_hash() {
    let _phase = crate::common::phase(module_path!());
    let mut args = vec!["demo", "--headless", "--steps", "12"];
    args.extend_from_slice(TINY_MODEL);
    let out = lockstep(&args);
    assert!(out.status.success(), "{}", text(&out));
    let events: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let mut per_node: std::collections::BTreeMap<u64, Vec<(u64, String)>> = Default::default();
    for e in events.iter().filter(|e| e["event"] == "weights") {
        let entry = per_node.entry(e["node"].as_u64().unwrap()).or_default();
        entry.push((e["step"].as_u64().unwrap(), e["whash"].as_str().unwrap().to_string()));
    }
    assert_eq!(per_node.len(), 3, "three nodes reported weights: {:?}", per_node.keys());
    let first = per_node.values().next().unwrap().clone();
    assert_eq!(first.iter().map(|(s, _)| *s).collect::<Vec<_>>(), (1..=12).collect::<Vec<_>>());
    for (node, hashes) in &per_node {
        assert_eq!(hashes, &first, "node {node}");
    }
    // The same arithmetic as the group replayed in one process (the ids give the data streams).
    let ids: Vec<String> = per_node.keys().map(|id| id.to_string()).collect();
    let group = ids.join(",");
    let replayed: Vec<(u64, String)> = train_json(&["--backend", "cpu", "--steps", "12", "--replay-group", &group])
        .iter()
        .map(|v| (v["step"].as_u64().unwrap(), v["whash"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(replayed, first, "the demo trains exactly what the replay computes");
    // The two others joined through the room's approval, which the demo gave.
    assert_eq!(events.iter().filter(|e| e["event"] == "join-request").count(), 2);
    assert!(events.iter().any(|e| e["event"] == "run-finished"));
}

#[test]
fn resuming_a_finished_run_with_more_steps_extends_it_and_a_shorter_length_is_refused() {
    let _phase = crate::common::phase(module_path!());
    let dir = std::env::temp_dir().join(format!("lockstep-extend-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let ckpt = dir.join("run20.ckpt");
    let tiny = ["--width", "32", "--context", "32", "--layers", "1", "--heads", "2", "--batch", "2"];
    let ckpt_arg = ckpt.to_str().expect("a UTF-8 path");
    let mut first = vec!["train", "--backend", "cpu", "--steps", "20", "--ckpt-out", ckpt_arg, "--eval-batches", "0"];
    first.extend(tiny);
    let out = lockstep(&first);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // A length the checkpoint has reached trains nothing: refused, saying why.
    let out = lockstep(&["train", "--backend", "cpu", "--resume", ckpt_arg, "--steps", "20", "--eval-batches", "0"]);
    let shown = text(&out);
    assert_ne!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("the checkpoint is at step 20 of a 20-step run; --steps 20 would train nothing"), "{shown}");

    // A longer one extends the run: steps 21..40 are trained, with real losses.
    let out = lockstep(&["train", "--backend", "cpu", "--resume", ckpt_arg, "--steps", "40", "--eval-batches", "0"]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("steps 20 → 40 of 40"), "{shown}");
    let last = shown.lines().find(|l| l.starts_with("final:")).expect("a final line");
    assert!(last.starts_with("final: step 40 loss "), "{last}");
    assert!(!shown.contains("NaN"), "{shown}");

    // Nothing to train (the run's own end): no loss is printed for a step not trained.
    let out = lockstep(&["train", "--backend", "cpu", "--resume", ckpt_arg, "--eval-batches", "0"]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("final: step 20 (no step trained)"), "{shown}");
    assert!(!shown.contains("NaN"), "{shown}");
    std::fs::remove_dir_all(&dir).expect("cleaned up");
}
