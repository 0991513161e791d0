//! What the op table (`table.rs`) is made of: the `op_table!` macro that turns each entry into
//! its struct, its ABI record codec, its accesses and its place in [`super::Op`], and the traits
//! that say how each kind of field crosses the ABI.
//!
//! **The record rule** (the layout of `OpCall`, the same for every op, so no op writes its own
//! codec): the op's fields are taken in the order the table declares them; a scalar appends its
//! words to `params` (`u32` one, `f32` one by its bits, `[u32; 2]` two); a buffer takes the next
//! of `buffers` for its handle and appends its words to `params` — its offset first, then for a
//! strided view its row, column and two batch strides; a `bool` is a bit of `flags`; an
//! optional buffer is a buffer whose presence is a bit of `flags` (absent: handle and offset 0).
//! Unused buffers and params are zero.
//!
//! **An entry** reads:
//!
//! ```text
//! /// What the op computes.
//! 9 bias_grad BiasGrad {
//!     rows: u32,                                  // a scalar
//!     width: u32,
//!     dy: Span => read(w(rows) * w(width)),       // a buffer: how it is accessed, and how many words
//!     db: Span => write(w(width)),
//! }
//! refuse { width == 0 => "width 0" }               // optional: shapes the op cannot take
//! samples [ BiasGrad { rows: 13, width: 37, dy: Span::new(1, 0), db: Span::new(2, 3) } ]
//! ```
//!
//! Roles: `read(EXTENT)`, `write(EXTENT)`, `update(EXTENT)` (read, then written), each with an
//! optional value rule for the words a test fills it with (`tokens(BOUND)`: ids below `BOUND`;
//! `nonneg`: no negative values); `optional(FLAG, EXTENT)`; `flag(FLAG)`. `EXTENT` is the words a
//! span touches (a `u64`), or `(batch, rows, cols)` for a view; every field is in scope by name.
//! The samples are the instances the conformance suite and the gate run on every backend (handles
//! are placeholders: a runner maps them to buffers it creates, sized by the accesses).

use super::{Access, Handle, Kind, MatView, Span, Values};

/// Buffers one op record names, at most.
pub const MAX_BUFFERS: usize = 8;
/// Parameter words one op record holds, at most.
pub const MAX_PARAMS: usize = 24;

/// `flags` bits, one meaning each for every op that has it.
pub const FLAG_ACCUMULATE: u32 = 1 << 0;
pub const FLAG_BIAS: u32 = 1 << 1;
/// Every flag with its name (for the generated C and WGSL constants).
pub const FLAGS: [(&str, u32); 2] = [("accumulate", FLAG_ACCUMULATE), ("bias", FLAG_BIAS)];

/// An op as the words of its ABI record (`OpCall`): see the module docs for the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub code: u32,
    pub flags: u32,
    pub buffers: [u64; MAX_BUFFERS],
    pub params: [u32; MAX_PARAMS],
}

/// Why a record does not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    UnknownCode(u32),
    UnknownFlags { code: u32, flags: u32 },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::UnknownCode(code) => write!(f, "unknown op code {code}"),
            DecodeError::UnknownFlags { code, flags } => write!(f, "op code {code}: unknown flags {flags:#x}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Writes a record field by field.
pub struct Encoder {
    record: Record,
    buffers: usize,
    params: usize,
}

impl Encoder {
    pub(crate) fn new(code: u32) -> Self {
        Self {
            record: Record { code, flags: 0, buffers: [0; MAX_BUFFERS], params: [0; MAX_PARAMS] },
            buffers: 0,
            params: 0,
        }
    }

    pub fn words(&mut self, words: &[u32]) {
        self.record.params[self.params..self.params + words.len()].copy_from_slice(words);
        self.params += words.len();
    }

    pub fn buffer(&mut self, handle: Handle, words: &[u32]) {
        self.record.buffers[self.buffers] = handle;
        self.buffers += 1;
        self.words(words);
    }

    pub fn flag(&mut self, on: bool, bit: u32) {
        if on {
            self.record.flags |= bit;
        }
    }

    pub(crate) fn finish(self) -> Record {
        self.record
    }
}

/// Reads a record field by field, in the order it was written.
pub struct Decoder<'a> {
    record: &'a Record,
    buffers: usize,
    params: usize,
}

