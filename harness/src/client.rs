//! The one client of headless nodes and signaling servers, for everything that drives real
//! processes from outside: `lockstep chaos`, `lockstep bench wan` and the process-level tests
//! (`tests/e2e/`).
//!
//! A [`Headless`] is a child process that prints JSON lines (`lockstep node --headless`): a
//! thread collects each line as it comes, stamped with `at_s`, the seconds since this
//! process's harness clock ([`clock`]) — one clock for every node, so events of different
//! nodes compare. Commands go to its stdin. Dropping it ends the process (woken first, if it
//! was suspended). Failures are `anyhow` errors that say what was awaited and what the node
//! said instead; the tests turn them into panics.
//!
//! A [`SignalServer`] is `lockstep signal` on a port of loopback (or inside a network
//! namespace), restartable on the same address with the same resume key, so a server that
//! was killed takes its members back.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use serde_json::Value;

/// The harness's clock: `at_s` of every event counts from its first reading.
pub fn clock() -> Instant {
    static CLOCK: OnceLock<Instant> = OnceLock::new();
    *CLOCK.get_or_init(Instant::now)
}

/// When the harness read `event` (from its `at_s`).
pub fn at(event: &Value) -> Instant {
    clock() + Duration::from_secs_f64(event["at_s"].as_f64().unwrap_or(0.0))
}

/// `lockstep node --headless` on `launcher` (the binary itself, or `ip netns exec NS binary`,
/// which execs it): joining `url` with `backend` on one thread (unless `extra` names
/// `--threads`), repairs asked after 300 ms (a loopback group needs no more), then `extra`.
pub fn node_command(mut launcher: Command, url: &str, backend: &str, extra: &[&str]) -> Command {
    launcher.args(["node", "--headless", "--signal", url, "--backend", backend]);
    if !extra.contains(&"--threads") {
        launcher.args(["--threads", "1"]);
    }
    launcher.args(["--repair-after-ms", "300"]).args(extra);
    launcher
}

/// One headless process: its events as they arrive, and its stdin.
pub struct Headless {
    child: Option<Child>,
    pid: u32,
    stdin: Option<ChildStdin>,
    events: Arc<Mutex<Vec<Value>>>,
    /// The member id it reported (`connected` or `waiting`); 0 until then.
    pub id: u64,
}

