//! The CPU mirror plugin: the verified INT8 units on the host's cores, bit-identical to
//! `lockstep_luts::gemm_nt`.
//!
//! Two paths share one quantizer ([`quantize`]) and one blocking scheme:
//! - [`avx2`], chosen at run time when the CPU has AVX2 and FMA: the quantized operands are
//!   widened to i16 pairs and multiplied with `vpmaddwd` (exact for every i8, so -128 needs no
//!   care), accumulated in i32 per block, and the block terms summed with one FMA each. The FMA
//!   is exact because a term `acc · 2^s` is representable: tiles whose scale exponents could
//!   make a term subnormal or infinite are sent to the portable path instead.
//! - [`portable`]: native integer multiply and the reference epilogue, any tile, any CPU.
//!
//! Every output element is computed by exactly one thread in one fixed order, so the thread
//! count never changes a bit.

use std::ffi::CStr;

use lockstep_worker_api::plugin::{Worker, WorkerError};
use lockstep_worker_api::{caps, status, CreateOptions};

mod gemm;
mod ops;
mod portable;
use lockstep_quantize as quantize;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use gemm::{gemm_f32, Path, Scratch, PATH_ENV};

/// The plugin instance.
pub struct CpuWorker {
    threads: usize,
    /// Worker threads, kept for the instance's life (spawning per call cost more than small
    /// products take); `None` for one thread.
    pool: Option<rayon::ThreadPool>,
    path: Path,
    scratch: Scratch,
    /// ABI 2: this instance's buffers.
    buffers: ops::Buffers,
}

impl Worker for CpuWorker {
    const NAME: &'static CStr = c"cpu";
    const DESCRIPTION: &'static CStr = c"CPU mirror of the verified INT8 units (AVX2 when available, else portable)";
    const CAPABILITIES: u64 = caps::REQUIRED;

    fn create(options: &CreateOptions) -> Result<Self, WorkerError> {
        lockstep_worker_api::plugin::check_create_flags(options)?;
        let threads = match options.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n as usize,
        };
        let pool = if threads > 1 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("lockstep-cpu-{i}"))
                .build()
                .map_err(|e| WorkerError::new(status::INTERNAL, format!("cannot start {threads} threads: {e}")))?;
            Some(pool)
        } else {
            None
        };
        let path = Path::chosen().map_err(|why| WorkerError::new(status::INVALID_ARGUMENT, why))?;
        Ok(Self { threads, pool, path, scratch: Scratch::default(), buffers: ops::Buffers::default() })
    }

    fn describe(&self) -> String {
        format!("{} path, element-wise {}, {} thread(s)", self.path.name(), ops::widest_name(), self.threads)
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
        gemm_f32(self.path, self.pool.as_ref(), &mut self.scratch, m, n, k, a, b, c).map_err(|error| {
            let code = match error {
                lockstep_luts::UnitError::NonFinite { .. } => status::NON_FINITE_INPUT,
                lockstep_luts::UnitError::Shape { .. } => status::INVALID_ARGUMENT,
            };
            WorkerError::new(code, error.to_string())
        })
    }

    fn gemm_i8(&mut self, m: usize, n: usize, k: usize, a: &[i8], b: &[i8], c: &mut [i32]) -> Result<(), WorkerError> {
        portable::gemm_i8(m, n, k, a, b, c);
        Ok(())
    }

    const OPS: u64 = lockstep_worker_api::ops::ALL;

    fn buffer_create(&mut self, words: usize) -> Result<u64, WorkerError> {
        Ok(self.buffers.create(words))
    }

    fn buffer_free(&mut self, handle: u64) {
        self.buffers.free(handle);
    }

    fn buffer_write(&mut self, handle: u64, offset: usize, data: &[u32]) -> Result<(), WorkerError> {
        self.buffers.write(handle, offset, data)
    }

    fn buffer_read(&mut self, handle: u64, offset: usize, out: &mut [u32]) -> Result<(), WorkerError> {
        self.buffers.read(handle, offset, out)
    }

    /// The whole sequence runs inside the pool, on one of its threads: each op's parallel parts
    /// are then joined from a worker, which takes part in them, instead of from the caller's
    /// thread, which would wake the workers and sleep once per op.
    fn run_ops(&mut self, ops: &[lockstep_luts::ops::Op]) -> Result<(), WorkerError> {
        let Self { buffers, pool, path, .. } = self;
        match pool {
            Some(pool) => pool.install(|| buffers.run(*path, Some(pool), ops)),
            None => buffers.run(*path, None, ops),
        }
    }
}

lockstep_worker_api::export_worker!(CpuWorker);
