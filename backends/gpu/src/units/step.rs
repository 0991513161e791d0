//! ABI 2 on the GPU: plugin-owned buffers in one device arena and the training step's ops as
//! dispatches of `step_ops.wgsl` and the unit kernel.
//!
//! **The arena**: every buffer the host creates is a range of one of up to four pages, each a
//! storage buffer no larger than the adapter's largest binding (64-word aligned, first fit, a
//! page grown by copying to exactly the size needed: the host reserves a program's words before
//! creating its buffers, so a program that fits one page costs one growth; one that does not
//! opens the next page), so every kernel binds the same storage and finds its operands by word
//! addresses (`page << 30 | word`, `arena.wgsl`) in a 256-byte uniform record. A buffer larger
//! than one binding, or one that fits in none of four pages, is refused with the limit named.
//!
//! **A call** (`run_ops`) checks every op (`Op::check` against the arena's lengths), plans each
//! as one to three dispatches (a product: quantize A, quantize B, the unit kernel; LayerNorm's
//! backward: rows, then the parameter gradients' columns; cross-entropy: rows, then the mean),
//! writes all records at once, encodes one compute pass (wgpu orders each dispatch's writes
//! before the next one's reads), and reads back one status word: the first op that met a
//! non-finite operand or a token id past the vocabulary, if any. Nothing else leaves the
//! device. An op whose outputs overlap its inputs (`Op::writes_overlap`; the training step has
//! none) runs on the reference on the host between the dispatches around it, same bits.

use std::collections::BTreeMap;

use lockstep_luts::ops::{self as def, Handle, MatView, Matmul, Op, OpError, Span};
use lockstep_luts::units::blocks_for;
use lockstep_shaders::{
    step_params, step_status, CoopTile, Kernel, StepKernel, Tile, MAX_PAGES, NARROW_BELOW_GROUPS, PAGE_SHIFT,
    QUANT_ROWS, SPLIT_SLICES, SPLIT_TILE, STEP_WORKGROUP,
};

use super::GpuError;

/// Arena ranges are multiples of this many words (256 bytes: any alignment a binding wants).
const ALIGN_WORDS: u64 = 64;

/// Words a buffer of `words` occupies in the arena.
fn reserved(words: u64) -> u64 {
    words.max(1).next_multiple_of(ALIGN_WORDS)
}

/// One buffer's range of the arena: its page and words there.
#[derive(Clone, Copy, Debug)]
struct Region {
    page: usize,
    start: u64,
    len: u64,
}

/// One page of the arena: a device buffer and the ranges of it in use.
#[derive(Default)]
pub(crate) struct Page {
    pub(crate) buffer: Option<wgpu::Buffer>,
    /// Words the device buffer holds.
    pub(crate) capacity: u64,
    /// Free ranges below `top`: start → length.
    free: BTreeMap<u64, u64>,
    top: u64,
}

/// The host's buffers as ranges of up to [`MAX_PAGES`] device buffers, each no larger than one
/// binding (`arena.wgsl`: a word address is `page << PAGE_SHIFT | word`).
pub(crate) struct Arena {
    pub(crate) pages: Vec<Page>,
    /// The most words one page may hold: the device's largest binding, at most 2^PAGE_SHIFT.
    limit: u64,
    regions: BTreeMap<Handle, Region>,
    next_handle: Handle,
}

/// Where a reservation went, and what must happen to the device first.
pub(crate) struct Placed {
    pub(crate) handle: Handle,
    page: usize,
    start: u64,
    len: u64,
    /// The page's device buffer must first grow to this many words (a new page: be made).
    pub(crate) grow: Option<u64>,
}

impl Arena {
    pub(crate) fn new(limit_bytes: u64) -> Self {
        let limit = (limit_bytes / 4).min(1 << PAGE_SHIFT) / ALIGN_WORDS * ALIGN_WORDS;
        Self { pages: Vec::new(), limit, regions: BTreeMap::new(), next_handle: 1 }
    }

