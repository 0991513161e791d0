//! A plugin that is exact on small products and wrong on large ones: every output past the
//! first [`EXACT_OUTPUTS`] words of a product is +0, as a kernel whose grid or buffer is sized
//! for the wrong limit would leave them (what `tc` did at GPT-2 size on an H100,
//! `docs/TRUST.md`). The gate's battery multiplies small matrices and admits it; a model's own
//! products (the tests' 32-wide model's logits alone are 128 × 256 outputs) are past the limit,
//! so the admission at the run's shapes must refuse it.

use lockstep_faulty_plugins::ReferenceWorker;
use lockstep_worker_api::plugin::{Worker, WorkerError};
use lockstep_worker_api::{caps, CreateOptions};

/// Outputs of one product computed right (64 KiB of f32): more than any product of the gate's
/// battery has (its largest, `shape-128x96x160`, 12,288), fewer than a model's logits have.
const EXACT_OUTPUTS: usize = 16 * 1024;

struct PastSize(ReferenceWorker);

impl Worker for PastSize {
    const NAME: &'static std::ffi::CStr = c"flaw-past-size";
    const DESCRIPTION: &'static std::ffi::CStr = c"exact below 16 Ki outputs a product, zeros past them (test fixture)";
    const CAPABILITIES: u64 = caps::REQUIRED;

    fn create(options: &CreateOptions) -> Result<Self, WorkerError> {
        ReferenceWorker::create(options).map(PastSize)
    }

    fn describe(&self) -> String {
        "test fixture: zeros past 16 Ki outputs".into()
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
        self.0.gemm_f32(m, n, k, a, b, c)?;
        if let Some(past) = c.get_mut(EXACT_OUTPUTS..) {
            past.fill(0.0);
        }
        Ok(())
    }

    fn gemm_i8(&mut self, m: usize, n: usize, k: usize, a: &[i8], b: &[i8], c: &mut [i32]) -> Result<(), WorkerError> {
        self.0.gemm_i8(m, n, k, a, b, c)
    }
}

lockstep_worker_api::export_worker!(PastSize);
