//! `lockstep node --headless`: events go to stdout, one JSON object per line; commands come
//! from stdin, one JSON object per line. `docs/PROTOCOL.md` lists both. The JSON format of
//! events is defined here, at the edge, from the typed `lockstep_mesh::Report`.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use lockstep_mesh::{CheckpointTarget, Command, Report, SwapProgress};
use lockstep_node::admission::{AtRunShapes, ShapesRefused};
use lockstep_node::config::RunConfig;
use lockstep_node::session::{DropReason, Event};
use lockstep_node::settings;
use lockstep_node::verdict::Verdict;
use lockstep_node::wire::{Evidence, PeerId, Removal};
use serde_json::{json, Value};

use crate::backend::Opening;
use crate::node_runtime::{exit_status, prepare, read_checkpoint, MeshArgs, NodeHandle, Prepared};

/// A gate verdict as JSON: `outcome` (`admitted`, `rejected`, `not-loadable`), its fields, and
/// `text`, the sentence a person reads.
pub fn verdict_json(verdict: &Verdict) -> Value {
    let mut value = crate::gate_child::verdict_to_json(verdict);
    value["text"] = verdict.to_string().into();
    value
}

/// One report as the JSON object `--headless` prints.
pub fn report_json(report: &Report) -> Value {
    let hex = |v: u32| format!("{v:#010x}");
    match report {
        Report::Connected { id, members, group, host } => {
            json!({"event": "connected", "id": id, "members": members, "group": group, "host": host})
        }
        Report::Waiting { id, room } => json!({"event": "waiting", "id": id, "room": room}),
        Report::JoinRequest { peer, address } => {
            json!({"event": "join-request", "peer": peer, "address": address})
        }
        Report::HostChanged(host) => json!({"event": "host-changed", "host": host}),
        Report::Denied(reason) => json!({"event": "denied", "reason": reason}),
        Report::SignalPeerLeft(peer) => json!({"event": "signal-peer-left", "peer": peer}),
        Report::PeerInfo { peer, backend, verdict } => {
            json!({"event": "peer-info", "peer": peer, "backend": backend, "verdict": verdict_json(verdict)})
        }
        Report::Link { peer, rtt_ms, bytes_in, bytes_out } => {
            json!({"event": "link", "peer": peer, "rtt_ms": rtt_ms, "bytes_in": bytes_in, "bytes_out": bytes_out})
        }
        Report::LinkSilent { peer, silent_ms } => json!({"event": "link-silent", "peer": peer, "silent_ms": silent_ms}),
        Report::LinkRetry { peer, retry_ms } => json!({"event": "link-retry", "peer": peer, "retry_ms": retry_ms}),
        Report::Swap(SwapProgress::Gating { backend, done, total }) => {
            json!({"event": "swap-gating", "backend": backend, "done": done, "total": total})
        }
        Report::Swap(SwapProgress::Staged { backend, verdict }) => {
            json!({"event": "swap-staged", "backend": backend, "verdict": verdict_json(verdict)})
        }
        Report::Swap(SwapProgress::Refused { backend, verdict }) => {
            json!({"event": "swap-refused", "backend": backend, "verdict": verdict_json(verdict),
                    "why": verdict.to_string()})
        }
        Report::AtRunShapes { backend, verdict } => at_run_shapes_json(backend, verdict),
        Report::BackendSwapped(change) => json!({"event": "swapped", "backend": change.backend,
                "verdict": verdict_json(&change.verdict), "step": change.step}),
        Report::CheckpointSaved { path, step, whash } => json!({"event": "checkpoint-saved",
                "path": path.display().to_string(), "step": step, "whash": hex(*whash)}),
        Report::ChannelOpen(peer) => json!({"event": "channel-open", "peer": peer}),
        Report::Applied { step, whash, timing } => json!({"event": "weights", "step": step, "whash": hex(*whash),
                "audited": timing.audits.audited, "audits_matched": timing.audits.matched,
                "audits_skipped": timing.audits.skipped, "audits_prefetched": timing.audits.prefetched,
                "audits_derived": timing.audits.derived,
                "audits_linked": timing.audits.linked, "audit_ms": timing.audit_seconds * 1e3,
                "sums_checked": timing.audits.sums_checked, "sums_failed": timing.audits.sums_failed,
                "sums_unchecked": timing.audits.sums_unchecked,
                "compute_ms": timing.compute * 1e3, "hash_guard_ms": timing.hash_guard * 1e3,
                "exchange_ms": timing.exchange * 1e3, "sent_bytes": timing.sent_bytes, "audit_bytes": timing.audit_bytes,
                "utilization": timing.utilization()}),
        Report::Restored { step, whash } => json!({"event": "restored", "step": step, "whash": hex(*whash)}),
        Report::Warning(message) => json!({"event": "warning", "message": message}),
        Report::RogueBegan { step } => json!({"event": "rogue-began", "step": step}),
        Report::SignalLost { why, retry_ms } => json!({"event": "signal-lost", "why": why, "retry_ms": retry_ms}),
        Report::SignalRestored { group, host } => json!({"event": "signal-restored", "group": group, "host": host}),
        Report::Session(event) => match event {
            Event::PeerJoined(p) => json!({"event": "peer-joined", "peer": p}),
            Event::PeerLeft(p) => json!({"event": "peer-left", "peer": p}),
            Event::Leader { peer, term } => json!({"event": "leader", "peer": peer, "term": term}),
            Event::Observer(p) => json!({"event": "observer", "peer": p}),
            Event::NoMajority { reach, voters, term } => {
                json!({"event": "no-majority", "reach": reach, "voters": voters, "term": term})
            }
            Event::Members { voters, learners, index } => {
                json!({"event": "members", "voters": voters, "learners": learners, "index": index})
            }
            Event::RunStarted { leader, settings } => {
                let mut fields = settings_json(settings);
                fields.insert("event".into(), json!("run-started"));
                fields.insert("leader".into(), json!(leader));
                fields.insert("syncs".into(), json!(settings.syncs()));
                fields.insert("corpus".into(), json!(format!("{:#018x}", settings.corpus)));
                Value::Object(fields)
            }
            Event::StepApplied { step, loss, peers, whash, weights, term, index } => {
                let mut fields = json!({"event": "step", "step": step, "loss": loss, "peers": peers.len(),
                    "roster": peers, "whash_before": hex(*whash), "term": term, "index": index});
                if !weights.is_empty() {
                    // Elastic windows: [peer, inner steps] per roster member, in roster order.
                    fields["weights"] = json!(weights);
                }
                fields
            }
            Event::Undone { step } => json!({"event": "undone", "step": step}),
            Event::RepairRequested { step, peer } => {
                json!({"event": "repair-requested", "step": step, "peer": peer})
            }
            Event::Repaired { step, peer } => json!({"event": "repaired", "step": step, "peer": peer}),
            Event::RepairServed { step, peer, to } => {
                json!({"event": "repair-served", "step": step, "peer": peer, "to": to})
            }
            Event::Resumed { step } => json!({"event": "resumed", "step": step}),
            Event::CatchingUp { applied, committed } => {
                json!({"event": "catching-up", "applied": applied, "committed": committed})
            }
            Event::Slept { ms } => json!({"event": "slept", "ms": ms}),
            Event::Behind { step, steps, of } => json!({"event": "behind", "step": step, "steps": steps, "of": of}),
            Event::PeerLeaving(p) => json!({"event": "peer-leaving", "peer": p}),
            Event::CheckpointRestored { from, step } => {
                json!({"event": "checkpoint-restored", "from": from, "step": step})
            }
            Event::GuardStopped(f) => json!({"event": "guard-stopped", "step": f.step,
                    "weight_mismatch": f.weight_mismatch, "probe_mismatch": f.probe_mismatch,
                    "message": f.to_string()}),
            Event::RunFinished { step } => json!({"event": "run-finished", "step": step}),
            Event::Ignored { from, why } => json!({"event": "ignored", "from": from, "why": why.to_string()}),
            Event::Dropped { peer, step, why } => {
                json!({"event": "dropped", "peer": peer, "step": step, "kind": drop_kind(why), "why": why.to_string()})
            }
            Event::Readmitted { peer, steps } => json!({"event": "readmitted", "peer": peer, "steps": steps}),
            Event::PushRefused { from } => json!({"event": "push-refused", "from": from,
                    "why": "a checkpoint push from a member that is not the run's leader"}),
            Event::ContributionRefused { peer, step, why } => {
                json!({"event": "contribution-refused", "peer": peer, "step": step, "why": why.to_string(),
                    "index": why.index})
            }
            Event::Removed { step, why } => json!({"event": "removed", "step": step, "why": why.to_string()}),
            Event::Audited { step, target } => json!({"event": "audited", "step": step, "target": target}),
            Event::Accused { step, target, by, evidence } => {
                let mut fields = json!({"event": "accused", "step": step, "target": target, "by": by,
                    "evidence": evidence.to_string()});
                evidence_json(&mut fields, evidence);
                fields
            }
            Event::Verdict(verdict) => {
                let mut fields = json!({"event": "verdict", "step": verdict.step, "target": verdict.target,
                    "found_by": verdict.found_by, "message": verdict.to_string()});
                evidence_json(&mut fields, &verdict.evidence);
                fields
            }
            Event::LeaderShunned { leader, step } => {
                json!({"event": "leader-shunned", "leader": leader, "step": step})
            }
            Event::ShunLapsed { leader, step, waited_ms } => {
                json!({"event": "shun-lapsed", "leader": leader, "step": step, "waited_ms": waited_ms})
            }
            Event::Disputing { step, target, evidence } => {
                let mut fields = json!({"event": "disputing", "step": step, "target": target,
                    "evidence": evidence.to_string()});
                evidence_json(&mut fields, evidence);
                fields
            }
            Event::AuditFailed { step, target, error } => {
                json!({"event": "audit-failed", "step": step, "target": target, "message": error.to_string()})
            }
            Event::SumCheckFailed { step, chunk, owner } => {
                json!({"event": "sum-check-failed", "step": step, "chunk": chunk, "owner": owner})
            }
            Event::SumSettled { step, chunk, owner } => {
                json!({"event": "sum-settled", "step": step, "chunk": chunk, "owner": owner})
            }
            Event::PrintsRecomputed { step, author } => {
                json!({"event": "prints-recomputed", "step": step, "author": author})
            }
            Event::SumUnsettled { step, chunk, owner } => {
                json!({"event": "sum-unsettled", "step": step, "chunk": chunk, "owner": owner})
            }
            Event::Problem(problem) => {
                json!({"event": "error", "kind": problem.kind(), "message": problem.to_string()})
            }
        },
    }
}