    pub(crate) fn len_of(&self, handle: Handle) -> Option<u64> {
        self.regions.get(&handle).map(|r| r.len)
    }

    /// The word address of a span (`page << PAGE_SHIFT | word`).
    fn at(&self, span: Span) -> u32 {
        let r = &self.regions[&span.buffer];
        ((r.page as u64) << PAGE_SHIFT | (r.start + u64::from(span.offset))) as u32
    }

    /// Whether the kernels must choose pages (the arena has more than one).
    pub(crate) fn paged(&self) -> bool {
        self.pages.len() > 1
    }

    /// Reserves `words` (a range of at least one alignment unit) in the first page with room
    /// (a free range, or room below the page limit past its top), or in a new page.
    fn reserve(&mut self, words: u64) -> Result<Placed, GpuError> {
        let rounded = reserved(words);
        if rounded > self.limit {
            return Err(GpuError::Device(format!(
                "a buffer of {words} words does not fit: the device's largest storage binding holds {} words",
                self.limit
            )));
        }
        let mut placed = None;
        for (index, page) in self.pages.iter_mut().enumerate() {
            if let Some((start, len)) = page.free.iter().find(|(_, &len)| len >= rounded).map(|(&s, &l)| (s, l)) {
                page.free.remove(&start);
                if len > rounded {
                    page.free.insert(start + rounded, len - rounded);
                }
                placed = Some((index, start, None));
                break;
            }
            if page.top + rounded <= self.limit {
                let start = page.top;
                page.top += rounded;
                // Exactly what is needed: the host announces a program's buffers before it
                // creates them (`Device::reserve`), so one growth covers them; doubling would
                // hold up to twice the memory the buffers need.
                placed = Some((index, start, (page.top > page.capacity).then_some(page.top)));
                break;
            }
        }
        let (page, start, grow) = match placed {
            Some(p) => p,
            None if self.pages.len() < MAX_PAGES => {
                self.pages.push(Page { top: rounded, ..Page::default() });
                (self.pages.len() - 1, 0, Some(rounded))
            }
            None => {
                let used: u64 = self.pages.iter().map(|p| p.top).sum();
                return Err(GpuError::Device(format!(
                    "a buffer of {words} words does not fit: {MAX_PAGES} pages of {} words (the device's largest storage binding) hold {used} words in use",
                    self.limit
                )));
            }
        };
        let handle = self.next_handle;
        self.next_handle += 1;
        self.regions.insert(handle, Region { page, start, len: words });
        Ok(Placed { handle, page, start, len: words, grow })
    }

    fn release(&mut self, handle: Handle) {
        if let Some(r) = self.regions.remove(&handle) {
            let page = &mut self.pages[r.page];
            let mut start = r.start;
            let mut len = reserved(r.len);
            // Merge with the free ranges on either side.
            if let Some((&s, &l)) = page.free.range(..start).next_back() {
                if s + l == start {
                    page.free.remove(&s);
                    start = s;
                    len += l;
                }
            }
            if let Some(l) = page.free.remove(&(start + len)) {
                len += l;
            }
            if start + len == page.top {
                page.top = start;
            } else {
                page.free.insert(start, len);
            }
        }
    }

    /// Checks that words `offset .. offset + len` lie inside the buffer; its page and the byte
    /// address there.
    fn range(&self, handle: Handle, offset: usize, len: usize) -> Result<(usize, u64), GpuError> {
        let r = self
            .regions
            .get(&handle)
            .ok_or_else(|| GpuError::Shape(format!("buffer {handle} does not exist on this instance")))?;
        if offset as u64 + len as u64 > r.len {
            return Err(GpuError::Shape(format!(
                "words {offset}..{} are outside buffer {handle} of {} words",
                offset + len,
                r.len
            )));
        }
        Ok((r.page, (r.start + offset as u64) * 4))
    }
}

