//! Where the model's matrix products go: the verified units through a backend plugin, or plain
//! f32 for the float reference trainer.

use lockstep_backends::{Backend, BackendError};

/// A failed matrix product: the run stops with this message, it never continues with zeros.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComputeError(pub String);

impl std::fmt::Display for ComputeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ComputeError {}

impl From<BackendError> for ComputeError {
    fn from(error: BackendError) -> Self {
        ComputeError(error.to_string())
    }
}

/// `c = a · bᵀ` with `a` `m × k`, `b` `n × k`, `c` `m × n`, row-major.
pub trait Gemm {
    fn gemm_nt(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<(), ComputeError>;

    /// What computes the products, for reports.
    fn label(&self) -> String;
}

/// The verified units through an admitted backend plugin.
pub struct UnitsGemm {
    backend: Backend,
}

impl UnitsGemm {
    pub fn new(backend: Backend) -> Self {
        Self { backend }
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut Backend {
        &mut self.backend
    }

    pub fn into_backend(self) -> Backend {
        self.backend
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
        Ok(self.backend.gemm_f32_into(m, n, k, a, b, c)?)
    }

    fn label(&self) -> String {
        format!("units via `{}`", self.backend.name())
    }
}

/// Plain f32 products (`matrixmultiply`'s sgemm, single-threaded, so deterministic too): the
/// float reference the units trainer is measured against.
#[derive(Default)]
pub struct FloatGemm;

impl Gemm for FloatGemm {
    fn gemm_nt(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        assert!(a.len() == m * k && b.len() == n * k && c.len() == m * n, "gemm_nt: lengths do not match {m}×{n}×{k}");
        if m == 0 || n == 0 {
            return Ok(());
        }
        // SAFETY: A is m×k row-major, B is n×k row-major read as its k×n transpose, C is m×n
        // row-major; the lengths were just checked.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                k as isize,
                1,
                b.as_ptr(),
                1,
                k as isize,
                0.0,
                c.as_mut_ptr(),
                n as isize,
                1,
            );
        }
        Ok(())
    }

    fn label(&self) -> String {
        "float reference (f32 sgemm)".into()
    }
}
