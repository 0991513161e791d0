//! The fault campaign's short form, in every CI run: `lockstep chaos` on real processes, each
//! node in a network namespace of its own on one bridge — suspensions (some past the links'
//! life), kills and newcomers, cut halves and one-way cuts and bursts of packet loss dropped by
//! nftables on the bridge, the signaling server down and back, quits and joins, in the sync
//! modes the campaign draws (every-step with f32, int8 or the sparse sync's `topk:64` picks, the
//! packed ones summed by the mesh or by chunk owners; `outer:2` plain, overlapped or elastic) —
//! must end with no fork, no hang and no guard stop, every time.

use std::process::Command;

use crate::common::BIN;

#[test]
fn a_short_fault_campaign_never_forks_and_never_hangs() {
    let _phase = crate::common::phase(module_path!());
    let keep = std::env::temp_dir().join(format!("lockstep-chaos-kept-{}", std::process::id()));
    let out = Command::new(BIN)
        .args(["chaos", "--episodes", "20", "--jobs", "2", "--seed", "2000", "--json"])
        .args(["--max-fault-s", "4", "--window-s", "6", "--long-sleep-pct", "10", "--progress-bound-s", "60"])
        .args(["--election-ms", "1000", "--network", "netns"])
        .arg("--keep")
        .arg(&keep)
        .output()
        .expect("lockstep chaos runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let summary = lines.iter().find(|l| l["summary"] == true).unwrap_or_else(|| panic!("no summary:\n{text}"));
    let failed: Vec<&serde_json::Value> = lines.iter().filter(|l| l["ok"] == false).collect();
    assert!(
        out.status.success() && failed.is_empty(),
        "failed episodes: {failed:#?}\n{summary}\n{}",
        what_the_nodes_said(&keep)
    );
    let _ = std::fs::remove_dir_all(&keep);
    assert_eq!(summary["episodes"], 20, "{summary}");
    assert_eq!((summary["forks"].as_u64(), summary["hangs"].as_u64()), (Some(0), Some(0)), "{summary}");
    assert_eq!(summary["guard_stops"], 0, "{summary}");
    // The seed's twenty episodes draw every mode: each is tried under faults in every CI run.
    let modes: std::collections::BTreeSet<&str> = lines.iter().filter_map(|l| l["mode"].as_str()).collect();
    let every = [
        "every-step",
        "every-step int8",
        "every-step topk:64 sign:0.999",
        "every-step int8 owners",
        "every-step topk:64 sign:0.999 owners",
        "outer:2 int8",
        "outer:2 int8 overlap 1",
        "outer:4 int8 elastic",
    ];
    assert_eq!(modes, every.into_iter().collect(), "{summary}");
    println!("chaos: {summary}");
}

/// A failed episode's nodes' reports (`lockstep chaos --keep`), the per-step events left out:
/// what a CI log needs to tell a hang's cause (elections, cuts, accusations, resumes).
fn what_the_nodes_said(keep: &std::path::Path) -> String {
    const ROUTINE: [&str; 7] = ["ignored", "link", "step", "weights", "audited", "info", "peer-info"];
    let mut said = String::new();
    let files = walk(keep);
    for file in files.iter().filter(|f| f.extension().is_some_and(|e| e == "jsonl")) {
        said += &format!("== {}\n", file.display());
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let events = text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
        let telling: Vec<String> = events
            .filter(|e| !ROUTINE.iter().any(|r| e["event"] == *r))
            .map(|e| e.to_string().chars().take(300).collect())
            .collect();
        for line in telling.iter().rev().take(80).rev() {
            said += line;
            said.push('\n');
        }
    }
    said
}

/// Every file under `dir`, in order.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found.sort();
    found
}