/// The unit kernel's tiles of an instance: `main`, and `narrow` for products `main` would
/// cover with fewer than [`NARROW_BELOW_GROUPS`] workgroups.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tiles {
    pub(crate) main: Tile,
    pub(crate) narrow: Option<Tile>,
    /// The `tc` instance's cooperative tile: its products run on [`Kernel::GemmTc`] (whose
    /// epilogue tile is `main`) where the split kernel does not take them.
    pub(crate) coop: Option<CoopTile>,
}

/// Which bind group a dispatch uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bind {
    /// The step kernels with the A-side quantizer outputs (every element-wise op uses it).
    StepA,
    /// The step kernels with the B-side quantizer outputs.
    StepB,
    /// The unit kernel reading both quantized operands, writing the arena.
    Gemm,
}

/// One planned dispatch.
pub(crate) struct Dispatch {
    pub(crate) kernel: Kernel,
    /// The unit kernel's tile (`None`: the instance's).
    pub(crate) tile: Option<Tile>,
    pub(crate) bind: Bind,
    pub(crate) params: [u32; step_params::WORDS],
    pub(crate) groups: [u32; 3],
}

/// Scratch the planned dispatches need, in words.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Needs {
    pub(crate) q_a: u64,
    pub(crate) q_b: u64,
    pub(crate) e_a: u64,
    pub(crate) e_b: u64,
    pub(crate) scratch: u64,
}

/// A 1-D grid of `n` invocations in 256-wide workgroups, two-dimensional past 65535 groups.
fn grid(n: u64) -> Result<[u32; 3], GpuError> {
    let groups = n.div_ceil(u64::from(STEP_WORKGROUP));
    let x = groups.min(65535);
    let y = if x == 0 { 0 } else { groups.div_ceil(x) };
    if y > 65535 {
        return Err(GpuError::Shape(format!("{n} invocations need more than 65535² workgroups")));
    }
    Ok([x as u32, y as u32, 1])
}

/// The record of one of `op`'s dispatches: its ABI params with every buffer offset turned into
/// the arena address of that word, its flags, which operand (`part`) and its index in the call.
/// The kernels read the params by the names the op table generates.
pub(crate) fn record(arena: &Arena, op: &Op, op_index: u32, part: u32) -> [u32; step_params::WORDS] {
    let r = op.record();
    let mut p = [0u32; step_params::WORDS];
    p[..r.params.len()].copy_from_slice(&r.params);
    for (i, (_, slot)) in op.spec().buffer_slots().into_iter().enumerate() {
        // An absent optional buffer (handle 0) has no address.
        if r.buffers[i] != 0 {
            p[slot] = arena.at(Span::new(r.buffers[i], r.params[slot]));
        }
    }
    p[step_params::FLAGS] = r.flags;
    p[step_params::PART] = part;
    p[step_params::OP_INDEX] = op_index; // and word ZERO stays 0
    p
}

/// The record of a plain unit call (ABI 1): an `m × n × k` product of host-quantized operands,
/// one batch, row-major into the output binding, no bias, no flags.
pub(crate) fn unit_record(m: usize, n: usize, k: usize) -> [u32; step_params::WORDS] {
    let (m, n, k) = (m as u32, n as u32, k as u32);
    let op = Op::Matmul(Matmul {
        m,
        n,
        k,
        batch: [1, 1],
        a: MatView::rows(0, 0, k),
        b: MatView::rows(0, 0, k),
        c: MatView::rows(0, 0, n),
        bias: None,
        accumulate: false,
    });
    let params = op.record().params;
    let mut p = [0u32; step_params::WORDS];
    p[..params.len()].copy_from_slice(&params);
    p
}

