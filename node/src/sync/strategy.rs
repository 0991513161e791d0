//! One member's side of a sync: what it keeps between syncs, what it contributes, and what it
//! does with the group's mean ([`Strategy`]), for every mode.

use std::sync::Arc;

use super::*;

/// What a member keeps between syncs besides its weights and Adam's state: tensors the sync
/// settings use (empty where a setting uses none), carried by checkpoints and resumes in the
/// order [`SyncState::tensors`] gives.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyncState {
    /// `outer:H`: the outer optimizer's momentum (identical on every member).
    pub outer_momentum: Vec<f32>,
    /// `int8`: what this member's past contributions left untaken (its own).
    pub residual: Vec<f32>,
}

impl SyncState {
    /// Zeros for every tensor `config` uses, for a model of `len` weights.
    pub fn new(config: &SyncConfig, len: usize) -> SyncState {
        SyncState::from_tensors(config, Vec::new(), len).expect("no tensors carried: nothing to refuse")
    }

    /// The tensors, in the order checkpoints store them.
    pub fn tensors(&self) -> [&[f32]; 2] {
        [&self.outer_momentum, &self.residual]
    }

    /// The state a checkpoint carried (`tensors` in [`SyncState::tensors`]' order, fewer when
    /// it is older), made to fit `config`: a tensor the settings use is kept, or zeros when the
    /// checkpoint had none (a run of another setting); one they do not use is dropped. A tensor
    /// of another length than the model's, or more tensors than this version knows, is refused.
    pub fn from_tensors(config: &SyncConfig, tensors: Vec<Vec<f32>>, len: usize) -> Result<SyncState, SyncError> {
        if tensors.len() > 2 {
            return Err(SyncError::TensorCount(tensors.len()));
        }
        if let Some(t) = tensors.iter().find(|t| !t.is_empty() && t.len() != len) {
            return Err(SyncError::TensorLength { values: t.len(), model: len });
        }
        let mut carried = tensors.into_iter();
        let mut take = |used: bool| match (used, carried.next().filter(|t| !t.is_empty())) {
            (true, Some(t)) => t,
            (true, None) => vec![0.0; len],
            (false, _) => Vec::new(),
        };
        let outer_momentum = take(matches!(config.mode, SyncMode::Outer { .. }));
        let residual = take(config.compression != Compression::None);
        Ok(SyncState { outer_momentum, residual })
    }
}

/// A member's training, as a sync drives it: its gradient on the next batch, one local
/// optimizer step, and its weights on the host.
pub trait Member {
    /// Loss and gradient of the next batch at the current weights.
    fn gradient(&mut self) -> Result<(f32, Vec<f32>), ComputeError>;
    /// One optimizer step (Adam) from `grad`.
    fn apply(&mut self, grad: &[f32]) -> Result<(), ComputeError>;
    /// Ends an `every-step` step by a rule other than Adam's whole ([`StepRule::adam_at`]
    /// said no), on the host: the sign rule's step, or Adam's with its second moment frozen.
    fn apply_by_rule(&mut self, rule: StepRule, mean: &[f32]);
    /// One local step: the gradient of the next batch, applied at once ([`Member::gradient`],
    /// then [`Member::apply`] — a member whose device holds its state may do both there,
    /// without moving the gradient). The loss.
    fn step_alone(&mut self) -> Result<f32, ComputeError> {
        let (loss, grad) = self.gradient()?;
        self.apply(&grad)?;
        Ok(loss)
    }
    /// The weights, on the host.
    fn weights(&mut self) -> &mut Vec<f32>;
    /// The inner optimizer's state, where the member has one on the host (`outer:H`): what an
    /// overlapped window names as it runs ahead ([`WindowState`]).
    fn optimizer(&self) -> Option<crate::adam::Adam> {
        None
    }
    /// Takes back the step count of `steps` local steps (a sync abandoned half way).
    fn rewind(&mut self, steps: u32);
    /// Optimizer steps the run has left.
    fn steps_left(&self) -> u32;
    /// Optimizer steps taken (the run's step rule may change with them).
    fn steps_done(&self) -> u32;
    /// Elastic windows: whether the window should end after `done` of its inner steps (another
    /// member finished its `H`). Asked after each inner step but the window's last.
    fn hurried(&self, _done: u32) -> bool {
        false
    }
    /// Elastic windows: passes over `steps` optimizer steps of a window ended early, as if they
    /// were taken — the step count (the learning-rate schedule's position) and the data stream
    /// move on to the next window's start, the weights and the optimizer's moments stay.
    fn skip(&mut self, steps: u32);
}