/// A backend's admission at a run's shapes as JSON: admitted (ops, seconds), or refused with
/// the op, buffer, word and both values where it departed (`lockstep train --json` prints the
/// same object).
pub fn at_run_shapes_json(backend: &str, verdict: &AtRunShapes) -> Value {
    match verdict {
        Ok((admitted, seconds)) => json!({"event": "admitted-at-run-shapes", "backend": backend,
            "ops": admitted.ops, "seconds": seconds}),
        Err(ShapesRefused::Departed(f)) => {
            let m = &f.mismatch;
            json!({"event": "refused-at-run-shapes", "backend": backend, "op_index": m.call, "op": m.op,
                "buffer": m.buffer, "word": m.index, "expected_bits": format!("{:#010x}", m.expected_bits),
                "actual_bits": format!("{:#010x}", m.actual_bits), "differing": m.differing,
                "message": verdict.as_ref().err().map(ToString::to_string)})
        }
        Err(refused) => json!({"event": "refused-at-run-shapes", "backend": backend, "message": refused.to_string()}),
    }
}

/// An audit's evidence as fields of `fields`: `word`, `expected_bits`, `claimed_bits` (the loss is
/// word 0, value `i` word `1 + i`); `named_digest`, `recomputed_digest`; `falsely_accused`;
/// `expected_state`, `named_state` (a packed contribution's link); `withheld: true`; or `op`,
/// `op_name`, `buffer`, `word`, `expected_bits`, `claimed_bits` (a dispute narrowed to one op:
/// the word of the buffer that op wrote); `weights: true` with `word`, `expected_bits`,
/// `claimed_bits` (the guard's dispute: the first weight that parts from the definition's
/// update) or with `expected_whash`, `claimed_whash`; `probe: true`, `expected_phash`,
/// `claimed_phash`; `chunk` with `sum_check: true` (an owner's sum whose fingerprints did not add
/// up), with `sum_word`, `expected_value`, `claimed_value` (its sum recomputed) or with
/// `expected_print`, `claimed_print` (a contributor's fingerprint against its own chunk).
fn evidence_json(fields: &mut Value, evidence: &Evidence) {
    let hex = |v: u32| format!("{v:#010x}");
    let extra = match *evidence {
        Evidence::Word { word, expected, claimed } => {
            json!({"word": word, "expected_bits": hex(expected), "claimed_bits": hex(claimed)})
        }
        Evidence::Digest { named, recomputed } => {
            json!({"named_digest": format!("{named:#018x}"), "recomputed_digest": format!("{recomputed:#018x}")})
        }
        Evidence::FalseAccusation { accused } => json!({"falsely_accused": accused}),
        Evidence::State { expected, claimed } => {
            json!({"expected_state": format!("{expected:#018x}"), "named_state": format!("{claimed:#018x}")})
        }
        Evidence::Withheld => json!({"withheld": true}),
        Evidence::Op { op, code, buffer, word, expected, claimed } => json!({
            "op": op, "op_name": Evidence::op_name(code), "buffer": buffer, "word": word,
            "expected_bits": hex(expected), "claimed_bits": hex(claimed),
        }),
        Evidence::Weights { word, expected, claimed } => json!({
            "weights": true, "word": word, "expected_bits": hex(expected), "claimed_bits": hex(claimed),
        }),
        Evidence::WeightHash { expected, claimed } => {
            json!({"weights": true, "expected_whash": hex(expected), "claimed_whash": hex(claimed)})
        }
        Evidence::Probe { expected, claimed } => {
            json!({"probe": true, "expected_phash": hex(expected), "claimed_phash": hex(claimed)})
        }
        Evidence::SumCheck { chunk } => json!({"chunk": chunk, "sum_check": true}),
        Evidence::SumWrong { chunk, word, expected, claimed } => json!({
            "chunk": chunk, "sum_word": word, "expected_value": expected, "claimed_value": claimed,
        }),
        Evidence::Fingerprint { chunk, expected, claimed } => json!({
            "chunk": chunk, "expected_print": format!("{expected:#018x}"), "claimed_print": format!("{claimed:#018x}"),
        }),
    };
    if let (Some(object), Value::Object(extra)) = (fields.as_object_mut(), extra) {
        object.extend(extra);
    }
}

