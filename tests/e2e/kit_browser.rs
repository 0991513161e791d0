//! The inference kit in a real browser: headless Chromium (Debian `chromium`) driven through
//! ChromeDriver types a prompt, presses Generate, and must produce exactly the bytes
//! `lockstep generate` produces; the page's logits must equal the Rust forward pass bit for bit.

use std::path::{Path, PathBuf};
use std::process::Command;

use lockstep_backends::UnitsGemm;
use lockstep_backends::{resolve_plugin, Plugin};
use lockstep_node::checkpoint;
use lockstep_node::config::VOCAB;
use lockstep_node::model::Model;
use lockstep_node::params::Layout;

fn lockstep(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lockstep")).args(args).output().expect("lockstep runs");
    assert!(out.status.success(), "lockstep {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn workdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lockstep-kit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/browser/kit_webdriver.py")
}

#[test]
fn kit_in_chromium_generates_what_lockstep_generate_does() {
    let _phase = crate::common::phase(module_path!());
    let dir = workdir();
    let ckpt = dir.join("kit.ckpt");
    let kit = dir.join("kit.html");
    let ckpt_s = ckpt.to_str().unwrap();
    lockstep(&[
        "train",
        "--width",
        "32",
        "--context",
        "32",
        "--layers",
        "2",
        "--heads",
        "2",
        "--batch",
        "8",
        "--steps",
        "150",
        "--lr",
        "0.006",
        "--seed",
        "5",
        "--eval-batches",
        "0",
        "--ckpt-out",
        ckpt_s,
    ]);
    let prompt = "We hold these truths";
    let generated: serde_json::Value = serde_json::from_str(&lockstep(&[
        "generate", "--ckpt", ckpt_s, "--prompt", prompt, "--tokens", "48", "--json",
    ]))
    .unwrap();
    lockstep(&["kit", "--ckpt", ckpt_s, "--out", kit.to_str().unwrap()]);

    // Windows to compare logits on: a short one, and one longer than the context.
    let long: Vec<u8> = b"And God said, Let there be light: and there was light. And".to_vec();
    let windows = vec![b"The ".to_vec(), long[long.len() - 32..].to_vec()];
    let windows_file = dir.join("windows.json");
    std::fs::write(&windows_file, serde_json::to_string(&windows).unwrap()).unwrap();

    let out = Command::new("python3")
        .arg(script())
        .args([kit.to_str().unwrap(), prompt, "48", windows_file.to_str().unwrap()])
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "browser driver failed: {}", String::from_utf8_lossy(&out.stderr));
    let page: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(page["status"], "done", "{page}");
    assert_eq!(page["bytes_hex"], generated["bytes_hex"], "page and CLI generated different bytes");
    assert_eq!(page["bytes_hex"].as_str().unwrap().len(), 96);

    let state = checkpoint::load(&ckpt, None).unwrap();
    let model = Model::new(Layout::new(state.run.model));
    let plugin = Plugin::load(&resolve_plugin("cpu").unwrap()).unwrap();
    let mut gemm = UnitsGemm::new(plugin.instantiate(1).unwrap());
    for (window, page_hex) in windows.iter().zip(page["logits"].as_array().unwrap()) {
        let fwd = model.forward(&mut gemm, &state.weights, window, 1, window.len()).unwrap();
        let last = &fwd.logits[(window.len() - 1) * VOCAB..];
        let hex: String = last.iter().map(|v| format!("{:08x}", v.to_bits())).collect();
        assert_eq!(page_hex.as_str().unwrap(), hex, "logits differ for window {:?}", String::from_utf8_lossy(window));
    }
}
