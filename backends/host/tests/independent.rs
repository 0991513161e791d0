//! The spec in `docs/VERIFICATION.md` is precise enough to reproduce the bits: a second
//! implementation written from it alone (`tests/independent/units.py`, pure Python) must agree
//! with the reference units on the probe and on the gate's adversarial cases.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use lockstep_backends::gate::{battery, Input};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/independent/units.py")
}

fn python(args: &[&str], stdin: &str) -> String {
    let mut child = Command::new("python3")
        .arg(script())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be installed (the README's test command checks)");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "units.py failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn independent_probe_hash_matches_reference_and_docs() {
    let reference = lockstep_luts::probe::reference_probe_hash().unwrap();
    let independent = python(&["--probe"], "");
    assert_eq!(independent.trim(), format!("{reference:#010x}"));
    let docs =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/VERIFICATION.md")).unwrap();
    assert!(docs.contains(&format!("**`{reference:#010x}`**")), "docs/VERIFICATION.md states another probe hash");
}

#[test]
fn independent_units_match_reference_on_adversarial_cases() {
    let wanted = [
        "shape-1x1x33",
        "shape-17x19x95",
        "zero-blocks",
        "one-huge-among-tiny",
        "subnormals",
        "overflow-to-inf-and-nan",
        "terms-below-normal-range",
        "rounding-ties",
    ];
    let cases: Vec<_> = battery().into_iter().filter(|c| wanted.contains(&c.name.as_str())).collect();
    assert_eq!(cases.len(), wanted.len());
    let mut json = Vec::new();
    let mut expected = Vec::new();
    for case in &cases {
        let Input::F32 { m, n, k, a, b } = &case.input else { panic!("{} is not an f32 case", case.name) };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        json.push(serde_json::json!({"name": case.name, "m": m, "n": n, "k": k, "a": bits(a), "b": bits(b)}));
        expected.push(bits(&lockstep_luts::gemm_nt(*m, *n, *k, a, b).unwrap()));
    }
    let output = python(&[], &serde_json::Value::Array(json).to_string());
    let actual: Vec<Vec<u32>> = serde_json::from_str(&output).unwrap();
    for ((case, want), got) in cases.iter().zip(&expected).zip(&actual) {
        let first = want.iter().zip(got).position(|(w, g)| w != g);
        assert_eq!(first, None, "case {}: reference and independent implementation differ", case.name);
        assert_eq!(want.len(), got.len());
    }
}
