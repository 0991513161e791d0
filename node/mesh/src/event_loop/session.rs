//! The loop's side of the session: inputs fed to the core ([`MeshLoop::drive`]) and each
//! [`Output`] carried out against the replica, in order — compute on a blocking thread, apply
//! (tentatively or not), confirm or undo a step taken ahead of its commit, checkpoints taken,
//! restored and saved — and what a compute result or a stop means for it.

use super::*;

impl<R: Fn(Report) + Send + 'static> MeshLoop<R> {
    pub(super) fn on_computed(
        &mut self,
        Computed { step, result, seconds, hash, change, rogue_began, generation }: Computed,
    ) {
        self.computing -= 1;
        if let Some(step) = rogue_began {
            (self.report)(Report::RogueBegan { step });
        }
        // The replica is free: the audits waiting for it take their kits now.
        for (step, target, private, trace, urgency) in std::mem::take(&mut self.audit_waiting) {
            self.spawn_audit(step, target, private, trace, urgency);
        }
        if let Some(change) = change {
            self.announce(change);
        }
        if generation != self.generation {
            // Begun before a restore, a new run or an undone step: it answers a state that is
            // gone.
            (self.report)(Report::Warning(
                "a gradient begun on weights since replaced (a restore, or a step undone) was dropped".into(),
            ));
            return;
        }
        match result {
            Ok(gradient) => {
                self.last_computed = Some((gradient.step, gradient.whash));
                // The gradient carries the hash of the weights it was computed from: the last
                // applied step's, when it is the next step's. (A step the group applied without
                // waiting for ours leaves our gradient one step behind: it is dropped, and the
                // hash asked of the replica.)
                match self.unreported.take() {
                    Some((step, timing)) if step + 1 == gradient.step => {
                        (self.report)(Report::Applied { step, whash: gradient.whash, timing })
                    }
                    other => {
                        self.unreported = other;
                        self.flush();
                    }
                }
                self.timing = StepTiming { compute: seconds - hash, hash_guard: hash, ..StepTiming::default() };
                self.computed_at = Some(Instant::now());
                self.drive(vec![Input::Computed(gradient)]);
            }
            // The session stops this node's run and says why (`Stop::Compute`).
            // The group applied this step without waiting for ours before the compute began (a
            // member it went on without): the replica is past it — nothing failed, nothing to send.
            Err(ReplicaError::WrongStep { asked, at }) if at >= asked => {}
            Err(error) => self.drive(vec![Input::Failed { task: Task::Compute { step }, error: Failure::new(error) }]),
        }
    }

    /// Feeds the session and carries out its outputs; an output that answers at once (a
    /// configure, a restore) feeds its answer back before anything else.
    pub(super) fn drive(&mut self, inputs: Vec<Input>) {
        let mut queue: VecDeque<Input> = inputs.into();
        while let Some(input) = queue.pop_front() {
            let Some(session) = self.session.as_mut() else { return };
            let handling = Instant::now();
            let outputs = session.handle(input);
            // The input that completes a step carries the guard and the roster-order average.
            let handled = handling.elapsed().as_secs_f64();
            for output in outputs {
                if let Some(answer) = self.execute(output, handled) {
                    queue.push_front(answer);
                }
            }
        }
    }

    /// Carries out one session output; returns the session's next input when the output is
    /// answered at once.
    fn execute(&mut self, output: Output, handled: f64) -> Option<Input> {
        match output {
            Output::Send { to, message } => self.links.send(to, &message),
            Output::Configure(settings) => {
                self.generation += 1;
                let (result, hurry) = {
                    let mut replica = self.replica();
                    (replica.configure(&settings), replica.hurry())
                };
                // The run's trainer is new: so is where its windows are told to end.
                self.hurry = hurry;
                let backend = match &self.hello {
                    Message::PeerInfo { backend, .. } => backend.clone(),
                    _ => self.config.backend.clone(),
                };
                match &result {
                    Ok(_) => {
                        self.replica().keep_audit_weights(self.config.audit_rate > 0);
                        if let Some(admitted) = self.replica().take_admission_at_shapes() {
                            (self.report)(Report::AtRunShapes { backend, verdict: Ok(admitted) });
                        }
                    }
                    Err(error) => {
                        if let Some(verdict) = error.cannot_take_part() {
                            // This node cannot compute the run: every peer is told (it is an
                            // observer from now on), then the session hears why.
                            self.hello = Message::PeerInfo { backend: backend.clone(), verdict };
                            let hello = self.hello.clone();
                            self.links.broadcast(&hello);
                        }
                        if let ReplicaError::Shapes(refused) = error {
                            (self.report)(Report::AtRunShapes { backend, verdict: Err(refused.clone()) });
                        }
                    }
                }
                return Some(match result {
                    Ok(weights) => Input::Configured { weights },
                    Err(error) => Input::Failed { task: Task::Configure, error: Failure::new(error) },
                });
            }
            Output::Compute { step, cap } => self.spawn_compute(step, cap),
            Output::Audit { step, target, private, trace, urgency } => {
                self.spawn_audit(step, target, private, trace, urgency)
            }
            Output::ServeTrace { to, step, definition } => self.spawn_trace(to, step, definition),
            Output::Settle { step, target, theirs } => self.spawn_settle(step, target, theirs),
            Output::CheckWeights { step } => self.spawn_weights_check(step),
            Output::ServeWeights { to, step, digests } => self.spawn_weights_served(to, step, digests),
            Output::ServeState { to, step, part, routine } => {
                // Copied and encoded off the loop (`Inbound::StateServed` sends it).
                let (kept, tx) = (self.kept_states.clone(), self.inbound.clone());
                tokio::task::spawn_blocking(move || {
                    let served = kept.served(step, &part);
                    let bytes = lockstep_node::wire::encode(&Message::State { step, served });
                    let _ = tx.send(Inbound::StateServed { to, bytes, routine });
                });
            }
            Output::Hurry { .. } => {
                if let Some(hurry) = &self.hurry {
                    hurry.store(0, Ordering::Relaxed);
                }
            }
            Output::Apply { step, mean, grid, ours, tentative, .. } => {
                self.flush();
                self.last_computed = None;
                let waited = self.computed_at.take().map_or(0.0, |t| t.elapsed().as_secs_f64());
                let mut timing = self.timing;
                timing.audit_seconds = std::mem::take(&mut self.audit_seconds);
                timing.audits = self.session.as_ref().map(Session::audit_stats).unwrap_or_default();
                {
                    let mut replica = self.replica();
                    if tentative {
                        replica.apply_tentatively(&mean, &grid, ours);
                    } else {
                        replica.apply(&mean, &grid, ours);
                    }
                    timing.hash_guard += replica.take_hash_seconds() + handled;
                }
                timing.exchange = waited;
                let sent = self.links.sent();
                timing.sent_bytes = sent.saturating_sub(std::mem::replace(&mut self.sent_at_apply, sent));
                let served = self.links.sent_for_audits();
                timing.audit_bytes = served.saturating_sub(std::mem::replace(&mut self.audit_sent_at_apply, served));
                if tentative {
                    self.tentative = Some((step, timing));
                } else {
                    self.unreported = Some((step, timing));
                }
            }
            Output::Confirm { step } => {
                let (_, timing) = self.tentative.take().filter(|(s, _)| *s == step)?;
                // The replica lets the undo go when it is free (now, or at its next apply): the
                // next step may be computing on it.
                if let Ok(mut replica) = self.replica.try_lock() {
                    replica.confirm();
                }
                match self.last_computed {
                    // The next step, computed behind the commit, carried the hash already.
                    Some((computed, whash)) if computed == step + 1 => {
                        (self.report)(Report::Applied { step, whash, timing })
                    }
                    _ => self.unreported = Some((step, timing)),
                }
                for target in std::mem::take(&mut self.deferred_saves) {
                    self.save(target);
                }
            }
            Output::Rollback { .. } => self.undo_tentative(),
            Output::SendSnapshot { to } => {
                let bytes = self.replica().snapshot();
                self.links.send(to, &Message::Resume(bytes));
            }
            Output::Restore { bytes } => {
                self.flush();
                self.generation += 1;
                let restored = {
                    let mut replica = self.replica();
                    replica.restore(&bytes).map(|(step, weights)| (step, weights, replica.weight_hash()))
                };
                return Some(match restored {
                    Ok((step, weights, whash)) => {
                        (self.report)(Report::Restored { step, whash });
                        Input::Restored { step, weights }
                    }
                    Err(error) => Input::Failed { task: Task::Restore, error: Failure::new(error) },
                });
            }
            Output::Event(event) => {
                // The last step's `weights` come before the run's end.
                if matches!(event, Event::RunFinished { .. } | Event::GuardStopped(_) | Event::Problem(_)) {
                    self.flush();
                }
                // A removal for good is said as `removed`; the session holds why it stopped.
                let removed = matches!(event, Event::Removed { .. })
                    .then(|| self.session.as_ref().and_then(Session::stopped).map(Stop::to_string))
                    .flatten();
                let must_stop = must_stop(&event).or(removed);
                (self.report)(Report::Session(event));
                if let Some(why) = must_stop {
                    self.stop_safely(why);
                }
            }
        }
        None
    }

    /// The run cannot go on here: the last committed state is saved to the checkpoint
    /// directory first, the user is told where, and the loop ends (the process exits non-zero).
    pub(super) fn stop_safely(&mut self, why: String) {
        let me = self.me.unwrap_or(0);
        // A step taken ahead of its commit is not the last committed state: undone first.
        if self.tentative.is_some() {
            self.undo_tentative();
        }
        let (bytes, step, whash) = {
            let mut replica = self.replica();
            (replica.snapshot(), replica.steps_done(), replica.weight_hash())
        };
        let target = CheckpointTarget::InDir(self.config.ckpt_dir.clone());
        let checkpoint = match save_checkpoint(target, me, &bytes, step, whash) {
            Ok(saved) => {
                (self.report)(Report::CheckpointSaved { path: saved.path.clone(), step, whash });
                Ok(saved.path)
            }
            Err(e) => {
                (self.report)(Report::Warning(format!("the last committed state was not saved: {e}")));
                Err(e.to_string())
            }
        };
        self.stopping = Some(Ended::Stopped { why, checkpoint });
    }

    /// Computes our contribution to `step` on a blocking thread (elastic windows: ending the
    /// window after `cap` inner steps unless hurried sooner).
    pub(super) fn spawn_compute(&mut self, step: u32, cap: u32) {
        if self.lazy {
            return;
        }
        self.computing += 1;
        if let Some(hurry) = &self.hurry {
            hurry.store(cap, Ordering::Relaxed);
        }
        let replica = self.replica.clone();
        let tx = self.inbound.clone();
        let generation = self.generation;
        tokio::task::spawn_blocking(move || {
            let began = Instant::now();
            let mut replica = replica.lock().unwrap_or_else(|p| p.into_inner());
            let result = replica.compute(step);
            let hash = replica.take_hash_seconds();
            let change = replica.take_backend_change();
            let rogue_began = replica.take_rogue_began();
            // Free before the answer: an audit waiting for the replica takes its kit on it.
            drop(replica);
            let seconds = began.elapsed().as_secs_f64();
            let computed = Computed { step, result, seconds, hash, change, rogue_began, generation };
            let _ = tx.send(Inbound::Computed(computed));
        });
    }

    /// Recomputes `target`'s contribution to `step`: what it needs is taken from the replica
    /// (its weights of the step, kept; the target's batch) as soon as no compute holds it — the
    /// loop never waits for one: the audit waits for the compute's answer instead — and the
    /// recomputation runs on a blocking thread without it, on the referee, beside the member's
    /// own next step (`Inbound::Audited` answers and brings the referee back).
    pub(super) fn spawn_audit(
        &mut self,
        step: u32,
        target: PeerId,
        private: Option<PrivateInputs>,
        trace: bool,
        urgency: Urgency,
    ) {
        let urgency = self.audit_urgency(urgency);
        let kit = match self.replica.try_lock() {
            Ok(mut replica) => replica.audit_kit(step, target),
            Err(_) => {
                // The newest as many as may run at once: an older one waiting still is one the
                // session gave up meanwhile (for a check, or a new run), whose answer it ignores.
                self.audit_waiting.push((step, target, private, trace, urgency));
                let most = self.config.audit_workers.max(1) as usize;
                let stale = self.audit_waiting.len().saturating_sub(most);
                self.audit_waiting.drain(..stale);
                return;
            }
        };
        let tx = self.inbound.clone();
        let kit = match kit {
            // The referee is lent only to a kit that was made (one that was not keeps it).
            Ok(kit) => AuditKit { private, trace, referee: self.referees.take(urgency), ..kit },
            Err(e) => {
                let _ =
                    tx.send(Inbound::Audited { step, target, outcome: Err(e), referee: None, urgency, seconds: 0.0 });
                return;
            }
        };
        // A thread of its own, a routine audit's at the lowest priority: the member's own step
        // comes first.
        let spawned = std::thread::Builder::new().name("audit".into()).spawn(move || {
            if urgency == Urgency::Routine {
                lockstep_node::audit::yield_to_training();
            }
            let began = Instant::now();
            let (outcome, referee) = kit.recompute();
            let outcome = outcome.map_err(ReplicaError::Compute);
            let seconds = began.elapsed().as_secs_f64();
            let _ = tx.send(Inbound::Audited { step, target, outcome, referee, urgency, seconds });
        });
        if let Err(e) = spawned {
            // The session hears that this audit is not done (its worker is free again).
            let outcome = Err(ReplicaError::Compute(lockstep_node::compute_error::ComputeError::backend(e)));
            let _ = self.inbound.send(Inbound::Audited { step, target, outcome, referee: None, urgency, seconds: 0.0 });
        }
    }

    /// How an audit of `urgency` runs here: a member that gives its audits its own priority
    /// runs each as a check is run.
    fn audit_urgency(&self, urgency: Urgency) -> Urgency {
        if self.config.audits_on_spare_cycles {
            urgency
        } else {
            Urgency::Check
        }
    }

    /// Audits on: the referees audits recompute on — a routine audit's and a check's — opened
    /// as the node starts, before any run, each on a thread of its own at its audits' priority
    /// (a referee's threads inherit it), and kept for them (`Inbound::RefereeOpened`). Nothing
    /// waits for them: an audit assigned before its referee is here opens one on its own thread
    /// ([`AuditKit::recompute`]). Never on the loop: opening one (the gate) held the loop for
    /// 0.1–0.4 s on a busy machine, a dispute's answer waited behind it, and joined at the
    /// audits' priority on saturated cores it held a joining member's configuration 5–26 s —
    /// long enough for a short run to end meanwhile. And not at the first check: a leader that
    /// opened its check's referee only then kept the group stepping meanwhile, 30–45 syncs on
    /// 16 cores between an accusation and the removal it proved.
    pub(super) fn open_audit_referees(&mut self) {
        if self.config.audit_rate == 0 {
            return;
        }
        let Some(open) = self.replica().referee_opener() else { return };
        // One for each audit that may run at once: a check (one at a time) and the routine ones;
        // a member that runs its routine audits as checks keeps the same referees for both.
        let workers = self.config.audit_workers.max(1) as usize;
        let wanted = match self.audit_urgency(Urgency::Routine) {
            Urgency::Routine => [(Urgency::Check, 1), (Urgency::Routine, workers)],
            Urgency::Check => [(Urgency::Check, workers), (Urgency::Routine, 0)],
        };
        let opening = wanted.into_iter().flat_map(|(urgency, n)| {
            let kept = self.referees.pool(urgency).len();
            std::iter::repeat_n(urgency, n.saturating_sub(kept))
        });
        for urgency in opening.collect::<Vec<_>>() {
            let (open, tx) = (open.clone(), self.inbound.clone());
            // No thread: the first audit of this urgency opens its own on its thread.
            let _ = std::thread::Builder::new().name("referee".into()).spawn(move || {
                if urgency == Urgency::Routine {
                    lockstep_node::audit::yield_to_training();
                }
                let _ = tx.send(Inbound::RefereeOpened { urgency, referee: open() });
            });
        }
    }

    /// A referee [`MeshLoop::open_audit_referees`] opened, kept for the audits (or why it could
    /// not be opened).
    pub(super) fn on_referee_opened(
        &mut self,
        urgency: Urgency,
        referee: Result<Box<dyn lockstep_node::gemm::Gemm + Send>, lockstep_node::replica::ForeignError>,
    ) {
        match referee {
            Ok(referee) => self.referees.give_back(urgency, Some(referee)),
            // The first audit tries again on its own thread, and says why if it cannot.
            Err(e) => (self.report)(Report::Warning(format!("no referee for audits yet: {e}"))),
        }
    }

    /// Disputes (target): this node's step `step` run again on its own backend, compared op
    /// by op with the leader's `definition` as it goes, on a blocking thread that holds the
    /// replica meanwhile (one step's time); the answer goes back through the loop
    /// (`Inbound::TraceServed`). One at a time: a request while one is being made is answered
    /// empty (no ops, no words), as is one whose step can no longer be traced.
    fn spawn_trace(&mut self, to: PeerId, step: u32, definition: Arc<Trace>) {
        let tx = self.inbound.clone();
        if std::mem::replace(&mut self.tracing, true) {
            let _ = tx.send(Inbound::TraceServed { to, step, answer: TraceAnswer::default() });
            return;
        }
        let replica = self.replica.clone();
        tokio::task::spawn_blocking(move || {
            let traced = replica.lock().unwrap_or_else(|p| p.into_inner()).trace(step, &Tracing::Answer(definition));
            let answer = match traced {
                Ok(Traced::Answer { trace, words }) => {
                    let words = words.map(|(op, chunk, words)| (op as u32, chunk as u32, words));
                    TraceAnswer { trace, words }
                }
                _ => TraceAnswer::default(),
            };
            let _ = tx.send(Inbound::TraceServed { to, step, answer });
        });
    }

    /// Disputes (leader): the definition's run of `target`'s step `step` (its weights, kept;
    /// its batch) on the referee, compared op by op with its trace, at a check's priority.
    fn spawn_settle(&mut self, step: u32, target: PeerId, theirs: Arc<Trace>) {
        let check = Urgency::Check;
        let (replica, tx, referee) = (self.replica.clone(), self.inbound.clone(), self.referees.take(check));
        let spawned = std::thread::Builder::new().name("dispute".into()).spawn(move || {
            let kit = replica.lock().unwrap_or_else(|p| p.into_inner()).audit_kit(step, target);
            let (outcome, referee) = match kit {
                Ok(kit) => {
                    let (outcome, referee) = AuditKit { referee, ..kit }.settle(theirs);
                    (outcome.map_err(ReplicaError::Compute), referee)
                }
                Err(e) => (Err(e), referee),
            };
            let _ = tx.send(Inbound::Settled { step, target, outcome, referee });
        });
        if let Err(e) = spawned {
            let outcome = Err(ReplicaError::Compute(lockstep_node::compute_error::ComputeError::backend(e)));
            let _ = self.inbound.send(Inbound::Settled { step, target, outcome, referee: None });
        }
    }

    /// The guard's disputes (leader): our weights of `step` checked against the definition's
    /// update on a blocking thread that holds the replica meanwhile (one update on the host);
    /// the answer goes back through the loop (`Inbound::WeightsChecked`).
    fn spawn_weights_check(&mut self, step: u32) {
        let (replica, tx) = (self.replica.clone(), self.inbound.clone());
        tokio::task::spawn_blocking(move || {
            let outcome = replica.lock().unwrap_or_else(|p| p.into_inner()).check_weights(step);
            let _ = tx.send(Inbound::WeightsChecked { step, outcome });
        });
    }

    /// The guard's disputes (a disputed member): where our weights of `step` part from the
    /// leader's digests, found on a blocking thread (`Inbound::WeightsServed` sends it).
    fn spawn_weights_served(&mut self, to: PeerId, step: u32, digests: Arc<Vec<u64>>) {
        let (replica, tx) = (self.replica.clone(), self.inbound.clone());
        tokio::task::spawn_blocking(move || {
            let words = replica.lock().unwrap_or_else(|p| p.into_inner()).weights_apart(step, &digests);
            let _ = tx.send(Inbound::WeightsServed { to, step, words });
        });
    }

    /// Undoes the step taken ahead of its commit: the replica goes back to the state before it,
    /// what is computing on it is dropped (its generation is gone), and the saves that waited
    /// for the step are made.
    fn undo_tentative(&mut self) {
        self.tentative = None;
        self.last_computed = None;
        self.generation += 1;
        self.replica().rollback();
        for target in std::mem::take(&mut self.deferred_saves) {
            self.save(target);
        }
    }

    /// Saves the replica's state to `target` on a blocking thread (`Inbound::Saved` says how it
    /// went).
    pub(super) fn save(&mut self, target: CheckpointTarget) {
        let me = self.me.unwrap_or(0);
        let replica = self.replica.clone();
        let tx = self.inbound.clone();
        tokio::task::spawn_blocking(move || {
            let (bytes, step, whash) = {
                let mut replica = replica.lock().unwrap_or_else(|p| p.into_inner());
                (replica.snapshot(), replica.steps_done(), replica.weight_hash())
            };
            let _ = tx.send(Inbound::Saved(save_checkpoint(target, me, &bytes, step, whash)));
        });
    }

    /// Reports the last applied step once its hash is known (asking the replica for it).
    pub(super) fn flush(&mut self) {
        if let Some((step, timing)) = self.unreported.take() {
            let whash = self.replica().weight_hash();
            (self.report)(Report::Applied { step, whash, timing });
        }
    }

    /// Our backend changed: tell every open peer and report it.
    pub(super) fn announce(&mut self, change: BackendChange) {
        self.hello = Message::PeerInfo { backend: change.backend.clone(), verdict: change.verdict.clone() };
        let hello = self.hello.clone();
        self.links.broadcast(&hello);
        (self.report)(Report::BackendSwapped(change));
    }
}

/// Why the run cannot go on at this node after `event`, if it cannot: it was taken out for
/// good, its compute failed, a committed step never reached it, or it could not restore the
/// state its group sent it. (A guard stop is the group's, and stays for the user to read.)
fn must_stop(event: &Event) -> Option<String> {
    match event {
        Event::Problem(Problem::Stopped(stop @ (Stop::Removed { .. } | Stop::Compute { .. } | Stop::Agreement(_)))) => {
            Some(stop.to_string())
        }
        Event::Problem(Problem::Failed { task: Task::Restore, error }) => {
            Some(format!("the state the group sent could not be restored: {error}"))
        }
        _ => None,
    }
}
