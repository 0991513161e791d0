//! The GPT-style decoder: its definition is [`crate::program::Program`], the op sequence of a
//! training step; this module runs that sequence for a batch.
//!
//! Pre-LayerNorm blocks: `x += attn(ln1(x))`, `x += mlp(ln2(x))`; final LayerNorm; an untied
//! LM head with bias. Attention is causal multi-head with scale `1/√(head_dim)`. The MLP is
//! `4c` wide with the tanh-approximated GELU. Every matrix product is a units product (an
//! `Op::Matmul`); the element-wise ops are `lockstep_luts::ops`.
//!
//! A backend with its own executor ([`Gemm::device`], ABI 2) keeps a training step's buffers
//! from step to step (the program is built once per device and batch shape); otherwise the host
//! runs the ops in its own memory and sends the products to [`Gemm::gemm_nt`].
//!
//! On such a backend the trainer may also leave the weights and Adam's moments there
//! ([`Weights::OnDevice`], [`Model::upload_training_state`], [`Model::adam_on_device`]): a step
//! then sends only tokens and targets in, takes the loss and the gradient out, and after the
//! sync sends the mean gradient in once and takes one hash word out.

use std::sync::Mutex;

use lockstep_luts::ops::{self, Handle, Op, Span};
use lockstep_luts::words::{of_f32s, of_f32s_mut};

use crate::audit::{run_audited, trace_ops, Audited, Auditing, Trace, Traced, Tracing};
use crate::compute_error::ComputeError;
use crate::device::Device;
use crate::gemm::Gemm;
use crate::host_device::{HostDevice, HostMemory};
use crate::params::Layout;
use crate::program::Program;

/// A forward pass's result.
pub struct Forward {
    /// `[batch · seq, 256]`.
    pub logits: Vec<f32>,
}

/// What a training step's buffers live in, kept between steps.
struct Cached {
    /// The device's instance, `None` for host memory.
    device: Option<u64>,
    program: Program,
    host: HostMemory,
    /// Adam's moments and the weight hash's word on the device, once the trainer keeps its state
    /// there.
    moments: Option<Moments>,
}

/// Device buffers of the optimizer state.
struct Moments {
    m: Handle,
    v: Handle,
    hash: Handle,
}

/// One Adam update's scalars: the learning rate of the step and the bias corrections
/// ([`crate::adam::Adam::next_corrections`]).
#[derive(Clone, Copy, Debug)]
pub struct AdamStep {
    pub lr: f32,
    pub correction1: f32,
    pub correction2: f32,
}

/// Where a training step's weights come from.
#[derive(Clone, Copy)]
pub enum Weights<'a> {
    /// These, written to the step's buffers first.
    Host(&'a [f32]),
    /// Already in the device's weight buffer (uploaded, or left there by [`Model::adam_on_device`]).
    OnDevice,
}

/// The trainer asked for state on a device that does not hold it (a bug: the trainer uploads
/// before it relies on the device).
#[derive(Debug)]
pub struct NotOnDevice;

impl std::fmt::Display for NotOnDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the training state is not on this backend's device (it was never uploaded there)")
    }
}

impl std::error::Error for NotOnDevice {}

/// The model: a layout plus the code that runs it.
pub struct Model {
    pub layout: Layout,
    cached: Mutex<Option<Cached>>,
}

fn token_words(tokens: &[u8]) -> Vec<u32> {
    tokens.iter().map(|&t| u32::from(t)).collect()
}

impl Model {
    pub fn new(layout: Layout) -> Self {
        Self { layout, cached: Mutex::new(None) }
    }

    fn check(&self, w: Weights<'_>, tokens: &[u8], batch: usize, seq: usize) {
        let cfg = self.layout.config;
        assert!(seq >= 1 && seq <= cfg.context, "sequence length {seq} outside 1..={}", cfg.context);
        assert_eq!(tokens.len(), batch * seq);
        if let Weights::Host(w) = w {
            assert_eq!(w.len(), self.layout.len);
        }
    }

