use super::*;
use crate::data::CorpusSource;
use crate::gemm::FloatGemm;

/// An auditor whose applied step is the promise ahead of a contribution's may ask for its
/// state while this member computes the next step and lags by one more: still served, at a
/// GPT-2-sized residual (the fewest kept) as at a tiny one.
#[test]
fn states_are_served_past_the_promise_while_the_next_step_computes() {
    for len in [10_000, 85_800_000] {
        let kept = KeptStates::default();
        let state = Arc::new(vec![0.5f32; len]);
        let promised = crate::session::STATE_PROMISED_STEPS;
        // The asker applied step 1 + promised + 1 (it lags the group by one); this member
        // applied the group's step 1 + promised + 2 and computes the next.
        for step in 1..=1 + promised + 3 {
            kept.keep(step, state.clone());
        }
        assert!(kept.get(1).is_some(), "len {len}: the state asked for is gone");
    }
}

/// Float products and the built-in corpus; a backend opened by name is refused, so a test
/// that needed one fails.
struct FloatOnly;

impl Provider for FloatOnly {
    fn open_backend(&mut self, name: &str) -> Result<Box<dyn Gemm + Send>, ForeignError> {
        Err(Arc::new(std::io::Error::other(format!("no backend `{name}` in this test"))))
    }

    fn data_source(&mut self, seed: u64) -> Result<Box<dyn DataSource>, ForeignError> {
        Ok(Box::new(CorpusSource::builtin(seed)))
    }

    fn referee_opener(&self) -> crate::replica::RefereeOpener {
        Arc::new(|| Err(Arc::new(std::io::Error::other("no referee in this test (float products are not checked)"))))
    }
}

fn as_f32(gradient: &Gradient) -> &[f32] {
    match &gradient.values {
        crate::sync::Values::F32(v) => v,
        crate::sync::Values::Int8(_) | crate::sync::Values::Int4(_) => panic!("an uncompressed run sends f32"),
    }
}

fn tiny() -> RunConfig {
    RunConfig {
        model: crate::config::ModelConfig { width: 32, context: 32, layers: 1, heads: 2 },
        batch: 2,
        ..RunConfig::DEFAULT
    }
}

#[test]
fn a_new_run_keeps_the_backend_the_last_run_ended_with() {
    // A name nothing resolves to: a second run that opened `backend` again would fail.
    let float = Box::new(FloatGemm::new(1));
    let mut replica = TrainerReplica::new("no-such-backend", Box::new(FloatOnly), Some(float));
    replica.configure(&tiny()).expect("the first run takes the admitted backend");
    let gradient = replica.compute(1).expect("a step");
    replica.apply(as_f32(&gradient), &[], true);
    assert_eq!(replica.weight_hash(), replica.compute(2).expect("a second step").whash);
    replica.configure(&tiny()).expect("the second run takes the first run's backend");
    assert_eq!(replica.compute(1).expect("a step of the new run"), gradient);
}

/// The group applied step 2 before this member's compute of it began (the adapter took the
/// replica first, or the member caught up on records): the compute is refused as stale, in
/// every mode — never run on the new weights as if they were the old ones. (In `outer:H` the
/// step count once stayed behind, the stale compute ran, and its weights forked.)
#[test]
fn a_compute_begun_after_its_step_was_applied_is_refused_as_stale() {
    for (sync, overlap) in [("every-step", "0"), ("outer:2", "0"), ("outer:2", "1")] {
        let run = crate::settings::with(tiny(), [("sync", sync), ("overlap", overlap)]).expect("a sync mode");
        let sync = format!("{sync} overlap {overlap}");
        let member = || {
            let mut r = TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
            r.configure(&run).expect("a run");
            r
        };
        let (mut a, mut b) = (member(), member());
        let first = a.compute(1).expect("step 1");
        b.compute(1).expect("step 1");
        a.apply(as_f32(&first), &[], true);
        b.apply(as_f32(&first), &[], true);
        // Step 2's mean, from a's contribution alone: b never began its own.
        let second = a.compute(2).expect("step 2");
        a.apply(as_f32(&second), &[], true);
        b.apply(as_f32(&second), &[], false);
        assert_eq!(b.steps_done(), 2, "{sync}: a sync applied without computing counts");
        assert!(
            matches!(b.compute(2), Err(ReplicaError::WrongStep { asked: 2, at: 2 })),
            "{sync}: the stale compute is refused"
        );
        assert_eq!(b.weight_hash(), a.weight_hash(), "{sync}: one group, one set of weights");
        assert_eq!(b.compute(3).expect("step 3").whash, a.compute(3).expect("step 3").whash, "{sync}");
    }
}