/// A short stable name for why a member was dropped (the JSON's `kind`).
fn drop_kind(why: &DropReason) -> &'static str {
    match why {
        DropReason::Deadline { .. } => "deadline",
        DropReason::Refused { .. } => "refused",
        DropReason::Disconnected { .. } => "disconnected",
        DropReason::Left => "left",
        DropReason::Forgotten => "forgotten",
        DropReason::Gone { .. } => "gone",
        DropReason::CannotCompute => "cannot-compute",
        DropReason::Removed(Removal::Kicked(_)) => "kicked",
        DropReason::Removed(Removal::Slow { .. }) => "slow",
        DropReason::Removed(Removal::Audit(_)) => "audit",
    }
}

/// The run a `start` command asks for: `defaults` with every other key of the command read as
/// the run setting of that name (`lockstep_node::settings`, `_` for `-`); a key that names no
/// setting is refused.
fn settings_from(command: &Value, defaults: &RunConfig) -> anyhow::Result<RunConfig> {
    let object = command.as_object().context("a command is a JSON object")?;
    let mut run = *defaults;
    for (key, value) in object.iter().filter(|(key, _)| key.as_str() != "cmd") {
        let text = match value {
            Value::String(text) => text.clone(),
            Value::Number(number) => number.to_string(),
            Value::Bool(flag) => flag.to_string(),
            other => bail!("`{key}` must be a string, a number or a boolean, not {other}"),
        };
        settings::set(&mut run, key, &text)?;
    }
    Ok(run)
}

