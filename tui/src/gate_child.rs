//! The gate in a child process: a plugin that segfaults, aborts, or hangs while it is gated
//! becomes a REJECTED verdict naming the signal or the timeout, and the process that asked —
//! `lockstep gate`, a node, the console in the middle of a hot-swap — keeps running.
//!
//! The parent runs `lockstep gate-child NAME …` (this binary, a hidden subcommand) and reads its
//! stdout, one JSON object per line: `{"loaded": …}` once the plugin is open (or
//! `{"not-loadable": why}`), `{"progress": …}` before each case, and `{"report": …}` with every
//! case's outcome and the verdict. What the child's exit says decides the rest: a report and a
//! clean exit is the verdict; death by a signal, a timeout (the child is killed) or an exit
//! without a report is a rejection, naming the case that was running.
//!
//! Inside the child the gate also guards every output the plugin writes (the host's `Backend`
//! surrounds each with canary words): a write one element past the output is a rejection too.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lockstep_backends::gate::GateProgress;
use lockstep_node::verdict::Verdict;
use serde_json::{json, Value};

/// Seconds a gate may take before its child is killed and the plugin rejected, unless the
/// command line says otherwise (lavapipe gates a GPU plugin in ~20 s on two cores).
pub const DEFAULT_TIMEOUT_S: u64 = 300;

/// What a gate in a child process found.
pub struct ChildGate {
    pub verdict: Verdict,
    /// The plugin's name, file, description and device, once it loaded.
    pub loaded: Option<Value>,
    /// The child's report, when it finished one.
    pub report: Option<Value>,
    /// The verdict as one line (the report's, or what the parent saw).
    pub verdict_line: String,
}

/// A signal's usual name.
fn signal_name(signal: i32) -> &'static str {
    match signal {
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        15 => "SIGTERM",
        _ => "a signal",
    }
}

/// How the child opens the plugin: `backend::Opening`'s flags and the device choice, as the
/// child's command line.
pub struct ChildOptions {
    pub threads: u32,
    pub hardware_only: bool,
    pub fresh_copy: bool,
    /// `--gpu-adapter …`, `--gpu-tile …` as the asking process has them, and anything else
    /// for the child's command line (`--phase SEED`).
    pub extra_args: Vec<String>,
}