/// One member's contribution to a sync.
#[derive(Clone, Debug, PartialEq)]
pub struct Contribution {
    /// The loss of the step (`every-step`) or the mean of the inner steps' losses, in order.
    pub loss: f32,
    pub values: Values,
    /// Its weight in the group's mean ([`SyncConfig::weights_allowed`]): in elastic windows the
    /// inner steps it stands for, else 1.
    pub weight: u32,
    /// `int8`, `int4`: the residual added before packing (the private state an auditor needs to
    /// recompute the values, `docs/TRUST.md`); `None` without compression.
    pub state: Option<Arc<Vec<f32>>>,
}

/// A wrong member's arithmetic, for fault injection (`crate::replica::Rogue`): what it does to
/// its contribution before any packing, so a packed contribution departs as an f32 one does.
#[derive(Clone, Debug, PartialEq)]
pub enum Tamper {
    /// Every value times this factor.
    Scale(f32),
    /// These values sign-flipped (one tensor).
    Negate(std::ops::Range<usize>),
    /// `int8`, `int4`: the residual multiplied by this factor before it is added and named —
    /// a state that its own past contributions did not leave.
    ForgeResidual(f32),
}

/// The private state an `outer:H` window's contribution depends on ([`window_state`]): the
/// inner optimizer at the window's start and, in packed runs, the residual. With an overlap,
/// the window's first steps ran from the member's own weights before the group's mean came
/// ([`Strategy::run_ahead`]): the optimizer is named as those steps began, with their count and
/// the weights they began from (the end of the member's previous window).
#[derive(Clone, Debug, PartialEq)]
pub struct WindowState {
    pub adam: crate::adam::Adam,
    /// Overlapped runs: the steps run ahead (0: none; the window began on the group's weights)
    /// and the weights they began from (empty when none).
    pub ahead: Option<(u32, Vec<f32>)>,
    pub residual: Vec<f32>,
}

/// A window's private state as one vector of words (what it names by digest and serves an
/// auditor): the inner optimizer's moments `m`, `v`, its two bias-correction powers and its
/// update count (the count's bits as a word); in overlapped runs the steps run ahead (a word)
/// and the `n` weights they began from (zeros when none); then the residual (packed runs; an f32
/// window has none). Every-step runs name the residual alone.
pub fn window_state(state: &WindowState) -> Vec<f32> {
    let WindowState { adam, ahead, residual } = state;
    let n = adam.m.len();
    let mut words = Vec::with_capacity(n * 3 + 4 + residual.len());
    words.extend_from_slice(&adam.m);
    words.extend_from_slice(&adam.v);
    words.extend_from_slice(&[adam.beta1_power, adam.beta2_power, f32::from_bits(adam.t)]);
    if let Some((steps, from)) = ahead {
        words.push(f32::from_bits(*steps));
        match from.is_empty() {
            true => words.resize(words.len() + n, 0.0),
            false => words.extend_from_slice(from),
        }
    }
    words.extend_from_slice(residual);
    words
}

/// [`window_state`] read back for a model of `len` weights in a run of `config`; `None`: not
/// such a state (another length).
pub fn split_window_state(words: &[f32], config: &SyncConfig, len: usize) -> Option<WindowState> {
    if words.len() != private_state_len(config, len) || !matches!(config.mode, SyncMode::Outer { .. }) {
        return None;
    }
    let (m, rest) = words.split_at(len);
    let (v, rest) = rest.split_at(len);
    let (powers, rest) = rest.split_at(3);
    let adam = crate::adam::Adam {
        m: m.to_vec(),
        v: v.to_vec(),
        beta1_power: powers[0],
        beta2_power: powers[1],
        t: powers[2].to_bits(),
    };
    let (ahead, residual) = match config.overlap {
        0 => (None, rest),
        _ => {
            let (steps, rest) = rest.split_at(1);
            let (from, residual) = rest.split_at(len);
            let steps = steps[0].to_bits();
            (Some((steps, if steps == 0 { Vec::new() } else { from.to_vec() })), residual)
        }
    };
    Some(WindowState { adam, ahead, residual: residual.to_vec() })
}