/// The dispatches of one op (none for an empty one) and the scratch they need.
pub(crate) fn plan(
    arena: &Arena,
    op: &Op,
    op_index: u32,
    tiles: Tiles,
    needs: &mut Needs,
) -> Result<Vec<Dispatch>, GpuError> {
    use StepKernel as K;
    let params = record(arena, op, op_index, 0);
    // `items`: the kernel's outputs (elements, rows or columns), each one invocation or, for a
    // lane kernel, one per lane.
    let step = |kernel: StepKernel, items: u64| -> Result<Dispatch, GpuError> {
        let lanes = if kernel.per_lane() { def::LANES as u64 } else { 1 };
        let groups = if kernel.single() { [1, 1, 1] } else { grid(items * lanes)? };
        Ok(Dispatch { kernel: Kernel::Step(kernel), tile: None, bind: Bind::StepA, params, groups })
    };
    let n = u64::from;
    Ok(match *op {
        Op::Matmul(mm) => plan_matmul(&mm, params, tiles, needs)?,
        Op::Embed(o) => vec![step(K::Embed, n(o.rows) * n(o.width))?],
        Op::EmbedBackward(o) => {
            // The row lists: one start per token, the total, one entry per row.
            needs.scratch = needs.scratch.max(n(o.vocab) + 1 + n(o.rows));
            vec![step(K::EmbedLists, 1)?, step(K::EmbedBackward, (n(o.vocab) + n(o.positions)) * n(o.width))?]
        }
        Op::LayerNorm(o) => vec![step(K::LayerNorm, n(o.rows))?],
        Op::LayerNormBackward(o) => {
            vec![step(K::LayerNormBackward, n(o.rows))?, step(K::LayerNormParamGrads, n(o.width))?]
        }
        Op::Gelu(o) => vec![step(K::Gelu, n(o.len))?],
        Op::GeluBackward(o) => vec![step(K::GeluBackward, n(o.len))?],
        Op::CausalSoftmax(o) => vec![step(K::CausalSoftmax, n(o.blocks) * n(o.t))?],
        Op::CausalSoftmaxBackward(o) => vec![step(K::CausalSoftmaxBackward, n(o.blocks) * n(o.t))?],
        Op::BiasGrad(o) => vec![step(K::BiasGrad, n(o.width))?],
        Op::CrossEntropy(o) => {
            needs.scratch = needs.scratch.max(n(o.rows));
            vec![step(K::CrossEntropy, n(o.rows))?, step(K::CrossEntropyMean, 1)?]
        }
        Op::Adam(o) => vec![step(K::Adam, n(o.len))?],
        Op::Hash(o) => {
            let chunks = n(o.len).div_ceil(lockstep_luts::hash::HASH_CHUNK_WORDS as u64);
            needs.scratch = needs.scratch.max(chunks);
            vec![step(K::HashChunks, chunks)?, step(K::HashFold, 1)?]
        }
    })
}