/// A run's settings as JSON fields, by the table's names (numbers as numbers).
fn settings_json(run: &RunConfig) -> serde_json::Map<String, Value> {
    settings::describe(run)
        .into_iter()
        .map(|(setting, text)| {
            let value = match text.parse::<serde_json::Number>() {
                Ok(number) => Value::Number(number),
                Err(_) => text.parse::<bool>().map_or(Value::String(text), Value::Bool),
            };
            (setting.json_key(), value)
        })
        .collect()
}

/// What one stdin line asks for.
enum Request {
    Mesh(Command),
    Swap(String),
}

/// One stdin line as a request.
fn parse_request(line: &str, defaults: &RunConfig, ckpt_dir: &std::path::Path) -> anyhow::Result<Request> {
    let value: Value = serde_json::from_str(line).context("not JSON")?;
    let peer = |what: &str| value["peer"].as_u64().with_context(|| format!("`{what}` needs a `peer`"));
    let command = match value["cmd"].as_str() {
        Some("start") => {
            let run = settings_from(&value, defaults)?;
            run.validate()?;
            Command::Start(run)
        }
        Some("push" | "broadcast" | "load") => {
            let path = value["path"].as_str().context("`broadcast` needs a `path`")?;
            Command::PushCheckpoint(read_checkpoint(std::path::Path::new(path))?)
        }
        Some("save") => match value["path"].as_str() {
            Some(path) => Command::SaveCheckpoint(CheckpointTarget::File(PathBuf::from(path))),
            None => Command::SaveCheckpoint(CheckpointTarget::InDir(ckpt_dir.to_path_buf())),
        },
        Some("approve") => Command::Approve(peer("approve")?),
        Some("deny") => Command::Deny {
            peer: peer("deny")?,
            reason: value["reason"].as_str().unwrap_or("the host declined").to_string(),
        },
        Some("swap") => {
            let backend = value["backend"].as_str().context("`swap` needs a `backend` (a name or a path)")?;
            return Ok(Request::Swap(backend.to_string()));
        }
        Some("cut") => Command::CutLinkTo(peer("cut")?),
        Some("heal") => Command::HealLinkTo(peer("heal")?),
        Some("forget") => Command::Forget(peer("forget")?),
        Some("kick") => Command::Kick {
            peer: peer("kick")?,
            why: value["reason"].as_str().unwrap_or("the operator removed it").to_string(),
        },
        Some("flip") => Command::FlipWeightBit,
        Some("lazy") => Command::NeverCompute,
        Some("poison") => {
            let value = match &value["value"] {
                Value::String(s) if s.eq_ignore_ascii_case("nan") => f32::NAN,
                Value::Number(n) => n.as_f64().context("`poison` needs a number or \"nan\"")? as f32,
                _ => bail!("`poison` needs a `value`: a number or \"nan\""),
            };
            Command::PoisonContributions(value)
        }
        Some("rogue") => {
            let kind =
                value["kind"].as_str().context("`rogue` needs a `kind`: scale:F, flip, batch:PEER, stale or state")?;
            Command::PlayRogue(kind.parse().map_err(anyhow::Error::msg)?)
        }
        Some("wrong-owner") => Command::PlayWrongOwner,
        Some("false-fingerprints") => Command::PlayFalseFingerprints,
        Some("withhold-fingerprints") => Command::PlayWithheldFingerprints,
        Some("quit") => Command::Quit,
        other => {
            bail!(
                "unknown command {other:?} (start, approve, deny, swap, save, load, broadcast, push, kick, forget, cut, heal, flip, poison, rogue, wrong-owner, false-fingerprints, withhold-fingerprints, quit)"
            )
        }
    };
    Ok(Request::Mesh(command))
}