/// How many words a contribution's private state has, for a model of `len` weights
/// (`every-step`: the residual, none in f32; `outer:H`: [`window_state`]).
pub fn private_state_len(config: &SyncConfig, len: usize) -> usize {
    let residual = if config.compression == Compression::None { 0 } else { len };
    let ahead = if config.overlap > 0 { 1 + len } else { 0 };
    match config.mode {
        SyncMode::EveryStep => residual,
        SyncMode::Outer { .. } => 2 * len + 3 + ahead + residual,
    }
}

/// Whether a mode's contributions depend on a private state, which they name by digest
/// ([`Contribution::state`], `crate::wire::Gradient::state`): packed ones (the residual) and
/// `outer:H` windows (the inner optimizer's state).
pub fn names_state(config: &SyncConfig) -> bool {
    config.compression != Compression::None || matches!(config.mode, SyncMode::Outer { .. })
}

/// What recomputing a packed contribution from its values before packing gives
/// ([`repack`]): the contribution's values, and what the group's sum on `grid` leaves as
/// the member's next residual (`None` where the values do not fit the grid: they are not the
/// contribution the group summed).
pub struct Repacked {
    pub values: Values,
    pub next_state: Option<Vec<f32>>,
}

/// `x` plus what a member carries of its residual `state` to its next contribution, `decay·r`
/// (one f32 product and one sum a value; a decay of 1 — every rule but the sign rule's —
/// carries `r` itself, exactly).
fn carry(x: &mut [f32], state: &[f32], decay: f32) {
    x.iter_mut().zip(state).for_each(|(v, r)| *v += decay * r);
}

/// A member's packed contribution recomputed, as [`Strategy::contribute`] makes it: `x` (its
/// gradient or pseudo-gradient) plus what it carries of `state` (the residual it named; the
/// step rule's decay), packed as the run's compression packs after `done` steps
/// ([`SyncConfig::compression_at`]); and the residual it leaves when summed on the group's `grid` (`Strategy::finish`).
/// `part`: only these values' state is known (block-aligned ranges, an audit of a part): the
/// blocks outside them are left empty, so only those inside are the contribution's, and its
/// residual's.
pub fn repack(
    mut x: Vec<f32>,
    state: &[f32],
    sync: &SyncConfig,
    done: u32,
    grid: &[u8],
    part: Option<&[std::ops::Range<usize>]>,
) -> Result<Repacked, NonFinite> {
    let compression = sync.compression_at(done);
    carry(&mut x, state, sync.rule.residual_decay());
    let mut packed = pack_as(&x, compression)?;
    if let Some(ranges) = part {
        // One pass over the blocks (a GPT-2-sized state has millions, a part thousands of ranges).
        let mut kept = vec![false; packed.exponents.len()];
        for range in ranges {
            kept[range.start / BLOCK..range.end.div_ceil(BLOCK)].fill(true);
        }
        for block in (0..kept.len()).filter(|&b| !kept[b]) {
            packed.exponents[block] = EMPTY_BLOCK;
            let end = ((block + 1) * BLOCK).min(packed.q.len());
            packed.q[block * BLOCK..end].fill(0);
        }
    }
    let next_state = fits(&packed, grid).then(|| residual(&x, &packed, grid));
    Ok(Repacked { values: Values::packed_as(compression, packed), next_state })
}

/// Why a contribution could not be made.
#[derive(Clone, Debug)]
pub enum ContributeError {
    Compute(ComputeError),
    /// The values to send are not finite: this member's training diverged.
    NonFinite(NonFinite),
}

impl std::fmt::Display for ContributeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ContributeError::Compute(e) => write!(f, "{e}"),
            ContributeError::NonFinite(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ContributeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // Transparent: each says what its error says (`ComputeError`'s own source goes on).
        match self {
            ContributeError::Compute(e) => e.source(),
            ContributeError::NonFinite(e) => e.source(),
        }
    }
}

impl From<ComputeError> for ContributeError {
    fn from(e: ComputeError) -> Self {
        ContributeError::Compute(e)
    }
}

/// A contribution under way: what [`Strategy::finish`] needs of it.
#[derive(Clone, Debug, Default)]
struct InFlight {
    /// `outer:H`: the global weights the inner steps started from.
    global: Option<Vec<f32>>,
    /// `int8`: the values and what they were packed as.
    packed: Option<(Vec<f32>, Packed)>,
}

