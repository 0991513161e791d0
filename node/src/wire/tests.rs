use super::*;
use crate::sync::{Compression, OuterOptimizer, StepRule, SyncMode};

fn gradient(n: usize) -> Gradient {
    Gradient {
        step: 7,
        whash: 0xdead_beef,
        phash: 0xdf23_2627,
        loss: 2.5,
        values: Values::F32((0..n).map(|i| i as f32 * 0.25 - 1.0).collect()),
        weight: 1,
        state: 0,
    }
}

fn packed(n: usize) -> Gradient {
    let values: Vec<f32> = (0..n).map(|i| (i as f32 - 20.0) * 0.125).collect();
    Gradient { values: Values::Int8(crate::sync::pack(&values).unwrap()), ..gradient(0) }
}

#[test]
fn golden_bytes() {
    let g = Gradient {
        step: 3,
        whash: 0x0102_0304,
        phash: 0xa0b0_c0d0,
        loss: 1.0,
        values: Values::F32(vec![-2.0]),
        weight: 1,
        state: 0,
    };
    assert_eq!(
        encode(&Message::Gradient(g.clone())),
        vec![3, 0, 0, 0, 4, 3, 2, 1, 0xd0, 0xc0, 0xb0, 0xa0, 0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0]
    );
    assert_eq!(
        encode(&Message::RepairRequest { step: 9, peer: 2 }),
        vec![0xf9, 0xff, 0xff, 0xff, 9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]
    );
    let response = encode(&Message::RepairResponse { peer: 4, gradient: g.clone() });
    assert_eq!(&response[..12], &[0xf8, 0xff, 0xff, 0xff, 4, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&response[12..], &encode(&Message::Gradient(g.clone()))[..]);
    assert_eq!(
        encode(&Message::PeerInfo { backend: "lut".into(), verdict: Verdict::Admitted { cases: 40 } }),
        vec![0xf7, 0xff, 0xff, 0xff, 3, 0, b'l', b'u', b't', 0, 40, 0, 0, 0]
    );
    assert_eq!(
        encode(&Message::PeerInfo {
            backend: "x".into(),
            verdict: Verdict::Rejected { case: "c".into(), detail: "d".into() }
        }),
        vec![0xf7, 0xff, 0xff, 0xff, 1, 0, b'x', 1, 1, 0, b'c', 1, 0, b'd']
    );
    assert_eq!(
        encode(&Message::PeerInfo { backend: "x".into(), verdict: Verdict::NotLoadable { why: "w".into() } }),
        vec![0xf7, 0xff, 0xff, 0xff, 1, 0, b'x', 2, 1, 0, b'w']
    );
    assert_eq!(encode(&Message::Ping { nonce: 258 }), vec![0xf6, 0xff, 0xff, 0xff, 2, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(encode(&Message::Pong { nonce: 1 }), vec![0xf5, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        encode(&Message::Epoch(Epoch { count: 2, pusher: 0x0103 })),
        vec![0xf4, 0xff, 0xff, 0xff, 2, 0, 0, 0, 3, 1, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        encode(&Message::Removed { step: 5, why: Removal::Kicked("ab".into()) }),
        vec![0xf3, 0xff, 0xff, 0xff, 5, 0, 0, 0, 0, 2, 0, b'a', b'b']
    );
    assert_eq!(
        encode(&Message::Removed { step: 5, why: Removal::Slow { windows: 3 } }),
        vec![0xf3, 0xff, 0xff, 0xff, 5, 0, 0, 0, 1, 3, 0, 0, 0]
    );
    assert_eq!(encode(&Message::Leaving), vec![0xf1, 0xff, 0xff, 0xff]);
    assert_eq!(
        encode(&Message::Raft { run: 0x0102, bytes: vec![8, 9] }),
        vec![0xed, 0xff, 0xff, 0xff, 2, 1, 0, 0, 0, 0, 0, 0, 8, 9]
    );
    assert_eq!(encode(&Message::CatchUp { applied: 258 }), vec![0xec, 0xff, 0xff, 0xff, 2, 1, 0, 0]);
    // The retired sentinels of the home-made agreement read as unknown.
    for retired in [-4i32, -16, -17] {
        assert_eq!(decode(&retired.to_le_bytes()), Err(WireError::UnknownSentinel(retired)));
    }
    // A state asked for whole, in two chunks, or its digests alone; served (its length, each
    // chunk's digest, the chunks asked for) or none kept.
    let whole = Message::StateRequest { step: 258, part: StatePart::Whole };
    assert_eq!(encode(&whole), vec![0xea, 0xff, 0xff, 0xff, 2, 1, 0, 0, 0xff, 0xff, 0xff, 0xff]);
    let two = Message::StateRequest { step: 258, part: StatePart::Chunks(vec![1, 5]) };
    assert_eq!(encode(&two), vec![0xea, 0xff, 0xff, 0xff, 2, 1, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0]);
    for request in [whole, two, Message::StateRequest { step: 3, part: StatePart::Chunks(Vec::new()) }] {
        assert_eq!(decode(&encode(&request)), Ok(request));
    }
    let backwards = [0xea, 0xff, 0xff, 0xff, 2, 1, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0, 0];
    assert!(matches!(decode(&backwards), Err(WireError::Invalid(_))));
    let too_many = [0xea, 0xff, 0xff, 0xff, 2, 1, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0];
    assert!(matches!(decode(&too_many), Err(WireError::Invalid(_))));
    let residual: Vec<f32> = (0..STATE_CHUNK + 2).map(|i| i as f32 - 3.5).collect();
    let digests = state_chunk_digests(&residual);
    let served = ServedState::of(&residual, &digests, &StatePart::Chunks(vec![1]));
    assert_eq!(served.parts, vec![(1, vec![STATE_CHUNK as f32 - 3.5, STATE_CHUNK as f32 - 2.5])]);
    let state = Message::State { step: 3, served: served.clone() };
    let mut bytes = vec![0xe9, 0xff, 0xff, 0xff, 3, 0, 0, 0, 2, 4, 0, 0, 2, 0, 0, 0];
    digests.iter().for_each(|d| bytes.extend_from_slice(&d.to_le_bytes()));
    bytes.extend_from_slice(&[1, 0, 0, 0, 1, 0, 0, 0]);
    [STATE_CHUNK as f32 - 3.5, STATE_CHUNK as f32 - 2.5].iter().for_each(|v| bytes.extend_from_slice(&v.to_le_bytes()));
    assert_eq!(encode(&state), bytes);
    assert_eq!(decode(&bytes), Ok(state));
    let nothing_kept = Message::State { step: 3, served: ServedState::default() };
    assert_eq!(encode(&nothing_kept), vec![0xe9, 0xff, 0xff, 0xff, 3, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(decode(&encode(&nothing_kept)), Ok(nothing_kept));
    // A chunk count that is not the length's, a chunk past the state, a part cut short.
    let mut wrong_count = bytes.clone();
    wrong_count[12] = 3;
    assert!(matches!(decode(&wrong_count), Err(WireError::Invalid(_))));
    let mut past = bytes.clone();
    past[36] = 2;
    assert!(matches!(decode(&past), Err(WireError::Invalid(_))));
    assert!(matches!(decode(&bytes[..bytes.len() - 1]), Err(WireError::Truncated { .. })));
    // Disputes (protocol 17): a trace asked for against the leader's (the trace after the
    // step), and the answer: the trace up to the op where it parts, then that op's words of
    // the chunk.
    let theirs = Trace { ops: vec![vec![9], vec![3, 4]] };
    let against = Message::TraceRequest { step: 2, definition: theirs };
    let mut bytes = vec![0xe8, 0xff, 0xff, 0xff, 2, 0, 0, 0, 2, 0, 0, 0];
    bytes.extend([1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
    bytes.extend([2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(encode(&against), bytes);
    assert_eq!(decode(&bytes), Ok(against));
    for cut in 4..bytes.len() {
        assert!(decode(&bytes[..cut]).is_err(), "{cut} bytes");
    }
    // An op count or a chunk count past what the message holds is refused before allocating.
    let mut huge = bytes[..8].to_vec();
    huge.extend(u32::MAX.to_le_bytes());
    assert!(matches!(decode(&huge), Err(WireError::Invalid(_))));
    let mut huge = bytes[..12].to_vec();
    huge.extend(u32::MAX.to_le_bytes());
    assert!(matches!(decode(&huge), Err(WireError::Invalid(_))));
    let ours = Trace { ops: vec![vec![9], vec![3, 5]] };
    let parted = TraceAnswer { trace: ours.clone(), words: Some((1, 1, vec![7, 0x8000_0000])) };
    let answer = Message::Trace { step: 2, answer: parted };
    let mut bytes = vec![0xe7, 0xff, 0xff, 0xff, 2, 0, 0, 0, 2, 0, 0, 0];
    bytes.extend([1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
    bytes.extend([2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]);
    bytes.extend([1, 1, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0x80]);
    assert_eq!(encode(&answer), bytes);
    assert_eq!(decode(&bytes), Ok(answer));
    let agrees = Message::Trace { step: 2, answer: TraceAnswer { trace: ours, words: None } };
    assert_eq!(decode(&encode(&agrees)), Ok(agrees));
    let nothing = Message::Trace { step: 2, answer: TraceAnswer::default() };
    assert_eq!(encode(&nothing), vec![0xe7, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(decode(&encode(&nothing)), Ok(nothing));
    // A words marker that is neither, and words that are not whole, are refused.
    let mut marked = bytes.clone();
    marked[44] = 2;
    assert!(matches!(decode(&marked), Err(WireError::Invalid(_))));
    assert!(matches!(decode(&bytes[..bytes.len() - 1]), Err(WireError::Invalid(_))));
    // The guard's disputes (protocol 19): the leader's digests of its checked weights, and
    // the answer — the first chunk that parts and its words, or nothing.
    let request = Message::WeightsRequest { step: 5, digests: vec![9, 1 << 40] };
    let mut bytes = vec![0xe5, 0xff, 0xff, 0xff, 5, 0, 0, 0, 2, 0, 0, 0];
    bytes.extend([9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]);
    assert_eq!(encode(&request), bytes);
    assert_eq!(decode(&bytes), Ok(request));
    for cut in 4..bytes.len() {
        assert!(decode(&bytes[..cut]).is_err(), "{cut} bytes");
    }
    let mut huge = bytes[..8].to_vec();
    huge.extend(u32::MAX.to_le_bytes());
    assert!(matches!(decode(&huge), Err(WireError::Invalid(_))), "a chunk count past the message");
    let answer = Message::Weights { step: 5, words: Some((1, vec![7, 0x8000_0000])) };
    let bytes = vec![0xe4, 0xff, 0xff, 0xff, 5, 0, 0, 0, 1, 1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0x80];
    assert_eq!(encode(&answer), bytes);
    assert_eq!(decode(&bytes), Ok(answer));
    let nothing = Message::Weights { step: 5, words: None };
    assert_eq!(encode(&nothing), vec![0xe4, 0xff, 0xff, 0xff, 5, 0, 0, 0, 0]);
    assert_eq!(decode(&encode(&nothing)), Ok(nothing));
    let mut marked = bytes.clone();
    marked[8] = 2;
    assert!(matches!(decode(&marked), Err(WireError::Invalid(_))));
    assert!(matches!(decode(&bytes[..bytes.len() - 1]), Err(WireError::Invalid(_))), "words not whole");
    // 127 and -1 in one block: e = 0, the block byte is 133 (0x85); weight 3 (three inner
    // steps of an elastic window); the residual it was packed with named 0x0807060504030201.
    let p = Gradient {
        values: Values::Int8(crate::sync::pack(&[127.0, -1.0]).unwrap()),
        weight: 3,
        state: 0x0807_0605_0403_0201,
        ..g.clone()
    };
    assert_eq!(
        encode(&Message::Gradient(p.clone())),
        vec![
            0xf2, 0xff, 0xff, 0xff, 3, 0, 0, 0, 4, 3, 2, 1, 0xd0, 0xc0, 0xb0, 0xa0, 0, 0, 0x80, 0x3f, 3, 0, 0, 0, 1, 2,
            3, 4, 5, 6, 7, 8, 2, 0, 0, 0, 0x85, 127, 0xff
        ]
    );
    assert_eq!(decode(&encode(&Message::Gradient(p.clone()))), Ok(Message::Gradient(p.clone())));
    let response = encode(&Message::RepairResponse { peer: 4, gradient: p.clone() });
    assert_eq!(&response[12..], &encode(&Message::Gradient(p))[..]);
    // int4: 127, -1, -112 on the grid 16 times coarser (block byte 137): 127/16 rounds to
    // 8, clamped to 7; -1/16 to 0; -112/16 is -7 (nibble 9). Two to a byte, low first.
    let p4 = Gradient { values: Values::Int4(crate::sync::pack4(&[127.0, -1.0, -112.0]).unwrap()), ..g.clone() };
    let bytes = encode(&Message::Gradient(p4.clone()));
    assert_eq!(
        bytes,
        vec![
            0xee, 0xff, 0xff, 0xff, 3, 0, 0, 0, 4, 3, 2, 1, 0xd0, 0xc0, 0xb0, 0xa0, 0, 0, 0x80, 0x3f, 1, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0x89, 0x07, 0x09
        ]
    );
    assert_eq!(decode(&bytes), Ok(Message::Gradient(p4.clone())));
    let response = encode(&Message::RepairResponse { peer: 4, gradient: p4.clone() });
    assert_eq!(&response[12..], &encode(&Message::Gradient(p4))[..]);
    // The run's bytes are `RunConfig::encode`'s (pinned in config.rs), after the protocol.
    let run = crate::config::tests::unlike_the_default();
    let config = encode(&Message::RunConfig { protocol: 4, run_id: 0, run });
    assert_eq!(config[8..], run.encode()[..RunConfig::ENCODED_LEN_V3]);
    assert_eq!(config[..8], [0xfd, 0xff, 0xff, 0xff, 4, 0, 0, 0]);
    assert_eq!(config.len(), 4 + 7 * 4 + 4 + 8 + 1 + 4 + 1 + 4 + 4);
    // Since protocol 10 the run's log follows the protocol; since 11 the corpus's digest ends
    // the settings.
    let config = encode(&Message::RunConfig { protocol: 10, run_id: 0x0203, run });
    assert_eq!(config[..16], [0xfd, 0xff, 0xff, 0xff, 10, 0, 0, 0, 3, 2, 0, 0, 0, 0, 0, 0]);
    assert_eq!(config[16..], run.encode()[..RunConfig::ENCODED_LEN_V3]);
    let config = encode(&Message::RunConfig { protocol: 11, run_id: 0x0203, run });
    assert_eq!(config[16..], run.encode()[..RunConfig::ENCODED_LEN_V4]);
    assert_eq!(config[config.len() - 8..], [0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
    // Since protocol 18 the step rule ends them; since 20 its byte's high bit says chunk
    // owners.
    let config = encode(&Message::RunConfig { protocol: 18, run_id: 0x0203, run });
    assert_eq!(config[16..], run.encode());
    assert_eq!(config[config.len() - 5..], [128 + 1, 0, 0, 0x60, 0x3f]);
}

/// A contribution's digest is a function of its wire bytes: the same whatever path it took
/// (decoded, repaired), different for any change of a value or a header field.
#[test]
fn a_digest_names_one_contribution() {
    let g = packed(100);
    let again = match decode(&encode(&Message::RepairResponse { peer: 3, gradient: g.clone() })) {
        Ok(Message::RepairResponse { gradient, .. }) => gradient,
        other => panic!("{other:?}"),
    };
    assert_eq!(again.digest(), g.digest());
    let mut changed = g.clone();
    if let Values::Int8(p) = &mut changed.values {
        p.q[99] = p.q[99].wrapping_add(1).clamp(-127, 127);
    }
    assert_ne!(changed.digest(), g.digest());
    assert_ne!(Gradient { weight: 2, ..g.clone() }.digest(), g.digest());
    assert_ne!(Gradient { whash: g.whash ^ 1, ..g.clone() }.digest(), g.digest());
    assert_ne!(Gradient { state: g.state ^ 1, ..g.clone() }.digest(), g.digest());
    // A state's digest names its values, in order.
    assert_ne!(state_digest(&[1.0, 2.0]), state_digest(&[2.0, 1.0]));
    assert_ne!(state_digest(&[0.0]), state_digest(&[0.0, 0.0]));
    assert_ne!(state_digest(&[0.0]), state_digest(&[-0.0]));
    assert_ne!(gradient(10).digest(), gradient(11).digest());
    // The definition, stated again byte by byte: FNV-1a's step on little-endian 64-bit words
    // of the header, then of each of 64 pieces' digests — a piece being every value of blocks
    // `⌊blocks·p/64⌋..⌊blocks·(p+1)/64⌋`, its digest the same step over its value count, then
    // its values (odd lengths padded with zeros).
    let fnv = |bytes: &[u8]| {
        let mut bytes = bytes.to_vec();
        bytes.resize(bytes.len().div_ceil(8) * 8, 0);
        bytes.chunks(8).fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
            (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let by_hand = |g: &Gradient| {
        let mut bytes: Vec<u8> = Vec::new();
        let kind = match &g.values {
            Values::F32(_) => 0u64,
            Values::Int8(_) => 1,
            Values::Int4(_) => 2,
        };
        for word in [g.step as u64, g.whash as u64, g.phash as u64, g.loss.to_bits() as u64, g.weight as u64, g.state] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.extend_from_slice(&kind.to_le_bytes());
        let len = g.values.len();
        bytes.extend_from_slice(&(len as u64).to_le_bytes());
        let blocks = len.div_ceil(32);
        let start = |p: usize| (blocks * p / 64 * 32).min(len);
        for p in 0..64 {
            let (from, to) = (start(p), start(p + 1));
            let mut piece = ((to - from) as u64).to_le_bytes().to_vec();
            match &g.values {
                Values::F32(v) => {
                    v[from..to].iter().for_each(|x| piece.extend_from_slice(&x.to_bits().to_le_bytes()));
                }
                Values::Int8(q) | Values::Int4(q) => {
                    piece.extend_from_slice(&q.exponents[from / 32..to.div_ceil(32)]);
                    piece.resize(piece.len().div_ceil(8) * 8, 0);
                    piece.extend(q.q[from..to].iter().map(|&q| q as u8));
                }
            }
            bytes.extend_from_slice(&fnv(&piece).to_le_bytes());
        }
        fnv(&bytes)
    };
    let named = Gradient { state: 0x1234_5678_9abc_def0, ..packed(33) };
    let f32_named = Gradient { state: 0x1234_5678_9abc_def0, ..gradient(5) };
    for g in [gradient(4), gradient(5), gradient(40_000), packed(70_000), packed(33), named, f32_named] {
        assert_eq!(g.digest(), by_hand(&g));
    }
}

/// Chunk owners' frames: a header names the contribution its whole does, a chunk is checked
/// against the header piece by piece, and all three frames round-trip and refuse what is
/// malformed.
#[test]
fn owners_frames_name_the_contribution_and_its_pieces() {
    let g = packed(70_000);
    let header = g.header();
    assert_eq!(header.digest(), g.digest());
    assert_eq!(header.pieces.len(), 64);
    let round = |m: Message| decode(&encode(&m)).unwrap();
    let message = Message::Header { author: 42, header: header.clone() };
    assert_eq!(round(message.clone()), message);
    let bytes = encode(&message);
    assert_eq!(bytes[..12], [0xe3, 0xff, 0xff, 0xff, 42, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(bytes.len(), 4 + 8 + 5 * 4 + 8 + 1 + 4 + 64 * 8);
    assert_eq!(bytes[40], 1, "int8");
    for pieces in [0..1, 3..9, 63..64, 0..64] {
        let chunk = Chunk::of(&g, 42, pieces.clone());
        assert!(header.names(&chunk), "{pieces:?}");
        assert_eq!(chunk.range(g.values.len()).len(), chunk.values.len());
        assert_eq!(round(Message::Chunk(chunk.clone())), Message::Chunk(chunk.clone()));
        // One quant changed, or the pieces said to be others: not the header's.
        let mut changed = chunk.clone();
        if let Values::Int8(p) = &mut changed.values {
            p.q[0] = if p.q[0] == 5 { 6 } else { 5 };
        }
        assert!(!header.names(&changed), "{pieces:?}");
        let other = (pieces.start ^ 1) as u8;
        let shifted = Chunk { first: other, end: other + 1, ..Chunk::of(&g, 42, pieces.start..pieces.start + 1) };
        assert!(!header.names(&shifted), "{pieces:?}");
    }
    // int4 chunks travel as nibbles.
    let int4 = Gradient { values: Values::Int4(crate::sync::pack4(&vec![0.5f32; 3000]).unwrap()), ..g.clone() };
    let chunk = Chunk::of(&int4, 7, 2..5);
    assert!(int4.header().names(&chunk));
    assert_eq!(round(Message::Chunk(chunk.clone())), Message::Chunk(chunk));
    let sum = SumMessage { step: 9, record: 0xfeed, owner: 2, owners: 3, bytes: vec![1, 2, 3] };
    assert_eq!(round(Message::ChunkSum(sum.clone())), Message::ChunkSum(sum.clone()));
    let request = Message::SumRequest { step: 9, record: 0xfeed, owner: 2, owners: 3 };
    assert_eq!(round(request.clone()), request);
    for asked in [
        Message::ChunkRequest { step: 9, author: 4, first: 3, end: 9 },
        Message::ChunkHeld { step: 9, author: 4, first: 3, end: 9 },
    ] {
        assert_eq!(round(asked.clone()), asked);
        for (first, end) in [(3u8, 3u8), (0, 65)] {
            let mut bad = encode(&asked);
            (bad[16], bad[17]) = (first, end);
            assert!(matches!(decode(&bad), Err(WireError::Invalid(_))), "{first}..{end}");
        }
    }
    // Fingerprints: golden bytes, a round trip, a count past the bytes refused.
    let prints = Message::Fingerprints { step: 9, record: 2, seed: 3, prints: vec![5, u64::MAX] };
    let mut golden = vec![0xdd, 0xff, 0xff, 0xff, 9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 2, 0];
    golden.extend_from_slice(&[5, 0, 0, 0, 0, 0, 0, 0]);
    golden.extend_from_slice(&[0xff; 8]);
    assert_eq!(encode(&prints), golden);
    assert_eq!(round(prints.clone()), prints);
    let mut bad = encode(&prints);
    bad[24] = 3;
    assert!(matches!(decode(&bad), Err(WireError::Invalid(_))));
    bad.truncate(26);
    bad[24..26].copy_from_slice(&0u16.to_le_bytes());
    assert_eq!(decode(&bad).unwrap(), Message::Fingerprints { step: 9, record: 2, seed: 3, prints: vec![] });
    let again = Message::FingerprintsRequest { step: 9, record: 2 };
    assert_eq!(encode(&again), [0xdc, 0xff, 0xff, 0xff, 9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(round(again.clone()), again);
    let mut bad = encode(&request);
    bad[16] = 3;
    assert!(matches!(decode(&bad), Err(WireError::Invalid(_))));
    // Refused: a chunk of no pieces or past the 64th, an f32 chunk, an owner past the owners, a
    // header of an unknown encoding or of weight 0, one cut short.
    let chunk_bytes = encode(&Message::Chunk(Chunk::of(&g, 42, 3..9)));
    for (at, byte) in [(16, 9u8), (17, 65), (18, 0), (18, 3)] {
        let mut bad = chunk_bytes.clone();
        bad[at] = byte;
        assert!(matches!(decode(&bad), Err(WireError::Invalid(_))), "byte {at} = {byte}");
    }
    let mut bad = encode(&Message::ChunkSum(sum));
    bad[16] = 3;
    assert!(matches!(decode(&bad), Err(WireError::Invalid(_))));
    let mut bad = bytes.clone();
    bad[40] = 3;
    assert!(matches!(decode(&bad), Err(WireError::Invalid(_))));
    let mut bad = bytes.clone();
    bad[28..32].copy_from_slice(&0u32.to_le_bytes());
    assert!(matches!(decode(&bad), Err(WireError::Invalid(_))));
    assert!(matches!(decode(&bytes[..bytes.len() - 1]), Err(WireError::Truncated { .. })));
}

#[test]
fn a_run_config_from_an_older_protocol_still_reads_its_version() {
    // Protocol 3 had no sync settings: the message decodes, and the session refuses it by
    // its version.
    let mut old = RUN_CONFIG.to_le_bytes().to_vec();
    for v in [3u32, 128, 128, 16, 4, 4, 600] {
        old.extend_from_slice(&v.to_le_bytes());
    }
    old.extend_from_slice(&3e-3f32.to_le_bytes());
    old.extend_from_slice(&1u64.to_le_bytes());
    let Message::RunConfig { protocol, run, .. } = decode(&old).unwrap() else { panic!("a run config") };
    assert_eq!((protocol, run.steps, run.sync), (3, 600, SyncConfig::SEED));
}

#[test]
fn packed_gradients_are_checked_on_arrival() {
    let good = encode(&Message::Gradient(packed(40)));
    assert!(decode(&good).is_ok());
    // Quant -128 (never produced by the quantizer).
    let mut minus_128 = good.clone();
    *minus_128.last_mut().unwrap() = 0x80;
    assert!(matches!(decode(&minus_128), Err(WireError::Sync(SyncError::QuantRange { quant: -128, .. }))));
    // A block marked empty with values in it.
    let mut empty = good.clone();
    empty[36] = crate::sync::EMPTY_BLOCK;
    assert!(matches!(decode(&empty), Err(WireError::Sync(SyncError::EmptyBlockNotEmpty { block: 0 }))));
    // A contribution that stands for nothing.
    let mut weightless = good.clone();
    weightless[20..24].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(decode(&weightless), Err(WireError::Invalid("a gradient of weight 0".into())));
    assert!(matches!(decode(&good[..good.len() - 1]), Err(WireError::Truncated { .. })));
    let mut long = good;
    long.push(0);
    assert_eq!(decode(&long), Err(WireError::Trailing(1)));
}

/// An f32 contribution that names a private state (an `outer:H` window's inner optimizer
/// state) takes the `-26` form: the `-14` header, then the f32 values to the end. The seed's
/// form stays for one without; each gradient has one form.
#[test]
fn an_f32_gradient_with_a_state_takes_its_own_form() {
    let g = Gradient { state: 0x0102_0304_0506_0708, ..gradient(2) };
    let mut bytes = vec![0xe6, 0xff, 0xff, 0xff, 7, 0, 0, 0, 0xef, 0xbe, 0xad, 0xde, 0x27, 0x26, 0x23, 0xdf];
    bytes.extend([0, 0, 0x20, 0x40, 1, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1]);
    bytes.extend([0, 0, 0x80, 0xbf, 0, 0, 0x40, 0xbf]);
    assert_eq!(encode(&Message::Gradient(g.clone())), bytes);
    assert_eq!(decode(&bytes), Ok(Message::Gradient(g.clone())));
    let repair = Message::RepairResponse { peer: 3, gradient: g.clone() };
    assert_eq!(decode(&encode(&repair)), Ok(repair));
    // Without a state, the seed's form.
    assert_eq!(encode(&Message::Gradient(gradient(2)))[..4], 7i32.to_le_bytes());
    let mut stateless = bytes.clone();
    stateless[24..32].fill(0);
    assert_eq!(decode(&stateless), Err(WireError::Invalid("an f32 gradient with a state names state 0".into())));
    let mut heavy = bytes.clone();
    heavy[20] = 2;
    assert!(matches!(decode(&heavy), Err(WireError::Invalid(_))), "an f32 gradient stands for one step");
    let mut half = bytes.clone();
    half.pop();
    assert!(matches!(decode(&half), Err(WireError::Invalid(_))), "a value cut short");
    for cut in 4..32 {
        assert!(matches!(decode(&bytes[..cut]), Err(WireError::Truncated { .. })), "{cut} bytes");
    }
}

#[test]
fn int4_gradients_are_checked_on_arrival() {
    let values: Vec<f32> = (0..41).map(|i| (i as f32 - 20.0) * 0.125).collect();
    let g = Gradient { values: Values::Int4(crate::sync::pack4(&values).unwrap()), ..gradient(0) };
    let good = encode(&Message::Gradient(g.clone()));
    assert_eq!(decode(&good), Ok(Message::Gradient(g)));
    // 41 values: 2 block bytes, 21 bytes of nibbles, the last high nibble empty.
    assert_eq!(good.len(), 36 + 2 + 21);
    let mut high = good.clone();
    *high.last_mut().unwrap() |= 0x10;
    assert!(matches!(decode(&high), Err(WireError::Invalid(_))), "a nibble past the length");
    // Nibble 8 is -8, which the quantizer never makes.
    let mut eight = good.clone();
    eight[38] = (eight[38] & 0xf0) | 8;
    assert!(matches!(decode(&eight), Err(WireError::Sync(SyncError::QuantRange { index: 0, quant: -8 }))));
    assert!(matches!(decode(&good[..good.len() - 1]), Err(WireError::Truncated { .. })));
}

#[test]
fn epochs_order_by_count_then_pusher() {
    let e = |count, pusher| Epoch { count, pusher };
    assert!(e(0, 0) < e(1, 9));
    assert!(e(1, 9) < e(2, 1), "a later push wins whoever sent it");
    assert!(e(2, 1) < e(2, 5), "of two pushes made at once, the larger pusher id wins");
    assert_eq!(Epoch::default(), e(0, 0));
}

#[test]
fn peer_info_texts_are_bounded_and_utf8() {
    let long = "é".repeat(MAX_INFO_TEXT);
    let Message::PeerInfo { backend, .. } =
        decode(&encode(&Message::PeerInfo { backend: long, verdict: Verdict::NotLoadable { why: String::new() } }))
            .unwrap()
    else {
        panic!("a peer info decodes as one")
    };
    assert_eq!(backend.len(), MAX_INFO_TEXT);
    let mut oversized = PEER_INFO.to_le_bytes().to_vec();
    oversized.extend_from_slice(&(MAX_INFO_TEXT as u16 + 1).to_le_bytes());
    oversized.extend(std::iter::repeat_n(b'a', MAX_INFO_TEXT + 1));
    oversized.extend_from_slice(&[0, 0, 0, 0, 0]);
    assert!(matches!(decode(&oversized), Err(WireError::Invalid(_))));
    let not_utf8 = [PEER_INFO.to_le_bytes().as_slice(), &[1, 0, 0xff, 0, 1, 0, 0, 0]].concat();
    assert!(matches!(decode(&not_utf8), Err(WireError::Invalid(_))));
    let unknown_kind = [PEER_INFO.to_le_bytes().as_slice(), &[1, 0, b'x', 3]].concat();
    assert!(matches!(decode(&unknown_kind), Err(WireError::Invalid(_))));
}

#[test]
fn every_message_round_trips() {
    let settings = Message::RunConfig { protocol: 1, run_id: 0, run: RunConfig::DEFAULT };
    let outer = Message::RunConfig {
        protocol: MESH_PROTOCOL_VERSION,
        run_id: u64::MAX,
        run: RunConfig {
            sync: SyncConfig {
                mode: SyncMode::Outer { inner_steps: 50 },
                compression: Compression::Int8,
                outer: OuterOptimizer::DEFAULT,
                overlap: 0,
                elastic: false,
                rule: StepRule::Adam,
                exchange: crate::sync::Exchange::Mesh,
            },
            ..RunConfig::DEFAULT
        },
    };
    let messages = vec![
        outer,
        Message::Gradient(packed(100)),
        Message::Gradient(packed(0)),
        Message::RepairResponse { peer: 3, gradient: packed(33) },
        Message::Gradient(gradient(10)),
        Message::Gradient(gradient(0)),
        Message::CheckpointPush(vec![1, 2, 3]),
        settings,
        Message::Fragment { id: 5, index: 1, count: 3, payload: vec![9; 100] },
        Message::Resume(vec![4; 50]),
        Message::RepairRequest { step: 4, peer: 77 },
        Message::RepairResponse { peer: 2, gradient: gradient(3) },
        Message::PeerInfo { backend: "dp4a".into(), verdict: Verdict::Admitted { cases: 40 } },
        Message::PeerInfo {
            backend: "lut".into(),
            verdict: Verdict::Rejected { case: "k=1".into(), detail: "bits".into() },
        },
        Message::PeerInfo { backend: "x".into(), verdict: Verdict::NotLoadable { why: "no device".into() } },
        Message::Ping { nonce: u64::MAX },
        Message::Pong { nonce: 0 },
        Message::Epoch(Epoch { count: u32::MAX, pusher: 7 }),
        Message::Removed { step: 9, why: Removal::Kicked("kicked".into()) },
        Message::Removed { step: 9, why: Removal::Slow { windows: 4 } },
        Message::Leaving,
        Message::Raft { run: 3, bytes: vec![] },
        Message::Raft { run: 3, bytes: vec![1; 300] },
        Message::CatchUp { applied: 7 },
    ];
    for m in messages {
        assert_eq!(decode(&encode(&m)).unwrap(), m);
    }
}

/// The audits' messages: an accusation of each evidence kind, a removal for a verdict.
#[test]
fn audit_messages_round_trip() {
    use crate::wire::{AuditVerdict, Evidence};
    let evidences = [
        Evidence::Word { word: 7, expected: 1, claimed: 2 },
        Evidence::Digest { named: 3, recomputed: 4 },
        Evidence::FalseAccusation { accused: 9 },
    ];
    for evidence in evidences {
        let accusation = Message::Accusation { step: 12, target: 5, evidence };
        assert_eq!(decode(&encode(&accusation)), Ok(accusation.clone()));
        let bytes = encode(&accusation);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "{cut} bytes");
        }
        let verdict = AuditVerdict { step: 12, target: 5, found_by: 2, evidence };
        let removed = Message::Removed { step: 14, why: Removal::Audit(verdict) };
        assert_eq!(decode(&encode(&removed)), Ok(removed));
    }
    assert_eq!(
        encode(&Message::Accusation { step: 1, target: 2, evidence: evidences[2] })[..4],
        [0xeb, 0xff, 0xff, 0xff]
    );
}

#[test]
fn malformed_bytes_are_errors_never_panics() {
    assert!(matches!(decode(&[]), Err(WireError::Truncated { .. })));
    assert!(matches!(decode(&[1, 0]), Err(WireError::Truncated { .. })));
    assert_eq!(decode(&(-99i32).to_le_bytes()), Err(WireError::UnknownSentinel(-99)));
    let mut g = encode(&Message::Gradient(gradient(2)));
    g.push(0);
    assert!(matches!(decode(&g), Err(WireError::Invalid(_))));
    let mut req = encode(&Message::RepairRequest { step: 1, peer: 1 });
    req.push(0);
    assert_eq!(decode(&req), Err(WireError::Trailing(1)));
    let epoch = encode(&Message::Epoch(Epoch { count: 1, pusher: 2 }));
    assert!(matches!(decode(&epoch[..epoch.len() - 1]), Err(WireError::Truncated { .. })));
    let mut big = (-2i32).to_le_bytes().to_vec();
    big.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(decode(&big), Err(WireError::Invalid(_))));
    let removal = [REMOVED.to_le_bytes().as_slice(), &[1, 0, 0, 0, 7]].concat();
    assert_eq!(decode(&removal), Err(WireError::Invalid("removal kind 7".into())));
    let bad_fragment = encode(&Message::Fragment { id: 1, index: 3, count: 3, payload: vec![] });
    assert!(matches!(decode(&bad_fragment), Err(WireError::Invalid(_))));
    // Every prefix and a seeded stream of random frames: errors or messages, no panics.
    let full = encode(&Message::RepairResponse { peer: 2, gradient: gradient(5) });
    for cut in 0..full.len() {
        let _ = decode(&full[..cut]);
    }
    let mut rng = lockstep_luts::rng::SplitMix64::new(99);
    let mut reassembler = Reassembler::default();
    for _ in 0..5000 {
        let len = rng.below(64) as usize;
        let mut frame: Vec<u8> = (0..len).map(|_| rng.next_u32() as u8).collect();
        if len >= 4 && rng.below(2) == 0 {
            let sentinel = -(rng.below(20) as i32) - 1;
            frame[..4].copy_from_slice(&sentinel.to_le_bytes());
        }
        let _ = decode(&frame);
        let _ = reassembler.push(rng.below(3), &frame);
    }
}

#[test]
fn large_messages_fragment_and_reassemble_in_any_order() {
    let message = Message::Gradient(gradient(40_000)); // 160 KB
    let parts = frames(encode(&message), 42);
    assert_eq!(parts.len(), 4);
    assert!(parts.iter().all(|f| f.len() <= FRAGMENT_BYTES));
    let mut r = Reassembler::default();
    let order = [2, 0, 3, 1];
    for (i, &k) in order.iter().enumerate() {
        let out = r.push(1, &parts[k]).unwrap();
        if i + 1 < order.len() {
            assert_eq!(out, None);
            assert_eq!(r.push(1, &parts[k]).unwrap(), None, "a duplicate is ignored");
        } else {
            assert_eq!(out, Some(message.clone()));
        }
    }
    // Two senders' fragments with the same id do not mix.
    let small = frames(encode(&Message::Gradient(gradient(20_000))), 42);
    let mut r = Reassembler::default();
    for f in &small[..small.len() - 1] {
        assert_eq!(r.push(1, f).unwrap(), None);
        assert_eq!(r.push(2, f).unwrap(), None);
    }
    assert!(r.push(1, small.last().unwrap()).unwrap().is_some());
    r.forget(2);
    assert_eq!(r.held(), 0);
    // A message that fits travels whole.
    assert_eq!(frames(encode(&Message::RepairRequest { step: 1, peer: 1 }), 0).len(), 1);
}

/// An auditor takes a served state only as the one its contribution named, of the part asked
/// for, each chunk matching its digest: the state back with the chunks in place (zeros
/// elsewhere); anything else is another state (withholding), none served is none kept.
#[test]
fn a_served_state_is_checked_against_the_digest_named_chunk_by_chunk() {
    let residual: Vec<f32> = (0..3 * STATE_CHUNK - 5).map(|i| (i as f32).sin()).collect();
    let digests = state_chunk_digests(&residual);
    let named = state_digest(&residual);
    assert_eq!(named, state_digest_of(residual.len(), &digests));
    let len = residual.len();
    let part = StatePart::Chunks(vec![0, 2]);
    let served = ServedState::of(&residual, &digests, &part);
    let state = served.check(len, named, &part).expect("the state named");
    assert_eq!(&state[..STATE_CHUNK], &residual[..STATE_CHUNK]);
    assert!(state[STATE_CHUNK..2 * STATE_CHUNK].iter().all(|&v| v == 0.0));
    assert_eq!(&state[2 * STATE_CHUNK..], &residual[2 * STATE_CHUNK..]);
    let whole = ServedState::of(&residual, &digests, &StatePart::Whole);
    assert_eq!(whole.check(len, named, &StatePart::Whole), Ok(residual.clone()));
    assert_eq!(served.check(len, named ^ 1, &part), Err(NotServed::Another), "another state's digests");
    assert_eq!(served.check(len, named, &StatePart::Chunks(vec![0, 1])), Err(NotServed::Another), "another part");
    let mut tampered = served.clone();
    tampered.parts[1].1[0] += 1.0;
    assert_eq!(tampered.check(len, named, &part), Err(NotServed::Another), "a value not its chunk's digest's");
    let mut doubled = residual.clone();
    doubled.iter_mut().for_each(|v| *v *= 2.0);
    let forged = ServedState::of(&doubled, &state_chunk_digests(&doubled), &part);
    assert_eq!(forged.check(len, named, &part), Err(NotServed::Another), "a forged residual");
    assert_eq!(ServedState::default().check(len, named, &part), Err(NotServed::Gone));
}

/// The agreement's, the link's and the audits' messages jump a link's outgoing queue, read
/// from a message's first word; contributions, repairs, resumes, epochs and served states wait
/// their turn. Only the audits' are read before what came ahead of them, never a fragment.
#[test]
fn the_agreements_the_links_and_the_audits_messages_jump_the_queue() {
    let evidence = Evidence::Word { word: 1, expected: 0, claimed: 1 };
    let served = ServedState { len: 0, digests: Vec::new(), parts: Vec::new() };
    let agreement = [
        Message::Raft { run: 3, bytes: vec![1; 30] },
        Message::CatchUp { applied: 7 },
        Message::Ping { nonce: 1 },
        Message::Pong { nonce: 1 },
        Message::PeerInfo { backend: "cpu".into(), verdict: Verdict::Admitted { cases: 1 } },
        Message::Leaving,
        Message::Removed { step: 9, why: Removal::Slow { windows: 4 } },
    ];
    let audits = [
        Message::Accusation { step: 3, target: 7, evidence },
        Message::StateRequest { step: 3, part: StatePart::Whole },
        Message::TraceRequest { step: 3, definition: Trace { ops: vec![vec![1, 2]] } },
        Message::Trace { step: 3, answer: TraceAnswer { trace: Trace::default(), words: Some((2, 0, vec![0; 4096])) } },
        Message::WeightsRequest { step: 3, digests: vec![1; 900] },
        Message::Weights { step: 3, words: Some((2, vec![0; 1024])) },
    ];
    let waiting = [
        Message::Gradient(gradient(10)),
        Message::Gradient(packed(100)),
        Message::RepairRequest { step: 4, peer: 77 },
        Message::RepairResponse { peer: 2, gradient: gradient(3) },
        Message::Resume(vec![4; 50]),
        Message::Epoch(Epoch { count: 1, pusher: 7 }),
        Message::State { step: 3, served },
    ];
    for m in &agreement {
        assert!(jumps_the_queue(&encode(m)) && !audit_message(&encode(m)), "{m:?}");
    }
    for m in &audits {
        assert!(jumps_the_queue(&encode(m)) && audit_message(&encode(m)), "{m:?}");
    }
    for m in &waiting {
        assert!(!jumps_the_queue(&encode(m)) && !audit_message(&encode(m)), "{m:?}");
    }
    let large = Message::Trace {
        step: 3,
        answer: TraceAnswer { trace: Trace::default(), words: Some((2, 0, vec![0; 40_000])) },
    };
    let parts = frames(encode(&large), 1);
    assert!(parts.len() > 1 && parts.iter().all(|f| !audit_message(f)));
    assert!(!jumps_the_queue(&[]) && !audit_message(&[0xff, 0xff]));
}
