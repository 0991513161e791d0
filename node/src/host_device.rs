//! [`HostDevice`]: a [`Device`] on host memory for backends that compute only the products
//! (ABI 1 plugins, the float reference): the element-wise ops by the reference itself, on the
//! buffers' own words, and every product through a [`Gemm`].

use std::collections::BTreeMap;

use lockstep_luts::ops::{self, Handle, Matmul, Op, OpError};
use lockstep_luts::words::f32s;

use crate::compute_error::ComputeError;
use crate::device::{op_error, Device};
use crate::gemm::Gemm;

/// Host memory for [`HostDevice`], kept from step to step.
#[derive(Default)]
pub struct HostMemory {
    buffers: BTreeMap<Handle, Vec<u32>>,
    next: Handle,
    /// Gathered operands of one product, reused.
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

impl HostMemory {
    /// Memory holding `buffers` (each handle's words), new handles past the largest.
    pub fn with_buffers(buffers: BTreeMap<Handle, Vec<u32>>) -> HostMemory {
        let next = buffers.keys().next_back().copied().unwrap_or(0);
        HostMemory { buffers, next, ..HostMemory::default() }
    }

    pub fn into_buffers(self) -> BTreeMap<Handle, Vec<u32>> {
        self.buffers
    }
}

/// Host memory plus a [`Gemm`] for the products.
pub struct HostDevice<'a> {
    pub memory: &'a mut HostMemory,
    pub gemm: &'a mut dyn Gemm,
}

impl HostDevice<'_> {
    fn matmul(&mut self, mm: &Matmul) -> Result<(), ComputeError> {
        let (m, n, k) = (mm.m as usize, mm.n as usize, mm.k as usize);
        let HostMemory { buffers, a, b, c, .. } = &mut *self.memory;
        fn gather(
            buffers: &BTreeMap<Handle, Vec<u32>>,
            out: &mut Vec<f32>,
            v: ops::MatView,
            rows: usize,
            k: usize,
            p: usize,
            q: usize,
        ) {
            let words = &buffers[&v.buffer];
            let (base, rs, cs) = (v.index(p, q, 0, 0), v.row_stride as usize, v.col_stride as usize);
            out.clear();
            out.resize(rows * k, 0.0);
            if cs == 1 {
                for (i, row) in out.chunks_exact_mut(k).enumerate() {
                    for (o, &w) in row.iter_mut().zip(&words[base + i * rs..][..k]) {
                        *o = f32::from_bits(w);
                    }
                }
            } else {
                // A transposed view: 8 × 8 blocks, so reads and writes both stay in cache lines.
                const T: usize = 8;
                for l0 in (0..k).step_by(T) {
                    for i0 in (0..rows).step_by(T) {
                        for l in l0..(l0 + T).min(k) {
                            let line = &words[base + l * cs..];
                            for i in i0..(i0 + T).min(rows) {
                                out[i * k + l] = f32::from_bits(line[i * rs]);
                            }
                        }
                    }
                }
            }
        }
        let bias: Option<Vec<f32>> =
            mm.bias.map(|s| buffers[&s.buffer][s.offset as usize..][..n].iter().map(|&w| f32::from_bits(w)).collect());
        for p in 0..mm.batch[0] as usize {
            for q in 0..mm.batch[1] as usize {
                c.clear();
                c.resize(m * n, 0.0);
                // A product that reads views in place (the float reference) skips the gathers.
                let view = |v: ops::MatView| {
                    (&f32s(&buffers[&v.buffer])[v.index(p, q, 0, 0)..], v.row_stride as usize, v.col_stride as usize)
                };
                match self.gemm.gemm_nt_strided(m, n, k, view(mm.a), view(mm.b), c) {
                    Some(result) => result?,
                    None => {
                        gather(buffers, a, mm.a, m, k, p, q);
                        gather(buffers, b, mm.b, n, k, p, q);
                        self.gemm.gemm_nt(m, n, k, a, b, c)?;
                    }
                }
                let out = buffers.get_mut(&mm.c.buffer).expect("checked");
                let (base, rs, cs) = (mm.c.index(p, q, 0, 0), mm.c.row_stride as usize, mm.c.col_stride as usize);
                for i in 0..m {
                    for j in 0..n {
                        let mut v = c[i * n + j];
                        if let Some(bias) = &bias {
                            v += bias[j];
                        }
                        let at = base + i * rs + j * cs;
                        out[at] = if mm.accumulate { f32::from_bits(out[at]) + v } else { v }.to_bits();
                    }
                }
            }
        }
        Ok(())
    }
}

impl Device for HostDevice<'_> {
    fn create_buffer(&mut self, words: usize) -> Result<Handle, ComputeError> {
        self.memory.next += 1;
        self.memory.buffers.insert(self.memory.next, vec![0; words]);
        Ok(self.memory.next)
    }

    fn free_buffer(&mut self, buffer: Handle) {
        self.memory.buffers.remove(&buffer);
    }

    fn write(&mut self, buffer: Handle, offset: usize, words: &[u32]) -> Result<(), ComputeError> {
        let target = self.memory.buffers.get_mut(&buffer).and_then(|b| b.get_mut(offset..offset + words.len()));
        target.ok_or_else(|| op_error(OpError::UnknownBuffer { op: "write", buffer }))?.copy_from_slice(words);
        Ok(())
    }

    fn read(&mut self, buffer: Handle, offset: usize, out: &mut [u32]) -> Result<(), ComputeError> {
        let source = self.memory.buffers.get(&buffer).and_then(|b| b.get(offset..offset + out.len()));
        out.copy_from_slice(source.ok_or_else(|| op_error(OpError::UnknownBuffer { op: "read", buffer }))?);
        Ok(())
    }

    fn run(&mut self, ops: &[Op]) -> Result<(), ComputeError> {
        for op in ops {
            match op {
                Op::Matmul(mm) => {
                    op.check(|b| self.memory.buffers.get(&b).map(|v| v.len() as u64)).map_err(op_error)?;
                    self.matmul(mm)?;
                }
                // The reference runs on the buffers' own words (no copies unless the op's
                // writes overlap its reads).
                _ => ops::run_reference(op, &mut self.memory.buffers).map_err(op_error)?,
            }
        }
        Ok(())
    }

    fn computes(&self, op: &Op) -> bool {
        matches!(op, Op::Matmul(_))
    }

    fn label(&self) -> String {
        self.gemm.label()
    }

    fn instance(&self) -> u64 {
        0
    }
}