/// `outer:H` with an overlap: the next window's first steps, run before the group's mean came.
#[derive(Clone, Debug)]
struct Ahead {
    /// The member's weights when they began (the end of the window it contributed).
    anchor: Vec<f32>,
    steps: u32,
    losses: f32,
    /// The member's optimizer when they began ([`Member::optimizer`]): with the anchor, what
    /// the window's contribution names as its state.
    adam: Option<crate::adam::Adam>,
}

/// `outer:H` with an overlap, after the mean: the window's steps so far sit on the new global
/// weights, which the window's contribution is measured from.
#[derive(Clone, Debug)]
struct Rebased {
    global: Vec<f32>,
    steps: u32,
    losses: f32,
    /// Where the steps began, and the optimizer then ([`Ahead`]).
    anchor: Vec<f32>,
    adam: Option<crate::adam::Adam>,
}

/// One member's side of every sync, for every mode: what it contributes, and what it does with
/// the group's mean. A new sync mode is a new [`SyncMode`] and its arms here; the trainer has no
/// mode of its own.
///
/// With an overlap `D` (`outer:H`, [`SyncConfig::overlap`]) a window's steps are split: after
/// contributing window `k`, the member runs the first `D` steps of window `k + 1` from its own
/// weights `L` ([`Strategy::run_ahead`]) while the group sums window `k`; then the group's mean
/// gives the new global weights `G`, and the member's weights become `G − (L − W)`, where `W` is
/// where the `D` steps ended: its progress moved onto the group's weights, element by element,
/// each subtraction one f32 rounding. Window `k + 1` contributes `G` minus its weights after its
/// remaining `H − D` steps. Every member's global weights (what the guard hashes) stay
/// bit-identical; with `D = 0` the arithmetic is exactly the plain `outer:H`.
#[derive(Clone, Debug, Default)]
pub struct Strategy {
    config: SyncConfig,
    state: SyncState,
    in_flight: Option<InFlight>,
    ahead: Option<Ahead>,
    rebased: Option<Rebased>,
    tamper: Option<Tamper>,
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig::SEED
    }
}

impl Strategy {
    pub fn new(config: SyncConfig, state: SyncState) -> Strategy {
        Strategy { config, state, in_flight: None, ahead: None, rebased: None, tamper: None }
    }

    /// Fault injection: the lowest bit of the first weight of the group's weights this member
    /// holds apart from its own (`Trainer::flip_weight_bit`): an `outer:H` window's start once
    /// its contribution is made, or, in an overlapped window after the mean came, the group's
    /// weights its steps run ahead were moved onto.
    pub fn flip_held_group_weights(&mut self) {
        let start = self.in_flight.as_mut().and_then(|f| f.global.as_mut());
        let held = start.or(self.rebased.as_mut().map(|r| &mut r.global));
        if let Some(first) = held.and_then(|g| g.first_mut()) {
            *first = f32::from_bits(first.to_bits() ^ 1);
        }
    }

    /// Fault injection: what the next contributions do wrong (`None`: nothing).
    pub fn tamper(&mut self, tamper: Option<Tamper>) {
        self.tamper = tamper;
    }

    pub fn config(&self) -> &SyncConfig {
        &self.config
    }

    pub fn state(&self) -> &SyncState {
        &self.state
    }

    /// The group's weights while the member's own differ from them (an overlapped window after
    /// the mean came), with the steps of the window already taken; `None` when the member's
    /// weights are the group's.
    pub fn global(&self) -> Option<(&[f32], u32)> {
        self.rebased.as_ref().map(|r| (&r.global[..], r.steps))
    }

    /// The group's weights, given the member's own: [`Strategy::global`]'s, or `own`.
    pub fn group_weights<'a>(&'a self, own: &'a [f32]) -> &'a [f32] {
        self.global().map_or(own, |(global, _)| global)
    }

    /// The group's weights the sync under way started from, given the member's own: an
    /// `outer:H` window's start once its contribution is made (the member's own are its inner
    /// steps' then), else [`Strategy::group_weights`].
    pub fn sync_start<'a>(&'a self, own: &'a [f32]) -> &'a [f32] {
        match self.in_flight.as_ref().and_then(|f| f.global.as_deref()) {
            Some(global) => global,
            None => self.group_weights(own),
        }
    }

