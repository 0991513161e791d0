//! A plugin whose every product fails with a device error, as a GPU that was lost would.
use lockstep_worker_api::plugin::{Worker, WorkerError};
use lockstep_worker_api::{caps, status, CreateOptions};

struct Lost;

impl Worker for Lost {
    const NAME: &'static std::ffi::CStr = c"bad-error-status";
    const DESCRIPTION: &'static std::ffi::CStr = c"reports a lost device on every call (test fixture)";
    const CAPABILITIES: u64 = caps::REQUIRED;

    fn create(_: &CreateOptions) -> Result<Self, WorkerError> {
        Ok(Lost)
    }

    fn describe(&self) -> String {
        "test fixture".into()
    }

    fn gemm_f32(
        &mut self,
        _: usize,
        _: usize,
        _: usize,
        _: &[f32],
        _: &[f32],
        _: &mut [f32],
    ) -> Result<(), WorkerError> {
        Err(WorkerError::new(status::DEVICE_ERROR, "simulated device loss"))
    }

    fn gemm_i8(&mut self, _: usize, _: usize, _: usize, _: &[i8], _: &[i8], _: &mut [i32]) -> Result<(), WorkerError> {
        Err(WorkerError::new(status::DEVICE_ERROR, "simulated device loss"))
    }
}

lockstep_worker_api::export_worker!(Lost);
