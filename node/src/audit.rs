//! Audits of a step's ops: [`run_audited`] runs a sequence on a [`Device`] with one op (the live
//! audit) or every op (`lockstep bisect`, the admission at a run's shapes) recomputed by the
//! reference from copies of what it read, compared word for word. With a referee
//! ([`Auditing::referee`], the CPU mirror on every core) the products are recomputed by it
//! instead of the scalar reference's units (the same bits, at the mirror's speed): what checks a
//! backend at a run's own sizes.

use std::collections::BTreeMap;

use lockstep_luts::ops::{self, Handle, Op};

use crate::compute_error::{AuditFailure, AuditMismatch, ComputeError};
use crate::device::{op_error, Device};
use crate::gemm::Gemm;
use crate::host_device::{HostDevice, HostMemory};

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

/// Which ops of a sequence the reference recomputes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audit {
    /// The `n`-th of the ops the device computes itself (modulo their number): the live audit.
    One(usize),
    /// Every op the device computes itself, each checked before the next runs: the first op
    /// where a backend departs from the definition (`lockstep bisect`).
    Every,
}

/// Which ops an audit recomputes, and what recomputes the products.
pub struct Auditing<'a> {
    pub which: Audit,
    /// Recomputes the products (on host copies of their operands) where the scalar reference's
    /// units would be too slow; the element-wise ops are always the reference's.
    pub referee: Option<&'a mut dyn Gemm>,
}

impl Auditing<'_> {
    /// The ops `which` picks, the products by the scalar reference.
    pub fn by_reference(which: Audit) -> Auditing<'static> {
        Auditing { which, referee: None }
    }
}

/// What an audited sequence recomputed.
#[derive(Clone, Debug, PartialEq)]
pub struct Audited {
    /// The (last) op's position in the sequence and its name.
    pub index: usize,
    pub name: &'static str,
}

/// Runs `ops` on `device`; with `audit`, the op it picks (or every op the device computes
/// itself) is recomputed by the reference from copies of everything it touches, and every word
/// it wrote is compared. A difference fails the step, naming the op.
pub fn run_audited(
    device: &mut dyn Device,
    ops: &[Op],
    audit: Option<Auditing<'_>>,
    step: u32,
) -> Result<Option<Audited>, ComputeError> {
    let Some(Auditing { which, mut referee }) = audit else {
        device.run(ops)?;
        return Ok(None);
    };
    let auditable: Vec<usize> = (0..ops.len()).filter(|&i| device.computes(&ops[i])).collect();
    let picked: Vec<usize> = match which {
        Audit::One(t) if !auditable.is_empty() => vec![auditable[t % auditable.len()]],
        Audit::Every => auditable,
        Audit::One(_) => Vec::new(),
    };
    let Some(&last) = picked.last() else {
        device.run(ops)?;
        return Ok(None);
    };
    let mut next = 0;
    for &index in &picked {
        if next < index {
            device.run(&ops[next..index])?;
        }
        check_op(device, &ops[index], index, step, referee.as_deref_mut())?;
        next = index + 1;
    }
    device.run(&ops[next..])?;
    Ok(Some(Audited { index: last, name: ops[last].name() }))
}

/// Runs `op` (the `index`-th of its sequence) on `device` and compares every word it may have
/// written with the reference's, computed from copies of what it touched just before (a
/// product by `referee` when there is one).
fn check_op(
    device: &mut dyn Device,
    op: &Op,
    index: usize,
    step: u32,
    referee: Option<&mut (dyn Gemm + '_)>,
) -> Result<(), ComputeError> {
    let mut expected = snapshot(device, op)?;
    device.run(std::slice::from_ref(op))?;
    match referee {
        Some(gemm) => expected = on_referee(gemm, op, expected)?,
        None => ops::run_reference(op, &mut expected).map_err(op_error)?,
    }
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
    Ok(())
}

/// `op` recomputed by `referee` on copies of what it touched (`memory`): on the referee's own
/// executor when it has one (the CPU mirror runs every op on every core, the reference's bits),
/// else its products through host memory and the rest by the reference.
fn on_referee(
    referee: &mut (dyn Gemm + '_),
    op: &Op,
    mut memory: BTreeMap<Handle, Vec<u32>>,
) -> Result<BTreeMap<Handle, Vec<u32>>, ComputeError> {
    let Some(device) = referee.device() else {
        let mut memory = HostMemory::with_buffers(memory);
        HostDevice { memory: &mut memory, gemm: referee }.run(std::slice::from_ref(op))?;
        return Ok(memory.into_buffers());
    };
    let mut theirs = BTreeMap::new();
    let mut ran = || -> Result<(), ComputeError> {
        for (&buffer, words) in &memory {
            let copy = device.create_buffer(words.len())?;
            theirs.insert(buffer, copy);
            device.write(copy, 0, words)?;
        }
        device.run(std::slice::from_ref(&op.with_buffers(|h| theirs[&h])))?;
        for (buffer, words) in &mut memory {
            device.read(theirs[buffer], 0, words)?;
        }
        Ok(())
    };
    let result = ran();
    for copy in theirs.into_values() {
        device.free_buffer(copy);
    }
    result.map(|()| memory)
}
