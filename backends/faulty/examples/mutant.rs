//! One mutant of the reference per process: the units and every op of the reference, with the
//! one departure `LOCKSTEP_MUTANT` names (`lockstep_faulty_plugins::mutants::MUTANTS`), or none
//! with `LOCKSTEP_MUTANT=none` (the harness's control, which the gate must admit). An unknown or
//! missing name refuses to create. `tests/e2e/mutants.rs` gates every mutant.
use std::collections::BTreeMap;

use lockstep_faulty_plugins::mutants::{self, Mutation};
use lockstep_faulty_plugins::{flawed_gemm, flawed_gemm_i8, ReferenceWorker};
use lockstep_luts::ops::{run_reference, Op};
use lockstep_worker_api::plugin::{Worker, WorkerError};
use lockstep_worker_api::{caps, status, CreateOptions};

struct Mutant {
    mutation: Option<Mutation>,
    buffers: BTreeMap<u64, Vec<u32>>,
    next: u64,
}

fn invalid(message: String) -> WorkerError {
    WorkerError::new(status::INVALID_ARGUMENT, message)
}

impl Worker for Mutant {
    const NAME: &'static std::ffi::CStr = c"mutant";
    const DESCRIPTION: &'static std::ffi::CStr =
        c"the reference with one mutation, named by LOCKSTEP_MUTANT (test fixture)";
    const CAPABILITIES: u64 = caps::REQUIRED;
    const OPS: u64 = lockstep_worker_api::ops::ALL;

    fn create(_: &CreateOptions) -> Result<Self, WorkerError> {
        let name = std::env::var("LOCKSTEP_MUTANT").unwrap_or_default();
        let mutation = match name.as_str() {
            "none" => None,
            other => Some(
                mutants::find(other)
                    .ok_or_else(|| invalid(format!("LOCKSTEP_MUTANT={other:?} names no mutant (or `none`)")))?
                    .mutation,
            ),
        };
        Ok(Self { mutation, buffers: BTreeMap::new(), next: 0 })
    }

    fn describe(&self) -> String {
        format!("mutant {:?} (test fixture)", self.mutation)
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
        match self.mutation {
            Some(Mutation::Units(flaw)) => {
                flawed_gemm(flaw, m, n, k, a, b, c).map_err(|e| WorkerError::new(status::NON_FINITE_INPUT, e))
            }
            _ => ReferenceWorker.gemm_f32(m, n, k, a, b, c),
        }
    }

    fn gemm_i8(&mut self, m: usize, n: usize, k: usize, a: &[i8], b: &[i8], c: &mut [i32]) -> Result<(), WorkerError> {
        match self.mutation {
            Some(Mutation::Units(flaw)) => {
                flawed_gemm_i8(flaw, m, n, k, a, b, c);
                Ok(())
            }
            _ => ReferenceWorker.gemm_i8(m, n, k, a, b, c),
        }
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
            op.check(|h| self.buffers.get(&h).map(|b| b.len() as u64)).map_err(|e| invalid(e.to_string()))?;
            let done = match (self.mutation, op) {
                (Some(Mutation::Units(flaw)), Op::Matmul(mm)) => mutants::run_matmul(flaw, mm, &mut self.buffers)
                    .map_err(|e| WorkerError::new(status::NON_FINITE_INPUT, e)),
                (Some(Mutation::Op(mutation)), _) => {
                    mutants::run_op(mutation, op, &mut self.buffers).map_err(|e| invalid(e.to_string()))
                }
                _ => run_reference(op, &mut self.buffers).map_err(|e| invalid(e.to_string())),
            };
            done?;
        }
        Ok(())
    }
}

lockstep_worker_api::export_worker!(Mutant);