/// Gates `name` in a child process (see the module docs).
pub fn gate_in_child(
    name: &str,
    options: &ChildOptions,
    limit: Duration,
    progress: &mut dyn FnMut(GateProgress<'_>),
) -> ChildGate {
    let not_loadable = |why: String| ChildGate {
        verdict_line: format!("NOT LOADABLE: {why}"),
        verdict: Verdict::NotLoadable { why },
        loaded: None,
        report: None,
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return not_loadable(format!("cannot find this program to run the gate in: {e}")),
    };
    let mut command = Command::new(exe);
    command.arg("gate-child").arg(name).arg("--threads").arg(options.threads.to_string());
    if options.hardware_only {
        command.arg("--hardware-only");
    }
    if options.fresh_copy {
        command.arg("--fresh-copy");
    }
    command.args(&options.extra_args);
    die_with_parent(&mut command);
    let mut child = match command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn() {
        Ok(child) => child,
        Err(e) => return not_loadable(format!("cannot start the gate's process: {e}")),
    };
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let (lines_tx, lines) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr_tail = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        let lines: Vec<&str> = text.lines().filter(|l| !l.contains("XDG_RUNTIME_DIR")).collect();
        lines[lines.len().saturating_sub(3)..].join(" | ")
    });
    let started = Instant::now();
    let (mut loaded, mut report, mut case, mut timed_out) = (None, None, String::from("loading the plugin"), false);
    loop {
        let left = limit.saturating_sub(started.elapsed());
        match lines.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok(line) => {
                let Ok(value) = serde_json::from_str::<Value>(&line) else { continue };
                if let Some(why) = value.get("not-loadable").and_then(Value::as_str) {
                    let _ = child.wait();
                    return not_loadable(why.to_string());
                }
                if let Some(p) = value.get("progress") {
                    case = p["case"].as_str().unwrap_or("?").to_string();
                    let done = p["done"].as_u64().unwrap_or(0) as usize;
                    let total = p["total"].as_u64().unwrap_or(0) as usize;
                    progress(GateProgress { done, total, case: &case });
                }
                if let Some(l) = value.get("loaded") {
                    loaded = Some(l.clone());
                }
                if let Some(r) = value.get("report") {
                    report = Some(r.clone());
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                let _ = child.kill();
                break;
            }
        }
    }
    let status = child.wait();
    let tail = stderr_tail.join().unwrap_or_default();
    let name_of = |loaded: &Option<Value>| loaded.as_ref().and_then(|l| l["name"].as_str()).unwrap_or(name).to_string();
    let rejected = |detail: String| {
        let line = format!("REJECTED: backend `{}` failed case `{case}`: {detail}", name_of(&loaded));
        ChildGate {
            verdict: Verdict::Rejected { case: case.clone(), detail },
            loaded: loaded.clone(),
            report: None,
            verdict_line: line,
        }
    };
    if timed_out {
        return rejected(format!(
            "no verdict within {} s: the plugin hung (the gate's process was killed)",
            limit.as_secs()
        ));
    }
    #[cfg(unix)]
    if let Ok(Some(signal)) = status.as_ref().map(std::os::unix::process::ExitStatusExt::signal) {
        return rejected(format!(
            "the plugin killed the gate's process with {} ({signal}){}",
            signal_name(signal),
            if tail.is_empty() { String::new() } else { format!("; it said: {tail}") }
        ));
    }
    match report {
        Some(report) => {
            let verdict = verdict_from_json(&report["verdict"]);
            ChildGate {
                verdict,
                loaded,
                verdict_line: report["verdict_line"].as_str().unwrap_or("").to_string(),
                report: Some(report),
            }
        }
        None => rejected(format!(
            "the gate's process ended ({}) without a verdict{}",
            status.map_or_else(|e| e.to_string(), |s| s.to_string()),
            if tail.is_empty() { String::new() } else { format!("; it said: {tail}") }
        )),
    }
}

/// A verdict as the child reports it (`outcome` and its fields; the headless stream adds
/// `text`).
pub fn verdict_to_json(verdict: &Verdict) -> Value {
    match verdict {
        Verdict::Admitted { cases } => json!({"outcome": "admitted", "cases": cases}),
        Verdict::Rejected { case, detail } => json!({"outcome": "rejected", "case": case, "detail": detail}),
        Verdict::NotLoadable { why } => json!({"outcome": "not-loadable", "why": why}),
    }
}

/// The inverse of [`verdict_to_json`].
fn verdict_from_json(v: &Value) -> Verdict {
    let text = |key: &str| v[key].as_str().unwrap_or("").to_string();
    match v["outcome"].as_str() {
        Some("admitted") => Verdict::Admitted { cases: v["cases"].as_u64().unwrap_or(0) as u32 },
        Some("rejected") => Verdict::Rejected { case: text("case"), detail: text("detail") },
        _ => Verdict::NotLoadable { why: text("why") },
    }
}

/// The gate's child dies with the process that started it: a node killed while gating a plugin
/// (the fault campaign kills them) left its child computing the battery for up to a minute, on
/// cores the next test needed. (Linux delivers it when the thread that started the child ends:
/// [`gate_in_child`] waits for the child on that thread.)
#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    extern "C" {
        fn prctl(option: std::ffi::c_int, ...) -> std::ffi::c_int;
    }
    const PR_SET_PDEATHSIG: std::ffi::c_int = 1;
    const SIGKILL: std::ffi::c_ulong = 9;
    // SAFETY: the closure runs in the child between fork and exec, and calls only prctl, which
    // is async-signal-safe and touches no memory of ours.
    unsafe {
        command.pre_exec(|| {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_: &mut Command) {}
