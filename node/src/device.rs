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
//! `audit.rs` runs a sequence with ops recomputed by the reference and compared.

use lockstep_luts::ops::{Handle, Op, OpError};

use crate::compute_error::ComputeError;

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