/// A step taken tentatively and undone leaves the replica as it was, bit for bit: the
/// weights, and the next contribution (the same batch, the same optimizer state).
#[test]
fn an_undone_step_leaves_the_replica_as_it_was() {
    for sync in ["every-step", "outer:2"] {
        let run = crate::settings::with(tiny(), [("sync", sync)]).expect("a sync mode");
        let mut replica = TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
        replica.configure(&run).expect("a run");
        let first = replica.compute(1).expect("step 1");
        let (before, done) = (replica.weight_hash(), replica.steps_done());
        let other: Vec<f32> = as_f32(&first).iter().map(|v| v * 0.5).collect();
        replica.apply_tentatively(&other, &[], true);
        assert_ne!(replica.weight_hash(), before, "{sync}: the tentative step moved the weights");
        let on_top = replica.compute(2).expect("step 2 behind the commit");
        replica.rollback();
        assert_eq!(replica.weight_hash(), before, "{sync}: undone");
        assert_eq!(replica.steps_done(), done, "{sync}");
        // The step that did commit, then the next, as a replica that never guessed has them.
        let mut plain = TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
        plain.configure(&run).expect("a run");
        assert_eq!(plain.compute(1).expect("step 1"), first);
        plain.apply(as_f32(&first), &[], true);
        replica.apply(as_f32(&first), &[], true);
        let (ours, theirs) = (replica.compute(2).expect("step 2"), plain.compute(2).expect("step 2"));
        assert_eq!(ours, theirs, "{sync}: the same contribution after the undo");
        assert_ne!(ours.whash, on_top.whash, "{sync}");
        // A step that stands: confirmed, it is the plain apply's.
        replica.apply_tentatively(as_f32(&ours), &[], true);
        replica.confirm();
        plain.apply(as_f32(&theirs), &[], true);
        assert_eq!(replica.weight_hash(), plain.weight_hash(), "{sync}: confirmed");
    }
}

