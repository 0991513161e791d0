//! `lockstep chaos`, short: the fault campaign of `docs/PERFORMANCE.md` (reliability) at CI
//! size, on real processes.

use std::process::Command;

use serde_json::Value;

use crate::common::BIN;

/// Ten seeded episodes of overlapping faults — members and leaders suspended, nodes killed and
/// new ones started, the links between two halves cut and healed, the signaling server killed
/// and started again, quits and joins — in `every-step` and `outer:2` int8: no two nodes hold
/// different weights for one step (tentative steps aside), no live node stays stuck past the
/// bound after the last fault heals, no guard stops.
#[test]
fn a_short_fault_campaign_finds_no_fork_and_no_hang() {
    let _phase = crate::common::phase(module_path!());
    let out = Command::new(BIN)
        .args(["chaos", "--episodes", "10", "--seed", "100", "--window-s", "4", "--max-fault-s", "3"])
        .args(["--long-sleep-pct", "0", "--max-faults", "3", "--progress-bound-s", "60", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let summary = lines.iter().find(|l| l["summary"] == true).unwrap_or_else(|| panic!("no summary:\n{stdout}"));
    assert!(out.status.success(), "{stdout}");
    assert_eq!(summary["episodes"], 10, "{summary}");
    for key in ["forks", "hangs", "guard_stops", "errors"] {
        assert_eq!(summary[key], 0, "{key}: {stdout}");
    }
    let episodes: Vec<&Value> = lines.iter().filter(|l| l.get("seed").is_some()).collect();
    assert_eq!(episodes.len(), 10);
    assert!(episodes.iter().all(|e| e["ok"] == true && e["steps"].as_u64() > Some(3)), "{stdout}");
    // Both modes and every kind of fault were played.
    let faults: String = episodes.iter().flat_map(|e| e["faults"].as_array().unwrap()).map(|f| f.to_string()).collect();
    for kind in ["suspend", "kill", "cut halves", "signal down", "quit"] {
        assert!(faults.contains(kind), "no {kind} among {faults}");
    }
    assert!(episodes.iter().any(|e| e["mode"] == "every-step") && episodes.iter().any(|e| e["mode"] == "outer:2 int8"));
}