impl Headless {
    /// Starts `command` with its stdin and stdout piped (stderr dropped).
    pub fn spawn(mut command: Command) -> anyhow::Result<Headless> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {:?}", command.get_program()))?;
        let stdout = child.stdout.take().context("the process's stdout")?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        clock();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(mut value) = serde_json::from_str::<Value>(&line) {
                    value["at_s"] = clock().elapsed().as_secs_f64().into();
                    sink.lock().unwrap_or_else(|p| p.into_inner()).push(value);
                }
            }
        });
        Ok(Headless { pid: child.id(), stdin: child.stdin.take(), child: Some(child), events, id: 0 })
    }

    /// Starts `command` and waits for its member id: the `connected` event, or `waiting` for a
    /// node that asked to join a room.
    pub fn join(command: Command, within: Duration) -> anyhow::Result<Headless> {
        let mut node = Headless::spawn(command)?;
        let hello = node.wait_for("its id", within, |e| e["event"] == "connected" || e["event"] == "waiting")?;
        node.id = hello["id"].as_u64().context("an id in the welcome")?;
        Ok(node)
    }

    /// Sends one command line.
    pub fn command(&mut self, command: &Value) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("the node's stdin is closed")?;
        writeln!(stdin, "{command}").and_then(|()| stdin.flush()).with_context(|| format!("telling node {}", self.id))
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<Value> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The first event matching `pred`, waiting up to `within`; the error names `what` and
    /// lists everything the node said.
    pub fn wait_for(&self, what: &str, within: Duration, pred: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
        self.wait_among(what, within, Headless::events, pred)
    }

    /// Like [`Headless::wait_for`], among the events after the last `restored` one.
    pub fn wait_since_restore(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        self.wait_among(what, within, Headless::events_since_restore, pred)
    }

    fn wait_among(
        &self,
        what: &str,
        within: Duration,
        among: fn(&Headless) -> Vec<Value>,
        pred: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let started = Instant::now();
        loop {
            if let Some(found) = among(self).into_iter().find(|e| pred(e)) {
                return Ok(found);
            }
            ensure!(
                started.elapsed() < within,
                "node {} never reported {what} within {within:?}; it said:\n{}",
                self.id,
                self.events().iter().map(Value::to_string).collect::<Vec<_>>().join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The events after this node's last `restored` event (all of them if it never restored).
    /// A restore rewinds the step count, so a step reported before it comes again after it
    /// with other weights (the node's data stream does not rewind).
    pub fn events_since_restore(&self) -> Vec<Value> {
        let events = self.events();
        let start = events.iter().rposition(|e| e["event"] == "restored").map_or(0, |i| i + 1);
        events[start..].to_vec()
    }

    /// The `kind` events of the last run started (a node keeps its events across runs, and
    /// every run counts its steps from 1).
    pub fn events_of_last_run(&self, kind: &str) -> Vec<Value> {
        let events = self.events();
        let start = events.iter().rposition(|e| e["event"] == "run-started").unwrap_or(0);
        events[start..].iter().filter(|e| e["event"] == kind).cloned().collect()
    }

    /// Weight hash after each applied step (the later one where a restore repeated a step).
    pub fn hashes(&self) -> BTreeMap<u64, String> {
        weight_hashes(&self.events())
    }

    /// Weight hash after each step applied since the last restore.
    pub fn hashes_since_restore(&self) -> BTreeMap<u64, String> {
        weight_hashes(&self.events_since_restore())
    }

    /// Weight hash after each step of the last run started.
    pub fn hashes_of_last_run(&self) -> BTreeMap<u64, String> {
        weight_hashes(&self.events_of_last_run("weights"))
    }

    /// The last step this node applied (0 before any).
    pub fn last_step(&self) -> u64 {
        self.events().iter().filter(|e| e["event"] == "weights").filter_map(|e| e["step"].as_u64()).max().unwrap_or(0)
    }

    /// The process id (for suspending it, or putting it in a cgroup).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends the process a signal by `kill`'s name for it (`-STOP`, `-CONT`); a process that
    /// is gone cannot take it (nothing to do then).
    pub fn signal(&self, which: &str) {
        let _ = Command::new("kill").args([which, &self.pid.to_string()]).status();
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Tells the node to quit, closes its stdin and waits up to `within` for its exit code
    /// (`None` for a process already killed, or ended by a signal).
    pub fn quit(&mut self, within: Duration) -> anyhow::Result<Option<i32>> {
        let _ = self.command(&serde_json::json!({"cmd": "quit"}));
        self.stdin.take();
        let Some(child) = self.child.as_mut() else { return Ok(None) };
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(status.code());
            }
            ensure!(started.elapsed() < within, "node {} did not exit within {within:?}", self.id);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Headless {
    fn drop(&mut self) {
        self.stdin.take();
        // A suspended process dies of SIGKILL too, but its children of `ip netns exec` would
        // not see it: wake it first.
        if self.child.is_some() {
            self.signal("-CONT");
        }
        self.kill();
    }
}

/// Weight hash after each step the `weights` events among `events` report.
pub fn weight_hashes(events: &[Value]) -> BTreeMap<u64, String> {
    events
        .iter()
        .filter(|e| e["event"] == "weights")
        .filter_map(|e| Some((e["step"].as_u64()?, e["whash"].as_str()?.to_string())))
        .collect()
}

/// `lockstep signal` on one address, restartable there with the same resume key.
pub struct SignalServer {
    child: Option<Child>,
    bin: PathBuf,
    /// `ip netns exec NS`, or none for this process's own network.
    netns: Option<String>,
    bind: String,
    secret: Option<PathBuf>,
    /// More arguments for `lockstep signal` (`--static DIR`).
    extra: Vec<std::ffi::OsString>,
}

impl SignalServer {
    /// A server on a free port of loopback, signing resume tokens with the key in `secret`
    /// (created if missing) when one is given.
    pub fn on_loopback(bin: &Path, secret: Option<&Path>) -> anyhow::Result<SignalServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        SignalServer::start(bin, None, &format!("127.0.0.1:{port}"), secret)
    }

    /// A server bound to `bind`, inside network namespace `netns` if one is named.
    pub fn start(bin: &Path, netns: Option<&str>, bind: &str, secret: Option<&Path>) -> anyhow::Result<SignalServer> {
        SignalServer::start_with(bin, netns, bind, secret, &[])
    }

    /// [`SignalServer::start`] with more arguments for `lockstep signal` (`--static DIR`).
    pub fn start_with(
        bin: &Path,
        netns: Option<&str>,
        bind: &str,
        secret: Option<&Path>,
        extra: &[std::ffi::OsString],
    ) -> anyhow::Result<SignalServer> {
        let mut server = SignalServer {
            child: None,
            bin: bin.to_path_buf(),
            netns: netns.map(str::to_string),
            bind: bind.to_string(),
            secret: secret.map(Path::to_path_buf),
            extra: extra.to_vec(),
        };
        server.restart()?;
        Ok(server)
    }

    /// The WebSocket URL members join at.
    pub fn url(&self) -> String {
        format!("ws://{}/ws", self.bind)
    }

    /// Whether the server is running (not killed by [`SignalServer::kill`]).
    pub fn is_up(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the server if it is not running, and waits for it to listen.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            return Ok(());
        }
        let mut command = match &self.netns {
            Some(ns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", ns]).arg(&self.bin);
                command
            }
            None => Command::new(&self.bin),
        };
        command.args(["signal", "--bind", &self.bind, "--no-data"]);
        if let Some(secret) = &self.secret {
            command.arg("--resume-secret").arg(secret);
        }
        command.args(&self.extra);
        let mut child =
            command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().context("starting the signaling server")?;
        let stdout = child.stdout.take().context("the server's stdout")?;
        self.child = Some(child);
        // Its first line says it listens (inside a namespace this process cannot connect to
        // see); the rest is drained so the server never blocks on a full pipe.
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        std::thread::spawn(move || lines.for_each(drop));
        if !first.contains("listening") {
            self.kill();
            anyhow::bail!("the signaling server at {} did not listen: {first:?}", self.bind);
        }
        Ok(())
    }

    /// Kills the server (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for SignalServer {
    fn drop(&mut self) {
        self.kill();
    }
}