/// Prints one event as a JSON line, tagged `"node": id` when several nodes share stdout.
pub fn emit(mut value: Value, node: Option<PeerId>) {
    if let (Some(node), Some(object)) = (node, value.as_object_mut()) {
        object.insert("node".into(), node.into());
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

/// `lockstep node --headless`: joins `signal` as `mesh` says; `defaults` is what `start`
/// starts when a command leaves a setting out.
pub fn run(signal: &str, mesh: &MeshArgs, defaults: RunConfig) -> anyhow::Result<ExitCode> {
    let mut print = |line: String| emit(json!({"event": "info", "message": line}), None);
    let Prepared { config, replica, .. } = prepare(signal, mesh, Opening::default(), &mut print)?;
    let sink = Arc::new(|report: Report| emit(report_json(&report), None));
    let node = NodeHandle::start(config, replica, mesh.threads, sink)?;
    let (tx, rx) = std::sync::mpsc::channel::<Request>();
    let ckpt_dir = mesh.ckpt_dir.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if line.trim().is_empty() {
                continue;
            }
            match parse_request(&line, &defaults, &ckpt_dir) {
                Ok(request) => {
                    if tx.send(request).is_err() {
                        return;
                    }
                }
                Err(e) => emit(json!({"event": "command-error", "message": format!("{e:#}")}), None),
            }
        }
        let _ = tx.send(Request::Mesh(Command::Quit));
    });
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(200)) {
            Ok(Request::Mesh(Command::Quit)) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Ok(Request::Mesh(command)) => node.send(command),
            Ok(Request::Swap(name)) => node.swap(name),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if node.finished() {
                    break;
                }
            }
        }
    }
    let ended = node.quit()?;
    Ok(exit_status(&ended))
}
