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

/// The nice value of the threads that audit other members' contributions: the lowest priority,
/// so an audit takes only cycles the member's own step leaves (`docs/TRUST.md`).
pub const AUDIT_NICE: i32 = 19;

/// How a recomputation of another member's work is scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Urgency {
    /// A routine audit: on spare cycles only ([`yield_to_training`]).
    Routine,
    /// The leader's check of an accusation, or a dispute's run: at the member's own priority —
    /// a wrong contribution may be summed meanwhile, and accusations are rare (a false one
    /// convicts its accuser at the first).
    Check,
}

/// Lowers the calling thread to [`AUDIT_NICE`] (Linux keeps a nice value per thread, and the
/// threads it starts inherit it: a referee opened here computes on low-priority threads too).
/// Elsewhere, or where the call is refused, the thread keeps its priority.
pub fn yield_to_training() {
    #[cfg(target_os = "linux")]
    // SAFETY: `setpriority` reads no memory of ours; `who = 0` names the calling thread.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, AUDIT_NICE);
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

/// Words an op's trace hashes at a time. An op's digest is the digest of its chunks' digests, so
/// a dispute narrows a departure to one chunk, then one word, without sending the op's output.
pub const TRACE_CHUNK_WORDS: usize = 4096;

pub use crate::wire::Trace;

/// What [`trace_ops`] records.
#[derive(Clone, Debug, PartialEq)]
pub enum Tracing {
    /// Every op's chunk digests.
    Whole,
    /// Compared with another's trace op by op: the first op whose chunks differ, and this
    /// side's words of the first chunk that differs.
    Against(std::sync::Arc<Trace>),
    /// Compared with another's trace op by op, as `Against`, recording this side's trace as it
    /// goes: what a disputed member answers the leader's trace with ([`Traced::Answer`]).
    Answer(std::sync::Arc<Trace>),
}

/// What [`trace_ops`] found.
#[derive(Clone, Debug, PartialEq)]
pub enum Traced {
    Whole(Trace),
    /// Every op agrees with the other trace.
    Agrees,
    /// The other trace is not of this sequence: it has `theirs` ops, this one `ours`.
    Unlike {
        ours: usize,
        theirs: usize,
    },
    Departs(Departure),
    /// This side's trace up to and with the first op that parts from the other (every op where
    /// none does), and that op's first parting chunk and its words.
    Answer {
        trace: Trace,
        words: Option<(usize, usize, Vec<u32>)>,
    },
}

/// Words of one buffer, in a row: (buffer, first word, words).
pub type Stretch = (Handle, u64, u64);

/// The first op where two traces of one step part.
#[derive(Clone, Debug, PartialEq)]
pub struct Departure {
    pub op: usize,
    pub name: &'static str,
    /// The op's code (`lockstep_luts::ops::OPS`).
    pub code: u32,
    /// The first chunk of the op's written words whose digests differ.
    pub chunk: usize,
    /// This side's words of that chunk.
    pub words: Vec<u32>,
    /// Where the chunk's words lie: runs of (buffer, first word, words), in order.
    pub places: Vec<Stretch>,
}

impl Departure {
    /// Where word `i` of the chunk lies: its buffer and its index there.
    pub fn place(&self, i: usize) -> Option<(Handle, u64)> {
        let mut skip = i as u64;
        for &(buffer, start, len) in &self.places {
            if skip < len {
                return Some((buffer, start + skip));
            }
            skip -= len;
        }
        None
    }
}

/// The words `op` wrote, its written ranges concatenated, and the ranges (buffer, start, words).
fn written(device: &mut dyn Device, op: &Op) -> Result<(Vec<u32>, Vec<Stretch>), ComputeError> {
    let (mut words, mut ranges) = (Vec::new(), Vec::new());
    for access in op.accesses().into_iter().filter(|a| a.writes() && !a.is_empty()) {
        let len = (access.end - access.start) as usize;
        let at = words.len();
        words.resize(at + len, 0);
        device.read(access.buffer, access.start as usize, &mut words[at..])?;
        ranges.push((access.buffer, access.start, len as u64));
    }
    Ok((words, ranges))
}

/// The runs of `ranges` (concatenated) that chunk `chunk` covers.
fn places_of(ranges: &[Stretch], chunk: usize) -> Vec<Stretch> {
    let (from, to) = ((chunk * TRACE_CHUNK_WORDS) as u64, ((chunk + 1) * TRACE_CHUNK_WORDS) as u64);
    let (mut at, mut places) = (0u64, Vec::new());
    for &(buffer, start, len) in ranges {
        let (lo, hi) = (from.max(at), to.min(at + len));
        if lo < hi {
            places.push((buffer, start + lo - at, hi - lo));
        }
        at += len;
    }
    places
}

fn chunk_words(words: &[u32], chunk: usize) -> &[u32] {
    let from = (chunk * TRACE_CHUNK_WORDS).min(words.len());
    &words[from..(from + TRACE_CHUNK_WORDS).min(words.len())]
}

/// Runs `ops` on `device` and records what `tracing` asks of the words each op wrote: what two
/// members compare when one's contribution is disputed (the network form of
/// [`Audit::Every`], which compares with the reference in one process).
pub fn trace_ops(device: &mut dyn Device, ops: &[Op], tracing: &Tracing) -> Result<Traced, ComputeError> {
    let mut trace = Trace::default();
    for (i, op) in ops.iter().enumerate() {
        device.run(std::slice::from_ref(op))?;
        let (words, ranges) = written(device, op)?;
        let chunks: Vec<u64> = words.chunks(TRACE_CHUNK_WORDS).map(crate::wire::words_digest).collect();
        if let Tracing::Answer(theirs) = tracing {
            let parted = theirs.ops.get(i).filter(|their| **their != chunks).map(|their| {
                chunks.iter().zip(their).position(|(a, b)| a != b).unwrap_or(chunks.len().min(their.len()))
            });
            trace.ops.push(chunks);
            if let Some(chunk) = parted {
                return Ok(Traced::Answer { trace, words: Some((i, chunk, chunk_words(&words, chunk).to_vec())) });
            }
            continue;
        }
        if let Tracing::Against(theirs) = tracing {
            let Some(their) = theirs.ops.get(i) else {
                return Ok(Traced::Unlike { ours: ops.len(), theirs: theirs.ops.len() });
            };
            if *their != chunks {
                let chunk = chunks.iter().zip(their).position(|(a, b)| a != b).unwrap_or(chunks.len().min(their.len()));
                let words = chunk_words(&words, chunk).to_vec();
                let places = places_of(&ranges, chunk);
                let (name, code) = (op.name(), op.code());
                return Ok(Traced::Departs(Departure { op: i, name, code, chunk, words, places }));
            }
            continue;
        }
        trace.ops.push(chunks);
    }
    Ok(match tracing {
        Tracing::Answer(_) => Traced::Answer { trace, words: None },
        Tracing::Against(theirs) if theirs.ops.len() == ops.len() => Traced::Agrees,
        Tracing::Against(theirs) => Traced::Unlike { ours: ops.len(), theirs: theirs.ops.len() },
        _ => Traced::Whole(trace),
    })
}

#[cfg(test)]
mod tests {
    /// The calling thread's nice value.
    #[cfg(target_os = "linux")]
    fn nice() -> i32 {
        // SAFETY: `getpriority` reads no memory of ours; `who = 0` names the calling thread.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
    }

    /// An audit thread runs at the lowest priority, and so do the threads it starts (a
    /// referee's pool opened there); the thread that started it keeps its own.
    #[cfg(target_os = "linux")]
    #[test]
    fn an_audit_thread_and_the_threads_it_starts_yield_to_training() {
        let before = nice();
        let (audit, started) = std::thread::spawn(|| {
            super::yield_to_training();
            (nice(), std::thread::spawn(nice).join().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!((audit, started), (super::AUDIT_NICE, super::AUDIT_NICE));
        assert_eq!(nice(), before, "the caller's priority is its own");
        assert!(before < super::AUDIT_NICE);
    }
}
