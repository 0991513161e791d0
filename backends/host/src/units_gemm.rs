//! Admitted plugin instances as the model's products: `lockstep_node::gemm::Gemm` for a
//! [`Backend`] (one lane) and for [`UnitsGemm`] (a main instance plus single-threaded lanes).
//! A failed call keeps the plugin's [`BackendError`] whole inside `ComputeError::Backend`.

use lockstep_luts::ops::{Handle, Op};
use lockstep_node::device::Device;
use lockstep_node::gemm::{ComputeError, Gemm};

use lockstep_worker_api::caps;

use crate::backend::{Backend, BackendError, InstanceOptions};

/// One backend instance is a lane of its own.
impl Gemm for Backend {
    fn gemm_nt(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        self.gemm_f32_into(m, n, k, a, b, c).map_err(ComputeError::backend)
    }

    fn label(&self) -> String {
        format!("units via `{}`", self.name())
    }

    fn lanes(&mut self) -> Vec<&mut dyn Gemm> {
        vec![self]
    }
}

/// The verified units through an admitted backend plugin: a main instance (which may thread
/// large products internally) plus extra single-threaded instances of the same plugin as
/// lanes for parallel small products.
pub struct UnitsGemm {
    lanes: Vec<Backend>,
}

impl UnitsGemm {
    pub fn new(backend: Backend) -> Self {
        Self { lanes: vec![backend] }
    }

    /// `main` plus `extra` instances of the same plugin as parallel lanes.
    pub fn with_lanes(main: Backend, extra: Vec<Backend>) -> Self {
        assert!(extra.iter().all(|b| b.plugin().path() == main.plugin().path()), "lanes must be one plugin");
        let mut lanes = vec![main];
        lanes.extend(extra);
        Self { lanes }
    }

    /// The lane policy: a device plugin computes with its one instance (the device
    /// parallelises inside a call); a CPU plugin gets one lane per thread — `threads`, 0 for
    /// every core — each an extra single-threaded instance created with `options`.
    pub fn with_lane_policy(main: Backend, threads: u32, options: &InstanceOptions) -> Result<Self, BackendError> {
        let device = main.plugin().capabilities() & caps::DEVICE != 0;
        let lanes = match threads {
            _ if device => 1,
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n as usize,
        };
        let lane = InstanceOptions { threads: 1, ..options.clone() };
        let extra = (1..lanes).map(|_| main.plugin().instantiate_options(&lane)).collect::<Result<Vec<_>, _>>()?;
        Ok(Self::with_lanes(main, extra))
    }

    pub fn backend(&self) -> &Backend {
        &self.lanes[0]
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
        self.lanes[0].gemm_nt(m, n, k, a, b, c)
    }

    fn label(&self) -> String {
        format!("units via `{}` ({} lane(s))", self.lanes[0].name(), self.lanes.len())
    }

    fn lanes(&mut self) -> Vec<&mut dyn Gemm> {
        self.lanes.iter_mut().map(|b| b as &mut dyn Gemm).collect()
    }

    fn device(&mut self) -> Option<&mut dyn Device> {
        let main = &mut self.lanes[0];
        main.has_step_ops().then_some(main as &mut dyn Device)
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
}
