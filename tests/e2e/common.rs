//! What the process-level tests share: the binary, a real signaling server on a free port, and headless nodes through the harness's client
//! (`lockstep_harness::client`), whose failures become the test's panics.

use std::net::TcpListener;
use std::ops::{Deref, DerefMut};
use std::process::Command;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use lockstep_harness::client::{self, Headless, SignalServer};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_lockstep");

/// A signaling server on loopback, through the harness's client; killed when dropped.
pub struct Signal {
    pub _server: SignalServer,
    pub url: String,
}

pub fn signal_server() -> Signal {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    signal_server_at(port, None)
}

/// A signaling server on `port`, signing resume tokens with the key in `secret` (created if
/// missing), so a server started again with the same file takes its members back.
pub fn signal_server_at(port: u16, secret: Option<&std::path::Path>) -> Signal {
    signal_server_with(port, secret, &[])
}

/// [`signal_server_at`] with more arguments for `lockstep signal` (`--static DIR`).
pub fn signal_server_with(port: u16, secret: Option<&std::path::Path>, extra: &[std::ffi::OsString]) -> Signal {
    let bind = format!("127.0.0.1:{port}");
    let server = SignalServer::start_with(std::path::Path::new(BIN), None, &bind, secret, extra)
        .unwrap_or_else(|e| panic!("lockstep signal starts: {e:#}"));
    Signal { url: server.url(), _server: server }
}

/// One headless node: the harness's client ([`Headless`]), whose failures fail the test.
pub struct Node(Headless);

impl Deref for Node {
    type Target = Headless;
    fn deref(&self) -> &Headless {
        &self.0
    }
}

impl DerefMut for Node {
    fn deref_mut(&mut self) -> &mut Headless {
        &mut self.0
    }
}

impl Node {
    pub fn spawn(signal: &Signal, backend: &str) -> Node {
        Node::spawn_with(signal, backend, &[])
    }

    /// A node asking to join `room`: its id comes with `waiting`.
    pub fn ask_to_join(signal: &Signal, room: &str) -> Node {
        let mut node = Node::spawn_at(&format!("{}?room={room}", signal.url), "cpu");
        let waiting = node.wait_for("waiting", |e| e["event"] == "waiting", 20);
        node.id = waiting["id"].as_u64().unwrap();
        node
    }

    /// Starts a node without waiting for anything.
    pub fn spawn_at(url: &str, backend: &str) -> Node {
        Node::spawn_command(Command::new(BIN), url, backend, &[])
    }

    /// [`Node::spawn`] with more arguments for `lockstep node`.
    pub fn spawn_with(signal: &Signal, backend: &str, extra: &[&str]) -> Node {
        let mut node = Node::spawn_command(Command::new(BIN), &signal.url, backend, extra);
        let connected = node.wait_for("connected", |e| e["event"] == "connected", 20);
        node.id = connected["id"].as_u64().unwrap();
        node
    }

    /// Starts a node inside network namespace `netns` (`lockstep_harness::netns`).
    pub fn spawn_in(netns: &str, url: &str, backend: &str) -> Node {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", netns, BIN]);
        Node::spawn_command(command, url, backend, &[])
    }

    /// `launcher` (the binary, or something that execs it) with the node's arguments.
    fn spawn_command(launcher: Command, url: &str, backend: &str, extra: &[&str]) -> Node {
        let mut command = client::node_command(launcher, url, backend, extra);
        if !extra.contains(&"--ckpt-dir") {
            // A node that must stop saves its state first: never into the source tree.
            command.arg("--ckpt-dir").arg(std::env::temp_dir().join("lockstep-e2e-stops"));
        }
        Node(Headless::spawn(command).expect("lockstep node starts"))
    }

    pub fn command(&mut self, command: Value) {
        self.0.command(&command).unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// Waits for an event matching `pred`, failing after `secs` with everything seen.
    pub fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool, secs: u64) -> Value {
        self.0.wait_for(what, Duration::from_secs(secs), pred).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Like `wait_for`, among the events after the last `restored` one.
    pub fn wait_since_restore(&self, what: &str, pred: impl Fn(&Value) -> bool, secs: u64) -> Value {
        self.0.wait_since_restore(what, Duration::from_secs(secs), pred).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Closes stdin (the node leaves) and waits for the process's exit status.
    pub fn exit_status(&mut self, secs: u64) -> Option<i32> {
        self.0.quit(Duration::from_secs(secs)).unwrap_or_else(|e| panic!("{e:#}"))
    }
}

/// Tests of one file run side by side; tests of different files never overlap (each file's
/// tests were sized for the machine on their own). The guard holds the file's phase.
pub struct Phase;

static PHASE: Mutex<(Option<&'static str>, usize)> = Mutex::new((None, 0));
static PHASE_CHANGED: Condvar = Condvar::new();

/// Waits until no test of another file runs, then holds `file`'s phase until dropped.
pub fn phase(file: &'static str) -> Phase {
    let mut held = PHASE.lock().unwrap_or_else(|p| p.into_inner());
    while held.0.is_some_and(|f| f != file) {
        held = PHASE_CHANGED.wait(held).unwrap_or_else(|p| p.into_inner());
    }
    held.0 = Some(file);
    held.1 += 1;
    Phase
}

impl Drop for Phase {
    fn drop(&mut self) {
        let mut held = PHASE.lock().unwrap_or_else(|p| p.into_inner());
        held.1 -= 1;
        if held.1 == 0 {
            held.0 = None;
            PHASE_CHANGED.notify_all();
        }
    }
}
