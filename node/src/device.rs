//! Where a training step's op sequence runs.
//!
//! A [`Device`] owns buffers of 32-bit words and runs [`Op`]s on them (`lockstep_luts::ops`,
//! the one definition). Two kinds exist:
//! - a backend's own executor (an ABI 2 plugin, adapted by the composition root and offered
//!   through `Gemm::device`): the whole sequence goes over in one call, the buffers stay in the
//!   backend from step to step;
//! - `HostDevice` (`host_device.rs`): host memory, the element-wise ops by the reference itself
//!   and every product through a `Gemm` — what an ABI 1 plugin (products only) and the float
//!   reference trainer run on.
//!
//! [`run_audited`] runs a sequence with one op recomputed by the reference from copies of what it
//! read, compared word for word: the live audit.

use std::collections::BTreeMap;

use lockstep_luts::ops::{self, Handle, Op, OpError};

use crate::compute_error::{AuditFailure, AuditMismatch, ComputeError};

/// Buffers and ops. Every call either completes or fails with a typed error; a failed op
/// leaves its outputs undefined and the step is abandoned.
pub trait Device {
    /// A new buffer of `words` 32-bit words (contents unspecified until written).
    fn create_buffer(&mut self, words: usize) -> Result<Handle, ComputeError>;
    fn free_buffer(&mut self, buffer: Handle);
    /// Says that buffers of `words` words in all are about to be created (a program's), so a
    /// backend that keeps them in one growing allocation grows it once, to what they need,
    /// instead of once or more per buffer. Only a hint: nothing is created.
    fn reserve(&mut self, _words: usize) -> Result<(), ComputeError> {
        Ok(())
    }
    fn write(&mut self, buffer: Handle, offset: usize, words: &[u32]) -> Result<(), ComputeError>;
    fn read(&mut self, buffer: Handle, offset: usize, out: &mut [u32]) -> Result<(), ComputeError>;
    /// Runs `ops` in order.
    fn run(&mut self, ops: &[Op]) -> Result<(), ComputeError>;
    /// Which ops the backend computes itself (and an audit may check): all, for a backend's own
    /// executor; the products only, for [`HostDevice`].
    fn computes(&self, op: &Op) -> bool;
    fn label(&self) -> String;
    /// Tells instances apart (a hot-swap makes a new one): unique in the process.
    fn instance(&self) -> u64;
    /// Whether the backend computes on an accelerator (its buffers are device memory).
    fn accelerator(&self) -> bool {
        false
    }
    /// The backend's own one-line description now (for a GPU: the adapter and the device
    /// memory it holds), for reports.
    fn describe_now(&mut self) -> String {
        self.label()
    }
}

/// A fresh value for [`Device::instance`].
pub fn new_instance_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A device's failure to run an op the way the definition allows (an out-of-bounds view, a
/// token past the vocabulary, a non-finite operand of the units).
#[derive(Debug)]
pub struct OpFailed(pub OpError);

impl std::fmt::Display for OpFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for OpFailed {}

/// An op's refusal as a compute failure.
pub(crate) fn op_error(e: OpError) -> ComputeError {
    ComputeError::backend(OpFailed(e))
}

/// Copies of the buffers an op touches, as the reference's memory.
fn snapshot(device: &mut dyn Device, op: &Op) -> Result<BTreeMap<Handle, Vec<u32>>, ComputeError> {
    let mut copies = BTreeMap::new();
    for (buffer, end) in op.extents() {
        let mut words = vec![0u32; end as usize];
        device.read(buffer, 0, &mut words)?;
        copies.insert(buffer, words);
    }
    Ok(copies)
}

/// Which ops of a sequence the reference recomputes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audit {
    /// The `n`-th of the ops the device computes itself (modulo their number): the live audit.
    One(usize),
    /// Every op the device computes itself, each checked before the next runs: the first op
    /// where a backend departs from the definition (`lockstep bisect`).
    Every,
}

/// What an audited sequence recomputed.
#[derive(Clone, Debug, PartialEq)]
pub struct Audited {
    /// The (last) op's position in the sequence and its name.
    pub index: usize,
    pub name: &'static str,
}

/// Runs `ops` on `device`; with `audit`, the op it picks (or every op the device computes
/// itself) is recomputed by the reference from copies of everything it touches, and every word
/// it wrote is compared. A difference fails the step, naming the op.
pub fn run_audited(
    device: &mut dyn Device,
    ops: &[Op],
    audit: Option<Audit>,
    step: u32,
) -> Result<Option<Audited>, ComputeError> {
    let auditable: Vec<usize> = match audit {
        None => Vec::new(),
        Some(_) => (0..ops.len()).filter(|&i| device.computes(&ops[i])).collect(),
    };
    let picked: Vec<usize> = match audit {
        Some(Audit::One(t)) if !auditable.is_empty() => vec![auditable[t % auditable.len()]],
        Some(Audit::Every) => auditable,
        _ => Vec::new(),
    };
    let Some(&last) = picked.last() else {
        device.run(ops)?;
        return Ok(None);
    };
    let mut next = 0;
    for &index in &picked {
        if next < index {
            device.run(&ops[next..index])?;
        }
        check_op(device, &ops[index], index, step)?;
        next = index + 1;
    }
    device.run(&ops[next..])?;
    Ok(Some(Audited { index: last, name: ops[last].name() }))
}

/// Runs `op` (the `index`-th of its sequence) on `device` and compares every word it may have
/// written with the reference's, computed from copies of what it touched just before.
fn check_op(device: &mut dyn Device, op: &Op, index: usize, step: u32) -> Result<(), ComputeError> {
    let mut expected = snapshot(device, op)?;
    device.run(std::slice::from_ref(op))?;
    ops::run_reference(op, &mut expected).map_err(op_error)?;
    let actual = snapshot(device, op)?;
    for (buffer, want) in &expected {
        let got = &actual[buffer];
        let mut differing = want.iter().zip(got).enumerate().filter(|(_, (x, y))| x != y);
        if let Some((at, (&x, &y))) = differing.next() {
            let mismatch = AuditMismatch {
                call: index,
                op: op.name(),
                buffer: *buffer,
                index: at,
                expected_bits: x,
                actual_bits: y,
                differing: 1 + differing.count(),
            };
            return Err(ComputeError::Audit(AuditFailure { step, mismatch, backend: device.label() }));
        }
    }
    Ok(())
}
