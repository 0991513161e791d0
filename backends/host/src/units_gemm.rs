//! Admitted plugin instances as the model's products: `lockstep_node::gemm::Gemm` for
//! [`UnitsGemm`] (one instance, which threads large products and — ABI 2 — whole steps itself),
//! and `lockstep_node::device::Device` for a [`Backend`] with the step's ops. A failed call keeps
//! the plugin's `BackendError` whole inside `ComputeError::Backend`.

use lockstep_luts::ops::{Handle, Op};
use lockstep_node::compute_error::ComputeError;
use lockstep_node::device::Device;
use lockstep_node::gemm::Gemm;

use crate::backend::Backend;

/// The verified units through an admitted backend plugin.
pub struct UnitsGemm {
    backend: Backend,
    /// The user's thread count, for the host's work beside the products ([`Gemm::threads`]).
    threads: usize,
}

impl UnitsGemm {
    /// `backend` with the host working on one thread beside it.
    pub fn new(backend: Backend) -> Self {
        Self::with_threads(backend, 1)
    }

    /// `backend` with the host working on `threads` threads beside it.
    pub fn with_threads(backend: Backend, threads: usize) -> Self {
        Self { backend, threads: threads.max(1) }
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }
}

impl Gemm for UnitsGemm {
    fn gemm_nt(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        self.backend.gemm_f32_into(m, n, k, a, b, c).map_err(ComputeError::backend)
    }

    fn label(&self) -> String {
        format!("units via `{}`", self.backend.name())
    }

    fn units(&self) -> bool {
        true
    }

    fn threads(&self) -> usize {
        self.threads
    }

    fn device(&mut self) -> Option<&mut dyn Device> {
        self.backend.has_step_ops().then_some(&mut self.backend as &mut dyn Device)
    }
}

/// An ABI 2 backend as the node's [`Device`]: its own buffers and ops.
impl Device for Backend {
    fn create_buffer(&mut self, words: usize) -> Result<Handle, ComputeError> {
        Backend::create_buffer(self, words).map_err(ComputeError::backend)
    }

    fn free_buffer(&mut self, buffer: Handle) {
        Backend::free_buffer(self, buffer)
    }

    /// On an accelerator, a buffer of `words` made and freed at once: a GPU plugin's arena page
    /// grows to hold it and keeps the room for the buffers that follow (the ABI has no call of
    /// its own for this). A program larger than one page cannot be announced that way: the
    /// refusal is ignored and its buffers open pages as they come (a real shortage of memory
    /// is reported by the creation that meets it). A CPU plugin's buffers are separate
    /// allocations: nothing to do.
    fn reserve(&mut self, words: usize) -> Result<(), ComputeError> {
        if self.accelerator() && words > 0 {
            if let Ok(room) = Backend::create_buffer(self, words) {
                Backend::free_buffer(self, room);
            }
        }
        Ok(())
    }

    fn write(&mut self, buffer: Handle, offset: usize, words: &[u32]) -> Result<(), ComputeError> {
        self.write_buffer(buffer, offset, words).map_err(ComputeError::backend)
    }

    fn read(&mut self, buffer: Handle, offset: usize, out: &mut [u32]) -> Result<(), ComputeError> {
        self.read_buffer(buffer, offset, out).map_err(ComputeError::backend)
    }

    fn run(&mut self, ops: &[Op]) -> Result<(), ComputeError> {
        self.run_ops(ops).map_err(ComputeError::backend)
    }

    fn computes(&self, _: &Op) -> bool {
        true
    }

    fn label(&self) -> String {
        format!("units via `{}` (ABI 2 ops)", self.name())
    }

    fn instance(&self) -> u64 {
        self.instance_id()
    }

    fn accelerator(&self) -> bool {
        self.plugin_capabilities() & lockstep_worker_api::caps::DEVICE != 0
    }

    fn describe_now(&mut self) -> String {
        self.describe()
    }
}
