//! Real plugin files through the real loader and gate: the CPU mirror is admitted, every
//! deliberately wrong plugin is rejected with a message that names what went wrong, and every
//! broken file gives a typed error while this process keeps running.
//!
//! The plugins are cdylibs built by `cargo build --workspace --all-targets` (the README's test
//! command runs it first); a missing file fails the test with that instruction.

use std::path::PathBuf;

use lockstep_backends::gate::{run_gate, Failure};
use lockstep_backends::{resolve_plugin, LoadError, Plugin};
use lockstep_worker_api::status;

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps/<test>").to_path_buf()
}

fn fixture(name: &str) -> PathBuf {
    let path = target_dir().join("examples").join(format!("lib{name}.so"));
    assert!(path.is_file(), "{} is missing: run `cargo build --workspace --all-targets` first", path.display());
    path
}

fn load(path: &std::path::Path) -> Plugin {
    Plugin::load(path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn cpu_plugin_is_admitted_and_shares_the_probe_hash() {
    let path = resolve_plugin("cpu").unwrap_or_else(|e| panic!("{e}"));
    let plugin = load(&path);
    assert_eq!(plugin.name(), "cpu");
    // 16 threads on any machine: splits of work that do not divide evenly are exercised.
    for threads in [1, 2, 16] {
        let mut backend = plugin.instantiate(threads).unwrap();
        let mut seen = Vec::new();
        let report = run_gate(&mut backend, &mut |p| seen.push(p.done));
        assert!(report.admitted(), "{}", report.verdict_line());
        assert_eq!(report.probe_hash, Some(report.reference_probe_hash));
        assert_eq!(seen.first(), Some(&0));
        assert_eq!(seen.last(), Some(&report.cases.len()));
        assert!(report.verdict_line().starts_with("ADMITTED"));
    }
}

#[test]
fn wrong_arithmetic_is_rejected_with_case_index_and_bits() {
    // (fixture, a case that must be among the failures)
    let expectations = [
        ("flaw_f32_accumulation", "alternating-signs"),
        ("flaw_saturating_pairs", "probe"),
        ("flaw_round_half_away", "rounding-ties"),
        ("flaw_reversed_blocks", "alternating-signs"),
        // Caught by the stronger battery's cases.
        ("flaw_boundary_exponent", "block-scale-boundaries"),
        ("flaw_integer_sums_in_f32", "int8-sums-past-2^24"),
        ("flaw_cache_by_address", "buffers-reused-in-place"),
        ("flaw_flush_at_end", "subnormal-partial-sums"),
    ];
    for (name, must_fail) in expectations {
        let plugin = load(&fixture(name));
        let mut backend = plugin.instantiate(1).unwrap();
        let report = run_gate(&mut backend, &mut |_| {});
        assert!(!report.admitted(), "{name} was admitted");
        let failed: Vec<&str> = report.failures().map(|c| c.name.as_str()).collect();
        eprintln!("{name}: rejected by {failed:?}");
        assert!(failed.contains(&must_fail), "{name}: expected `{must_fail}` among failures, got {failed:?}");
        // Every failure is a bit mismatch (the fixtures never error), reported precisely.
        for case in report.failures() {
            match case.failure.as_ref().unwrap() {
                Failure::Mismatch { expected_bits, actual_bits, wrong, .. } => {
                    assert_ne!(expected_bits, actual_bits);
                    assert!(*wrong >= 1);
                }
                other => panic!("{name}: case {} failed oddly: {other}", case.name),
            }
        }
        let line = report.verdict_line();
        assert!(line.starts_with("REJECTED"), "{line}");
        assert!(line.contains("expected bits 0x") && line.contains("got 0x") && line.contains("row "), "{line}");
    }
}

#[test]
fn a_file_that_is_not_a_library_is_refused() {
    let dir = std::env::temp_dir().join(format!("lockstep-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("libnot_a_plugin.so");
    std::fs::write(&path, b"#!/bin/sh\necho this is not an ELF file\n").unwrap();
    let error = Plugin::load(&path).unwrap_err();
    assert!(matches!(error, LoadError::NotALibrary { .. }), "{error:?}");
    assert!(error.to_string().contains("is not a loadable shared library"), "{error}");

    let error = Plugin::load(&dir.join("no-such-file.so")).unwrap_err();
    assert!(matches!(error, LoadError::Io { .. }), "{error:?}");
    let error = resolve_plugin("cpu").map(|p| p.join("x")).and_then(|p| Plugin::load(&p)).unwrap_err();
    assert!(matches!(error, LoadError::Io { .. }));
}

#[test]
fn a_library_without_the_entry_symbol_is_refused() {
    let error = Plugin::load(&fixture("bad_no_entry")).unwrap_err();
    assert!(matches!(error, LoadError::MissingEntry { .. }), "{error:?}");
    assert!(error.to_string().contains("lockstep_worker_entry"), "{error}");
}

#[test]
fn a_wrong_abi_major_version_is_refused() {
    let error = Plugin::load(&fixture("bad_abi_major")).unwrap_err();
    match &error {
        LoadError::AbiMajor { found, expected, .. } => assert_eq!((*found, *expected), (3, 2)),
        other => panic!("{other:?}"),
    }
    assert!(error.to_string().contains("ABI major version 3, this host speaks 1 to 2"), "{error}");
}

/// An ABI 2 plugin whose units are exact but whose softmax uses the platform's `exp` passes the
/// units battery and is rejected at the first softmax of the step, which the verdict names.
#[test]
fn a_wrong_op_is_rejected_by_name() {
    let plugin = load(&fixture("flaw_op_softmax"));
    assert_eq!(plugin.ops(), lockstep_worker_api::ops::ALL);
    let mut backend = plugin.instantiate(1).unwrap();
    assert!(backend.has_step_ops());
    let report = run_gate(&mut backend, &mut |_| {});
    assert!(!report.admitted(), "a softmax through the platform's exp was admitted");
    let failed: Vec<&str> = report.failures().map(|c| c.name.as_str()).collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].starts_with("step-0 ") && failed[0].contains("causal_softmax"), "{failed:?}");
    // Every units case passed and the ops before the softmax were checked.
    assert!(report.ops_checked >= 4, "{}", report.ops_checked);
    let line = report.verdict_line();
    assert!(line.contains("causal_softmax") && line.contains("expected bits 0x"), "{line}");
}

/// The ABI is implementable from its C header alone: `worker-api/examples/c_units.c`, the units
/// written in portable C against `lockstep_worker.h` and `docs/VERIFICATION.md`, compiled here
/// with the system's `cc`, loads as an ABI 2.0 products-only plugin and is admitted by the full
/// gate; a refused call leaves its output untouched, as the header promises.
#[test]
fn a_plugin_written_in_c_from_the_header_is_admitted() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out_dir = std::env::temp_dir().join(format!("lockstep-c-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let library = out_dir.join("libc_units.so");
    let built = std::process::Command::new("cc")
        .args(["-std=c11", "-O2", "-ffp-contract=off", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("worker-api/include"))
        .arg(root.join("worker-api/examples/c_units.c"))
        .arg("-o")
        .arg(&library)
        .output()
        .expect("a C compiler `cc` (Rust links with it)");
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let plugin = load(&library);
    assert_eq!((plugin.name(), plugin.abi_major(), plugin.abi_minor(), plugin.ops()), ("c-units", 2, 1, 0));
    let mut backend = plugin.instantiate(0).unwrap();
    let report = run_gate(&mut backend, &mut |_| {});
    assert!(report.admitted(), "{}", report.verdict_line());
    assert_eq!(report.probe_hash, Some(report.reference_probe_hash));
    // Refused: a NaN in B. The output keeps what it held.
    let mut c = vec![7.0f32; 6];
    let b = [1.0, f32::NAN, 1.0];
    let error = backend.gemm_f32_into(2, 3, 1, &[1.0, 2.0], &b, &mut c).unwrap_err();
    assert_eq!(error.status, lockstep_worker_api::status::NON_FINITE_INPUT, "{error}");
    assert!(error.message.contains("in B at index 1"), "{error}");
    assert_eq!(c, vec![7.0; 6]);
    // Zero-sized shapes: nothing to write, no error; k = 0 gives zeros.
    assert_eq!(backend.gemm_f32(0, 3, 4, &[], &[0.5; 12]).unwrap(), Vec::<f32>::new());
    assert_eq!(backend.gemm_f32(2, 2, 0, &[], &[]).unwrap(), vec![0.0; 4]);
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// A plugin built against ABI 1.2 still loads and is admitted, as a product-only backend: the
/// host reads nothing past its 1.2 table (the bytes after it claim every op).
#[test]
fn an_abi_1_plugin_loads_as_a_product_only_backend() {
    let plugin = load(&fixture("abi_1_products_only"));
    assert_eq!((plugin.abi_major(), plugin.abi_minor(), plugin.ops()), (1, 2, 0));
    let mut backend = plugin.instantiate(1).unwrap();
    assert!(!backend.has_step_ops());
    let report = run_gate(&mut backend, &mut |_| {});
    assert!(report.admitted(), "{}", report.verdict_line());
    assert_eq!(report.ops_checked, 0);
}

/// A plugin built against ABI 2.0 loads with everything its table has and is admitted; the 2.1 field past its
/// `struct_size` (`time_peak`) is absent, so the host answers `UNSUPPORTED` without a call,
/// whatever capability bits the plugin sets.
#[test]
fn an_abi_2_0_plugin_loads_without_the_2_1_field() {
    let plugin = load(&fixture("abi_2_0_table"));
    assert_eq!((plugin.abi_major(), plugin.abi_minor()), (2, 0));
    let mut backend = plugin.instantiate(1).unwrap();
    let error = backend.time_peak(1).unwrap_err();
    assert_eq!(error.status, status::UNSUPPORTED, "{error}");
    let report = run_gate(&mut backend, &mut |_| {});
    assert!(report.admitted(), "{}", report.verdict_line());
}

#[test]
fn a_panicking_plugin_is_contained_and_never_admitted() {
    let plugin = load(&fixture("bad_panics"));
    let mut backend = plugin.instantiate(1).unwrap();
    let error = backend.gemm_f32(1, 1, 1, &[1.0], &[1.0]).unwrap_err();
    assert_eq!(error.status, status::PANIC);
    assert!(error.message.contains("panics on purpose"), "{error}");
    // The instance is poisoned: no further call reaches the plugin.
    let again = backend.gemm_f32(1, 1, 1, &[1.0], &[1.0]).unwrap_err();
    assert!(again.message.contains("poisoned"), "{again}");

    let mut fresh = plugin.instantiate(1).unwrap();
    let report = run_gate(&mut fresh, &mut |_| {});
    assert!(!report.admitted());
    assert!(report.aborted.is_some());
    assert!(report.verdict_line().contains("panic"), "{}", report.verdict_line());
    // This process is still here and can still run a good plugin.
    let mut cpu = load(&resolve_plugin("cpu").unwrap()).instantiate(1).unwrap();
    assert_eq!(cpu.gemm_f32(1, 1, 1, &[2.0], &[3.0]).unwrap(), vec![6.0]);
}

#[test]
fn a_plugin_returning_errors_is_rejected_with_its_message() {
    let plugin = load(&fixture("bad_error_status"));
    let mut backend = plugin.instantiate(1).unwrap();
    let error = backend.gemm_f32(1, 1, 1, &[1.0], &[1.0]).unwrap_err();
    assert_eq!(error.status, status::DEVICE_ERROR);
    assert_eq!(error.message, "simulated device loss");
    let report = run_gate(&mut backend, &mut |_| {});
    assert!(!report.admitted());
    let line = report.verdict_line();
    assert!(line.contains("device error") && line.contains("simulated device loss"), "{line}");
}

#[test]
fn fresh_copies_load_as_separate_libraries() {
    let path = resolve_plugin("cpu").unwrap();
    let first = Plugin::load_fresh_copy(&path).unwrap();
    let second = Plugin::load_fresh_copy(&path).unwrap();
    assert_ne!(first.path(), second.path());
    assert_ne!(first.path(), path.as_path());
    let (a, b) = ([1.5f32; 64], [2.0f32; 64]);
    let one = first.instantiate(1).unwrap().gemm_f32(1, 1, 64, &a, &b).unwrap();
    let two = second.instantiate(1).unwrap().gemm_f32(1, 1, 64, &a, &b).unwrap();
    assert_eq!(one, vec![192.0]);
    assert_eq!(one, two);
}

#[test]
fn unknown_names_are_paths_and_missing_builtins_say_where_they_looked() {
    // A bare word that is not a built-in is taken as a path, and that path does not exist.
    let error = Plugin::load(&resolve_plugin("no-such-backend").unwrap()).unwrap_err();
    assert!(matches!(error, LoadError::Io { .. }));
    assert!(error.to_string().contains("no-such-backend"), "{error}");
    assert!(resolve_plugin("cpu").unwrap().is_file());
    // A built-in that was not built names every place it was looked for.
    let missing = LoadError::NotFound {
        name: "lut".into(),
        searched: vec![PathBuf::from("/a/liblockstep_backend_lut.so"), PathBuf::from("/b/liblockstep_backend_lut.so")],
    };
    let text = missing.to_string();
    assert!(text.contains("`lut` not found") && text.contains("/a/liblockstep_backend_lut.so, /b/"), "{text}");
}
