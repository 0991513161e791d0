//! ABI 2 on the CPU: buffers in this instance's memory and the step's ops on them.
//!
//! Products go to the units kernels ([`gemm_f32`]); a view that is not row-major is gathered
//! into a reused scratch first (the kernel quantizes rows along `k`). Batched products (the
//! attention heads) run one batch per thread, each single-threaded, so a batch's bits never
//! depend on the thread count. Element-wise ops call `lockstep_luts::ops`' slice kernels — the
//! definition itself — on ranges of rows (or, for the column reductions, of columns), one
//! range per thread: every output is computed by one thread in the definition's order.
//!
//! An op whose outputs overlap its inputs in a way the fast paths do not handle runs on
//! `lockstep_luts::ops::run_reference` instead (same bits, slower); the training step never
//! does that.

use std::collections::BTreeMap;
use std::ops::Range;

use lockstep_luts::ops::{self as def, Handle, MatView, Matmul, Op, OpError, Span};
use lockstep_worker_api::plugin::WorkerError;
use lockstep_worker_api::status;

use crate::gemm::{gemm_f32, Path, Scratch};

/// Buffers and reused scratch of one instance.
#[derive(Default)]
pub struct Buffers {
    map: BTreeMap<Handle, Vec<u32>>,
    next: Handle,
    /// Per thread: gathered operands, product output, the kernel's scratch.
    lanes: Vec<Lane>,
}

#[derive(Default)]
struct Lane {
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    scratch: Scratch,
}

fn error(e: OpError) -> WorkerError {
    let code = match e {
        OpError::Unit(lockstep_luts::UnitError::NonFinite { .. }) => status::NON_FINITE_INPUT,
        _ => status::INVALID_ARGUMENT,
    };
    WorkerError::new(code, e.to_string())
}

/// A buffer's words as a raw pointer, for the disjoint writes of one op's threads.
#[derive(Clone, Copy)]
struct Raw(*mut u32, usize);

// SAFETY: an op's threads write disjoint ranges (one output element, one thread) and finish
// before the op returns; reads are of ranges no thread of the op writes (ops whose writes
// overlap another of their ranges, `Op::writes_overlap`, take the reference instead).
unsafe impl Send for Raw {}
// SAFETY: as above.
unsafe impl Sync for Raw {}

impl Raw {
    /// `len` words at `offset` as f32.
    ///
    /// # Safety
    /// In bounds (the op was checked), and no live `&mut` to these words on another thread.
    unsafe fn f32s<'a>(self, offset: usize, len: usize) -> &'a [f32] {
        assert!(offset + len <= self.1);
        // SAFETY: in bounds (asserted); f32 and u32 have one layout.
        unsafe { std::slice::from_raw_parts(self.0.add(offset).cast::<f32>(), len) }
    }

    /// # Safety
    /// In bounds, and these words are this caller's alone while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn f32s_mut<'a>(self, offset: usize, len: usize) -> &'a mut [f32] {
        assert!(offset + len <= self.1);
        // SAFETY: as above, exclusive by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(offset).cast::<f32>(), len) }
    }

    /// # Safety
    /// As [`Raw::f32s`].
    unsafe fn u32s<'a>(self, offset: usize, len: usize) -> &'a [u32] {
        assert!(offset + len <= self.1);
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(self.0.add(offset), len) }
    }
}

/// Which compilation of an element-wise kernel runs: the same Rust source built for the widest
/// vectors the CPU has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tier {
    /// AVX-512 (F and BW): sixteen lanes where the kernel's loops allow.
    Avx512,
    /// AVX2: eight lanes.
    Avx2,
    Portable,
}

impl Tier {
    /// Every tier this CPU runs, widest first.
    fn available() -> Vec<Tier> {
        let mut tiers = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx2") {
                tiers.push(Tier::Avx512);
            }
            if has!("avx2") {
                tiers.push(Tier::Avx2);
            }
        }
        tiers.push(Tier::Portable);
        tiers
    }

    /// The widest tier the CPU has, at most the one [`crate::PATH_ENV`]'s path implies.
    fn widest() -> Tier {
        static WIDEST: std::sync::OnceLock<Tier> = std::sync::OnceLock::new();
        *WIDEST.get_or_init(|| Tier::capped(std::env::var(crate::PATH_ENV).ok().as_deref()))
    }

    /// The widest tier the CPU has at most as wide as the one path `path` implies.
    fn capped(path: Option<&str>) -> Tier {
        let cap = match path {
            Some("portable") => Tier::Portable,
            Some("avx2" | "avx-vnni") => Tier::Avx2,
            _ => Tier::Avx512,
        };
        Tier::available().into_iter().find(|&t| t.rank() <= cap.rank()).unwrap_or(Tier::Portable)
    }

    /// Wider tiers rank higher.
    fn rank(self) -> u8 {
        match self {
            Tier::Avx512 => 2,
            Tier::Avx2 => 1,
            Tier::Portable => 0,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Tier::Avx512 => "avx512",
            Tier::Avx2 => "avx2",
            Tier::Portable => "portable",
        }
    }
}

/// The element-wise ops' tier, by name (the plugin's description says it).
pub fn widest_name() -> &'static str {
    Tier::widest().name()
}

