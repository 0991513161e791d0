//! The console end to end: the real `lockstep node` in a real terminal (tmux), driven with
//! keystrokes and read back with `capture-pane`, next to a real signaling server and a real
//! headless joiner over WebRTC on 127.0.0.1.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{signal_server, Node, BIN};

/// A tmux server of our own (its own socket), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().expect("tmux runs (apt-get install tmux)")
    }

    fn screen(&self) -> String {
        let out = self.run(&["capture-pane", "-p", "-t", "console"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        for key in keys {
            let out = self.run(&["send-keys", "-t", "console", key]);
            assert!(out.status.success(), "tmux send-keys {key}: {}", String::from_utf8_lossy(&out.stderr));
            std::thread::sleep(Duration::from_millis(150));
        }
    }

    /// Waits until the screen satisfies `pred`; fails with the last screen.
    fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool, secs: u64) -> String {
        let started = Instant::now();
        loop {
            let screen = self.screen();
            if pred(&screen) {
                return screen;
            }
            assert!(
                started.elapsed() < Duration::from_secs(secs),
                "the console never showed {what}; it shows:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn alive(&self) -> bool {
        self.run(&["has-session", "-t", "console"]).status.success()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

fn checkpoints(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "ckpt")).collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// `0x…` after `whash ` in a line of the screen that contains `marker`.
fn whash_on_screen(screen: &str, marker: &str) -> Option<String> {
    let line = screen.lines().find(|l| l.contains(marker))?;
    let at = line.find("whash 0x")? + "whash ".len();
    Some(line[at..at + 10].to_string())
}

#[test]
fn the_console_approves_a_join_swaps_its_backend_and_broadcasts_a_checkpoint() {
    let _phase = crate::common::phase(module_path!());
    let signal = signal_server();
    let room = format!("{}?room=e2e", signal.url);
    let dir = std::env::temp_dir().join(format!("lockstep-console-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let tmux = Tmux { socket: format!("lockstep-e2e-{}", std::process::id()) };
    let command = format!(
        "{BIN} node --signal '{room}' --backend cpu --threads 1 --ckpt-dir '{}' \
         --steps 100000 --width 32 --context 32 --layers 1 --heads 2 --batch 4 2>'{}'",
        dir.display(),
        dir.join("stderr.txt").display()
    );
    let out = tmux.run(&["new-session", "-d", "-s", "console", "-x", "120", "-y", "40", &command]);
    assert!(out.status.success(), "tmux new-session: {}", String::from_utf8_lossy(&out.stderr));
    let screen = tmux.wait_for("the room", |s| s.contains("| room e2e |") && s.contains("(host)"), 60);
    assert!(screen.contains("Roster") && screen.contains("Step health") && screen.contains("Checkpoints"));

    // A joiner asks; the console shows the request with its id and address; `y` admits it.
    let joiner = Node::ask_to_join(&signal, "e2e");
    let joiner_id = joiner.id;
    tmux.wait_for(
        "the join request",
        |s| s.contains("Join request") && s.contains(&format!("Node {joiner_id} at 127.0.0.1")),
        30,
    );
    tmux.keys(&["y"]);
    joiner.wait_for("admission", |e| e["event"] == "connected", 30);
    let channel = joiner.wait_for("an open channel", |e| e["event"] == "channel-open", 30);
    let console_id = channel["peer"].as_u64().unwrap();

    // Start a run from the console (it leads); the joiner trains.
    tmux.wait_for("the joiner's channel", |s| s.contains(&format!("channel to node {joiner_id} open")), 30);
    tmux.keys(&["s"]);
    tmux.wait_for("the start dialog", |s| s.contains("Start a run"), 10);
    tmux.keys(&["y"]);
    joiner.wait_for("run-started", |e| e["event"] == "run-started" && e["leader"] == console_id, 30);
    joiner.wait_for("training", |e| e["event"] == "weights" && e["step"].as_u64() >= Some(5), 60);

    // Hot-swap to the LUT kernel (lavapipe here): gated, then in use from a step boundary; the
    // joiner hears of it and training goes on in agreement.
    tmux.keys(&["w"]);
    tmux.wait_for("the swap dialog", |s| s.contains("Swap backend"), 10);
    tmux.keys(&["Down", "Enter"]);
    let screen = tmux.wait_for("the swap", |s| s.contains("now computing with `lut`"), 120);
    assert!(screen.lines().next().unwrap().contains("| lut |"), "the header names the new backend:\n{screen}");
    joiner.wait_for(
        "the console's new backend",
        |e| e["event"] == "peer-info" && e["peer"] == console_id && e["backend"] == "lut",
        30,
    );
    let swapped_at = joiner.last_step();
    joiner.wait_for(
        "steps after the swap",
        |e| e["event"] == "weights" && e["step"].as_u64() >= Some(swapped_at + 5),
        60,
    );

    // Save a checkpoint, then broadcast it: every node restores to its hash.
    tmux.keys(&["c"]);
    tmux.wait_for("the saved checkpoint", |s| s.contains("node") && s.contains(".ckpt (step"), 30);
    let files = checkpoints(&dir);
    assert_eq!(files.len(), 1, "one checkpoint in {}", dir.display());
    let state = lockstep_node::checkpoint::load(&files[0], None).expect("the saved checkpoint loads");
    let expected = format!("{:#010x}", lockstep_node::params::weight_hash(&state.weights));
    tmux.keys(&["b"]);
    tmux.wait_for("the broadcast dialog", |s| s.contains("Broadcast checkpoint"), 10);
    tmux.keys(&["y"]);
    let restored = joiner.wait_for("the restore", |e| e["event"] == "restored", 30);
    assert_eq!(restored["whash"], expected.as_str(), "the joiner holds the checkpoint's weights");
    assert_eq!(restored["step"].as_u64(), Some(u64::from(state.step)));
    let screen = tmux.wait_for("the console's restore", |s| s.contains("restored: step"), 30);
    eprintln!("the console after the broadcast:\n{screen}");
    assert_eq!(
        whash_on_screen(&screen, "restored: step").as_deref(),
        Some(expected.as_str()),
        "the console node:\n{screen}"
    );
    joiner.wait_since_restore(
        "training after the restore",
        |e| e["event"] == "weights" && e["step"].as_u64() >= Some(u64::from(state.step) + 3),
        60,
    );
    assert!(!joiner.events().iter().any(|e| e["event"] == "guard-stopped"), "the guard never stopped the run");

    // `q` asks during a run; `y` leaves.
    tmux.keys(&["q"]);
    tmux.wait_for("the quit dialog", |s| s.contains("Leave the group?"), 10);
    tmux.keys(&["y"]);
    let started = Instant::now();
    while tmux.alive() {
        assert!(started.elapsed() < Duration::from_secs(20), "the console did not exit:\n{}", tmux.screen());
        std::thread::sleep(Duration::from_millis(100));
    }
    joiner.wait_for("the console leaving", |e| e["event"] == "peer-left" && e["peer"] == console_id, 30);
    let _ = std::fs::remove_dir_all(&dir);
}