    /// Runs the forward pass (and the loss against `targets`), then `out` reads what it needs:
    /// evaluation and generation, which change no state. On a backend with its own executor the
    /// pass runs there, in buffers made for the call and freed after it; otherwise in host
    /// memory. The same bits either way.
    #[allow(clippy::too_many_arguments)]
    fn run_forward<T>(
        &self,
        gemm: &mut dyn Gemm,
        w: &[f32],
        tokens: &[u8],
        targets: &[u32],
        batch: usize,
        seq: usize,
        out: impl FnOnce(&mut dyn Device, &Program) -> Result<T, ComputeError>,
    ) -> Result<T, ComputeError> {
        self.check(Weights::Host(w), tokens, batch, seq);
        let feed = |device: &mut dyn Device, program: &Program| -> Result<(), ComputeError> {
            device.write(program.weights, 0, of_f32s(w))?;
            device.write(program.tokens, 0, &token_words(tokens))?;
            device.write(program.targets, 0, targets)?;
            device.run(program.forward())
        };
        if let Some(device) = gemm.device() {
            // The training program's buffers, when this device holds one of this shape: its
            // forward pass is this one, and a second set of activations would double the
            // device memory (past what one binding holds on some adapters).
            let cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = cached.as_ref() {
                let program = &entry.program;
                if entry.device == Some(device.instance()) && (program.batch, program.seq) == (batch, seq) {
                    feed(device, program)?;
                    return out(device, program);
                }
            }
            drop(cached);
            let program = Program::forward_only(device, &self.layout, batch, seq)?;
            let result = feed(device, &program).and_then(|()| out(device, &program));
            for &b in program.buffers() {
                device.free_buffer(b);
            }
            return result;
        }
        let mut memory = HostMemory::default();
        let mut device = HostDevice { memory: &mut memory, gemm };
        let program = Program::forward_only(&mut device, &self.layout, batch, seq)?;
        feed(&mut device, &program)?;
        out(&mut device, &program)
    }

    /// Runs `batch` sequences of `seq ≤ context` tokens: the logits.
    pub fn forward(
        &self,
        gemm: &mut dyn Gemm,
        w: &[f32],
        tokens: &[u8],
        batch: usize,
        seq: usize,
    ) -> Result<Forward, ComputeError> {
        self.run_forward(gemm, w, tokens, &vec![0; tokens.len()], batch, seq, |device, program| {
            let mut logits = vec![0f32; tokens.len() * crate::config::VOCAB];
            device.read(program.logits, 0, of_f32s_mut(&mut logits))?;
            Ok(Forward { logits })
        })
    }

    /// Mean cross-entropy without gradients (evaluation).
    pub fn loss(
        &self,
        gemm: &mut dyn Gemm,
        w: &[f32],
        tokens: &[u8],
        targets: &[u8],
        batch: usize,
        seq: usize,
    ) -> Result<f32, ComputeError> {
        self.run_forward(gemm, w, tokens, &token_words(targets), batch, seq, |device, program| {
            let mut loss = [0u32];
            device.read(program.loss, 0, &mut loss)?;
            Ok(f32::from_bits(loss[0]))
        })
    }

    /// Mean cross-entropy of next-token prediction and the gradient of every weight.
    pub fn loss_and_grad(
        &self,
        gemm: &mut dyn Gemm,
        w: &[f32],
        tokens: &[u8],
        targets: &[u8],
        batch: usize,
        seq: usize,
    ) -> Result<(f32, Vec<f32>), ComputeError> {
        self.step(gemm, Weights::Host(w), tokens, targets, batch, seq, None, 0).map(|(loss, grad, _)| (loss, grad))
    }

