//! A plugin whose products go wrong after a warm-up, as a kernel chosen by autotuning after
//! some calls might: exact for its first [`WARMUP`] products of more than [`PROBE_OUTPUTS`]
//! outputs, then every such product has the lowest mantissa bit of output `len / 3` flipped —
//! the same output of the same product every time, so running the step again reproduces it.
//! The gate's battery and the admission at a run's shapes finish inside the warm-up and admit
//! it; the guard's probe product is smaller and never sees it; the audits name it, and the
//! dispute narrows it to the first product of the member's step (`docs/TRUST.md`, "Disputes").

use lockstep_faulty_plugins::ReferenceWorker;
use lockstep_worker_api::plugin::{Worker, WorkerError};
use lockstep_worker_api::{caps, CreateOptions};

/// Products at or below this many outputs are never touched (the guard's probe is 37 × 53).
const PROBE_OUTPUTS: usize = 2048;
/// Large products computed exactly before the wrong kernel takes over.
const WARMUP: u64 = 200;

struct AfterWarmup {
    exact: ReferenceWorker,
    large: u64,
}

impl Worker for AfterWarmup {
    const NAME: &'static std::ffi::CStr = c"flaw-after-warmup";
    const DESCRIPTION: &'static std::ffi::CStr =
        c"one bit of one output of every large product flipped after 200 of them (test fixture)";
    const CAPABILITIES: u64 = caps::REQUIRED;

    fn create(options: &CreateOptions) -> Result<Self, WorkerError> {
        Ok(AfterWarmup { exact: ReferenceWorker::create(options)?, large: 0 })
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
            if self.large > WARMUP {
                let i = c.len() / 3;
                c[i] = f32::from_bits(c[i].to_bits() ^ 1);
            }
        }
        Ok(())
    }

    fn gemm_i8(&mut self, m: usize, n: usize, k: usize, a: &[i8], b: &[i8], c: &mut [i32]) -> Result<(), WorkerError> {
        self.exact.gemm_i8(m, n, k, a, b, c)
    }
}

lockstep_worker_api::export_worker!(AfterWarmup);