/// A product: both operands quantized on the device (the quantizer's record is the matmul's,
/// `part` saying which operand), then the unit kernel on the same record.
fn plan_matmul(
    mm: &Matmul,
    params: [u32; step_params::WORDS],
    tiles: Tiles,
    needs: &mut Needs,
) -> Result<Vec<Dispatch>, GpuError> {
    let batches = u64::from(mm.batch[0]) * u64::from(mm.batch[1]);
    if batches == 0 || mm.m == 0 || mm.n == 0 {
        return Ok(Vec::new());
    }
    let blocks = blocks_for(mm.k as usize) as u64;
    let groups_of = |(rows, cols): (u32, u32)| {
        [u64::from(mm.n).div_ceil(u64::from(cols)), u64::from(mm.m).div_ceil(u64::from(rows)), batches]
    };
    let on = |tile: Tile| groups_of((tile.rows(), tile.cols()));
    let tile = match tiles.narrow {
        Some(narrow) if on(tiles.main).iter().product::<u64>() < NARROW_BELOW_GROUPS => narrow,
        _ => tiles.main,
    };
    let tiled = on(tile);
    let (kernel, gemm_groups) = if uses_split_kernel(tiled, blocks) {
        (Kernel::GemmUnitsSplit, groups_of(SPLIT_TILE))
    } else {
        (tiles.coop.map_or(Kernel::GemmUnits, Kernel::GemmTc), tiled)
    };
    // The cooperative kernel reads whole tiles of operand rows past each batch's first row.
    let slack = |rows: u32| if matches!(kernel, Kernel::GemmTc(_)) { u64::from(rows) * blocks * 8 } else { 0 };
    if gemm_groups.iter().any(|&g| g > 65535) {
        return Err(GpuError::Shape(format!(
            "a {}x{}x{} product in {batches} batches needs more than 65535 workgroups in one dimension",
            mm.m, mm.n, mm.k
        )));
    }
    let mut out = Vec::new();
    if blocks > 0 {
        for (part, rows, bind, tile_rows) in
            [(0u32, mm.m, Bind::StepA, tile.rows()), (1, mm.n, Bind::StepB, tile.cols())]
        {
            let units = batches * u64::from(rows) * blocks;
            // A workgroup of `STEP_WORKGROUP` invocations per 32 rows of one block.
            let workgroups = batches * u64::from(rows).div_ceil(u64::from(QUANT_ROWS)) * blocks;
            let (q, e) = if part == 0 { (&mut needs.q_a, &mut needs.e_a) } else { (&mut needs.q_b, &mut needs.e_b) };
            *q = (*q).max(units * 8 + slack(tile_rows));
            *e = (*e).max(units);
            let mut record = params;
            record[step_params::PART] = part;
            out.push(Dispatch {
                kernel: Kernel::Step(StepKernel::Quantize),
                tile: None,
                bind,
                params: record,
                groups: grid(workgroups * u64::from(STEP_WORKGROUP))?,
            });
        }
    }
    out.push(Dispatch { kernel, tile: Some(tile), bind: Bind::Gemm, params, groups: gemm_groups.map(|g| g as u32) });
    Ok(out)
}

/// Fewer workgroups than this for a product's tiled kernel leave a large GPU mostly idle while
/// each walks its k (an H200 has 132 multiprocessors). Measured on the H200 (docs/PERFORMANCE.md):
/// the default model's weight gradients (2 to 8 tiled workgroups) ran 2.3× faster on the split
/// kernel, products of 32 workgroups the same, and the 25.6M configuration's products of 96 to
/// 256 workgroups 1.5 to 2× slower.
const SPLIT_BELOW_GROUPS: u64 = 64;

/// Whether a product whose tiled kernel would run `tiled` workgroups over `blocks` blocks of k
/// runs on the split kernel instead (`gemm_split.wgsl`): few workgroups and at least one full
/// stage of blocks. Either kernel gives the same bits; this only decides which is faster.
pub(crate) fn uses_split_kernel(tiled: [u64; 3], blocks: u64) -> bool {
    blocks >= u64::from(SPLIT_SLICES) && tiled.iter().product::<u64>() < SPLIT_BELOW_GROUPS
}

/// The error a status word names (its op index counts from the call's first op).
pub(crate) fn status_error(word: u32, ops: &[Op]) -> Option<GpuError> {
    if word == step_status::CLEAR {
        return None;
    }
    let index = (word >> 4) as usize;
    let name = ops.get(index).map_or("?", |op| op.name());
    Some(match word & 0xf {
        step_status::NON_FINITE => GpuError::NonFinite(format!(
            "op #{index} {name}: a non-finite operand (the units accept finite values only)"
        )),
        _ => GpuError::Shape(format!("op #{index} {name}: a token id outside the vocabulary")),
    })
}

/// Maps an op's refusal onto a GPU error.
pub(crate) fn op_error(e: OpError) -> GpuError {
    match e {
        OpError::Unit(u) => GpuError::Unit(u),
        other => GpuError::Shape(other.to_string()),
    }
}