impl<'a> Decoder<'a> {
    pub(crate) fn new(record: &'a Record) -> Self {
        Self { record, buffers: 0, params: 0 }
    }

    pub fn words<const N: usize>(&mut self) -> [u32; N] {
        let out: [u32; N] = self.record.params[self.params..self.params + N].try_into().expect("N words");
        self.params += N;
        out
    }

    pub fn buffer(&mut self) -> Handle {
        self.buffers += 1;
        self.record.buffers[self.buffers - 1]
    }

    pub fn flag(&self, bit: u32) -> bool {
        self.record.flags & bit != 0
    }
}

/// A scalar field: `u32`, `f32` (by its bits) or `[u32; 2]`.
pub trait Scalar: Copy {
    /// The suffix of each of its words' names after the field's own.
    const SLOTS: &'static [&'static str];
    fn put(self, e: &mut Encoder);
    fn take(d: &mut Decoder<'_>) -> Self;
}

impl Scalar for u32 {
    const SLOTS: &'static [&'static str] = &[""];
    fn put(self, e: &mut Encoder) {
        e.words(&[self]);
    }
    fn take(d: &mut Decoder<'_>) -> Self {
        d.words::<1>()[0]
    }
}

impl Scalar for f32 {
    const SLOTS: &'static [&'static str] = &[""];
    fn put(self, e: &mut Encoder) {
        e.words(&[self.to_bits()]);
    }
    fn take(d: &mut Decoder<'_>) -> Self {
        f32::from_bits(d.words::<1>()[0])
    }
}

impl Scalar for [u32; 2] {
    const SLOTS: &'static [&'static str] = &["0", "1"];
    fn put(self, e: &mut Encoder) {
        e.words(&self);
    }
    fn take(d: &mut Decoder<'_>) -> Self {
        d.words::<2>()
    }
}

/// A strided view's words in the buffer, from its first word on (its offset is 0 here).
#[derive(Debug)]
pub struct View<'a> {
    pub view: MatView,
    pub words: &'a [u32],
}

/// A strided view's words to write (see [`View`]).
#[derive(Debug)]
pub struct ViewMut<'a> {
    pub view: MatView,
    pub words: &'a mut [u32],
}

/// A buffer's words an op reads, or reads and writes, bound for a kernel.
#[derive(Debug)]
pub enum Piece<'a> {
    Read(&'a [u32]),
    Write(&'a mut [u32]),
}

impl<'a> Piece<'a> {
    pub fn read(self) -> &'a [u32] {
        match self {
            Piece::Read(words) => words,
            Piece::Write(words) => words,
        }
    }

    pub fn write(self) -> &'a mut [u32] {
        match self {
            Piece::Write(words) => words,
            Piece::Read(_) => unreachable!("a written access is bound to words it may write"),
        }
    }
}

