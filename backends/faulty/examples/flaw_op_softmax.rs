//! An ABI 2 plugin whose units are exact and whose ops follow the definition, except one: its
//! causal softmax takes the platform's `f32::exp` instead of the definition's `mathf::exp` — the
//! plausible slip of a port that "uses the standard library". The gate must reject it, naming
//! the op.
use std::collections::BTreeMap;

use lockstep_faulty_plugins::ReferenceWorker;
use lockstep_luts::ops::{self, run_reference, Op, Span};
use lockstep_worker_api::plugin::{Worker, WorkerError};
use lockstep_worker_api::{caps, status, CreateOptions};

struct SoftmaxWithLibm {
    buffers: BTreeMap<u64, Vec<u32>>,
    next: u64,
}

fn invalid(message: String) -> WorkerError {
    WorkerError::new(status::INVALID_ARGUMENT, message)
}

impl SoftmaxWithLibm {
    fn softmax(&mut self, blocks: u32, t: u32, scale: f32, scores: Span) -> Result<(), WorkerError> {
        let t = t as usize;
        let words = self.buffers.get_mut(&scores.buffer).ok_or_else(|| invalid("no buffer".into()))?;
        let start = scores.offset as usize;
        let block =
            words.get_mut(start..start + blocks as usize * t * t).ok_or_else(|| invalid("out of bounds".into()))?;
        for (r, row) in block.chunks_exact_mut(t).enumerate() {
            let i = r % t;
            let mut v: Vec<f32> = row[..=i].iter().map(|&w| f32::from_bits(w) * scale).collect();
            let max = v.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            for x in &mut v {
                *x = (*x - max).exp(); // the flaw: the platform's exp
            }
            let sum: f32 = v.iter().sum();
            for (j, w) in row.iter_mut().enumerate() {
                *w = if j <= i { (v[j] / sum).to_bits() } else { 0 };
            }
        }
        Ok(())
    }
}

impl Worker for SoftmaxWithLibm {
    const NAME: &'static std::ffi::CStr = c"flaw-op-softmax";
    const DESCRIPTION: &'static std::ffi::CStr = c"exact units, softmax through the platform's exp (test fixture)";
    const CAPABILITIES: u64 = caps::REQUIRED;
    const OPS: u64 = lockstep_worker_api::ops::ALL;

    fn create(_: &CreateOptions) -> Result<Self, WorkerError> {
        Ok(Self { buffers: BTreeMap::new(), next: 0 })
    }

    fn describe(&self) -> String {
        "test fixture".into()
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
        ReferenceWorker.gemm_f32(m, n, k, a, b, c)
    }

    fn gemm_i8(&mut self, m: usize, n: usize, k: usize, a: &[i8], b: &[i8], c: &mut [i32]) -> Result<(), WorkerError> {
        ReferenceWorker.gemm_i8(m, n, k, a, b, c)
    }

    fn buffer_create(&mut self, words: usize) -> Result<u64, WorkerError> {
        self.next += 1;
        self.buffers.insert(self.next, vec![0; words]);
        Ok(self.next)
    }

    fn buffer_free(&mut self, handle: u64) {
        self.buffers.remove(&handle);
    }

    fn buffer_write(&mut self, handle: u64, offset: usize, data: &[u32]) -> Result<(), WorkerError> {
        let b = self.buffers.get_mut(&handle).and_then(|b| b.get_mut(offset..offset + data.len()));
        b.ok_or_else(|| invalid(format!("buffer {handle}: out of bounds")))?.copy_from_slice(data);
        Ok(())
    }

    fn buffer_read(&mut self, handle: u64, offset: usize, out: &mut [u32]) -> Result<(), WorkerError> {
        let b = self.buffers.get(&handle).and_then(|b| b.get(offset..offset + out.len()));
        out.copy_from_slice(b.ok_or_else(|| invalid(format!("buffer {handle}: out of bounds")))?);
        Ok(())
    }

    fn run_ops(&mut self, ops: &[Op]) -> Result<(), WorkerError> {
        for op in ops {
            match *op {
                Op::CausalSoftmax(ops::CausalSoftmax { blocks, t, scale, scores }) => {
                    self.softmax(blocks, t, scale, scores)?
                }
                _ => run_reference(op, &mut self.buffers).map_err(|e| invalid(e.to_string()))?,
            }
        }
        Ok(())
    }
}

lockstep_worker_api::export_worker!(SoftmaxWithLibm);