/// `$name(args)` runs `$kernel(args)` compiled for the widest [`Tier`] the CPU has (`$name::on`
/// runs a chosen one): the kernel (inlined into each wrapper) then runs eight or sixteen lanes
/// wide where its loops allow. The same IEEE operations in the same order on every tier — Rust
/// never contracts into FMAs and never reorders a float reduction — so the bits do not depend
/// on the instruction set (a test runs every tier against the reference).
macro_rules! simd_dispatch {
    ($(fn $name:ident => $kernel:path, ($($arg:ident: $ty:ty),*);)*) => {$(
        #[allow(clippy::too_many_arguments)]
        fn $name($($arg: $ty),*) {
            $name::on(Tier::widest(), $($arg),*)
        }

        mod $name {
            use super::*;

            #[allow(clippy::too_many_arguments)]
            pub(super) fn on(tier: Tier, $($arg: $ty),*) {
                #[cfg(target_arch = "x86_64")]
                match tier {
                    // SAFETY: `Tier::available` offers a tier only where the CPU has its
                    // features, and callers pass one of those.
                    Tier::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    Tier::Avx2 => return unsafe { avx2($($arg),*) },
                    Tier::Portable => {}
                }
                let _ = tier;
                $kernel($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn avx2($($arg: $ty),*) {
                $kernel($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx2")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn avx512($($arg: $ty),*) {
                $kernel($($arg),*)
            }
        }
    )*};
}

simd_dispatch! {
    fn layer_norm_rows => def::layer_norm_rows, (width: usize, x: &[f32], gain: &[f32], bias: &[f32], y: &mut [f32], xhat: &mut [f32], rstd: &mut [f32]);
    fn layer_norm_backward_rows => def::layer_norm_backward_rows, (width: usize, dy: &[f32], xhat: &[f32], rstd: &[f32], gain: &[f32], dx: &mut [f32], accumulate: bool);
    fn layer_norm_param_grads => def::layer_norm_param_grads, (width: usize, rows: usize, cols: Range<usize>, dy: &[f32], xhat: &[f32], dgain: &mut [f32], dbias: &mut [f32]);
    fn bias_grad_cols => def::bias_grad_cols, (width: usize, rows: usize, cols: Range<usize>, dy: &[f32], db: &mut [f32]);
    fn embed_backward_cols => def::embed_backward_cols, (width: usize, seq: usize, cols: Range<usize>, tokens: &[u32], dy: &[f32], dtok: &mut [f32], dpos: &mut [f32]);
    fn gelu_into => def::gelu_into, (x: &[f32], y: &mut [f32]);
    fn gelu_backward_into => def::gelu_backward_into, (dy: &[f32], x: &[f32], dx: &mut [f32]);
    fn causal_softmax_rows => def::causal_softmax_rows, (t: usize, first_row: usize, scale: f32, scores: &mut [f32]);
    fn causal_softmax_backward_rows => def::causal_softmax_backward_rows, (t: usize, first_row: usize, scale: f32, probs: &[f32], dprobs: &[f32], dscores: &mut [f32]);
    fn cross_entropy_rows => def::cross_entropy_rows, (vocab: usize, logits: &[f32], targets: &[u32], inv_rows: f32, dlogits: &mut [f32], losses: &mut [f32]);
    fn adam_into => def::adam_into, (weights: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], lr: f32, correction1: f32, correction2: f32);
}

/// Runs `f` over `parts` contiguous ranges of `0..items` on the pool (or here).
fn split(pool: Option<&rayon::ThreadPool>, items: usize, min_per_part: usize, f: impl Fn(Range<usize>) + Sync) {
    let threads = pool.map_or(1, |p| p.current_num_threads());
    let parts = threads.min(items / min_per_part.max(1)).max(1);
    match pool {
        Some(pool) if parts > 1 => {
            let per = items.div_ceil(parts);
            pool.scope(|scope| {
                // `per · parts` may pass `items`: the last parts can be empty, and are skipped.
                for start in (0..items).step_by(per) {
                    let f = &f;
                    scope.spawn(move |_| f(start..(start + per).min(items)));
                }
            });
        }
        _ if items > 0 => f(0..items),
        _ => {}
    }
}

impl Buffers {
    pub fn create(&mut self, words: usize) -> u64 {
        self.next += 1;
        self.map.insert(self.next, vec![0; words]);
        self.next
    }

    pub fn free(&mut self, handle: u64) {
        self.map.remove(&handle);
    }

    fn get(&mut self, handle: u64, range: Range<usize>) -> Result<&mut [u32], WorkerError> {
        let len = self.map.get(&handle).map(Vec::len);
        self.map.get_mut(&handle).and_then(|b| b.get_mut(range.clone())).ok_or_else(|| {
            WorkerError::new(
                status::INVALID_ARGUMENT,
                match len {
                    None => format!("no buffer {handle}"),
                    Some(len) => format!("words {range:?} are outside buffer {handle} of {len}"),
                },
            )
        })
    }

    pub fn write(&mut self, handle: u64, offset: usize, data: &[u32]) -> Result<(), WorkerError> {
        self.get(handle, offset..offset + data.len())?.copy_from_slice(data);
        Ok(())
    }

    pub fn read(&mut self, handle: u64, offset: usize, out: &mut [u32]) -> Result<(), WorkerError> {
        out.copy_from_slice(self.get(handle, offset..offset + out.len())?);
        Ok(())
    }

    fn raw(&mut self, handle: Handle) -> Raw {
        let b = self.map.get_mut(&handle).expect("checked");
        Raw(b.as_mut_ptr(), b.len())
    }

    /// Runs ops in order.
    pub fn run(&mut self, path: Path, pool: Option<&rayon::ThreadPool>, ops: &[Op]) -> Result<(), WorkerError> {
        let threads = pool.map_or(1, |p| p.current_num_threads());
        if self.lanes.len() < threads {
            self.lanes.resize_with(threads, Lane::default);
        }
        for (i, op) in ops.iter().enumerate() {
            let numbered = |e: WorkerError| WorkerError { message: format!("op #{i}: {}", e.message), ..e };
            op.check(|b| self.map.get(&b).map(|v| v.len() as u64)).map_err(|e| numbered(error(e)))?;
            if op.writes_overlap() {
                def::run_reference(op, &mut self.map).map_err(|e| numbered(error(e)))?;
            } else {
                self.run_one(path, pool, op).map_err(numbered)?;
            }
        }
        Ok(())
    }

    fn run_one(&mut self, path: Path, pool: Option<&rayon::ThreadPool>, op: &Op) -> Result<(), WorkerError> {
        let name = op.name();
        // Raw pointers for the spans: checked in bounds, and outputs overlap no input.
        let sp = |me: &mut Self, s: Span| (me.raw(s.buffer), s.offset as usize);
        match *op {
            Op::Matmul(mm) => self.matmul(path, pool, &mm).map_err(error)?,
            Op::Embed(def::Embed { rows, seq, width, vocab, tokens, tok, pos, out }) => {
                let (rows, seq, width) = (rows as usize, seq as usize, width as usize);
                let ((tr, to), (kr, ko), (pr, po), (or, oo)) =
                    (sp(self, tokens), sp(self, tok), sp(self, pos), sp(self, out));
                // SAFETY: checked in bounds; `out` overlaps no input.
                let ids = unsafe { tr.u32s(to, rows) };
                def::check_tokens(name, ids, vocab).map_err(error)?;
                // SAFETY: the op was checked (every span in bounds) and no output overlaps an input; each thread touches only its own part of the outputs.
                let (table, pos) = unsafe { (kr.f32s(ko, vocab as usize * width), pr.f32s(po, seq * width)) };
                split(pool, rows, 64, |r| {
                    // SAFETY: rows `r` of `out` belong to this thread.
                    let out = unsafe { or.f32s_mut(oo + r.start * width, r.len() * width) };
                    def::embed_rows(width, &ids[r.clone()], r.start, seq, table, pos, out);
                });
            }
            Op::EmbedBackward(def::EmbedBackward { rows, seq, width, vocab, positions, tokens, dy, dtok, dpos }) => {
                let (rows, seq, width) = (rows as usize, seq as usize, width as usize);
                let ((tr, to), (dr, dof), (ar, ao), (br, bo)) =
                    (sp(self, tokens), sp(self, dy), sp(self, dtok), sp(self, dpos));
                // SAFETY: checked in bounds; outputs overlap no input.
                let ids = unsafe { tr.u32s(to, rows) };
                def::check_tokens(name, ids, vocab).map_err(error)?;
                // SAFETY: the op was checked (every span in bounds) and no output overlaps an input; each thread touches only its own part of the outputs.
                let dyv = unsafe { dr.f32s(dof, rows * width) };
                // Columns split across threads; each thread forms its columns' lane sums in
                // tables of its own (written out once: rows of two threads' columns share
                // cache lines of the output).
                let (vocab, positions) = (vocab as usize, positions as usize);
                split(pool, width, 16, |cols| {
                    let n = cols.len();
                    let (mut dt, mut dp) = (vec![0.0f32; vocab * n], vec![0.0f32; positions * n]);
                    embed_backward_cols(width, seq, cols.clone(), ids, dyv, &mut dt, &mut dp);
                    for (v, row) in dt.chunks_exact(n).enumerate() {
                        // SAFETY: columns `cols` of both tables belong to this thread; in bounds
                        // (checked).
                        unsafe { ar.f32s_mut(ao + v * width + cols.start, n).copy_from_slice(row) };
                    }
                    for (p, row) in dp.chunks_exact(n).enumerate() {
                        // SAFETY: as above.
                        unsafe { br.f32s_mut(bo + p * width + cols.start, n).copy_from_slice(row) };
                    }
                });
            }
            Op::LayerNorm(def::LayerNorm { rows, width, x, gain, bias, y, xhat, rstd }) => {
                let (rows, w) = (rows as usize, width as usize);
                let (xs, gs, bs, ys, hs, ss) =
                    (sp(self, x), sp(self, gain), sp(self, bias), sp(self, y), sp(self, xhat), sp(self, rstd));
                // SAFETY: checked; each thread writes its rows of the three outputs.
                let (g, b) = unsafe { (gs.0.f32s(gs.1, w), bs.0.f32s(bs.1, w)) };
                // SAFETY: the op was checked (every span in bounds) and no output overlaps an input; each thread touches only its own part of the outputs.
                split(pool, rows, 16, |r| unsafe {
                    layer_norm_rows(
                        w,
                        xs.0.f32s(xs.1 + r.start * w, r.len() * w),
                        g,
                        b,
                        ys.0.f32s_mut(ys.1 + r.start * w, r.len() * w),
                        hs.0.f32s_mut(hs.1 + r.start * w, r.len() * w),
                        ss.0.f32s_mut(ss.1 + r.start, r.len()),
                    )
                });
            }
            Op::LayerNormBackward(def::LayerNormBackward {
                rows,
                width,
                dy,
                xhat,
                rstd,
                gain,
                dx,
                dgain,
                dbias,
                accumulate,
            }) => {
                let (rows, w) = (rows as usize, width as usize);
                let (ds, hs, ss, gs, xs, dgs, dbs) = (
                    sp(self, dy),
                    sp(self, xhat),
                    sp(self, rstd),
                    sp(self, gain),
                    sp(self, dx),
                    sp(self, dgain),
                    sp(self, dbias),
                );
                // SAFETY: checked; rows of dx, then columns of dgain/dbias, per thread.
                let (dyv, hv, g) =
                    unsafe { (ds.0.f32s(ds.1, rows * w), hs.0.f32s(hs.1, rows * w), gs.0.f32s(gs.1, w)) };
                // SAFETY: the op was checked (every span in bounds) and no output overlaps an input; each thread touches only its own part of the outputs.
                split(pool, rows, 16, |r| unsafe {
                    layer_norm_backward_rows(
                        w,
                        &dyv[r.start * w..r.end * w],
                        &hv[r.start * w..r.end * w],
                        ss.0.f32s(ss.1 + r.start, r.len()),
                        g,
                        xs.0.f32s_mut(xs.1 + r.start * w, r.len() * w),
                        accumulate,
                    )
                });
                // Each thread sums into arrays of its own and writes them once: columns of two
                // threads may share a cache line of the output, which rows of updates would
                // bounce between cores.
                split(pool, w, 16, |cols| {
                    let (mut g, mut b) = (vec![0.0f32; cols.len()], vec![0.0f32; cols.len()]);
                    layer_norm_param_grads(w, rows, cols.clone(), dyv, hv, &mut g, &mut b);
                    // SAFETY: columns `cols` of both outputs belong to this thread.
                    unsafe {
                        dgs.0.f32s_mut(dgs.1 + cols.start, cols.len()).copy_from_slice(&g);
                        dbs.0.f32s_mut(dbs.1 + cols.start, cols.len()).copy_from_slice(&b);
                    }
                });
            }
            Op::Gelu(def::Gelu { len, x, y }) => {
                let (xs, ys) = (sp(self, x), sp(self, y));
                split(pool, len as usize, 4096, |r| unsafe {
                    // SAFETY: checked; each thread its own range of y.
                    gelu_into(xs.0.f32s(xs.1 + r.start, r.len()), ys.0.f32s_mut(ys.1 + r.start, r.len()))
                });
            }
            Op::GeluBackward(def::GeluBackward { len, dy, x, dx }) => {
                let (ds, xs, os) = (sp(self, dy), sp(self, x), sp(self, dx));
                split(pool, len as usize, 4096, |r| unsafe {
                    // SAFETY: as above.
                    gelu_backward_into(
                        ds.0.f32s(ds.1 + r.start, r.len()),
                        xs.0.f32s(xs.1 + r.start, r.len()),
                        os.0.f32s_mut(os.1 + r.start, r.len()),
                    )
                });
            }
            Op::CausalSoftmax(def::CausalSoftmax { blocks, t, scale, scores }) => {
                let (t, rows) = (t as usize, blocks as usize * t as usize);
                let s = sp(self, scores);
                split(pool, rows, 64, |r| unsafe {
                    // SAFETY: in place, rows `r` belong to this thread.
                    causal_softmax_rows(t, r.start, scale, s.0.f32s_mut(s.1 + r.start * t, r.len() * t))
                });
            }
            Op::CausalSoftmaxBackward(def::CausalSoftmaxBackward { blocks, t, scale, probs, dprobs, dscores }) => {
                let (t, rows) = (t as usize, blocks as usize * t as usize);
                let (ps, dps, dss) = (sp(self, probs), sp(self, dprobs), sp(self, dscores));
                split(pool, rows, 64, |r| unsafe {
                    // SAFETY: checked; rows `r` of dscores belong to this thread.
                    causal_softmax_backward_rows(
                        t,
                        r.start,
                        scale,
                        ps.0.f32s(ps.1 + r.start * t, r.len() * t),
                        dps.0.f32s(dps.1 + r.start * t, r.len() * t),
                        dss.0.f32s_mut(dss.1 + r.start * t, r.len() * t),
                    )
                });
            }
            Op::BiasGrad(def::BiasGrad { rows, width, dy, db }) => {
                let (rows, w) = (rows as usize, width as usize);
                let (ds, bs) = (sp(self, dy), sp(self, db));
                // SAFETY: checked; columns of db per thread.
                let dyv = unsafe { ds.0.f32s(ds.1, rows * w) };
                // Summed into an array of the thread's own, written once (see layer_norm_backward).
                split(pool, w, 16, |cols| {
                    let mut db = vec![0.0f32; cols.len()];
                    bias_grad_cols(w, rows, cols.clone(), dyv, &mut db);
                    // SAFETY: columns `cols` of db belong to this thread.
                    unsafe { bs.0.f32s_mut(bs.1 + cols.start, cols.len()).copy_from_slice(&db) };
                });
            }
            Op::CrossEntropy(def::CrossEntropy { rows, vocab, logits, targets, dlogits, loss }) => {
                let (rows, v) = (rows as usize, vocab as usize);
                let (ls, ts, ds, os) = (sp(self, logits), sp(self, targets), sp(self, dlogits), sp(self, loss));
                // SAFETY: checked; rows of dlogits and of the per-row losses per thread.
                let ids = unsafe { ts.0.u32s(ts.1, rows) };
                def::check_tokens(name, ids, vocab).map_err(error)?;
                let mut losses = vec![0.0f32; rows];
                let lr = Raw(losses.as_mut_ptr().cast(), rows);
                let inv = 1.0 / rows as f32;
                // SAFETY: the op was checked (every span in bounds) and no output overlaps an input; each thread touches only its own part of the outputs.
                split(pool, rows, 16, |r| unsafe {
                    cross_entropy_rows(
                        v,
                        ls.0.f32s(ls.1 + r.start * v, r.len() * v),
                        &ids[r.clone()],
                        inv,
                        ds.0.f32s_mut(ds.1 + r.start * v, r.len() * v),
                        lr.f32s_mut(r.start, r.len()),
                    )
                });
                // SAFETY: one word, checked.
                unsafe { os.0.f32s_mut(os.1, 1)[0] = def::mean_loss(&losses) };
            }
            Op::Adam(def::Adam { len, weights, grad, m, v, lr, correction1, correction2 }) => {
                let (ws, gs, ms, vs) = (sp(self, weights), sp(self, grad), sp(self, m), sp(self, v));
                split(pool, len as usize, 4096, |r| unsafe {
                    // SAFETY: checked; each thread its own elements.
                    adam_into(
                        ws.0.f32s_mut(ws.1 + r.start, r.len()),
                        gs.0.f32s(gs.1 + r.start, r.len()),
                        ms.0.f32s_mut(ms.1 + r.start, r.len()),
                        vs.0.f32s_mut(vs.1 + r.start, r.len()),
                        lr,
                        correction1,
                        correction2,
                    )
                });
            }
            Op::Hash(def::Hash { len, data, out }) => {
                let (ds, os) = (sp(self, data), sp(self, out));
                let threads = pool.map_or(1, |p| p.current_num_threads());
                // SAFETY: checked (in bounds), and nothing writes these words during the op.
                let data = unsafe { ds.0.u32s(ds.1, len as usize) };
                let h = lockstep_luts::hash::chunked_words_threaded(data, threads);
                // SAFETY: the op was checked (every span in bounds) and no output overlaps an input; each thread touches only its own part of the outputs.
                unsafe { os.0.f32s_mut(os.1, 1)[0] = f32::from_bits(h) };
            }
        }
        Ok(())
    }

    fn matmul(&mut self, path: Path, pool: Option<&rayon::ThreadPool>, mm: &Matmul) -> Result<(), OpError> {
        let (m, n, k) = (mm.m as usize, mm.n as usize, mm.k as usize);
        let (a, b, c) = (self.raw(mm.a.buffer), self.raw(mm.b.buffer), self.raw(mm.c.buffer));
        let bias = mm.bias.map(|s| {
            let r = self.raw(s.buffer);
            // SAFETY: checked in bounds; the bias is read only.
            unsafe { r.f32s(s.offset as usize, n) }
        });
        let batches = mm.batch[0] as usize * mm.batch[1] as usize;
        if batches == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        let run = |lane: &mut Lane, pool: Option<&rayon::ThreadPool>, index: usize| -> Result<(), OpError> {
            let (p, q) = (index / mm.batch[1] as usize, index % mm.batch[1] as usize);
            let Lane { a: a_scratch, b: b_scratch, c: c_scratch, scratch } = lane;
            // SAFETY: the op was checked (views in bounds) and its writes overlap no read.
            let (a_rows, b_rows) = unsafe {
                (operand(pool, a, &mm.a, p, q, m, k, a_scratch), operand(pool, b, &mm.b, p, q, n, k, b_scratch))
            };
            let direct = mm.c.col_stride == 1 && (mm.c.row_stride as usize == n || m == 1);
            if direct && !mm.accumulate {
                // Straight into the output rows, then the bias in place: `r + bias`, as defined.
                // SAFETY: batches write disjoint outputs (the op's contract); in bounds.
                let out = unsafe { c.f32s_mut(mm.c.index(p, q, 0, 0), m * n) };
                gemm_f32(path, pool, scratch, m, n, k, a_rows, b_rows, out).map_err(OpError::Unit)?;
                if let Some(bias) = bias {
                    let shared = Raw(out.as_mut_ptr().cast(), out.len());
                    split(pool, m, 64, |rows| {
                        // SAFETY: rows `rows` of the output belong to this thread.
                        let part = unsafe { shared.f32s_mut(rows.start * n, rows.len() * n) };
                        for row in part.chunks_exact_mut(n) {
                            for (v, b) in row.iter_mut().zip(bias) {
                                *v += b;
                            }
                        }
                    });
                }
                return Ok(());
            }
            if c_scratch.len() < m * n {
                c_scratch.resize(m * n, 0.0);
            }
            gemm_f32(path, pool, scratch, m, n, k, a_rows, b_rows, &mut c_scratch[..m * n]).map_err(OpError::Unit)?;
            let result = &c_scratch[..m * n];
            split(pool, m, 64, |rows| {
                // SAFETY: batches write disjoint outputs (the op's contract), threads disjoint
                // rows of this batch's; in bounds (checked).
                unsafe { scatter(c, &mm.c, p, q, rows, n, result, bias, mm.accumulate) }
            });
            Ok(())
        };
        let threads = pool.map_or(1, |p| p.current_num_threads());
        if batches == 1 || threads == 1 {
            let lane = &mut self.lanes[0];
            for index in 0..batches {
                run(lane, pool, index)?;
            }
            return Ok(());
        }
        // One batch per task, each single-threaded: lanes are handed out by contiguous ranges.
        let per = batches.div_ceil(threads);
        let results: Vec<Result<(), OpError>> = {
            let lanes = &mut self.lanes[..threads];
            let pool = pool.expect("threads > 1");
            let mut results = vec![Ok(()); lanes.len()];
            pool.scope(|scope| {
                for (t, (lane, result)) in lanes.iter_mut().zip(results.iter_mut()).enumerate() {
                    let run = &run;
                    scope.spawn(move |_| {
                        for index in t * per..((t + 1) * per).min(batches) {
                            if let Err(e) = run(lane, None, index) {
                                *result = Err(e);
                                return;
                            }
                        }
                    });
                }
            });
            results
        };
        results.into_iter().collect()
    }
}

/// The `rows × k` matrix a view shows for batch `(p, q)`, row-major: the buffer's own words when
/// the view already is row-major, else a copy in `scratch`.
///
/// # Safety
/// The view is in bounds, and nothing writes these words while the slice lives.
#[allow(clippy::too_many_arguments)]
unsafe fn operand<'a>(
    pool: Option<&rayon::ThreadPool>,
    src: Raw,
    v: &MatView,
    p: usize,
    q: usize,
    rows: usize,
    k: usize,
    scratch: &'a mut Vec<f32>,
) -> &'a [f32] {
    let base = v.index(p, q, 0, 0);
    if v.col_stride == 1 && (v.row_stride as usize == k || rows == 1) {
        // SAFETY: in bounds and unwritten by the caller's promise.
        return unsafe { src.f32s(base, rows * k) };
    }
    if scratch.len() < rows * k {
        scratch.resize(rows * k, 0.0);
    }
    let out = &mut scratch[..rows * k];
    // SAFETY: the op was checked: every index of the view is inside the buffer.
    let words = unsafe { std::slice::from_raw_parts(src.0.cast::<f32>(), src.1) };
    let (rs, cs) = (v.row_stride as usize, v.col_stride as usize);
    if cs == 1 {
        for i in 0..rows {
            out[i * k..(i + 1) * k].copy_from_slice(&words[base + i * rs..base + i * rs + k]);
        }
    } else if rs == 1 {
        // A transposed view: the source is `k × rows` with leading dimension `cs`; threads take
        // ranges of its columns (our rows), multiples of 8 wide.
        let src = &words[base..];
        let shared = Raw(out.as_mut_ptr().cast(), out.len());
        split(pool, rows.div_ceil(8), 1, |r| {
            let cols = r.start * 8..(r.end * 8).min(rows);
            // SAFETY: rows `cols` of `out` belong to this thread.
            let part = unsafe { shared.f32s_mut(cols.start * k, cols.len() * k) };
            transpose(src, k, cols, cs, part);
        });
    } else {
        for i in 0..rows {
            for l in 0..k {
                out[i * k + l] = words[base + i * rs + l * cs];
            }
        }
    }
    &scratch[..rows * k]
}

