//! The fault campaign's short form, in every CI run: `lockstep chaos` on real processes, each
//! node in a network namespace of its own on one bridge — suspensions (some past the links'
//! life), kills and newcomers, cut halves and one-way cuts and bursts of packet loss dropped by
//! nftables on the bridge, the signaling server down and back, quits and joins, in all four sync
//! modes — must end with no fork, no hang and no guard stop, every time.

use std::process::Command;

use crate::common::BIN;

#[test]
fn a_short_fault_campaign_never_forks_and_never_hangs() {
    let _phase = crate::common::phase(module_path!());
    let out = Command::new(BIN)
        .args(["chaos", "--episodes", "20", "--jobs", "2", "--seed", "2000", "--json"])
        .args(["--max-fault-s", "4", "--window-s", "6", "--long-sleep-pct", "10", "--progress-bound-s", "60"])
        .args(["--election-ms", "1000", "--network", "netns"])
        .output()
        .expect("lockstep chaos runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let summary = lines.iter().find(|l| l["summary"] == true).unwrap_or_else(|| panic!("no summary:\n{text}"));
    let failed: Vec<&serde_json::Value> = lines.iter().filter(|l| l["ok"] == false).collect();
    assert!(out.status.success() && failed.is_empty(), "failed episodes: {failed:#?}\n{summary}");
    assert_eq!(summary["episodes"], 20, "{summary}");
    assert_eq!((summary["forks"].as_u64(), summary["hangs"].as_u64()), (Some(0), Some(0)), "{summary}");
    assert_eq!(summary["guard_stops"], 0, "{summary}");
    println!("chaos: {summary}");
}