#[test]
fn a_staged_swap_takes_over_at_the_next_step_and_is_reported_once() {
    let mut replica = TrainerReplica::new("first", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
    replica.configure(&tiny()).expect("a run");
    let first = replica.compute(1).expect("step 1");
    replica.apply(as_f32(&first), &[], true);
    replica.stage("second".into(), Verdict::Admitted { cases: 40 }, Box::new(FloatGemm::new(2)));
    assert_eq!(replica.take_backend_change(), None, "staged, not yet in use");
    replica.compute(2).expect("step 2");
    assert_eq!(
        replica.take_backend_change(),
        Some(BackendChange { backend: "second".into(), verdict: Verdict::Admitted { cases: 40 }, step: 2 })
    );
    assert_eq!(replica.take_backend_change(), None);
}

/// An audit recomputes a contribution from the state it named, in every mode that names one
/// — packed `every-step` (the residual) and `outer:H` (the window's inner optimizer state and
/// the residual, none in f32; the window run again by a trainer on the referee): the values and loss
/// bit for bit, and the digest of the state the contribution leaves is the one the
/// member's next contribution names. A state the member did not start from gives other
/// values. An audit of a part (`every-step`: two chunks of the residual, zeros elsewhere)
/// gives the same values and the same next residual in those chunks.
#[test]
fn an_audit_recomputes_a_contribution_from_the_state_it_named_and_the_state_it_leaves() {
    let modes = [
        ("every-step", "int8", "0"),
        ("outer:2", "int8", "0"),
        ("outer:3", "int4", "0"),
        ("outer:2", "none", "0"),
        ("outer:3", "int8", "1"),
        ("outer:3", "none", "2"),
    ];
    for (sync, compress, overlap) in modes {
        let settings = [("sync", sync), ("compress", compress), ("overlap", overlap)];
        let run = crate::settings::with(tiny(), settings).expect("a sync mode");
        let mut member = TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
        member.set_identity(5);
        member.keep_audit_weights(true);
        member.configure(&run).expect("a run");
        let kept = member.kept_states();
        let mut left: Option<u64> = None;
        for step in 1..=4 {
            let sent = member.compute(step).expect("a contribution");
            let state = kept.get(step).expect("the state it named is kept");
            assert_eq!(crate::wire::state_digest(&state), sent.state, "{sync} {compress} step {step}");
            let n = crate::params::Layout::new(run.model).len;
            assert_eq!(state.len(), crate::sync::private_state_len(&run.sync, n));
            if run.sync.overlap > 0 {
                // The first window began on the group's weights; each after it, with steps run
                // ahead from the member's own.
                let named = crate::sync::split_window_state(&state, &run.sync, n).expect("a window's state");
                let ahead = named.ahead.expect("an overlapped window names its steps run ahead").0;
                assert_eq!(ahead, if step == 1 { 0 } else { run.sync.overlap }, "{sync} {compress} step {step}");
            }
            if let Some(left) = left {
                assert_eq!(sent.state, left, "{sync} {compress} step {step}: the link holds");
            }
            let reduced = crate::sync::reduce_one(sent.values.clone());
            let grid = Arc::new(reduced.grid.clone());
            let audit_part = |state: Arc<Vec<f32>>, checked: Option<Vec<u32>>, member: &mut TrainerReplica| {
                let mut kit = member.audit_kit(step, 5).expect("a kit");
                kit.referee = Some(Box::new(FloatGemm::new(1)));
                let (grid, weight, checked) = (grid.clone(), sent.weight, checked.map(Arc::new));
                kit.private = Some(PrivateInputs { residual: state, checked, grid, weight });
                kit.recompute().0.expect("recomputed")
            };
            let audit = |state: Arc<Vec<f32>>, member: &mut TrainerReplica| audit_part(state, None, member);
            let again = audit(state.clone(), &mut member);
            assert_eq!(again.values, sent.values, "{sync} {compress} step {step}");
            assert_eq!(again.loss.to_bits(), sent.loss.to_bits(), "{sync} {compress} step {step}");
            let next = again.next_state.clone().expect("the values fit the grid");
            left = Some(crate::wire::state_digest_of(state.len(), &next));
            if sync == "every-step" {
                assert!(crate::wire::chunks_of(state.len()) > 3, "a residual of more than three chunks");
                let mut part = vec![0.0; state.len()];
                for c in [1, 3] {
                    let range = crate::wire::chunk_range(c, state.len());
                    part[range.clone()].copy_from_slice(&state[range]);
                }
                let of_part = audit_part(Arc::new(part), Some(vec![1, 3]), &mut member);
                let (Values::Int8(whole), Values::Int8(got)) = (&sent.values, &of_part.values) else {
                    panic!("int8 values")
                };
                for c in [1, 3] {
                    let range = crate::wire::chunk_range(c, state.len());
                    let values =
                        |p: &crate::sync::Packed| range.clone().map(|i| p.value(i).to_bits()).collect::<Vec<_>>();
                    assert_eq!(values(got), values(whole), "chunk {c} at step {step}");
                    assert_eq!(of_part.next_state.as_ref().expect("fits")[c as usize], next[c as usize], "chunk {c}");
                }
                assert_eq!(of_part.loss.to_bits(), sent.loss.to_bits());
            }
            if step > 1 {
                // The residual doubled, as the `state` rogue does (it is the state's tail); an
                // f32 window's first moment (the state's head: it has no residual).
                let mut forged = state.to_vec();
                let forged_range = if compress == "none" { 0..n } else { state.len() - n..state.len() };
                forged[forged_range].iter_mut().for_each(|r| *r *= 2.0);
                let forged = Arc::new(forged);
                assert_ne!(audit(forged, &mut member).values, sent.values, "{sync} {compress} step {step}");
            }
            member.apply(&reduced.mean, &reduced.grid, true);
        }
    }
}

/// A member resumed from a checkpoint at step 3 computes, at step 4, the gradient a member
/// that trained from the start computes there: its batch depends on its seed and the step,
/// not on when it joined (`docs/TRUST.md`, batches by position).
#[test]
fn a_member_resumed_mid_run_draws_the_batch_of_the_step() {
    let replica = || TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
    let mut from_start = replica();
    from_start.configure(&tiny()).expect("a run");
    for step in 1..=3 {
        let gradient = from_start.compute(step).expect("a step");
        from_start.apply(as_f32(&gradient), &[], true);
    }
    let checkpoint = from_start.snapshot();
    let mut joiner = replica();
    joiner.configure(&tiny()).expect("a run");
    // The joiner has drawn a batch of its own before it is resumed.
    let early = joiner.compute(1).expect("a step");
    joiner.apply(as_f32(&early), &[], true);
    assert_eq!(joiner.restore(&checkpoint).expect("a resume").0, 3);
    assert_eq!(joiner.compute(4).expect("a step"), from_start.compute(4).expect("a step"));
}

/// A member that slept through steps and took them from the group's records (applied without
/// computing them) draws, at its next compute, the batch of that step — not the next of its
/// own stream, which would make its honest contribution depart from the definition and an
/// audit remove it (a chaos campaign found it so): a member that computed every step gives the
/// same contribution there.
#[test]
fn a_member_that_took_steps_without_computing_them_draws_the_batch_of_the_step() {
    let replica = || TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
    let (mut every, mut slept) = (replica(), replica());
    every.configure(&tiny()).expect("a run");
    slept.configure(&tiny()).expect("a run");
    for step in 1..=3 {
        let gradient = every.compute(step).expect("a step");
        every.apply(as_f32(&gradient), &[], true);
        slept.apply(as_f32(&gradient), &[], false);
    }
    assert_eq!(slept.compute(4).expect("a step"), every.compute(4).expect("a step"));
}

/// `outer:4` with an overlap of 2: the replica runs the next window's first steps on a
/// thread of its own after each contribution and gives the bits of a trainer driven by
/// hand (contribute, run ahead, finish); its hash and checkpoint are the group's state at
/// the sync, and a member resumed from that checkpoint contributes from the same weights.
#[test]
fn an_overlapped_replica_runs_ahead_and_checkpoints_the_groups_state() {
    let mut run = tiny();
    run.steps = 12;
    run.sync = crate::sync::SyncConfig {
        mode: crate::sync::SyncMode::Outer { inner_steps: 4 },
        overlap: 2,
        ..crate::sync::SyncConfig::SEED
    };
    let replica = || TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
    let mut member = replica();
    member.configure(&run).expect("a run");
    let mut by_hand =
        Trainer::new(run, Box::new(FloatGemm::new(1)), Box::new(CorpusSource::builtin(node_data_seed(run.seed, 0))))
            .expect("a run");
    let halved = |g: &Gradient| as_f32(g).iter().map(|v| v * 0.5).collect::<Vec<f32>>();
    for step in 1..=2 {
        let gradient = member.compute(step).expect("a sync");
        assert_eq!(member.steps_done(), step, "running ahead adds no sync");
        let contribution = by_hand.contribute().expect("a sync");
        assert_eq!(Values::F32(as_f32(&gradient).to_vec()), contribution.values);
        by_hand.run_ahead().expect("steps ahead");
        // Any mean will do: half the contribution.
        member.apply(&halved(&gradient), &[], true);
        by_hand.finish_sync(&halved(&gradient), &[], true).expect("the mean");
        assert_eq!(member.weight_hash(), by_hand.weight_hash());
        assert_eq!(by_hand.step_count(), 4 * step + 2, "two steps ahead");
    }
    let checkpoint = member.snapshot();
    let state = checkpoint::decode(&checkpoint, Some(run.model)).expect("a checkpoint");
    assert_eq!(state.step, 8, "the sync's step, not the steps run ahead");
    assert_eq!(crate::params::weight_hash(&state.weights), by_hand.weight_hash());
    let mut joiner = replica();
    joiner.configure(&run).expect("a run");
    assert_eq!(joiner.restore(&checkpoint).expect("a resume").0, 2);
    let from_start = member.compute(3).expect("the last sync");
    let joined = joiner.compute(3).expect("the last sync");
    assert_eq!(joined.whash, from_start.whash, "both contribute from the group's weights");
    assert_ne!(joined.values, from_start.values, "the joiner has no steps ahead");
}

#[test]
fn errors_stay_typed() {
    let mut replica = TrainerReplica::new("none", Box::new(FloatOnly), None);
    assert!(matches!(replica.compute(1), Err(ReplicaError::NoRun)));
    assert!(matches!(replica.configure(&tiny()), Err(ReplicaError::Backend(_))));
    let mut bad = tiny();
    bad.model.heads = 3;
    assert!(matches!(
        replica.configure(&bad),
        Err(ReplicaError::Config(ConfigError::HeadsDoNotDivideWidth { width: 32, heads: 3 }))
    ));
    let mut replica = TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
    replica.configure(&tiny()).expect("a run");
    assert!(matches!(replica.compute(2), Err(ReplicaError::WrongStep { asked: 2, at: 0 })));
    assert!(matches!(replica.restore(b"not a checkpoint"), Err(ReplicaError::Checkpoint(_))));
}

/// The guard's disputes on a real trainer, in every mode (an overlapped window's too): the check of
/// our own weights finds them the definition's while nothing touched them (applied at once or
/// taken ahead of the commit and confirmed), and the first weight where they part once one
/// bit flips — after an update (the update's result departs) or before one (the state it began
/// from departs from what the step before was computed from); a member's answer names the
/// first chunk that parts from the leader's digests, with its words.
#[test]
fn the_weights_a_step_was_computed_from_are_checked_against_the_definitions_update() {
    let modes =
        [("every-step", "none", "0"), ("every-step", "int8", "0"), ("outer:2", "int8", "0"), ("outer:2", "int8", "1")];
    for (sync, compress, overlap) in modes {
        let settings = [("sync", sync), ("compress", compress), ("overlap", overlap)];
        let run = crate::settings::with(tiny(), settings).expect("a sync mode");
        for tentative in [false, true] {
            let what = format!("{sync} {compress} overlap {overlap} tentative {tentative}");
            let mut member = TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
            member.set_identity(5);
            member.keep_audit_weights(true);
            member.configure(&run).expect("a run");
            let apply = |member: &mut TrainerReplica, sent: &Gradient| {
                let reduced = crate::sync::reduce_one(sent.values.clone());
                if tentative {
                    member.apply_tentatively(&reduced.mean, &reduced.grid, true);
                    member.confirm();
                } else {
                    member.apply(&reduced.mean, &reduced.grid, true);
                }
            };
            for step in 1..=3 {
                let sent = member.compute(step).expect("a contribution");
                let checked = member.check_weights(step).unwrap_or_else(|e| panic!("{what} step {step}: {e}"));
                assert_eq!(checked.departs, None, "{what} step {step}");
                let held = member.started_from(step).expect("kept");
                assert_eq!(checked.definition.as_slice(), held.as_slice(), "{what} step {step}: bit for bit");
                assert_eq!(member.weights_apart(step, &checked.digests), None, "{what} step {step}");
                apply(&mut member, &sent);
            }
            // One bit flipped after the update of step 3: the contribution to step 4 is
            // computed from it, and the update's result departs there.
            member.flip_weight_bit();
            let sent = member.compute(4).expect("a contribution");
            let checked = member.check_weights(4).expect("checked");
            let held = member.started_from(4).expect("kept");
            let (word, expected, claimed) = checked.departs.expect("the flip departs");
            assert_eq!((word, expected ^ 1), (0, claimed), "{what}");
            assert_eq!(claimed, held[0].to_bits(), "{what}");
            // A member answering the definition's digests names chunk 0 and its words.
            let honest: Vec<f32> = checked.definition.to_vec();
            let digests = crate::wire::state_chunk_digests(&honest);
            let (chunk, words) = member.weights_apart(4, &digests).expect("a chunk parts");
            assert_eq!((chunk, words[0]), (0, claimed), "{what}");
            assert_eq!(words.len(), crate::wire::STATE_CHUNK.min(held.len()), "{what}");
            // Flipped back before the update of step 4 (inside the sync: an `outer:H` window's
            // start with it): the state that update began from is not the one step 4 was
            // computed from.
            member.flip_weight_bit();
            apply(&mut member, &sent);
            member.compute(5).expect("a contribution");
            let (word, expected, claimed) = member.check_weights(5).expect("checked").departs.expect("departs");
            assert_eq!((word, expected ^ 1), (0, claimed), "{what}: the weights the update began from");
            // Past what is kept: said, not guessed.
            assert!(matches!(member.check_weights(2), Err(ReplicaError::UpdateGone { step: 2 })), "{what}");
        }
    }
}

/// [`FloatOnly`] with a referee opener that records the threads it was called on.
struct CountedReferee(Arc<std::sync::Mutex<Vec<std::thread::ThreadId>>>);

impl Provider for CountedReferee {
    fn open_backend(&mut self, name: &str) -> Result<Box<dyn Gemm + Send>, ForeignError> {
        FloatOnly.open_backend(name)
    }

    fn data_source(&mut self, seed: u64) -> Result<Box<dyn DataSource>, ForeignError> {
        FloatOnly.data_source(seed)
    }

    fn referee_opener(&self) -> crate::replica::RefereeOpener {
        let opened = self.0.clone();
        Arc::new(move || {
            opened.lock().unwrap().push(std::thread::current().id());
            Ok(Box::new(FloatGemm::new(1)))
        })
    }
}

/// An audit's kit is made under the replica's lock on the adapter's loop; the referee it needs
/// when none was kept is opened where the recomputation runs — its own thread, at its
/// priority — never where the kit is made (opening one, the gate, held the loop for up to
/// 0.4 s on a busy machine). The referee comes back for the next audit; one that cannot be
/// opened is the audit's error, with none to give back.
#[test]
fn an_audit_opens_its_referee_where_it_runs_not_where_its_kit_is_made() {
    let opened = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut member =
        TrainerReplica::new("f", Box::new(CountedReferee(opened.clone())), Some(Box::new(FloatGemm::new(1))));
    member.set_identity(5);
    member.keep_audit_weights(true);
    member.configure(&tiny()).expect("a run");
    let sent = member.compute(1).expect("a contribution");
    let kit = member.audit_kit(1, 5).expect("a kit");
    assert!(opened.lock().unwrap().is_empty(), "no referee opened with the kit");
    let (outcome, referee) = std::thread::spawn(move || kit.recompute()).join().expect("the audit's thread");
    let recomputed = outcome.expect("recomputed on the referee it opened");
    assert_eq!(recomputed.values, sent.values);
    assert!(referee.is_some(), "the referee comes back for the next audit");
    let on = opened.lock().unwrap().clone();
    assert_eq!(on.len(), 1);
    assert_ne!(on[0], std::thread::current().id(), "opened on the audit's thread");

    let mut member = TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
    member.set_identity(5);
    member.keep_audit_weights(true);
    member.configure(&tiny()).expect("a run");
    member.compute(1).expect("a contribution");
    let (outcome, referee) = member.audit_kit(1, 5).expect("a kit").recompute();
    let error = outcome.expect_err("no referee to recompute on").to_string();
    assert!(error.contains("no referee to recompute on"), "{error}");
    assert!(referee.is_none());
}