/// Rows `cols` of the transpose of `src` (`rows × ·` with leading dimension `ld`) into `out`
/// (`cols.len() × rows`, row-major): 8 × 8 tiles in AVX registers where the CPU has AVX (pure
/// data movement), else scalar.
fn transpose(src: &[f32], rows: usize, cols: Range<usize>, ld: usize, out: &mut [f32]) {
    assert!(rows == 0 || cols.is_empty() || (rows - 1) * ld + cols.end <= src.len());
    assert!(out.len() >= rows * cols.len());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX is present; bounds asserted above.
        return unsafe { transpose_avx(src, rows, cols, ld, out) };
    }
    transpose_scalar(src, 0..rows, cols.clone(), cols.start, ld, rows, out);
}

fn transpose_scalar(
    src: &[f32],
    rows: Range<usize>,
    cols: Range<usize>,
    first_col: usize,
    ld: usize,
    out_ld: usize,
    out: &mut [f32],
) {
    for c in cols {
        for r in rows.clone() {
            out[(c - first_col) * out_ld + r] = src[r * ld + c];
        }
    }
}

/// # Safety
/// The CPU supports AVX; `src` holds `rows` rows of `ld` words (the last may end at
/// `cols.end`) and `out` `rows × cols.len()` words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_avx(src: &[f32], rows: usize, cols: Range<usize>, ld: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    const T: usize = 8;
    let first = cols.start;
    let full_r = rows / T * T;
    let full_c = first + cols.len() / T * T;
    for c0 in (first..full_c).step_by(T) {
        for r0 in (0..full_r).step_by(T) {
            // SAFETY: rows r0..r0+8, columns c0..c0+8 of `src` and rows c0..c0+8 (less
            // `first`), columns r0..r0+8 of `out` are in bounds (the caller's promise);
            // unaligned loads and stores.
            unsafe {
                let load = |i: usize| _mm256_loadu_ps(src.as_ptr().add((r0 + i) * ld + c0));
                let (a0, a1, a2, a3, a4, a5, a6, a7) =
                    (load(0), load(1), load(2), load(3), load(4), load(5), load(6), load(7));
                let t0 = _mm256_unpacklo_ps(a0, a1);
                let t1 = _mm256_unpackhi_ps(a0, a1);
                let t2 = _mm256_unpacklo_ps(a2, a3);
                let t3 = _mm256_unpackhi_ps(a2, a3);
                let t4 = _mm256_unpacklo_ps(a4, a5);
                let t5 = _mm256_unpackhi_ps(a4, a5);
                let t6 = _mm256_unpacklo_ps(a6, a7);
                let t7 = _mm256_unpackhi_ps(a6, a7);
                let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                let u1 = _mm256_shuffle_ps::<0xee>(t0, t2);
                let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                let u3 = _mm256_shuffle_ps::<0xee>(t1, t3);
                let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                let u5 = _mm256_shuffle_ps::<0xee>(t4, t6);
                let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                let u7 = _mm256_shuffle_ps::<0xee>(t5, t7);
                let rows_out = [
                    _mm256_permute2f128_ps::<0x20>(u0, u4),
                    _mm256_permute2f128_ps::<0x20>(u1, u5),
                    _mm256_permute2f128_ps::<0x20>(u2, u6),
                    _mm256_permute2f128_ps::<0x20>(u3, u7),
                    _mm256_permute2f128_ps::<0x31>(u0, u4),
                    _mm256_permute2f128_ps::<0x31>(u1, u5),
                    _mm256_permute2f128_ps::<0x31>(u2, u6),
                    _mm256_permute2f128_ps::<0x31>(u3, u7),
                ];
                for (j, v) in rows_out.into_iter().enumerate() {
                    _mm256_storeu_ps(out.as_mut_ptr().add((c0 + j - first) * rows + r0), v);
                }
            }
        }
    }
    transpose_scalar(src, full_r..rows, first..full_c, first, ld, rows, out);
    transpose_scalar(src, 0..rows, full_c..cols.end, first, ld, rows, out);
}