    /// The member's contribution to the next sync: `every-step`, the gradient of one batch;
    /// `outer:H`, the global weights minus the weights after `H` local steps (fewer when some
    /// ran ahead of the last mean). With `int8`, the residual is added and the sum packed.
    /// Until [`Strategy::finish`], the weights are local (`outer:H`). A failed inner step puts
    /// the weights and the step count back to the window's start.
    pub fn contribute(&mut self, member: &mut dyn Member) -> Result<Contribution, ContributeError> {
        let (loss, mut x, global, weight) = match self.config.mode {
            SyncMode::EveryStep => {
                let (loss, grad) = member.gradient()?;
                (loss, grad, None, 1)
            }
            SyncMode::Outer { inner_steps } => {
                let (global, taken, mut losses) = match self.rebased.take() {
                    Some(Rebased { global, steps, losses, .. }) => (global, steps, losses),
                    None => (member.weights().clone(), 0, 0f32),
                };
                let mut done = taken;
                while done < inner_steps {
                    match member.step_alone() {
                        Ok(loss) => losses += loss,
                        Err(e) => {
                            member.rewind(done);
                            *member.weights() = global;
                            return Err(e.into());
                        }
                    }
                    done += 1;
                    if self.config.elastic && done < inner_steps && member.hurried(done) {
                        member.skip(inner_steps - done);
                        break;
                    }
                }
                let delta: Vec<f32> = global.iter().zip(member.weights().iter()).map(|(g, w)| g - w).collect();
                let weight = if self.config.elastic { done } else { 1 };
                (losses / done as f32, delta, Some(global), weight)
            }
        };
        match &self.tamper {
            Some(Tamper::Scale(factor)) => x.iter_mut().for_each(|v| *v *= factor),
            Some(Tamper::Negate(range)) => x[range.clone()].iter_mut().for_each(|v| *v = -*v),
            Some(Tamper::ForgeResidual(factor)) => self.state.residual.iter_mut().for_each(|r| *r *= factor),
            None => {}
        }
        let (values, packed, state) = match self.config.compression {
            Compression::None => (Values::F32(x), None, None),
            _ => {
                let state = Arc::new(self.state.residual.clone());
                carry(&mut x, &self.state.residual, self.config.rule.residual_decay());
                let compression = self.config.compression_at(member.steps_done());
                let packed = pack_as(&x, compression).map_err(ContributeError::NonFinite)?;
                (Values::packed_as(compression, packed.clone()), Some((x, packed)), Some(state))
            }
        };
        self.in_flight = Some(InFlight { global, packed });
        Ok(Contribution { loss, values, weight, state })
    }

    /// `outer:H` with an overlap, between [`Strategy::contribute`] and [`Strategy::finish`]:
    /// the next window's first [`SyncConfig::overlap`] steps, from the member's own weights (a
    /// member runs this while the group sums what it sent). Nothing to do in other modes, and
    /// after the run's last window. A failed step puts the weights and step count back.
    pub fn run_ahead(&mut self, member: &mut dyn Member) -> Result<(), ComputeError> {
        let steps = self.steps_to_run_ahead(member.steps_left());
        if steps == 0 || self.ahead.is_some() {
            return Ok(());
        }
        let anchor = member.weights().clone();
        let adam = member.optimizer();
        let mut losses = 0f32;
        for done in 0..steps {
            match member.step_alone() {
                Ok(loss) => losses += loss,
                Err(e) => {
                    member.rewind(done);
                    *member.weights() = anchor;
                    return Err(e);
                }
            }
        }
        self.ahead = Some(Ahead { anchor, steps, losses, adam });
        Ok(())
    }

