//! One conformance suite, instantiated for every backend plugin built with the workspace
//! (`cpu`, `lut`, `dp4a`): bit equality with the reference units, never an epsilon.
//!
//! The GPU plugins run on whatever adapter wgpu finds; in CI that is Mesa lavapipe (the test
//! command installs it). A plugin that cannot be created fails its suite with the plugin's
//! own message: nothing here is skipped.

use lockstep_backends::gate::run_gate;
use lockstep_backends::{resolve_plugin, Backend, Plugin};
use lockstep_luts::rng::SplitMix64;
use lockstep_luts::units::CANONICAL_NAN_BITS;
use lockstep_worker_api::status;

fn open(name: &str) -> Backend {
    let path = resolve_plugin(name).unwrap_or_else(|e| panic!("{e}"));
    let plugin = Plugin::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let backend = plugin.instantiate(0).unwrap_or_else(|e| panic!("backend `{name}` cannot be created here: {e}"));
    // `tc`'s products are the cooperative kernel's, not a fallback's.
    assert_eq!(backend.describe().contains("int8 cooperative matrices"), name == "tc", "{}", backend.describe());
    backend
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Compares one product with the reference, bit for bit, naming the first difference.
fn check(backend: &mut Backend, what: &str, m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) {
    let expected = lockstep_luts::gemm_nt(m, n, k, a, b).unwrap();
    let actual = backend.gemm_f32(m, n, k, a, b).unwrap_or_else(|e| panic!("{what} {m}x{n}x{k}: {e}"));
    if let Some(i) = bits(&expected).iter().zip(bits(&actual)).position(|(x, y)| *x != y) {
        panic!(
            "{} {what} {m}x{n}x{k}: element [{}][{}] expected {:#010x}, got {:#010x}",
            backend.name(),
            i / n,
            i % n,
            expected[i].to_bits(),
            actual[i].to_bits()
        );
    }
}

/// Values of magnitude around `2^scale`, with zeros sprinkled in.
fn values(rng: &mut SplitMix64, len: usize, scale: i32) -> Vec<f32> {
    (0..len).map(|_| if rng.below(13) == 0 { 0.0 } else { rng.next_signed_unit() * 2f32.powi(scale) }).collect()
}

fn admitted_with_the_reference_probe(name: &str) {
    let mut backend = open(name);
    let report = run_gate(&mut backend, &mut |_| {});
    assert!(report.admitted(), "{}: {}", backend.describe(), report.verdict_line());
    assert_eq!(report.probe_hash, Some(report.reference_probe_hash));
    assert_eq!(report.reference_probe_hash, 0xdf23_2627);
    // Every plugin of the workspace runs the step's ops, so the gate checked them all: three
    // training steps of every op kind and the Adam-and-hash case.
    assert!(report.ops_checked >= 3 * 13 + 2, "{name}: {} ops checked", report.ops_checked);
}

fn model_shapes(name: &str) {
    let mut backend = open(name);
    let mut rng = SplitMix64::new(0xc0ffee);
    // The default model's products at a small batch: linear layers forward and backward, the
    // attention products, the head; and odd shapes whose k is not a multiple of the block.
    let shapes = [
        (64, 384, 128),
        (64, 128, 384),
        (128, 64, 128),
        (128, 128, 32),
        (128, 32, 128),
        (32, 256, 64),
        (1, 1, 1),
        (3, 5, 31),
        (17, 9, 33),
        (33, 65, 100),
        (7, 130, 257),
    ];
    for (case, &(m, n, k)) in shapes.iter().enumerate() {
        let scale = [-3, 0, 2, -20, 30][case % 5];
        let a = values(&mut rng, m * k, scale);
        let b = values(&mut rng, n * k, -scale / 2);
        check(&mut backend, "model-shape", m, n, k, &a, &b);
    }
}

fn exponent_extremes(name: &str) {
    // Blocks whose scale sums leave the fast epilogue's range on either side, next to blocks
    // inside it, so every output mixes the exact path with the fast one; sums that overflow
    // to ±Inf and Inf - Inf (the canonical NaN) included.
    let mut backend = open(name);
    let mut rng = SplitMix64::new(77);
    let (m, n, k) = (9, 11, 32 * 6);
    for round in 0..6 {
        let exps = [[-60, 0, 60, -70, 2, 70], [0, 0, -120, 0, 0, 0], [120, 3, 0, 126, -4, 0]][round % 3];
        let row = |rng: &mut SplitMix64, flip: bool| -> Vec<f32> {
            (0..k)
                .map(|i| {
                    let e = exps[i / 32] * if flip { -1 } else { 1 } / if round >= 3 { 1 } else { 2 };
                    rng.next_signed_unit() * 2f32.powi(e.clamp(-149, 127))
                })
                .collect()
        };
        let a: Vec<f32> = (0..m).flat_map(|_| row(&mut rng, false)).collect();
        let b: Vec<f32> = (0..n).flat_map(|i| row(&mut rng, i % 2 == 1)).collect();
        check(&mut backend, "exponent-extremes", m, n, k, &a, &b);
    }
    // Overflow: two blocks of maximal terms with opposite signs give Inf - Inf.
    let a = vec![f32::MAX; 64];
    let mut b = vec![f32::MAX; 64];
    b[32..].iter_mut().for_each(|v| *v = -f32::MAX);
    let out = backend.gemm_f32(1, 1, 64, &a, &b).unwrap();
    assert_eq!(out[0].to_bits(), CANONICAL_NAN_BITS);
    check(&mut backend, "overflow", 1, 1, 64, &a, &b);
}

fn integer_product_over_the_full_range(name: &str) {
    let mut backend = open(name);
    let mut rng = SplitMix64::new(5);
    for &(m, n, k) in &[(1, 1, 1), (5, 7, 3), (16, 16, 256), (9, 33, 1000)] {
        let a: Vec<i8> = (0..m * k).map(|i| if i % 17 == 0 { -128 } else { rng.next_u32() as i8 }).collect();
        let b: Vec<i8> = (0..n * k).map(|i| if i % 19 == 0 { -128 } else { rng.next_u32() as i8 }).collect();
        let expected = lockstep_luts::gemm_i8_nt(m, n, k, &a, &b);
        assert_eq!(backend.gemm_i8(m, n, k, &a, &b).unwrap(), expected, "{name} gemm_i8 {m}x{n}x{k}");
    }
    // Every pair of int8 values at once: row a against column b over k = 256.
    let all: Vec<i8> = (0..=255u8).map(|v| v as i8).collect();
    let ones: Vec<i8> = all.iter().map(|_| 1).collect();
    let expected = lockstep_luts::gemm_i8_nt(1, 1, 256, &all, &all);
    assert_eq!(backend.gemm_i8(1, 1, 256, &all, &all).unwrap(), expected);
    assert_eq!(backend.gemm_i8(1, 1, 256, &all, &ones).unwrap(), vec![-128]);
}

/// Every sample of the op table (`lockstep_luts::ops::samples`: every op, so a new op is checked
/// here by its table entry alone) on `lockstep_luts::ops::hard_values`, run on the plugin and on
/// the reference from the same words; every word of every buffer compared (the gate's step
/// cases hold training-like values; these hold the corners of the arithmetic).
fn every_op_sample_on_hard_values(name: &str) {
    use lockstep_luts::ops::{hard_values, run_reference, sample_memory, samples};
    let mut backend = open(name);
    assert!(backend.has_step_ops(), "{name} claims every op of ABI 2");
    let mut rng = SplitMix64::new(0x5bec);
    let mut covered = std::collections::BTreeSet::new();
    for (index, sample) in samples().into_iter().enumerate() {
        let mut memory = std::collections::BTreeMap::new();
        let mut handles = std::collections::BTreeMap::new();
        for (placeholder, words) in sample_memory(&[sample], |len| hard_values(&mut rng, len + 11)) {
            let h = backend.create_buffer(words.len()).unwrap();
            backend.write_buffer(h, 0, &words).unwrap();
            handles.insert(placeholder, h);
            memory.insert(h, words);
        }
        let op = sample.with_buffers(|p| handles[&p]);
        run_reference(&op, &mut memory).unwrap_or_else(|e| panic!("the reference refused sample {index}: {e}"));
        backend
            .run_ops(std::slice::from_ref(&op))
            .unwrap_or_else(|e| panic!("{name} sample {index} {}: {e}", op.name()));
        for (&buffer, expected) in &memory {
            let mut actual = vec![0u32; expected.len()];
            backend.read_buffer(buffer, 0, &mut actual).unwrap();
            if let Some(i) = expected.iter().zip(&actual).position(|(e, a)| e != a) {
                panic!(
                    "{name} sample {index} {}: buffer {buffer} word {i}: expected {:#010x}, got {:#010x}",
                    op.name(),
                    expected[i],
                    actual[i]
                );
            }
            backend.free_buffer(buffer);
        }
        covered.insert(op.code());
    }
    assert_eq!(covered.len(), lockstep_luts::ops::OPS.len(), "every op has a sample");
}

fn non_finite_inputs_are_refused_with_their_place(name: &str) {
    let mut backend = open(name);
    for (bad, in_a) in [(f32::NAN, true), (f32::INFINITY, false), (f32::NEG_INFINITY, true)] {
        let mut a = vec![1.0f32; 4 * 40];
        let mut b = vec![0.5f32; 3 * 40];
        if in_a {
            a[77] = bad;
        } else {
            b[41] = bad;
        }
        let error = backend.gemm_f32(4, 3, 40, &a, &b).unwrap_err();
        assert_eq!(error.status, status::NON_FINITE_INPUT, "{error}");
        let place = if in_a { "in A at index 77" } else { "in B at index 41" };
        assert!(error.message.contains(place), "{error}");
    }
    // The instance is still usable afterwards.
    check(&mut backend, "after-refusal", 2, 2, 2, &[1.0, 2.0, 3.0, 4.0], &[0.5, 0.25, -1.0, 8.0]);
}

/// Set in the child process [`on_the_cooperative_driver`] starts.
const COOPERATIVE_CHILD: &str = "LOCKSTEP_COOPMAT_CHILD";

/// Runs this binary's test `test` again in a child process under the cooperative driver's own
/// dynamic loader, with only that driver visible, and fails with its output if it fails. The
/// system's lavapipe (Mesa 22.3) has no cooperative matrices, so this is where `tc` runs its
/// products for real in CI (the device machine runs it on NVIDIA's tensor cores).
fn on_the_cooperative_driver(test: &str, plugin: &str) {
    let plugin_dir = resolve_plugin(plugin).unwrap_or_else(|e| panic!("{e}"));
    // Under the loader this binary's own path is the loader's: name the plugins' directory.
    let dir = plugin_dir.parent().unwrap().as_os_str();
    lockstep_faulty_plugins::coopmat::CoopmatDriver::unpacked().rerun_test(
        test,
        COOPERATIVE_CHILD,
        &[("LOCKSTEP_PLUGIN_DIR", dir)],
    );
}

/// A plugin that claims `PEAK_TIMING` reports a finite positive rate for its product path (the
/// GPU plugins: DP4A, table lookups or cooperative matrices in a register loop); one that does
/// not is answered `UNSUPPORTED` by the host without a call. A GPU plugin reports a rate only
/// after its kernel's output matched the host's model of every operation the rate counts
/// (`lockstep_shaders::peak_words`, `peak_tc_words`): a kernel a driver cut short fails here.
fn times_its_product_path(name: &str) {
    let mut backend = open(name);
    let claims = backend.plugin().capabilities() & lockstep_worker_api::caps::PEAK_TIMING != 0;
    match backend.time_peak(2) {
        Ok(rate) => {
            assert!(claims && rate.is_finite() && rate > 0.0, "{name}: {rate} ops/s");
            eprintln!("{name}: product path {:.3} int8 TOP/s ({})", rate / 1e12, backend.describe());
        }
        Err(e) => assert!(!claims && e.status == status::UNSUPPORTED, "{name}: {e}"),
    }
    assert_eq!(claims, name != "cpu", "{name}: the GPU plugins time their path, the CPU mirror does not");
}

macro_rules! conformance {
    ($module:ident, $name:literal) => {
        conformance!($module, $name, |test: fn(&str), _: &str| test($name));
    };
    // `tc`: each test in a child process on the driver with cooperative matrices.
    ($module:ident, $name:literal, cooperative) => {
        conformance!($module, $name, |test: fn(&str), path: &str| {
            if std::env::var_os(super::COOPERATIVE_CHILD).is_some() {
                test($name)
            } else {
                // The test's name as libtest knows it: the module path without the crate.
                let name = path.split_once("::").map_or(path, |(_, rest)| rest);
                super::on_the_cooperative_driver(name, $name)
            }
        });
    };
    ($module:ident, $name:literal, $run:expr) => {
        mod $module {
            macro_rules! case {
                ($test:ident) => {
                    #[test]
                    fn $test() {
                        let run = $run;
                        run(super::$test, concat!(module_path!(), "::", stringify!($test)));
                    }
                };
            }
            case!(admitted_with_the_reference_probe);
            case!(model_shapes);
            case!(exponent_extremes);
            case!(integer_product_over_the_full_range);
            case!(every_op_sample_on_hard_values);
            case!(non_finite_inputs_are_refused_with_their_place);
            case!(times_its_product_path);
        }
    };
}

conformance!(cpu, "cpu");
conformance!(lut, "lut");
conformance!(dp4a, "dp4a");
conformance!(tc, "tc", cooperative);
