//! A plugin that is wrong once in a thousand products, by one bit: every 1000th product of more
//! than [`PROBE_OUTPUTS`] outputs has the lowest mantissa bit of one output flipped (the output
//! moves with the call count). The gate's battery and the admission at a run's shapes make
//! fewer large products than that and admit it; the guard's probe product is smaller and never
//! sees it; a run's step makes a dozen or more large products, so a flip lands in about one
//! step in a hundred at the tests' tiny sizes — what an audit by recomputation must name
//! (`docs/TRUST.md`).

use lockstep_faulty_plugins::ReferenceWorker;
use lockstep_worker_api::plugin::{Worker, WorkerError};
use lockstep_worker_api::{caps, CreateOptions};

/// Products at or below this many outputs are never touched (the guard's probe is 37 × 53).
const PROBE_OUTPUTS: usize = 2048;
/// One flip every this many large products.
const EVERY: u64 = 1000;

struct RareFlip {
    exact: ReferenceWorker,
    large: u64,
}

impl Worker for RareFlip {
    const NAME: &'static std::ffi::CStr = c"flaw-rare-flip";
    const DESCRIPTION: &'static std::ffi::CStr =
        c"one bit of one output flipped every 1000th large product (test fixture)";
    const CAPABILITIES: u64 = caps::REQUIRED;

    fn create(options: &CreateOptions) -> Result<Self, WorkerError> {
        Ok(RareFlip { exact: ReferenceWorker::create(options)?, large: 0 })
    }

    fn describe(&self) -> String {
        format!("test fixture: {} large products so far", self.large)
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
        self.exact.gemm_f32(m, n, k, a, b, c)?;
        if c.len() > PROBE_OUTPUTS {
            self.large += 1;
            if self.large.is_multiple_of(EVERY) {
                let i = (self.large as usize * 7919) % c.len();
                c[i] = f32::from_bits(c[i].to_bits() ^ 1);
            }
        }
        Ok(())
    }

    fn gemm_i8(&mut self, m: usize, n: usize, k: usize, a: &[i8], b: &[i8], c: &mut [i32]) -> Result<(), WorkerError> {
        self.exact.gemm_i8(m, n, k, a, b, c)
    }
}

lockstep_worker_api::export_worker!(RareFlip);
