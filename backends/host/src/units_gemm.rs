//! Admitted plugin instances as the model's products: `lockstep_node::gemm::Gemm` for a
//! [`Backend`] (one lane) and for [`UnitsGemm`] (a main instance plus single-threaded lanes).
//! A failed call keeps the plugin's [`BackendError`] whole inside `ComputeError::Backend`.

use lockstep_node::gemm::{ComputeError, Gemm};

use crate::backend::Backend;

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
}