    /// Frees the buffers this model holds on `gemm`'s device (its training program and the
    /// optimizer state there), when it holds any: the state on the device is gone after this.
    pub fn release(&self, gemm: &mut dyn Gemm) {
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        let Some(device) = gemm.device() else { return };
        if let Some(old) = cached.take_if(|c| c.device == Some(device.instance())) {
            let moments = old.moments.iter().flat_map(|m| [m.m, m.v, m.hash]);
            for b in old.program.buffers().iter().copied().chain(moments) {
                device.free_buffer(b);
            }
        }
    }

    /// The cached training program for `gemm`'s device (or host memory) and this batch shape,
    /// built (and the previous one's buffers freed) when there is none, with room reserved for
    /// `extra` words more; whether it was built now.
    fn program_for<'a>(
        &self,
        cached: &'a mut Option<Cached>,
        gemm: &mut dyn Gemm,
        batch: usize,
        seq: usize,
        extra: usize,
    ) -> Result<(&'a mut Cached, bool), ComputeError> {
        let own = gemm.device().map(|d| d.instance());
        let stale = cached.as_ref().is_none_or(|c| c.device != own || c.program.batch != batch || c.program.seq != seq);
        if stale {
            let mut host = HostMemory::default();
            let program = match gemm.device() {
                Some(device) => {
                    if let Some(old) = cached.take().filter(|c| c.device == own) {
                        for &b in old.program.buffers() {
                            device.free_buffer(b);
                        }
                        if let Some(m) = old.moments {
                            for b in [m.m, m.v, m.hash] {
                                device.free_buffer(b);
                            }
                        }
                    }
                    Program::with_room(device, &self.layout, batch, seq, extra)?
                }
                None => {
                    Program::new(&mut HostDevice { memory: &mut host, gemm: &mut *gemm }, &self.layout, batch, seq)?
                }
            };
            *cached = Some(Cached { device: own, program, host, moments: None });
        }
        Ok((cached.as_mut().expect("just filled"), stale))
    }

    /// The cached program and moments of `gemm`'s device, which must hold the training state.
    fn resident<'a>(
        cached: &'a mut Option<Cached>,
        gemm: &'a mut dyn Gemm,
    ) -> Result<(&'a mut dyn Device, &'a Program, &'a Moments), ComputeError> {
        let device = gemm.device().ok_or_else(|| ComputeError::backend(NotOnDevice))?;
        match cached.as_ref() {
            Some(Cached { device: Some(id), program, moments: Some(moments), .. }) if *id == device.instance() => {
                Ok((device, program, moments))
            }
            _ => Err(ComputeError::backend(NotOnDevice)),
        }
    }

    /// Puts the weights and Adam's moments on `gemm`'s device (an ABI 2 backend), in the buffers
    /// of the training program for `batch × seq`: from now on [`Weights::OnDevice`] steps and
    /// [`Model::adam_on_device`] updates use them.
    #[allow(clippy::too_many_arguments)]
    pub fn upload_training_state(
        &self,
        gemm: &mut dyn Gemm,
        w: &[f32],
        m: &[f32],
        v: &[f32],
        batch: usize,
        seq: usize,
    ) -> Result<(), ComputeError> {
        assert!(w.len() == self.layout.len && m.len() == w.len() && v.len() == w.len());
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        // Room for the moments and the hash word (64-word aligned, as a GPU arena keeps them).
        let moments_words = 2 * self.layout.len.next_multiple_of(64) + 64;
        let (entry, _) = self.program_for(&mut cached, gemm, batch, seq, moments_words)?;
        let device = gemm.device().ok_or_else(|| ComputeError::backend(NotOnDevice))?;
        if entry.moments.is_none() {
            let len = self.layout.len;
            entry.moments = Some(Moments {
                m: device.create_buffer(len)?,
                v: device.create_buffer(len)?,
                hash: device.create_buffer(1)?,
            });
        }
        let moments = entry.moments.as_ref().expect("just filled");
        device.write(entry.program.weights, 0, of_f32s(w))?;
        device.write(moments.m, 0, of_f32s(m))?;
        device.write(moments.v, 0, of_f32s(v))?;
        Ok(())
    }

    /// One Adam update on the device from `mean` (the group's gradient, written over this
    /// node's own), then the weight hash there: the hash is the only word that comes back.
    pub fn adam_on_device(&self, gemm: &mut dyn Gemm, mean: &[f32], adam: AdamStep) -> Result<u32, ComputeError> {
        assert_eq!(mean.len(), self.layout.len);
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        let (device, program, moments) = Self::resident(&mut cached, gemm)?;
        device.write(program.grads, 0, of_f32s(mean))?;
        device.run(&self.adam_and_hash(program, moments, adam))?;
        let mut hash = [0u32];
        device.read(moments.hash, 0, &mut hash)?;
        Ok(hash[0])
    }

    /// The Adam update of the program's weights from its gradient buffer, then the weight hash
    /// into the moments' hash word.
    fn adam_and_hash(&self, program: &Program, moments: &Moments, adam: AdamStep) -> [Op; 2] {
        let len = u32::try_from(self.layout.len).expect("checked by the run config");
        let at = |h| Span::new(h, 0);
        [
            Op::Adam(ops::Adam {
                len,
                weights: at(program.weights),
                grad: at(program.grads),
                m: at(moments.m),
                v: at(moments.v),
                lr: adam.lr,
                correction1: adam.correction1,
                correction2: adam.correction2,
            }),
            Op::Hash(ops::Hash { len, data: at(program.weights), out: at(moments.hash) }),
        ]
    }

    /// A training step and its Adam update in one call on the device that holds the training
    /// state ([`Model::upload_training_state`]): [`Model::step`] then [`Model::adam_on_device`]
    /// with the step's own gradient, without the gradient leaving the device — a lone member's
    /// `every-step` sync, whose mean is its gradient bit for bit. The loss and the new weight
    /// hash come back. `audit` may pick the update's ops too.
    #[allow(clippy::too_many_arguments)]
    pub fn step_and_adam_on_device(
        &self,
        gemm: &mut dyn Gemm,
        tokens: &[u8],
        targets: &[u8],
        batch: usize,
        seq: usize,
        audit: Option<Auditing<'_>>,
        step: u32,
        adam: AdamStep,
    ) -> Result<(f32, u32, Option<Audited>), ComputeError> {
        self.check(Weights::OnDevice, tokens, batch, seq);
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        let (device, program, moments) = Self::resident(&mut cached, gemm)?;
        if (program.batch, program.seq) != (batch, seq) {
            return Err(ComputeError::backend(NotOnDevice));
        }
        device.write(program.tokens, 0, &token_words(tokens))?;
        device.write(program.targets, 0, &token_words(targets))?;
        let mut sequence = program.step().to_vec();
        sequence.extend(self.adam_and_hash(program, moments, adam));
        let audited = run_audited(device, &sequence, audit, step)?;
        let (mut loss, mut hash) = ([0u32], [0u32]);
        device.read(program.loss, 0, &mut loss)?;
        device.read(moments.hash, 0, &mut hash)?;
        Ok((f32::from_bits(loss[0]), hash[0], audited))
    }

    /// Copies the device's weights into `w` and, when given, Adam's moments into `m` and `v`.
    pub fn download_training_state(
        &self,
        gemm: &mut dyn Gemm,
        w: &mut [f32],
        moments: Option<(&mut [f32], &mut [f32])>,
    ) -> Result<(), ComputeError> {
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        let (device, program, held) = Self::resident(&mut cached, gemm)?;
        device.read(program.weights, 0, of_f32s_mut(w))?;
        if let Some((m, v)) = moments {
            device.read(held.m, 0, of_f32s_mut(m))?;
            device.read(held.v, 0, of_f32s_mut(v))?;
        }
        Ok(())
    }

    /// [`Model::loss_and_grad`] with the live audit: `audit` picks the op of the step to
    /// recompute with the reference (see [`run_audited`]); `step` is for the report. With
    /// [`Weights::OnDevice`] the device must hold them ([`Model::upload_training_state`]).
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &self,
        gemm: &mut dyn Gemm,
        w: Weights<'_>,
        tokens: &[u8],
        targets: &[u8],
        batch: usize,
        seq: usize,
        audit: Option<Auditing<'_>>,
        step: u32,
    ) -> Result<(f32, Vec<f32>, Option<Audited>), ComputeError> {
        self.with_step(gemm, w, tokens, targets, batch, seq, |device, program| {
            let audited = run_audited(device, program.step(), audit, step)?;
            let (loss, grads) = self.loss_and_grads_of(device, program)?;
            Ok((loss, grads, audited))
        })
    }

    /// One step's ops from weights `w` on `tokens`, traced as `tracing` asks
    /// ([`crate::audit::trace_ops`]): what a disputed member and its auditor compare.
    #[allow(clippy::too_many_arguments)]
    pub fn trace(
        &self,
        gemm: &mut dyn Gemm,
        w: &[f32],
        tokens: &[u8],
        targets: &[u8],
        batch: usize,
        seq: usize,
        tracing: &Tracing,
    ) -> Result<Traced, ComputeError> {
        self.with_step(gemm, Weights::Host(w), tokens, targets, batch, seq, |device, program| {
            trace_ops(device, program.step(), tracing)
        })
    }

    /// [`Model::step`] from weights `w`, every op's written words traced as it runs
    /// ([`Tracing::Whole`]): a leader's check, which records the definition's trace of the
    /// contribution it recomputes.
    #[allow(clippy::too_many_arguments)]
    pub fn step_traced(
        &self,
        gemm: &mut dyn Gemm,
        w: &[f32],
        tokens: &[u8],
        targets: &[u8],
        batch: usize,
        seq: usize,
    ) -> Result<(f32, Vec<f32>, Trace), ComputeError> {
        self.with_step(gemm, Weights::Host(w), tokens, targets, batch, seq, |device, program| {
            let Traced::Whole(trace) = trace_ops(device, program.step(), &Tracing::Whole)? else {
                unreachable!("a whole trace asked for")
            };
            let (loss, grads) = self.loss_and_grads_of(device, program)?;
            Ok((loss, grads, trace))
        })
    }

    /// The loss and the gradient a step's program left on `device`.
    fn loss_and_grads_of(&self, device: &mut dyn Device, program: &Program) -> Result<(f32, Vec<f32>), ComputeError> {
        let mut loss = [0u32];
        device.read(program.loss, 0, &mut loss)?;
        let mut grads = vec![0f32; self.layout.len];
        device.read(program.grads, 0, of_f32s_mut(&mut grads))?;
        Ok((f32::from_bits(loss[0]), grads))
    }

    /// Runs `run` on the device (or host memory) holding the step's program, its weights (when
    /// given here) and batch written.
    #[allow(clippy::too_many_arguments)]
    fn with_step<R>(
        &self,
        gemm: &mut dyn Gemm,
        w: Weights<'_>,
        tokens: &[u8],
        targets: &[u8],
        batch: usize,
        seq: usize,
        run: impl FnOnce(&mut dyn Device, &Program) -> Result<R, ComputeError>,
    ) -> Result<R, ComputeError> {
        self.check(w, tokens, batch, seq);
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        let (entry, built) = self.program_for(&mut cached, gemm, batch, seq, 0)?;
        if matches!(w, Weights::OnDevice) && (built || entry.moments.is_none() || entry.device.is_none()) {
            return Err(ComputeError::backend(NotOnDevice));
        }
        let Cached { program, host, device: own, .. } = entry;
        let mut host_device;
        let device: &mut dyn Device = if own.is_some() {
            gemm.device().expect("it had one a moment ago")
        } else {
            host_device = HostDevice { memory: host, gemm };
            &mut host_device
        };
        if let Weights::Host(w) = w {
            device.write(program.weights, 0, of_f32s(w))?;
        }
        device.write(program.tokens, 0, &token_words(tokens))?;
        device.write(program.targets, 0, &token_words(targets))?;
        run(device, program)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::gemm::FloatGemm;
    use crate::params::init;
    use std::sync::Arc;

    use crate::audit::{Trace, TRACE_CHUNK_WORDS};
    use crate::data::{CorpusSource, DataSource};
    use crate::gemm::Gemm;

    /// Central differences on the float path: the hand-written backward pass agrees with the
    /// loss it differentiates, for weights of every kind.
    #[test]
    fn backward_matches_finite_differences() {
        let cfg = ModelConfig { width: 16, context: 8, layers: 2, heads: 2 };
        let model = Model::new(Layout::new(cfg));
        let mut w = init(&model.layout, 3);
        // Perturb gains and biases away from 1 and 0 so their gradients are generic.
        let mut rng = lockstep_luts::rng::SplitMix64::new(9);
        for v in &mut w {
            *v += rng.next_signed_unit() * 0.05;
        }
        let (batch, seq) = (2, 8);
        let tokens: Vec<u8> = (0..batch * seq).map(|i| (i * 37 % 251) as u8).collect();
        let targets: Vec<u8> = (0..batch * seq).map(|i| (i * 91 % 253) as u8).collect();
        let mut gemm = FloatGemm::default();
        let (_, grads) = model.loss_and_grad(&mut gemm, &w, &tokens, &targets, batch, seq).unwrap();

        let l = &model.layout;
        let lo = &l.layers[1];
        let probes = [
            l.tok_emb.start + tokens[3] as usize * 16 + 5,
            l.pos_emb.start + 2 * 16 + 7,
            l.layers[0].ln1_g.start + 3,
            l.layers[0].qkv_w.start + 5,           // a query weight
            l.layers[0].qkv_w.start + 16 * 16 + 9, // a key weight
            l.layers[0].qkv_w.start + 40 * 16 + 1, // a value weight
            l.layers[0].qkv_b.start + 20,
            lo.proj_w.start + 33,
            lo.ln2_b.start + 4,
            lo.fc_w.start + 100,
            lo.fc_b.start + 7,
            lo.fc2_w.start + 77,
            l.lnf_g.start + 11,
            l.head_w.start + targets[0] as usize * 16 + 2,
            l.head_b.start + targets[1] as usize,
        ];
        for &index in &probes {
            let h = 1e-2f32;
            let mut plus = w.clone();
            plus[index] += h;
            let mut minus = w.clone();
            minus[index] -= h;
            let lp = model.loss(&mut gemm, &plus, &tokens, &targets, batch, seq).unwrap();
            let lm = model.loss(&mut gemm, &minus, &tokens, &targets, batch, seq).unwrap();
            let numeric = (f64::from(lp) - f64::from(lm)) / (2.0 * f64::from(h));
            let analytic = f64::from(grads[index]);
            let tolerance = 2e-3 + 0.05 * analytic.abs().max(numeric.abs());
            assert!(
                (numeric - analytic).abs() <= tolerance,
                "weight {index}: analytic {analytic:e} vs numeric {numeric:e}"
            );
        }
    }

    /// The reference units as products; `flip`: the lowest bit of output `flip` of every product
    /// with more outputs than that flipped (a backend wrong past a size).
    struct FlipUnits {
        flip: Option<usize>,
    }

    impl Gemm for FlipUnits {
        fn gemm_nt(
            &mut self,
            m: usize,
            n: usize,
            k: usize,
            a: &[f32],
            b: &[f32],
            c: &mut [f32],
        ) -> Result<(), ComputeError> {
            c.copy_from_slice(&lockstep_luts::gemm_nt(m, n, k, a, b).map_err(ComputeError::backend)?);
            if let Some(i) = self.flip.filter(|&i| i < c.len()) {
                c[i] = f32::from_bits(c[i].to_bits() ^ 1);
            }
            Ok(())
        }

        fn label(&self) -> String {
            "units".into()
        }

        fn units(&self) -> bool {
            true
        }
    }

    /// One step of a small model traced as `tracing` asks, on `gemm`.
    fn traced(gemm: &mut FlipUnits, tracing: &Tracing) -> Traced {
        let cfg = ModelConfig { width: 32, context: 32, layers: 1, heads: 2 };
        let model = Model::new(Layout::new(cfg));
        let weights = init(&Layout::new(cfg), 5);
        let (batch, _) = CorpusSource::builtin(7).next_batch(2, cfg.context);
        model.trace(gemm, &weights, &batch.tokens, &batch.targets, 2, cfg.context, tracing).unwrap()
    }

    /// Two backends' traces of one step part at the first op whose words differ — a product
    /// past the size where one of them goes wrong — and nowhere before; the departure names
    /// that op, the first differing chunk and where its words lie, and the wrong side's words
    /// of that chunk (what a disputed member answers the definition's trace with) are the ones
    /// its trace's digest names and differ from the definition's by the flipped bit. Right
    /// against right agrees; a trace of another step's length is unlike.
    #[test]
    fn a_dispute_narrows_two_traces_to_the_first_op_chunk_and_word_that_differ() {
        let (mut right, mut wrong) = (FlipUnits { flip: None }, FlipUnits { flip: Some(5000) });
        let Traced::Whole(definition) = traced(&mut right, &Tracing::Whole) else { panic!("a trace") };
        let Traced::Whole(theirs) = traced(&mut wrong, &Tracing::Whole) else { panic!("a trace") };
        assert_eq!(definition.ops.len(), theirs.ops.len());
        let first = (0..theirs.ops.len()).find(|&i| definition.ops[i] != theirs.ops[i]).expect("they differ");
        assert!(first > 0, "the small products before it agree");
        assert_ne!(definition.op_digest(first), theirs.op_digest(first));
        let Traced::Departs(departure) = traced(&mut right, &Tracing::Against(Arc::new(theirs.clone()))) else {
            panic!("departs")
        };
        assert_eq!((departure.op, departure.name), (first, "matmul"));
        assert_eq!(departure.chunk, 5000 / TRACE_CHUNK_WORDS, "the chunk holding output 5000");
        // A disputed member answering the definition's trace in one run: its trace up to and
        // with the op where they part, and its words of that chunk.
        let Traced::Answer { trace, words } = traced(&mut wrong, &Tracing::Answer(Arc::new(definition.clone()))) else {
            panic!("an answer")
        };
        assert_eq!(trace.ops[..], theirs.ops[..=first]);
        let Some((op, chunk, words)) = words else { panic!("the words of the parting chunk") };
        assert_eq!((op, chunk), (first, departure.chunk));
        assert_eq!(crate::wire::words_digest(&words), theirs.ops[first][departure.chunk]);
        let at = (0..words.len()).find(|&i| words[i] != departure.words[i]).expect("a word differs");
        assert_eq!(words[at], departure.words[at] ^ 1);
        assert_eq!(at, 5000 % TRACE_CHUNK_WORDS);
        let (buffer, word) = departure.place(at).expect("in the chunk");
        let (start, len) = departure.places.iter().find(|p| p.0 == buffer).map(|p| (p.1, p.2)).unwrap();
        assert!(word >= start && word < start + len);
        assert_eq!(departure.place(departure.words.len()), None);
        assert_eq!(traced(&mut right, &Tracing::Against(Arc::new(definition.clone()))), Traced::Agrees);
        let short = Trace { ops: definition.ops[..3].to_vec() };
        let ours = definition.ops.len();
        assert_eq!(traced(&mut right, &Tracing::Against(Arc::new(short))), Traced::Unlike { ours, theirs: 3 });
        let agrees = traced(&mut right, &Tracing::Answer(Arc::new(definition.clone())));
        assert_eq!(agrees, Traced::Answer { trace: definition, words: None });
    }
}