/// A buffer field: a [`Span`] or a [`MatView`].
pub trait Buffer: Copy {
    /// The suffix of each of its parameter words' names after the field's own.
    const SLOTS: &'static [&'static str];
    /// What its extent in the table says: words (a span) or `(batch, rows, cols)` (a view).
    type Shape;
    type Read<'a>;
    type Write<'a>;
    fn put(self, e: &mut Encoder);
    fn take(d: &mut Decoder<'_>) -> Self;
    fn access(self, shape: Self::Shape, kind: Kind, values: Values) -> Access;
    fn bind_read(self, piece: Piece<'_>) -> Self::Read<'_>;
    fn bind_write(self, piece: Piece<'_>) -> Self::Write<'_>;
}

impl Buffer for Span {
    const SLOTS: &'static [&'static str] = &[""];
    type Shape = u64;
    type Read<'a> = &'a [u32];
    type Write<'a> = &'a mut [u32];
    fn put(self, e: &mut Encoder) {
        e.buffer(self.buffer, &[self.offset]);
    }
    fn take(d: &mut Decoder<'_>) -> Self {
        let buffer = d.buffer();
        Span::new(buffer, d.words::<1>()[0])
    }
    fn access(self, words: u64, kind: Kind, values: Values) -> Access {
        let start = u64::from(self.offset);
        Access { buffer: self.buffer, start, end: if words == 0 { 0 } else { start + words }, kind, values }
    }
    fn bind_read(self, piece: Piece<'_>) -> &[u32] {
        piece.read()
    }
    fn bind_write(self, piece: Piece<'_>) -> &mut [u32] {
        piece.write()
    }
}

impl Buffer for MatView {
    const SLOTS: &'static [&'static str] =
        &["_offset", "_row_stride", "_col_stride", "_batch_stride0", "_batch_stride1"];
    type Shape = ([u32; 2], u32, u32);
    type Read<'a> = View<'a>;
    type Write<'a> = ViewMut<'a>;
    fn put(self, e: &mut Encoder) {
        let v = self;
        e.buffer(v.buffer, &[v.offset, v.row_stride, v.col_stride, v.batch_stride[0], v.batch_stride[1]]);
    }
    fn take(d: &mut Decoder<'_>) -> Self {
        let buffer = d.buffer();
        let [offset, row_stride, col_stride, b0, b1] = d.words::<5>();
        MatView { buffer, offset, row_stride, col_stride, batch_stride: [b0, b1] }
    }
    fn access(self, (batch, rows, cols): Self::Shape, kind: Kind, values: Values) -> Access {
        Access { buffer: self.buffer, start: u64::from(self.offset), end: self.end(batch, rows, cols), kind, values }
    }
    fn bind_read(self, piece: Piece<'_>) -> View<'_> {
        View { view: MatView { offset: 0, ..self }, words: piece.read() }
    }
    fn bind_write(self, piece: Piece<'_>) -> ViewMut<'_> {
        ViewMut { view: MatView { offset: 0, ..self }, words: piece.write() }
    }
}

/// An optional span's part of a record: a buffer slot and an offset either way, its flag set
/// when it is there.
pub fn put_optional(span: Option<Span>, bit: u32, e: &mut Encoder) {
    let s = span.unwrap_or(Span::new(0, 0));
    e.buffer(s.buffer, &[s.offset]);
    e.flag(span.is_some(), bit);
}

pub fn take_optional(bit: u32, d: &mut Decoder<'_>) -> Option<Span> {
    let span = <Span as Buffer>::take(d);
    d.flag(bit).then_some(span)
}

/// What one field of an op is, for the generators (`generate.rs`) and the runners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldKind {
    Scalar { slots: &'static [&'static str] },
    Buffer { slots: &'static [&'static str], access: Kind, flag: Option<u32> },
    Flag { bit: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldSpec {
    pub name: &'static str,
    pub kind: FieldKind,
}

/// One entry of the op table, as data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSpec {
    pub code: u32,
    /// The ABI name (`docs/VERIFICATION.md` §9).
    pub name: &'static str,
    pub fields: &'static [FieldSpec],
    /// The flag bits the op may carry.
    pub flags: u32,
}

impl OpSpec {
    /// Every parameter word's name (`rows`, `a_row_stride`, `batch0`, …) with its index in
    /// `params`.
    pub fn param_slots(&self) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        for field in self.fields {
            let slots = match field.kind {
                FieldKind::Scalar { slots } | FieldKind::Buffer { slots, .. } => slots,
                FieldKind::Flag { .. } => continue,
            };
            for suffix in slots {
                let at = out.len();
                out.push((format!("{}{suffix}", field.name), at));
            }
        }
        out
    }

    /// The buffer fields in `buffers` order, each with the index in `params` of its offset.
    pub fn buffer_slots(&self) -> Vec<(&'static str, usize)> {
        let mut out = Vec::new();
        let mut at = 0;
        for field in self.fields {
            match field.kind {
                FieldKind::Scalar { slots } => at += slots.len(),
                FieldKind::Buffer { slots, .. } => {
                    out.push((field.name, at));
                    at += slots.len();
                }
                FieldKind::Flag { .. } => {}
            }
        }
        out
    }

    /// Parameter words the op uses.
    pub const fn param_words(&self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.fields.len() {
            n += match self.fields[i].kind {
                FieldKind::Scalar { slots } | FieldKind::Buffer { slots, .. } => slots.len(),
                FieldKind::Flag { .. } => 0,
            };
            i += 1;
        }
        n
    }

    /// Buffers the op names.
    pub const fn buffer_count(&self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.fields.len() {
            if let FieldKind::Buffer { .. } = self.fields[i].kind {
                n += 1;
            }
            i += 1;
        }
        n
    }
}

