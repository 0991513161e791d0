//! A plugin that panics inside `gemm_f32`; the export macro must turn that into a status.
use lockstep_worker_api::plugin::{Worker, WorkerError};
use lockstep_worker_api::{caps, CreateOptions};

struct Panicky;

impl Worker for Panicky {
    const NAME: &'static std::ffi::CStr = c"bad-panics";
    const DESCRIPTION: &'static std::ffi::CStr = c"panics on every product (test fixture)";
    const CAPABILITIES: u64 = caps::REQUIRED;

    fn create(_: &CreateOptions) -> Result<Self, WorkerError> {
        Ok(Panicky)
    }

    fn describe(&self) -> String {
        "test fixture".into()
    }

    fn gemm_f32(
        &mut self,
        m: usize,
        _: usize,
        _: usize,
        _: &[f32],
        _: &[f32],
        _: &mut [f32],
    ) -> Result<(), WorkerError> {
        panic!("index out of bounds: the fixture panics on purpose (m = {m})")
    }

    fn gemm_i8(&mut self, _: usize, _: usize, _: usize, _: &[i8], _: &[i8], _: &mut [i32]) -> Result<(), WorkerError> {
        panic!("the fixture panics on purpose")
    }
}

lockstep_worker_api::export_worker!(Panicky);