impl super::GpuUnits {
    /// A buffer of `words` words (zeroed), its handle.
    pub fn buffer_create(&mut self, words: usize) -> Result<Handle, GpuError> {
        self.take_uncaptured()?;
        let placed = self.arena.reserve(words as u64)?;
        if let Some(capacity) = placed.grow {
            if let Err(e) = self.grow_page(placed.page, capacity) {
                self.arena.release(placed.handle);
                if self.arena.pages[placed.page].buffer.is_none() {
                    self.arena.pages.pop();
                }
                return Err(e);
            }
        }
        // Fresh words read as zeros, as a new plugin buffer promises (a reused range may hold
        // an old buffer's words).
        let bytes = placed.len * 4;
        if bytes > 0 {
            let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            let buffer = self.arena.pages[placed.page].buffer.as_ref().expect("reserved");
            encoder.clear_buffer(buffer, placed.start * 4, Some(bytes));
            self.queue.submit([encoder.finish()]);
        }
        Ok(placed.handle)
    }

    /// Moves page `page` into a device buffer of `capacity` words, contents kept (a new page:
    /// makes its buffer).
    fn grow_page(&mut self, page: usize, capacity: u64) -> Result<(), GpuError> {
        use wgpu::BufferUsages as U;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let bigger = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("arena page"),
            size: capacity * 4,
            usage: U::STORAGE | U::COPY_SRC | U::COPY_DST,
            mapped_at_creation: false,
        });
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Device(format!("cannot allocate {} bytes for the buffers: {error}", capacity * 4)));
        }
        // While the copy runs, both are held.
        self.peak_bytes = self.peak_bytes.max(self.device_bytes() + capacity * 4);
        let held = &mut self.arena.pages[page];
        if let Some(old) = held.buffer.take() {
            let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            encoder.copy_buffer_to_buffer(&old, 0, &bigger, 0, held.capacity * 4);
            self.queue.submit([encoder.finish()]);
        }
        held.buffer = Some(bigger);
        held.capacity = capacity;
        Ok(())
    }

    pub fn buffer_free(&mut self, handle: Handle) {
        self.arena.release(handle);
    }

    pub fn buffer_write(&mut self, handle: Handle, offset: usize, data: &[u32]) -> Result<(), GpuError> {
        self.take_uncaptured()?;
        let (page, at) = self.arena.range(handle, offset, data.len())?;
        if !data.is_empty() {
            let buffer = self.arena.pages[page].buffer.as_ref().expect("a buffer exists");
            self.queue.write_buffer(buffer, at, bytemuck::cast_slice(data));
        }
        Ok(())
    }

    pub fn buffer_read(&mut self, handle: Handle, offset: usize, out: &mut [u32]) -> Result<(), GpuError> {
        self.take_uncaptured()?;
        let (page, at) = self.arena.range(handle, offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let buffer = self.arena.pages[page].buffer.clone().expect("a buffer exists");
        self.read_back(&buffer, at, bytemuck::cast_slice_mut(out))
    }

    /// Runs `ops` in order (see the module docs).
    pub fn run_ops(&mut self, ops: &[Op]) -> Result<(), GpuError> {
        self.take_uncaptured()?;
        for op in ops {
            op.check(|h| self.arena.len_of(h)).map_err(op_error)?;
        }
        let mut start = 0;
        for (i, op) in ops.iter().enumerate() {
            if op.writes_overlap() {
                self.dispatch_ops(ops, start..i)?;
                self.run_on_host(op)?;
                start = i + 1;
            }
        }
        self.dispatch_ops(ops, start..ops.len())
    }

    /// An op the kernels do not take (overlapping outputs): the reference on host copies.
    fn run_on_host(&mut self, op: &Op) -> Result<(), GpuError> {
        let mut memory = def::Memory::new();
        for (buffer, end) in op.extents() {
            let mut words = vec![0u32; end as usize];
            self.buffer_read(buffer, 0, &mut words)?;
            memory.insert(buffer, words);
        }
        def::run_reference(op, &mut memory).map_err(op_error)?;
        for (buffer, words) in &memory {
            self.buffer_write(*buffer, 0, words)?;
        }
        Ok(())
    }

    fn dispatch_ops(&mut self, ops: &[Op], range: std::ops::Range<usize>) -> Result<(), GpuError> {
        let mut needs = Needs::default();
        let mut dispatches = Vec::new();
        let tiles = Tiles { main: self.tile, narrow: self.narrow, coop: self.coop };
        for i in range {
            dispatches.extend(plan(&self.arena, &ops[i], i as u32, tiles, &mut needs)?);
        }
        if dispatches.is_empty() {
            return Ok(());
        }
        let status = self.run_dispatches(&dispatches, needs)?;
        match status_error(status, ops) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_shaders::{DEFAULT_TILE, NARROW_TILE};

    /// The kernel and tile a product of `m × n` outputs over k in `batches` runs on.
    fn chosen(m: u32, n: u32, k: u32, batches: u32) -> (Kernel, Tile, [u32; 3]) {
        let mm = Matmul {
            m,
            n,
            k,
            batch: [1, batches],
            a: MatView::rows(1, 0, k),
            b: MatView::rows(2, 0, n),
            c: MatView::rows(3, 0, n),
            bias: None,
            accumulate: false,
        };
        let tiles = Tiles { main: DEFAULT_TILE, narrow: Some(NARROW_TILE), coop: None };
        let plan = plan_matmul(&mm, [0; step_params::WORDS], tiles, &mut Needs::default()).unwrap();
        let gemm = plan.last().unwrap();
        (gemm.kernel, gemm.tile.unwrap(), gemm.groups)
    }

    /// The 25.6M configuration's products (c = 512, 4096 rows, 8 heads of 64 over t = 256, in
    /// 128 batches) and the default model's weight gradients (c = 128, 2048 rows).
    #[test]
    fn each_product_shape_gets_its_tile() {
        use Kernel::{GemmUnits as Tiled, GemmUnitsSplit as Split};
        let (main, narrow) = (DEFAULT_TILE, NARROW_TILE);
        // Forward and input gradients: 256 to 1024 workgroups of 64 × 64.
        assert_eq!(chosen(4096, 1536, 512, 1), (Tiled, main, [24, 64, 1]));
        assert_eq!(chosen(4096, 512, 2048, 1), (Tiled, main, [8, 64, 1]));
        assert_eq!(chosen(4096, 256, 512, 1), (Tiled, main, [4, 64, 1]));
        // Weight gradients: 512 output rows, k = 4096.
        assert_eq!(chosen(512, 1536, 4096, 1), (Tiled, narrow, [48, 8, 1]));
        assert_eq!(chosen(512, 512, 4096, 1), (Tiled, narrow, [16, 8, 1]));
        assert_eq!(chosen(512, 256, 4096, 1), (Tiled, narrow, [8, 8, 1]));
        assert_eq!(chosen(2048, 512, 4096, 1), (Tiled, main, [8, 32, 1]));
        // Attention: batched, k of 64 and 256.
        assert_eq!(chosen(256, 256, 64, 128), (Tiled, main, [4, 4, 128]));
        assert_eq!(chosen(256, 64, 256, 128), (Tiled, main, [1, 4, 128]));
        // The default model's weight gradients: still too few workgroups even when narrow.
        assert_eq!(chosen(128, 384, 2048, 1).0, Split);
        assert_eq!(chosen(128, 384, 2048, 1).2, [12, 8, 1]);
        // Too few blocks of k for the split kernel: narrow and tiled.
        assert_eq!(chosen(40, 24, 70, 6), (Tiled, narrow, [1, 1, 6]));
    }
}