/// Writes a product's `m × n` result through the output view: `+ bias`, then set or add.
///
/// # Safety
/// The view is in bounds, and no other thread touches these elements meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn scatter(
    dst: Raw,
    v: &MatView,
    p: usize,
    q: usize,
    rows: Range<usize>,
    n: usize,
    r: &[f32],
    bias: Option<&[f32]>,
    accumulate: bool,
) {
    let (rs, cs) = (v.row_stride as usize, v.col_stride as usize);
    let base = v.index(p, q, 0, 0);
    for i in rows {
        let row = &r[i * n..(i + 1) * n];
        for j in 0..n {
            let mut x = row[j];
            if let Some(bias) = bias {
                x += bias[j];
            }
            let at = base + i * rs + j * cs;
            debug_assert!(at < dst.1);
            // SAFETY: in bounds and exclusive by the caller's promise.
            unsafe {
                let w = dst.0.add(at);
                *w = if accumulate { f32::from_bits(*w) + x } else { x }.to_bits();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bad ops get typed refusals and leave the instance usable: a view past its buffer, an
    /// unknown buffer, a token past the vocabulary, a NaN into the units.
    /// The element-wise ops follow the path a member is told to run: no wider than it implies,
    /// never wider than the CPU has.
    #[test]
    fn the_element_wise_tier_is_capped_by_the_chosen_path() {
        let widest = Tier::available()[0];
        assert_eq!(Tier::capped(None), widest);
        assert_eq!(Tier::capped(Some("avx512-vnni")), widest);
        assert_eq!(Tier::capped(Some("portable")), Tier::Portable);
        let avx2 = if Tier::available().contains(&Tier::Avx2) { Tier::Avx2 } else { Tier::Portable };
        assert_eq!(Tier::capped(Some("avx2")), avx2);
        assert_eq!(Tier::capped(Some("avx-vnni")), avx2);
    }

    #[test]
    fn bad_ops_are_refused_with_their_reason() {
        let mut buffers = Buffers::default();
        let (x, y) = (buffers.create(8), buffers.create(8));
        let path = Path::detect();
        let refusal = |buffers: &mut Buffers, op: Op| buffers.run(path, None, &[op]).unwrap_err();

        let e = refusal(&mut buffers, Op::Gelu(def::Gelu { len: 8, x: Span::new(x, 4), y: Span::new(y, 0) }));
        assert_eq!(e.status, status::INVALID_ARGUMENT);
        assert!(e.message.contains("op #0") && e.message.contains("gelu: access up to word 12"), "{}", e.message);

        let e = refusal(&mut buffers, Op::Gelu(def::Gelu { len: 2, x: Span::new(77, 0), y: Span::new(y, 0) }));
        assert!(e.message.contains("no buffer 77"), "{}", e.message);

        buffers.write(x, 0, &[3, 300, 0, 0, 0, 0, 0, 0]).unwrap();
        let embed = Op::Embed(def::Embed {
            rows: 2,
            seq: 2,
            width: 1,
            vocab: 8,
            tokens: Span::new(x, 0),
            tok: Span::new(y, 0),
            pos: Span::new(y, 0),
            out: Span::new(x, 4),
        });
        let e = refusal(&mut buffers, embed);
        assert_eq!(e.status, status::INVALID_ARGUMENT);
        assert!(e.message.contains("token id 300 outside a vocabulary of 8"), "{}", e.message);

        buffers.write(x, 0, &[f32::NAN.to_bits(); 8]).unwrap();
        let mm = Op::Matmul(Matmul {
            m: 2,
            n: 2,
            k: 4,
            batch: [1, 1],
            a: MatView::rows(x, 0, 4),
            b: MatView::rows(y, 0, 4),
            c: MatView::rows(y, 0, 2).batched([0, 0]),
            bias: None,
            accumulate: false,
        });
        // C overlaps B: the reference takes it, and refuses the NaN the same way.
        let e = refusal(&mut buffers, mm);
        assert_eq!(e.status, status::NON_FINITE_INPUT, "{}", e.message);
        let z = buffers.create(4);
        let e = refusal(
            &mut buffers,
            Op::Matmul(Matmul {
                c: MatView::rows(z, 0, 2),
                ..match mm {
                    Op::Matmul(m) => m,
                    _ => unreachable!(),
                }
            }),
        );
        assert_eq!(e.status, status::NON_FINITE_INPUT, "{}", e.message);
        // Still usable.
        buffers.write(x, 0, &[1f32.to_bits(); 8]).unwrap();
        buffers.run(path, None, &[Op::Gelu(def::Gelu { len: 8, x: Span::new(x, 0), y: Span::new(y, 0) })]).unwrap();
    }

    /// Every split covers `0..items` exactly once with non-empty, in-order ranges, whatever
    /// the thread count (16 threads over 130 items once made an empty range past the end).
    /// Every tier's compilation of the element-wise kernels gives the reference kernel's bits
    /// (the reference compiled for no particular CPU), on values across the kernels' ranges.
    #[test]
    fn every_simd_tier_computes_the_reference_bits() {
        let mut rng = lockstep_luts::rng::SplitMix64::new(0x7133);
        let mut values = |len: usize, scale: f32| -> Vec<f32> {
            (0..len).map(|_| rng.next_signed_unit() * scale).collect::<Vec<f32>>()
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        let (width, rows, t) = (40, 24, 12);
        let x = values(width * rows, 6.0);
        let dy = values(width * rows, 1.0);
        let gain = values(width, 2.0);
        let bias = values(width, 1.0);
        let scores = values(t * t * 2, 9.0);
        let probs: Vec<f32> = values(t * t * 2, 1.0).iter().map(|v| v.abs()).collect();
        assert!(Tier::available().len() > 1, "this machine has no SIMD tier to check");
        for tier in Tier::available() {
            let mut out = [vec![0f32; width * rows], vec![0f32; width * rows]];
            let mut want = out.clone();
            gelu_into::on(tier, &x, &mut out[0]);
            def::gelu_into(&x, &mut want[0]);
            gelu_backward_into::on(tier, &dy, &x, &mut out[1]);
            def::gelu_backward_into(&dy, &x, &mut want[1]);
            assert_eq!(out.map(|v| bits(&v)), want.map(|v| bits(&v)), "gelu on {tier:?}");

            let [mut y, mut xhat, mut y_ref, mut xhat_ref] = [(); 4].map(|_| vec![0f32; width * rows]);
            let (mut rstd, mut rstd_ref) = (vec![0f32; rows], vec![0f32; rows]);
            layer_norm_rows::on(tier, width, &x, &gain, &bias, &mut y, &mut xhat, &mut rstd);
            def::layer_norm_rows(width, &x, &gain, &bias, &mut y_ref, &mut xhat_ref, &mut rstd_ref);
            assert_eq!(
                [bits(&y), bits(&xhat), bits(&rstd)],
                [bits(&y_ref), bits(&xhat_ref), bits(&rstd_ref)],
                "{tier:?}"
            );
            let (mut dx, mut dx_ref) = (vec![0f32; width * rows], vec![0f32; width * rows]);
            layer_norm_backward_rows::on(tier, width, &dy, &xhat, &rstd, &gain, &mut dx, false);
            def::layer_norm_backward_rows(width, &dy, &xhat, &rstd, &gain, &mut dx_ref, false);
            assert_eq!(bits(&dx), bits(&dx_ref), "layer norm backward on {tier:?}");

            let (mut s, mut s_ref) = (scores.clone(), scores.clone());
            causal_softmax_rows::on(tier, t, 0, 0.3, &mut s);
            def::causal_softmax_rows(t, 0, 0.3, &mut s_ref);
            assert_eq!(bits(&s), bits(&s_ref), "softmax on {tier:?}");
            let (mut ds, mut ds_ref) = (vec![0f32; t * t * 2], vec![0f32; t * t * 2]);
            causal_softmax_backward_rows::on(tier, t, 0, 0.3, &probs, &scores, &mut ds);
            def::causal_softmax_backward_rows(t, 0, 0.3, &probs, &scores, &mut ds_ref);
            assert_eq!(bits(&ds), bits(&ds_ref), "softmax backward on {tier:?}");

            let (mut w, mut m, mut v) = (x.clone(), dy.clone(), probs.repeat(width * rows / probs.len() + 1));
            let (mut w_ref, mut m_ref, mut v_ref) = (w.clone(), m.clone(), v.clone());
            v.truncate(w.len());
            v_ref.truncate(w.len());
            adam_into::on(tier, &mut w, &dy, &mut m, &mut v, 1e-3, 0.1, 0.01);
            def::adam_into(&mut w_ref, &dy, &mut m_ref, &mut v_ref, 1e-3, 0.1, 0.01);
            assert_eq!([bits(&w), bits(&m), bits(&v)], [bits(&w_ref), bits(&m_ref), bits(&v_ref)], "adam on {tier:?}");
        }
    }

    #[test]
    fn splits_partition_the_items() {
        for threads in [1, 2, 3, 16] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            for (items, min) in [(0, 1), (1, 1), (5, 1), (130, 1), (130, 64), (2048, 16), (17, 4)] {
                let seen = std::sync::Mutex::new(Vec::new());
                split(Some(&pool), items, min, |r| seen.lock().unwrap().push(r));
                let mut ranges = seen.into_inner().unwrap();
                ranges.sort_by_key(|r| r.start);
                let mut next = 0;
                for r in &ranges {
                    assert!(
                        r.start == next && r.end > r.start && r.end <= items,
                        "{threads} {items} {min}: {ranges:?}"
                    );
                    next = r.end;
                }
                assert_eq!(next, items, "{threads} {items} {min}: {ranges:?}");
            }
        }
    }

    #[test]
    fn transposes_of_every_edge_match_the_scalar_loop() {
        for (rows, cols, pad) in [(1, 1, 0), (3, 5, 2), (8, 8, 0), (9, 17, 3), (16, 3, 1), (33, 40, 7), (64, 130, 0)] {
            let ld = cols + pad;
            let src: Vec<f32> = (0..rows * ld).map(|i| i as f32).collect();
            let mut fast = vec![0.0; rows * cols];
            transpose(&src, rows, 0..cols, ld, &mut fast);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(fast[c * rows + r], src[r * ld + c], "{rows}x{cols}+{pad} at {r},{c}");
                }
            }
            // A column range, as one thread's share.
            let range = cols / 3..cols;
            let mut part = vec![0.0; rows * range.len()];
            transpose(&src, rows, range.clone(), ld, &mut part);
            assert_eq!(part[..], fast[range.start * rows..]);
        }
    }
}
