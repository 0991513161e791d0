//! Where the model's matrix products go: the verified units through an admitted backend, or
//! plain f32 for the float reference trainer.
//!
//! **API Boundary:** this crate never loads a plugin. The composition root adapts a loaded
//! backend to [`Gemm`]; a backend's own typed error arrives here as
//! [`ComputeError::Backend`], kept whole (it can be downcast) until a person reads it.

use crate::compute_error::ComputeError;
use crate::device::Device;

/// `c = a · bᵀ` with `a` `m × k`, `b` `n × k`, `c` `m × n`, row-major.
pub trait Gemm: Send {
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

    /// Whether these are the verified units (an admitted backend: bit-exact with the
    /// definition, so checked against it at a run's shapes), not the float reference.
    fn units(&self) -> bool;

    /// Threads the host may use for its own work beside the products (Adam, the element-wise
    /// ops of a product-only backend): the user's thread count. It never changes a bit.
    fn threads(&self) -> usize {
        1
    }

    /// The backend's own executor for a whole step's ops (ABI 2), when it has one: the trainer
    /// then keeps a step's buffers there. `None`: the host runs the ops and calls
    /// [`Gemm::gemm_nt`] for the products.
    fn device(&mut self) -> Option<&mut dyn Device> {
        None
    }

    /// `c = a · bᵀ` with `a` (`m × k`) and `b` (`n × k`) read through `(row, column)` strides,
    /// for a product that can read views in place (the float reference). `None`: not offered —
    /// the units quantize contiguous rows, so the host gathers them.
    #[allow(clippy::too_many_arguments)]
    fn gemm_nt_strided(
        &mut self,
        _m: usize,
        _n: usize,
        _k: usize,
        _a: (&[f32], usize, usize),
        _b: (&[f32], usize, usize),
        _c: &mut [f32],
    ) -> Option<Result<(), ComputeError>> {
        None
    }
}

/// Plain f32 products (`matrixmultiply`'s sgemm, single-threaded, so deterministic too): the
/// float reference the units trainer is measured against.
#[derive(Default)]
pub struct FloatGemm {
    /// The host's threads beside the products ([`Gemm::threads`]).
    threads: usize,
}

impl FloatGemm {
    pub fn new(threads: usize) -> Self {
        Self { threads }
    }
}

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

    fn units(&self) -> bool {
        false
    }

    fn threads(&self) -> usize {
        self.threads.max(1)
    }

    fn gemm_nt_strided(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        (a, a_rs, a_cs): (&[f32], usize, usize),
        (b, b_rs, b_cs): (&[f32], usize, usize),
        c: &mut [f32],
    ) -> Option<Result<(), ComputeError>> {
        assert_eq!(c.len(), m * n, "gemm_nt_strided: C is not {m}×{n}");
        if m == 0 || n == 0 {
            return Some(Ok(()));
        }
        let last = |rows: usize, rs: usize, cs: usize| (rows - 1) * rs + k.saturating_sub(1) * cs;
        assert!(
            k == 0 || (last(m, a_rs, a_cs) < a.len() && last(n, b_rs, b_cs) < b.len()),
            "gemm_nt_strided: a view leaves its slice"
        );
        // SAFETY: every index the strides reach is inside `a` and `b` (asserted); C is m×n
        // row-major. B is read as its k×n transpose: element (l, j) is b[j·b_rs + l·b_cs].
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                a_rs as isize,
                a_cs as isize,
                b.as_ptr(),
                b_cs as isize,
                b_rs as isize,
                0.0,
                c.as_mut_ptr(),
                n as isize,
                1,
            );
        }
        Some(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The float reference reading views through strides gives the bits it gives on gathered
    /// rows: the host may skip the gathers for it.
    #[test]
    fn strided_float_products_equal_gathered_ones() {
        let mut rng = lockstep_luts::rng::SplitMix64::new(11);
        let (m, n, k) = (37, 29, 70);
        let a: Vec<f32> = (0..m * k).map(|_| rng.next_signed_unit()).collect(); // m × k
        let bt: Vec<f32> = (0..k * n).map(|_| rng.next_signed_unit()).collect(); // k × n: B transposed
        let b: Vec<f32> = (0..n * k).map(|i| bt[(i % k) * n + i / k]).collect(); // n × k
        let mut gathered = vec![0.0; m * n];
        FloatGemm::default().gemm_nt(m, n, k, &a, &b, &mut gathered).unwrap();
        let mut strided = vec![0.0; m * n];
        FloatGemm::default().gemm_nt_strided(m, n, k, (&a, k, 1), (&bt, 1, n), &mut strided).unwrap().unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&strided), bits(&gathered));
    }
}