/// `u64` of a `u32`, for the extents in the table.
pub(crate) const fn w(x: u32) -> u64 {
    x as u64
}

/// Binds every access of an op to words of `memory` and hands them to `kernel` in access
/// order. With `copied` (an op whose writes overlap another of its ranges) each access gets a
/// copy of its words, and the written ones go back in access order afterwards: the inputs are
/// read whole before any output is written, as the definitions say. Otherwise the pieces are
/// the buffers' own words, split where the accesses lie (reads that overlap share words).
pub(crate) fn with_pieces<R>(
    accesses: &[Access],
    memory: &mut super::Memory,
    copied: bool,
    kernel: impl for<'a> FnOnce(std::vec::IntoIter<Piece<'a>>) -> R,
) -> R {
    if copied {
        let mut copies: Vec<Vec<u32>> = accesses.iter().map(|a| memory[&a.buffer][a.range()].to_vec()).collect();
        let result = kernel(
            copies
                .iter_mut()
                .zip(accesses)
                .map(|(c, a)| if a.kind == Kind::Read { Piece::Read(c) } else { Piece::Write(c) })
                .collect::<Vec<_>>()
                .into_iter(),
        );
        for (copy, a) in copies.iter().zip(accesses) {
            if a.kind != Kind::Read {
                memory.get_mut(&a.buffer).expect("checked")[a.range()].copy_from_slice(copy);
            }
        }
        return result;
    }
    let mut pieces: Vec<Option<Piece<'_>>> = accesses.iter().map(|_| None).collect();
    for (&handle, words) in memory.iter_mut() {
        // This buffer's accesses by start; runs of overlapping reads share one hull of words.
        let mut mine: Vec<usize> =
            (0..accesses.len()).filter(|&i| accesses[i].buffer == handle && !accesses[i].is_empty()).collect();
        if mine.is_empty() {
            continue;
        }
        mine.sort_by_key(|&i| accesses[i].start);
        let mut rest: &mut [u32] = words;
        let mut cursor = 0u64;
        let mut at = 0;
        while at < mine.len() {
            let first = &accesses[mine[at]];
            let (start, mut end) = (first.start, first.end);
            let mut group = vec![mine[at]];
            at += 1;
            while at < mine.len() && accesses[mine[at]].start < end {
                end = end.max(accesses[mine[at]].end);
                group.push(mine[at]);
                at += 1;
            }
            let (_, tail) = std::mem::take(&mut rest).split_at_mut((start - cursor) as usize);
            let (hull, tail) = tail.split_at_mut((end - start) as usize);
            rest = tail;
            cursor = end;
            if let [only] = group[..] {
                if accesses[only].kind != Kind::Read {
                    pieces[only] = Some(Piece::Write(hull));
                    continue;
                }
            }
            // Reads only: a written access overlaps nothing (`Op::writes_overlap` was false).
            let hull: &[u32] = hull;
            for i in group {
                let a = &accesses[i];
                pieces[i] = Some(Piece::Read(&hull[(a.start - start) as usize..(a.end - start) as usize]));
            }
        }
    }
    let pieces: Vec<Piece<'_>> = pieces
        .into_iter()
        .zip(accesses)
        .map(|(p, a)| p.unwrap_or(if a.kind == Kind::Read { Piece::Read(&[]) } else { Piece::Write(&mut []) }))
        .collect();
    kernel(pieces.into_iter())
}

