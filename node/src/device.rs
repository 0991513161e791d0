//! Where a training step's op sequence runs.
//!
//! A [`Device`] owns buffers of 32-bit words and runs [`Op`]s on them (`lockstep_luts::ops`,
//! the one definition). Two kinds exist:
//! - a backend's own executor (an ABI 2 plugin, adapted by the composition root and offered
//!   through [`Gemm::device`]): the whole sequence goes over in one call, the buffers stay in the
//!   backend from step to step;
//! - [`HostDevice`]: host memory, the element-wise ops by the reference itself and every product
//!   through a [`Gemm`] — what an ABI 1 plugin (products only) and the float reference trainer
//!   run on.
//!
//! [`run_audited`] runs a sequence with one op recomputed by the reference from copies of what it
//! read, compared word for word: the live audit.

use std::collections::BTreeMap;

use lockstep_luts::ops::{self, Handle, Matmul, Op, OpError};
use lockstep_luts::words::f32s;

use crate::gemm::{AuditFailure, AuditMismatch, ComputeError, Gemm};

/// Buffers and ops. Every call either completes or fails with a typed error; a failed op
/// leaves its outputs undefined and the step is abandoned.
pub trait Device {
    /// A new buffer of `words` 32-bit words (contents unspecified until written).
    fn create_buffer(&mut self, words: usize) -> Result<Handle, ComputeError>;
    fn free_buffer(&mut self, buffer: Handle);
    fn write(&mut self, buffer: Handle, offset: usize, words: &[u32]) -> Result<(), ComputeError>;
    fn read(&mut self, buffer: Handle, offset: usize, out: &mut [u32]) -> Result<(), ComputeError>;
    /// Runs `ops` in order.
    fn run(&mut self, ops: &[Op]) -> Result<(), ComputeError>;
    /// Which ops the backend computes itself (and an audit may check): all, for a backend's own
    /// executor; the products only, for [`HostDevice`].
    fn computes(&self, op: &Op) -> bool;
    fn label(&self) -> String;
    /// Tells instances apart (a hot-swap makes a new one): unique in the process.
    fn instance(&self) -> u64;
    /// Whether the backend computes on an accelerator (its buffers are device memory).
    fn accelerator(&self) -> bool {
        false
    }
    /// The backend's own one-line description now (for a GPU: the adapter and the device
    /// memory it holds), for reports.
    fn describe_now(&mut self) -> String {
        self.label()
    }
}

/// A fresh value for [`Device::instance`].
pub fn new_instance_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A device's failure to run an op the way the definition allows (an out-of-bounds view, a
/// token past the vocabulary, a non-finite operand of the units).
#[derive(Debug)]
pub struct OpFailed(pub OpError);

impl std::fmt::Display for OpFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for OpFailed {}

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

/// Host memory plus a [`Gemm`] for the products.
pub struct HostDevice<'a> {
    pub memory: &'a mut HostMemory,
    pub gemm: &'a mut dyn Gemm,
}

fn op_error(e: OpError) -> ComputeError {
    ComputeError::backend(OpFailed(e))
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

/// Copies of the buffers an op touches, as the reference's memory.
fn snapshot(device: &mut dyn Device, op: &Op) -> Result<BTreeMap<Handle, Vec<u32>>, ComputeError> {
    let mut copies = BTreeMap::new();
    for (buffer, end) in op.extents() {
        let mut words = vec![0u32; end as usize];
        device.read(buffer, 0, &mut words)?;
        copies.insert(buffer, words);
    }
    Ok(copies)
}

/// What an audited sequence recomputed.
#[derive(Clone, Debug, PartialEq)]
pub struct Audited {
    /// The op's position in the sequence and its name.
    pub index: usize,
    pub name: &'static str,
}

/// Runs `ops` on `device`; when `target` is given, the `target`-th op (counting only ops the
/// device computes itself, modulo their number) is recomputed by the reference from copies of
/// everything it touches, and every word it wrote is compared. A difference fails the step.
pub fn run_audited(
    device: &mut dyn Device,
    ops: &[Op],
    target: Option<usize>,
    step: u32,
) -> Result<Option<Audited>, ComputeError> {
    let index = target.and_then(|t| {
        let auditable: Vec<usize> = (0..ops.len()).filter(|&i| device.computes(&ops[i])).collect();
        (!auditable.is_empty()).then(|| auditable[t % auditable.len()])
    });
    let Some(index) = index else {
        device.run(ops)?;
        return Ok(None);
    };
    let op = &ops[index];
    device.run(&ops[..index])?;
    let mut expected = snapshot(device, op)?;
    device.run(std::slice::from_ref(op))?;
    ops::run_reference(op, &mut expected).map_err(op_error)?;
    let actual = snapshot(device, op)?;
    for (buffer, want) in &expected {
        let got = &actual[buffer];
        let mut differing = want.iter().zip(got).enumerate().filter(|(_, (x, y))| x != y);
        if let Some((at, (&x, &y))) = differing.next() {
            let mismatch = AuditMismatch {
                call: index,
                op: op.name(),
                buffer: *buffer,
                index: at,
                expected_bits: x,
                actual_bits: y,
                differing: 1 + differing.count(),
            };
            return Err(ComputeError::Audit(AuditFailure { step, mismatch, backend: device.label() }));
        }
    }
    device.run(&ops[index + 1..])?;
    Ok(Some(Audited { index, name: op.name() }))
}