    /// Ends a sync with the group's mean (`grid`: the group's block grid, `int8` only):
    /// `every-step` takes one optimizer step with it; `outer:H` takes one outer step on the
    /// global weights, and the member's weights become them (plus the progress of the steps it
    /// ran ahead, if it did). A member that made no contribution this sync (a fresh joiner)
    /// only needs the mean, never the grid. `ours`: whether our contribution is among those the
    /// mean sums — a member the group went on without (late for the step's record) keeps all
    /// of its packed contribution as residual, for the next. In `outer:H`, a sync this member
    /// computed nothing for (it caught up on the group's records, or the mean came before its
    /// compute began) passes over its `H` steps as if taken ([`Member::skip`]): the step count
    /// says how many syncs the weights hold, so a compute for this sync begun after it is refused
    /// as stale — never run on the new weights as if they were the old. (With an overlap, the
    /// steps it ran ahead into that sync's window are dropped first: the group's weights are
    /// the base, as they are for every member.)
    pub fn finish(
        &mut self,
        member: &mut dyn Member,
        mean: &[f32],
        grid: &[u8],
        ours: bool,
    ) -> Result<(), ComputeError> {
        let in_flight = self.in_flight.take().unwrap_or_default();
        if let Some((x, packed)) = &in_flight.packed {
            self.state.residual = if ours { residual(x, packed, grid) } else { x.clone() };
        }
        match self.config.mode {
            SyncMode::EveryStep => match self.config.rule {
                rule if rule.adam_at(member.steps_done()) => member.apply(mean)?,
                rule => member.apply_by_rule(rule, mean),
            },
            SyncMode::Outer { .. } => match (in_flight.global, self.ahead.take()) {
                (Some(mut global), Some(ahead)) => {
                    self.config.outer.step(&mut global, &mut self.state.outer_momentum, mean);
                    self.rebase(member, global, ahead);
                }
                (global, _) => {
                    let computed = global.is_some();
                    if !computed {
                        // With an overlap, the steps this member ran into the window it never
                        // contributed go: the group's weights are where the sync starts.
                        if let Some(Rebased { global: group, steps, .. }) = self.rebased.take() {
                            *member.weights() = group;
                            member.rewind(steps);
                        }
                    }
                    let weights = member.weights();
                    if let Some(global) = global {
                        *weights = global;
                    }
                    self.config.outer.step(weights, &mut self.state.outer_momentum, mean);
                    if !computed {
                        member.skip(self.config.mode.steps_per_sync());
                    }
                }
            },
        }
        Ok(())
    }

    /// How many steps [`Strategy::run_ahead`] runs with `steps_left` optimizer steps left in
    /// the run: the overlap, or fewer where fewer are left (`outer:H`; none in other modes).
    pub fn steps_to_run_ahead(&self, steps_left: u32) -> u32 {
        match self.config.mode {
            SyncMode::Outer { .. } => self.config.overlap.min(steps_left),
            SyncMode::EveryStep => 0,
        }
    }

    /// The steps run ahead moved onto the group's new weights `global`, element by element:
    /// the member's weights become `global − (anchor − w)`.
    fn rebase(&mut self, member: &mut dyn Member, global: Vec<f32>, ahead: Ahead) {
        let Ahead { anchor, steps, losses, adam } = ahead;
        for ((w, &g), &a) in member.weights().iter_mut().zip(&global).zip(&anchor) {
            *w = g - (a - *w);
        }
        self.rebased = Some(Rebased { global, steps, losses, anchor, adam });
    }

    /// The window under way's steps run ahead of the last mean, where there are any: their
    /// count, the weights they began from and the optimizer then (what the window's
    /// contribution names, [`WindowState::ahead`]).
    pub fn ahead_start(&self) -> Option<(u32, &[f32], Option<&crate::adam::Adam>)> {
        self.rebased.as_ref().map(|r| (r.steps, &r.anchor[..], r.adam.as_ref()))
    }

    /// An audit's run of an overlapped window (`crate::replica::AuditKit`): the steps run ahead
    /// (from the weights the member named, [`Strategy::run_ahead`]) moved onto the group's
    /// weights `global` at the window's start, as [`Strategy::finish`] moves them once the mean
    /// came. Nothing when none ran ahead.
    pub fn rebase_onto(&mut self, member: &mut dyn Member, global: Vec<f32>) {
        if let Some(ahead) = self.ahead.take() {
            self.rebase(member, global, ahead);
        }
    }

    /// A lone member's sync (a group of one: its contribution is the mean, bit for bit). In
    /// `every-step` without compression the mean of one gradient is that gradient (`g / 1` is
    /// `g`), so it is one local step, and the gradient need not leave the member's device.
    pub fn alone(&mut self, member: &mut dyn Member) -> Result<f32, ContributeError> {
        if self.config.mode == SyncMode::EveryStep && self.config.compression == Compression::None {
            return Ok(member.step_alone()?);
        }
        let Contribution { loss, values, .. } = self.contribute(member)?;
        self.run_ahead(member)?;
        let reduced = reduce_one(values);
        self.finish(member, &reduced.mean, &reduced.grid, true)?;
        Ok(loss)
    }
}