/// The op table: see the module docs for an entry's form.
macro_rules! op_table {
    ($(
        $(#[doc = $doc:literal])*
        $code:literal $snake:ident $Op:ident {
            $( $(#[doc = $fdoc:literal])* $f:ident : $t:ty $(=> $role:ident ( $($arg:tt)* ))? ),* $(,)?
        }
        $(refuse { $($cond:expr => $why:literal),* $(,)? })?
        samples [ $($sample:expr),* $(,)? ]
    )*) => {
        $(
            $(#[doc = $doc])*
            #[derive(Clone, Copy, Debug, PartialEq)]
            pub struct $Op {
                $( $(#[doc = $fdoc])* pub $f: $t, )*
            }

            impl $Op {
                pub const CODE: u32 = $code;
                pub const NAME: &'static str = stringify!($snake);
                pub const SPEC: $crate::ops::define::OpSpec = $crate::ops::define::OpSpec {
                    code: $code,
                    name: stringify!($snake),
                    fields: &[$(
                        $crate::ops::define::FieldSpec {
                            name: stringify!($f),
                            kind: op_field!(@kind $t; [$($role($($arg)*))?]),
                        },
                    )*],
                    flags: 0 $(| op_field!(@flag_bits [$($role($($arg)*))?]))*,
                };

                /// Every buffer range the op touches, in field order.
                #[allow(unused_variables, clippy::vec_init_then_push)]
                pub fn accesses(&self) -> Vec<$crate::ops::Access> {
                    let $Op { $($f),* } = *self;
                    let mut out = Vec::new();
                    $( op_field!(@access out, $f, $t; [$($role($($arg)*))?]); )*
                    out
                }

                /// A shape the op cannot take, if it has one.
                #[allow(unused_variables)]
                fn refusal(&self) -> Option<&'static str> {
                    let $Op { $($f),* } = *self;
                    $($( if $cond { return Some($why); } )*)?
                    None
                }

                fn encode(&self, e: &mut $crate::ops::define::Encoder) {
                    $( op_field!(@put e, self.$f, $t; [$($role($($arg)*))?]); )*
                }

                fn decode(d: &mut $crate::ops::define::Decoder<'_>) -> Self {
                    $Op { $( $f: op_field!(@take d, $t; [$($role($($arg)*))?]), )* }
                }

                /// The op with its accesses bound to words, in field order.
                fn bind<'a>(&self, pieces: &mut std::vec::IntoIter<$crate::ops::define::Piece<'a>>) -> io::$Op<'a> {
                    io::$Op { $( $f: op_field!(@bind pieces, self.$f, $t; [$($role($($arg)*))?]), )* }
                }
            }

            impl From<$Op> for Op {
                fn from(op: $Op) -> Op {
                    Op::$Op(op)
                }
            }

            const _: () = assert!(
                $Op::SPEC.param_words() <= $crate::ops::define::MAX_PARAMS
                    && $Op::SPEC.buffer_count() <= $crate::ops::define::MAX_BUFFERS,
                "an op's record holds at most 24 parameter words and 8 buffers"
            );
        )*

        /// One op of a training step (the op table, `table.rs`). Lengths are in words; every
        /// buffer holds 32-bit words (f32, or `u32` for tokens, targets and the hash).
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub enum Op {
            $( $(#[doc = $doc])* $Op($Op), )*
        }

        /// Every op's entry, by code.
        pub const OPS: &[$crate::ops::define::OpSpec] = &[$($Op::SPEC),*];

        const _: () = {
            let mut i = 0;
            while i < OPS.len() {
                assert!(OPS[i].code as usize == i, "op codes are 0, 1, 2, … in table order");
                i += 1;
            }
        };

        impl Op {
            /// The op's short name (its ABI name, `docs/VERIFICATION.md` §9).
            pub fn name(&self) -> &'static str {
                match self { $( Op::$Op(_) => $Op::NAME, )* }
            }

            /// The op's code (its bit in a plugin's `ops` is `1 << code`).
            pub fn code(&self) -> u32 {
                match self { $( Op::$Op(_) => $Op::CODE, )* }
            }

            pub fn spec(&self) -> &'static $crate::ops::define::OpSpec {
                &OPS[self.code() as usize]
            }

            /// Every buffer range the op touches, in field order.
            pub fn accesses(&self) -> Vec<$crate::ops::Access> {
                match self { $( Op::$Op(op) => op.accesses(), )* }
            }

            pub(crate) fn refusal(&self) -> Option<&'static str> {
                match self { $( Op::$Op(op) => op.refusal(), )* }
            }

            /// The op's ABI record.
            pub fn record(&self) -> $crate::ops::define::Record {
                let mut e = $crate::ops::define::Encoder::new(self.code());
                match self { $( Op::$Op(op) => op.encode(&mut e), )* }
                e.finish()
            }

            /// The op a record describes; unknown codes and flags are refused.
            pub fn from_record(record: &$crate::ops::define::Record) -> Result<Op, $crate::ops::define::DecodeError> {
                use $crate::ops::define::{Decoder, DecodeError};
                let spec = OPS.get(record.code as usize).ok_or(DecodeError::UnknownCode(record.code))?;
                if record.flags & !spec.flags != 0 {
                    return Err(DecodeError::UnknownFlags { code: record.code, flags: record.flags });
                }
                let mut d = Decoder::new(record);
                Ok(match record.code {
                    $( $code => Op::$Op($Op::decode(&mut d)), )*
                    _ => unreachable!("every code below OPS.len() is an entry"),
                })
            }

            /// Runs the reference kernel on bound words (see `with_pieces`).
            pub(crate) fn reference_on(&self, mut pieces: std::vec::IntoIter<$crate::ops::define::Piece<'_>>) -> Result<(), $crate::ops::OpError> {
                match self { $( Op::$Op(op) => op.bind(&mut pieces).reference(), )* }
            }
        }

        /// The instances of every op that the conformance suite and the gate run on every
        /// backend, in table order (their handles are placeholders, see `Op::with_buffers`).
        pub fn samples() -> Vec<Op> {
            vec![$($(Op::from($sample),)*)*]
        }

        /// Each op with its buffers bound to words: scalars as they are, spans as slices, views
        /// as [`View`](crate::ops::define::View)s. What a reference kernel works on.
        pub mod io {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[derive(Debug)]
                pub struct $Op<'a> {
                    $( pub $f: op_field!(@io_ty 'a, $t; [$($role($($arg)*))?]), )*
                }
            )*
        }
    };
}

/// One field of an entry, by its role (the empty role is a scalar).
macro_rules! op_field {
    // What the field is, for the generators.
    (@kind $t:ty; []) => { $crate::ops::define::FieldKind::Scalar { slots: <$t as $crate::ops::define::Scalar>::SLOTS } };
    (@kind $t:ty; [flag($bit:path)]) => { $crate::ops::define::FieldKind::Flag { bit: $bit } };
    (@kind $t:ty; [optional($bit:path, $($x:tt)*)]) => {
        $crate::ops::define::FieldKind::Buffer { slots: &[""], access: $crate::ops::Kind::Read, flag: Some($bit) }
    };
    (@kind $t:ty; [$role:ident($($x:tt)*)]) => {
        $crate::ops::define::FieldKind::Buffer {
            slots: <$t as $crate::ops::define::Buffer>::SLOTS,
            access: op_field!(@access_kind $role),
            flag: None,
        }
    };
    (@access_kind read) => { $crate::ops::Kind::Read };
    (@access_kind write) => { $crate::ops::Kind::Write };
    (@access_kind update) => { $crate::ops::Kind::Update };

    (@flag_bits [flag($bit:path)]) => { $bit };
    (@flag_bits [optional($bit:path, $($x:tt)*)]) => { $bit };
    (@flag_bits [$($x:tt)*]) => { 0 };

    // Its accesses.
    (@access $out:ident, $v:ident, $t:ty; []) => {};
    (@access $out:ident, $v:ident, $t:ty; [flag($($x:tt)*)]) => {};
    (@access $out:ident, $v:ident, $t:ty; [optional($bit:path, $ext:expr)]) => {
        if let Some(span) = $v {
            $out.push(<$crate::ops::Span as $crate::ops::define::Buffer>::access(
                span, $ext, $crate::ops::Kind::Read, $crate::ops::Values::Finite,
            ));
        }
    };
    (@access $out:ident, $v:ident, $t:ty; [$role:ident($ext:expr)]) => {
        $out.push(<$t as $crate::ops::define::Buffer>::access(
            $v, $ext, op_field!(@access_kind $role), $crate::ops::Values::Finite,
        ))
    };
    (@access $out:ident, $v:ident, $t:ty; [$role:ident($ext:expr, tokens($bound:expr))]) => {
        $out.push(<$t as $crate::ops::define::Buffer>::access(
            $v, $ext, op_field!(@access_kind $role), $crate::ops::Values::Below($bound),
        ))
    };
    (@access $out:ident, $v:ident, $t:ty; [$role:ident($ext:expr, nonneg)]) => {
        $out.push(<$t as $crate::ops::define::Buffer>::access(
            $v, $ext, op_field!(@access_kind $role), $crate::ops::Values::NonNegative,
        ))
    };

    // Its part of the record.
    (@put $e:ident, $v:expr, $t:ty; []) => { <$t as $crate::ops::define::Scalar>::put($v, $e) };
    (@put $e:ident, $v:expr, $t:ty; [flag($bit:path)]) => { $e.flag($v, $bit) };
    (@put $e:ident, $v:expr, $t:ty; [optional($bit:path, $($x:tt)*)]) => {
        $crate::ops::define::put_optional($v, $bit, $e)
    };
    (@put $e:ident, $v:expr, $t:ty; [$role:ident($($x:tt)*)]) => {
        <$t as $crate::ops::define::Buffer>::put($v, $e)
    };

    (@take $d:ident, $t:ty; []) => { <$t as $crate::ops::define::Scalar>::take($d) };
    (@take $d:ident, $t:ty; [flag($bit:path)]) => { $d.flag($bit) };
    (@take $d:ident, $t:ty; [optional($bit:path, $($x:tt)*)]) => { $crate::ops::define::take_optional($bit, $d) };
    (@take $d:ident, $t:ty; [$role:ident($($x:tt)*)]) => { <$t as $crate::ops::define::Buffer>::take($d) };

    // Its bound form, for the reference kernel.
    (@io_ty $lt:lifetime, $t:ty; []) => { $t };
    (@io_ty $lt:lifetime, $t:ty; [flag($($x:tt)*)]) => { bool };
    (@io_ty $lt:lifetime, $t:ty; [optional($($x:tt)*)]) => { Option<&$lt [u32]> };
    (@io_ty $lt:lifetime, $t:ty; [read($($x:tt)*)]) => { <$t as $crate::ops::define::Buffer>::Read<$lt> };
    (@io_ty $lt:lifetime, $t:ty; [$role:ident($($x:tt)*)]) => { <$t as $crate::ops::define::Buffer>::Write<$lt> };

    (@bind $p:ident, $v:expr, $t:ty; []) => { $v };
    (@bind $p:ident, $v:expr, $t:ty; [flag($($x:tt)*)]) => { $v };
    (@bind $p:ident, $v:expr, $t:ty; [optional($($x:tt)*)]) => {
        $v.map(|_| $p.next().expect("one piece per access").read())
    };
    (@bind $p:ident, $v:expr, $t:ty; [read($($x:tt)*)]) => {
        <$t as $crate::ops::define::Buffer>::bind_read($v, $p.next().expect("one piece per access"))
    };
    (@bind $p:ident, $v:expr, $t:ty; [$role:ident($($x:tt)*)]) => {
        <$t as $crate::ops::define::Buffer>::bind_write($v, $p.next().expect("one piece per access"))
    };
}
