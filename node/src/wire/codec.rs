//! Every message's bytes and back: [`encode`] and [`decode`] (the table in `wire.rs`).

use super::*;

/// The message's bytes (unfragmented).
pub fn encode(message: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    let blob = |out: &mut Vec<u8>, sentinel: i32, bytes: &[u8]| {
        out.extend_from_slice(&sentinel.to_le_bytes());
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    };
    match message {
        Message::Gradient(g) => put_gradient(&mut out, g),
        Message::CheckpointPush(bytes) => blob(&mut out, CHECKPOINT_PUSH, bytes),
        Message::Resume(bytes) => blob(&mut out, RESUME, bytes),
        Message::RunConfig { protocol, run_id, run } => {
            out.extend_from_slice(&RUN_CONFIG.to_le_bytes());
            out.extend_from_slice(&protocol.to_le_bytes());
            if *protocol >= 10 {
                out.extend_from_slice(&run_id.to_le_bytes());
            }
            // An older protocol's settings end before the step rule, or the corpus's digest.
            let len = match protocol {
                18.. => RunConfig::ENCODED_LEN,
                11..=17 => RunConfig::ENCODED_LEN_V4,
                _ => RunConfig::ENCODED_LEN_V3,
            };
            out.extend_from_slice(&run.encode()[..len]);
        }
        Message::Fragment { id, index, count, payload } => {
            out.extend_from_slice(&FRAGMENT.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&index.to_le_bytes());
            out.extend_from_slice(&count.to_le_bytes());
            out.extend_from_slice(payload);
        }
        Message::RepairRequest { step, peer } => {
            out.extend_from_slice(&REPAIR_REQUEST.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            out.extend_from_slice(&peer.to_le_bytes());
        }
        Message::RepairResponse { peer, gradient } => {
            out.extend_from_slice(&REPAIR_RESPONSE.to_le_bytes());
            out.extend_from_slice(&peer.to_le_bytes());
            put_gradient(&mut out, gradient);
        }
        Message::PeerInfo { backend, verdict } => {
            out.extend_from_slice(&PEER_INFO.to_le_bytes());
            put_text(&mut out, backend);
            match verdict {
                Verdict::Admitted { cases } => {
                    out.push(VERDICT_ADMITTED);
                    out.extend_from_slice(&cases.to_le_bytes());
                }
                Verdict::Rejected { case, detail } => {
                    out.push(VERDICT_REJECTED);
                    put_text(&mut out, case);
                    put_text(&mut out, detail);
                }
                Verdict::NotLoadable { why } => {
                    out.push(VERDICT_NOT_LOADABLE);
                    put_text(&mut out, why);
                }
            }
        }
        Message::Ping { nonce } => {
            out.extend_from_slice(&PING.to_le_bytes());
            out.extend_from_slice(&nonce.to_le_bytes());
        }
        Message::Pong { nonce } => {
            out.extend_from_slice(&PONG.to_le_bytes());
            out.extend_from_slice(&nonce.to_le_bytes());
        }
        Message::Epoch(epoch) => {
            out.extend_from_slice(&EPOCH.to_le_bytes());
            out.extend_from_slice(&epoch.count.to_le_bytes());
            out.extend_from_slice(&epoch.pusher.to_le_bytes());
        }
        Message::Removed { step, why } => {
            out.extend_from_slice(&REMOVED.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            match why {
                Removal::Kicked(words) => {
                    out.push(REMOVAL_KICKED);
                    put_text(&mut out, words);
                }
                Removal::Slow { windows } => {
                    out.push(REMOVAL_SLOW);
                    out.extend_from_slice(&windows.to_le_bytes());
                }
                Removal::Audit(verdict) => {
                    out.push(REMOVAL_AUDIT);
                    verdict.encode(&mut out);
                }
            }
        }
        Message::Leaving => out.extend_from_slice(&LEAVING.to_le_bytes()),
        Message::Raft { run, bytes } => {
            out.extend_from_slice(&RAFT.to_le_bytes());
            out.extend_from_slice(&run.to_le_bytes());
            out.extend_from_slice(bytes);
        }
        Message::CatchUp { applied } => {
            out.extend_from_slice(&CATCH_UP.to_le_bytes());
            out.extend_from_slice(&applied.to_le_bytes());
        }
        Message::Accusation { step, target, evidence } => {
            out.extend_from_slice(&ACCUSATION.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            out.extend_from_slice(&target.to_le_bytes());
            evidence.encode(&mut out);
        }
        Message::StateRequest { step, part } => {
            out.extend_from_slice(&STATE_REQUEST.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            part.encode(&mut out);
        }
        Message::State { step, served } => {
            out.extend_from_slice(&STATE.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            served.encode(&mut out);
        }
        Message::TraceRequest { step, definition } => {
            out.extend_from_slice(&TRACE_REQUEST.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            put_trace(&mut out, definition);
        }
        Message::Trace { step, answer: TraceAnswer { trace, words } } => {
            out.extend_from_slice(&TRACE.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            put_trace(&mut out, trace);
            match words {
                None => out.push(0),
                Some((op, chunk, words)) => {
                    out.push(1);
                    out.extend_from_slice(&op.to_le_bytes());
                    out.extend_from_slice(&chunk.to_le_bytes());
                    words.iter().for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
                }
            }
        }
        Message::WeightsRequest { step, digests } => {
            out.extend_from_slice(&WEIGHTS_REQUEST.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            out.extend_from_slice(&(digests.len() as u32).to_le_bytes());
            digests.iter().for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
        }
        Message::Header { author, header } => put_header(&mut out, *author, header),
        Message::Chunk(chunk) => put_chunk(&mut out, chunk),
        Message::ChunkSum(sum) => put_sum(&mut out, sum),
        Message::ChunkHeld { step, author, first, end } => {
            out.extend_from_slice(&CHUNK_HELD.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            out.extend_from_slice(&author.to_le_bytes());
            out.extend_from_slice(&[*first, *end]);
        }
        Message::ChunkRequest { step, author, first, end } => {
            out.extend_from_slice(&CHUNK_REQUEST.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            out.extend_from_slice(&author.to_le_bytes());
            out.extend_from_slice(&[*first, *end]);
        }
        Message::Fingerprints { step, record, seed, prints } => {
            out.extend_from_slice(&FINGERPRINTS.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            out.extend_from_slice(&record.to_le_bytes());
            out.extend_from_slice(&seed.to_le_bytes());
            out.extend_from_slice(&(prints.len() as u16).to_le_bytes());
            prints.iter().for_each(|p| out.extend_from_slice(&p.to_le_bytes()));
        }
        Message::FingerprintsRequest { step, record } => {
            out.extend_from_slice(&FINGERPRINTS_REQUEST.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            out.extend_from_slice(&record.to_le_bytes());
        }
        Message::SumRequest { step, record, owner, owners } => {
            out.extend_from_slice(&SUM_REQUEST.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            out.extend_from_slice(&record.to_le_bytes());
            out.extend_from_slice(&owner.to_le_bytes());
            out.extend_from_slice(&owners.to_le_bytes());
        }
        Message::Weights { step, words } => {
            out.extend_from_slice(&WEIGHTS.to_le_bytes());
            out.extend_from_slice(&step.to_le_bytes());
            match words {
                None => out.push(0),
                Some((chunk, words)) => {
                    out.push(1);
                    out.extend_from_slice(&chunk.to_le_bytes());
                    words.iter().for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
                }
            }
        }
    }
    out
}

/// A trace: `[u32 ops]`, then each op's `[u32 chunks][u64 digest × chunks]`.
fn put_trace(out: &mut Vec<u8>, trace: &Trace) {
    out.extend_from_slice(&(trace.ops.len() as u32).to_le_bytes());
    for chunks in &trace.ops {
        out.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
        chunks.iter().for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
    }
}

fn read_trace(r: &mut Reader<'_>) -> Result<Trace, WireError> {
    let n = r.u32()?;
    if n as usize > r.remaining() / 4 {
        return Err(WireError::Invalid(format!("a trace of {n} ops")));
    }
    let mut trace = Trace::default();
    for _ in 0..n {
        let chunks = r.u32()? as usize;
        // Each digest is 8 bytes: a count past what is left is refused before any allocation.
        if chunks > r.remaining() / 8 {
            return Err(WireError::Invalid(format!("a trace's op of {chunks} chunks")));
        }
        trace.ops.push((0..chunks).map(|_| r.u64()).collect::<Result<_, _>>()?);
    }
    Ok(trace)
}

/// Words to the message's end.
fn read_words(r: &mut Reader<'_>) -> Result<Vec<u32>, WireError> {
    let body = r.rest();
    if !body.len().is_multiple_of(4) {
        return Err(WireError::Invalid(format!("a chunk of {} bytes is not whole words", body.len())));
    }
    Ok(body.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Parses one complete message.
pub fn decode(bytes: &[u8]) -> Result<Message, WireError> {
    let mut r = Reader { bytes, at: 0 };
    let first = i32::from_le_bytes(Reader { bytes, at: 0 }.array()?);
    if first >= 0 || is_gradient_sentinel(first) {
        let gradient = read_gradient(&mut r)?;
        r.finish()?;
        return Ok(Message::Gradient(gradient));
    }
    r.i32()?;
    let message = match first {
        CHECKPOINT_PUSH => Message::CheckpointPush(r.blob()?),
        RESUME => Message::Resume(r.blob()?),
        RUN_CONFIG => {
            let protocol = r.u32()?;
            let run_id = if protocol >= 10 { r.u64()? } else { 0 };
            let run = if protocol < 4 {
                // An older node's config has no sync settings (the session refuses it by its
                // version): its fields, the seed's sync settings.
                let fields = r.array::<{ RunConfig::ENCODED_LEN_V3 - SyncConfig::ENCODED_LEN }>()?;
                r.rest();
                let mut bytes = [0u8; RunConfig::ENCODED_LEN_V3];
                bytes[..fields.len()].copy_from_slice(&fields);
                bytes[fields.len()..].copy_from_slice(&SyncConfig::SEED.encode());
                RunConfig::decode_v3(&bytes)
            } else if protocol < 11 {
                // Before the corpus's digest (the session refuses it by its version).
                RunConfig::decode_v3(&r.array::<{ RunConfig::ENCODED_LEN_V3 }>()?)
            } else if protocol < 18 {
                // Before the step rule.
                RunConfig::decode_v4(&r.array::<{ RunConfig::ENCODED_LEN_V4 }>()?)
            } else {
                RunConfig::decode(&r.array::<{ RunConfig::ENCODED_LEN }>()?)
            };
            Message::RunConfig { protocol, run_id, run: run.map_err(WireError::Sync)? }
        }
        FRAGMENT => {
            let id = r.u32()?;
            let index = r.u16()?;
            let count = r.u16()?;
            if count == 0 || index >= count {
                return Err(WireError::Invalid(format!("fragment {index} of {count}")));
            }
            let payload = r.rest().to_vec();
            if payload.len() > FRAGMENT_BYTES - FRAGMENT_HEADER {
                return Err(WireError::Invalid(format!("fragment payload of {} bytes", payload.len())));
            }
            Message::Fragment { id, index, count, payload }
        }
        REPAIR_REQUEST => Message::RepairRequest { step: r.u32()?, peer: r.u64()? },
        REPAIR_RESPONSE => {
            let peer = r.u64()?;
            Message::RepairResponse { peer, gradient: read_gradient(&mut r)? }
        }
        PEER_INFO => {
            let backend = r.text()?;
            let verdict = match r.u8()? {
                VERDICT_ADMITTED => Verdict::Admitted { cases: r.u32()? },
                VERDICT_REJECTED => Verdict::Rejected { case: r.text()?, detail: r.text()? },
                VERDICT_NOT_LOADABLE => Verdict::NotLoadable { why: r.text()? },
                other => return Err(WireError::Invalid(format!("verdict kind {other}"))),
            };
            Message::PeerInfo { backend, verdict }
        }
        PING => Message::Ping { nonce: r.u64()? },
        PONG => Message::Pong { nonce: r.u64()? },
        EPOCH => Message::Epoch(Epoch { count: r.u32()?, pusher: r.u64()? }),
        REMOVED => {
            let step = r.u32()?;
            let why = match r.u8()? {
                REMOVAL_KICKED => Removal::Kicked(r.text()?),
                REMOVAL_SLOW => Removal::Slow { windows: r.u32()? },
                REMOVAL_AUDIT => {
                    let mut rest = r.rest();
                    let verdict =
                        AuditVerdict::decode(&mut rest).ok_or(WireError::Invalid("an audit's verdict".into()))?;
                    r.put_back(rest);
                    Removal::Audit(verdict)
                }
                other => return Err(WireError::Invalid(format!("removal kind {other}"))),
            };
            Message::Removed { step, why }
        }
        LEAVING => Message::Leaving,
        RAFT => {
            let run = r.u64()?;
            Message::Raft { run, bytes: r.rest().to_vec() }
        }
        CATCH_UP => Message::CatchUp { applied: r.u32()? },
        ACCUSATION => {
            let (step, target) = (r.u32()?, r.u64()?);
            let mut rest = r.rest();
            let evidence = Evidence::decode(&mut rest).ok_or(WireError::Invalid("an accusation's evidence".into()))?;
            r.put_back(rest);
            Message::Accusation { step, target, evidence }
        }
        STATE_REQUEST => Message::StateRequest { step: r.u32()?, part: StatePart::decode(&mut r)? },
        STATE => Message::State { step: r.u32()?, served: ServedState::decode(&mut r)? },
        TRACE_REQUEST => Message::TraceRequest { step: r.u32()?, definition: read_trace(&mut r)? },
        TRACE => {
            let (step, trace) = (r.u32()?, read_trace(&mut r)?);
            let words = match r.u8()? {
                0 => None,
                1 => {
                    let (op, chunk) = (r.u32()?, r.u32()?);
                    Some((op, chunk, read_words(&mut r)?))
                }
                other => return Err(WireError::Invalid(format!("a trace's words marked {other}"))),
            };
            Message::Trace { step, answer: TraceAnswer { trace, words } }
        }
        WEIGHTS_REQUEST => {
            let step = r.u32()?;
            let chunks = r.u32()? as usize;
            // Each digest is 8 bytes: a count past what is left is refused before any allocation.
            if chunks > r.remaining() / 8 {
                return Err(WireError::Invalid(format!("a weights request of {chunks} chunks")));
            }
            Message::WeightsRequest { step, digests: (0..chunks).map(|_| r.u64()).collect::<Result<_, _>>()? }
        }
        WEIGHTS => {
            let step = r.u32()?;
            let words = match r.u8()? {
                0 => None,
                1 => Some((r.u32()?, read_words(&mut r)?)),
                other => return Err(WireError::Invalid(format!("weights marked {other}"))),
            };
            Message::Weights { step, words }
        }
        HEADER => {
            let author = r.u64()?;
            Message::Header { author, header: read_header(&mut r)? }
        }
        CHUNK => Message::Chunk(read_chunk(&mut r)?),
        CHUNK_SUM => Message::ChunkSum(read_sum(&mut r)?),
        sentinel @ (CHUNK_REQUEST | CHUNK_HELD) => {
            let (step, author, first, end) = (r.u32()?, r.u64()?, r.u8()?, r.u8()?);
            if first >= end || usize::from(end) > crate::sync::owners::PIECES {
                return Err(WireError::Invalid(format!("pieces {first}..{end}")));
            }
            match sentinel {
                CHUNK_HELD => Message::ChunkHeld { step, author, first, end },
                _ => Message::ChunkRequest { step, author, first, end },
            }
        }
        SUM_REQUEST => {
            let (step, record, owner, owners) = (r.u32()?, r.u64()?, r.u16()?, r.u16()?);
            if owner >= owners {
                return Err(WireError::Invalid(format!("a request for chunk {owner} of {owners} owners")));
            }
            Message::SumRequest { step, record, owner, owners }
        }
        FINGERPRINTS => {
            let (step, record, seed, n) = (r.u32()?, r.u64()?, r.u64()?, usize::from(r.u16()?));
            // Each print is 8 bytes: a count past what is left is refused before any allocation.
            if n > r.remaining() / 8 || n > MAX_PRINTS {
                return Err(WireError::Invalid(format!("fingerprints of {n} chunks")));
            }
            Message::Fingerprints { step, record, seed, prints: (0..n).map(|_| r.u64()).collect::<Result<_, _>>()? }
        }
        FINGERPRINTS_REQUEST => Message::FingerprintsRequest { step: r.u32()?, record: r.u64()? },
        other => return Err(WireError::UnknownSentinel(other)),
    };
    r.finish()?;
    Ok(message)
}
