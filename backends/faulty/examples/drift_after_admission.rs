//! A plugin that is exact while the gate watches, then drifts: from its 200th `gemm_f32`
//! call on, one element of every product has its lowest mantissa bit flipped. The gate admits
//! it (it makes fewer calls than that); the live audit must catch it.

use lockstep_worker_api::plugin::{Worker, WorkerError};
use lockstep_worker_api::{caps, status, CreateOptions};

/// Calls before the drift starts; the gate makes far fewer.
const HONEST_CALLS: u64 = 200;

struct Drifting {
    calls: u64,
}

impl Worker for Drifting {
    const NAME: &'static std::ffi::CStr = c"drift-after-admission";
    const DESCRIPTION: &'static std::ffi::CStr = c"exact, then one flipped bit per product (test fixture)";
    const CAPABILITIES: u64 = caps::REQUIRED;

    fn create(_: &CreateOptions) -> Result<Self, WorkerError> {
        Ok(Drifting { calls: 0 })
    }

    fn describe(&self) -> String {
        format!("test fixture, {} calls so far", self.calls)
    }

    fn gemm_f32(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<(), WorkerError> {
        let exact = lockstep_luts::gemm_nt(m, n, k, a, b)
            .map_err(|e| WorkerError::new(status::NON_FINITE_INPUT, e.to_string()))?;
        c.copy_from_slice(&exact);
        self.calls += 1;
        if self.calls > HONEST_CALLS && !c.is_empty() {
            let i = (self.calls as usize * 7919) % c.len();
            c[i] = f32::from_bits(c[i].to_bits() ^ 1);
        }
        Ok(())
    }

    fn gemm_i8(&mut self, m: usize, n: usize, k: usize, a: &[i8], b: &[i8], c: &mut [i32]) -> Result<(), WorkerError> {
        c.copy_from_slice(&lockstep_luts::gemm_i8_nt(m, n, k, a, b));
        Ok(())
    }
}

lockstep_worker_api::export_worker!(Drifting);
