//! The ABI's types and numbers: versions, status codes, capability and creation flags, the
//! options a host creates an instance with, the error buffer, and the function table. The C
//! header (`include/lockstep_worker.h`) states the same layout; tests here pin it.

use std::ffi::{c_char, c_void};

use crate::ops;

/// ABI major version. 2: plugin-owned buffers and the training step's ops (appended after 1.2's
/// table). A host loads majors [`ABI_MAJOR_OLDEST`] ..= this one; a 1.x plugin is a product-only
/// backend, as it always was.
pub const ABI_MAJOR: u16 = 2;
/// The oldest major version a host still loads.
pub const ABI_MAJOR_OLDEST: u16 = 1;
/// ABI minor version: fields appended within one major version. 2.1: `time_peak`.
pub const ABI_MINOR: u16 = 1;
/// The one exported symbol, without its NUL.
pub const ENTRY_SYMBOL: &str = "lockstep_worker_entry";

/// Integer status codes returned by every call that can fail.
pub mod status {
    pub const OK: i32 = 0;
    /// A null pointer, zero-sized or overflowing shape, or a bad option.
    pub const INVALID_ARGUMENT: i32 = 1;
    /// A NaN or ±Inf input: the units accept finite values only.
    pub const NON_FINITE_INPUT: i32 = 2;
    /// The plugin does not implement the call.
    pub const UNSUPPORTED: i32 = 3;
    /// The device (GPU, driver) failed, or no suitable device exists.
    pub const DEVICE_ERROR: i32 = 4;
    /// The plugin panicked; the instance must not be used again.
    pub const PANIC: i32 = 5;
    /// Any other failure inside the plugin.
    pub const INTERNAL: i32 = 6;

    /// A short name for a status code.
    pub fn name(code: i32) -> &'static str {
        match code {
            OK => "ok",
            INVALID_ARGUMENT => "invalid argument",
            NON_FINITE_INPUT => "non-finite input",
            UNSUPPORTED => "unsupported",
            DEVICE_ERROR => "device error",
            PANIC => "panic",
            INTERNAL => "internal error",
            _ => "unknown status",
        }
    }
}

/// Capability flags in [`WorkerVTable::capabilities`].
pub mod caps {
    /// `gemm_f32`: the full unit, f32 in and out. Required.
    pub const GEMM_F32: u64 = 1 << 0;
    /// `gemm_i8`: the raw integer product over the full i8 range. Required.
    pub const GEMM_I8: u64 = 1 << 1;
    /// `time_kernel` (ABI 1.1): times the device kernel alone on operands already resident
    /// on the device, for benchmarks. Optional.
    pub const KERNEL_TIMING: u64 = 1 << 2;
    /// The plugin computes on an accelerator and serializes calls on it: hosts use one
    /// instance rather than one per thread. Informational (ABI 1.1).
    pub const DEVICE: u64 = 1 << 3;
    /// `time_peak` (ABI 2.1): the int8 rate of the path the plugin's products use, in a
    /// register-resident loop, for benchmarks to set the kernel's rate against. Optional.
    pub const PEAK_TIMING: u64 = 1 << 4;
    /// Bits 8 and 9 were reserved in ABI 1 for a fused attention entry and a back-to-back MLP
    /// chain entry. ABI 2 retires them: attention is the batched products and the causal
    /// softmax ops of one `run_ops` call, the MLP its products (bias riding on them) and the
    /// GELU ops, all on plugin-owned buffers, which is what the fused entries were for. A host
    /// ignores these bits and they are never given another meaning.
    pub const RETIRED: u64 = (1 << 8) | (1 << 9);
    /// What every v1 plugin must offer.
    pub const REQUIRED: u64 = GEMM_F32 | GEMM_I8;
}

/// Bits of [`CreateOptions::flags`] (ABI 1.1; 1.0 had none).
pub mod create_flags {
    /// Refuse to run on a software adapter (lavapipe, SwiftShader): the host's automatic
    /// backend choice sets it, because such an adapter is slower than the CPU mirror. CPU
    /// plugins accept and ignore it.
    pub const HARDWARE_ONLY: u64 = 1 << 0;
    /// Every bit this ABI version defines.
    pub const KNOWN: u64 = HARDWARE_ONLY;
}

/// A host-owned buffer the plugin writes an error message into (UTF-8, not NUL-terminated).
#[repr(C)]
#[derive(Debug)]
pub struct ErrorBuf {
    pub ptr: *mut u8,
    pub capacity: u32,
    /// Set by the plugin: bytes written.
    pub len: u32,
}

/// Options for creating an instance. `struct_size` comes first so it can grow: a plugin reads
/// the fields that fit in `struct_size` and takes the defaults (zero, null) for the rest, so a
/// host of an older minor version works with a newer plugin and the other way round.
///
/// Everything that decides what an instance computes with comes from the host through here —
/// never from the plugin's environment — so the gate sees what will run.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CreateOptions {
    pub struct_size: u32,
    /// Worker threads a CPU plugin may use; 0 means all available.
    pub threads: u32,
    /// Bits from [`create_flags`]; a plugin refuses bits it does not know.
    pub flags: u64,
    /// (1.2) Device plugins: use the adapter whose name contains this text (UTF-8, not
    /// NUL-terminated, case-insensitive). Null with `adapter_len` 0: the plugin's choice. The
    /// bytes stay readable for the duration of `create` only.
    pub adapter: *const u8,
    pub adapter_len: u32,
    /// (1.2) Device plugins: the workgroup tile `[tm, tn, wx, wy, kb]`. All zero: the
    /// plugin's choice. The tile decides which invocation computes an output, never a bit.
    pub tile: [u32; 5],
}

/// `struct_size` of ABI 1.1's options (`threads` and `flags`), the smallest a plugin accepts.
pub const CREATE_OPTIONS_1_1_SIZE: u32 = 16;

impl CreateOptions {
    pub fn new(threads: u32) -> Self {
        Self {
            struct_size: std::mem::size_of::<Self>() as u32,
            threads,
            flags: 0,
            adapter: std::ptr::null(),
            adapter_len: 0,
            tile: [0; 5],
        }
    }
}

/// `create(options, out_instance, error) -> status`
pub type CreateFn =
    unsafe extern "C" fn(options: *const CreateOptions, out: *mut *mut c_void, error: *mut ErrorBuf) -> i32;
/// `destroy(instance)`
pub type DestroyFn = unsafe extern "C" fn(instance: *mut c_void);
/// `describe(instance, out) -> status`: a one-line description of the device in use.
pub type DescribeFn = unsafe extern "C" fn(instance: *mut c_void, out: *mut ErrorBuf) -> i32;
/// `gemm_f32(instance, m, n, k, a, b, c, error) -> status`: the unit `C = A · Bᵀ`, with `A`
/// `m × k`, `B` `n × k` and `C` `m × n`, all row-major f32, exactly as `lockstep_luts::gemm_nt`.
pub type GemmF32Fn = unsafe extern "C" fn(
    instance: *mut c_void,
    m: u32,
    n: u32,
    k: u32,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    error: *mut ErrorBuf,
) -> i32;
/// `gemm_i8(instance, m, n, k, a, b, c, error) -> status`: `C = A · Bᵀ` over the full i8 range
/// with i32 accumulation, exactly as `lockstep_luts::gemm_i8_nt`.
pub type GemmI8Fn = unsafe extern "C" fn(
    instance: *mut c_void,
    m: u32,
    n: u32,
    k: u32,
    a: *const i8,
    b: *const i8,
    c: *mut i32,
    error: *mut ErrorBuf,
) -> i32;
/// `time_kernel(instance, m, n, k, repeat, out_seconds, error) -> status` (ABI 1.1): uploads
/// operands of an `m × n × k` unit once, then runs the unit's device kernel `repeat` times and
/// writes the seconds per run, excluding quantization and transfers.
pub type TimeKernelFn = unsafe extern "C" fn(
    instance: *mut c_void,
    m: u32,
    n: u32,
    k: u32,
    repeat: u32,
    out_seconds: *mut f64,
    error: *mut ErrorBuf,
) -> i32;
/// `buffer_create(instance, words, out_handle, error) -> status` (2.0): a plugin-owned buffer of
/// `words` 32-bit words, named by a non-zero handle.
pub type BufferCreateFn =
    unsafe extern "C" fn(instance: *mut c_void, words: u64, out: *mut u64, error: *mut ErrorBuf) -> i32;
/// `buffer_free(instance, handle)` (2.0).
pub type BufferFreeFn = unsafe extern "C" fn(instance: *mut c_void, handle: u64);
/// `buffer_write(instance, handle, offset, src, words, error) -> status` (2.0): copies `words`
/// words from host memory to words `offset ..` of the buffer.
pub type BufferWriteFn = unsafe extern "C" fn(
    instance: *mut c_void,
    handle: u64,
    offset: u64,
    src: *const u32,
    words: u64,
    error: *mut ErrorBuf,
) -> i32;
/// `buffer_read(instance, handle, offset, dst, words, error) -> status` (2.0).
pub type BufferReadFn = unsafe extern "C" fn(
    instance: *mut c_void,
    handle: u64,
    offset: u64,
    dst: *mut u32,
    words: u64,
    error: *mut ErrorBuf,
) -> i32;
/// `run_ops(instance, ops, count, error) -> status` (2.0): runs `count` [`ops::OpCall`]s in
/// order, a whole step's sequence at once if the host likes. Each op means exactly what
/// `lockstep_luts::ops` defines; an op the plugin's [`WorkerVTable::ops`] lacks is
/// `UNSUPPORTED`, one whose views leave their buffers `INVALID_ARGUMENT`, a non-finite operand
/// of the units `NON_FINITE_INPUT`. After a failure the ops' outputs are undefined.
pub type RunOpsFn =
    unsafe extern "C" fn(instance: *mut c_void, ops: *const ops::OpCall, count: u32, error: *mut ErrorBuf) -> i32;
/// `time_peak(instance, repeat, out_ops_per_second, error) -> status` (ABI 2.1): runs the
/// plugin's product path (the DP4A instruction, table lookups, tensor cores) `repeat` times over
/// operands held in registers or workgroup memory, no memory traffic, and writes the int8
/// operations (a multiply and an add each) per second it reached: the ceiling its products'
/// `time_kernel` rate is measured against.
pub type TimePeakFn =
    unsafe extern "C" fn(instance: *mut c_void, repeat: u32, out_ops_per_second: *mut f64, error: *mut ErrorBuf) -> i32;
/// The entry symbol's type.
pub type EntryFn = unsafe extern "C" fn() -> *const WorkerVTable;

/// The table a plugin's entry symbol returns. Append-only; see the crate docs.
#[repr(C)]
#[derive(Debug)]
pub struct WorkerVTable {
    pub abi_major: u16,
    pub abi_minor: u16,
    /// `size_of::<WorkerVTable>()` as the plugin was compiled.
    pub struct_size: u32,
    pub capabilities: u64,
    /// Static NUL-terminated short name, e.g. `cpu`.
    pub name: *const c_char,
    /// Static NUL-terminated one-line description.
    pub description: *const c_char,
    pub create: Option<CreateFn>,
    pub destroy: Option<DestroyFn>,
    pub describe: Option<DescribeFn>,
    pub gemm_f32: Option<GemmF32Fn>,
    pub gemm_i8: Option<GemmI8Fn>,
    // ---- ABI 1.1 ----
    pub time_kernel: Option<TimeKernelFn>,
    // ---- ABI 2.0 ----
    /// One bit per op the plugin runs ([`ops::bit`]); 0 for a product-only backend.
    pub ops: u64,
    pub buffer_create: Option<BufferCreateFn>,
    pub buffer_free: Option<BufferFreeFn>,
    pub buffer_write: Option<BufferWriteFn>,
    pub buffer_read: Option<BufferReadFn>,
    pub run_ops: Option<RunOpsFn>,
    // ---- ABI 2.1 ----
    pub time_peak: Option<TimePeakFn>,
}

/// Size of an ABI 1.0 table: the smallest a host accepts. Fields past it are read only when
/// `struct_size` covers them.
pub const TABLE_SIZE_1_0: u32 = 72;
/// Size of an ABI 2.0 table: the smallest a host accepts from a major-2 plugin.
pub const TABLE_SIZE_2_0: u32 = 128;

// SAFETY: the table is immutable and its pointers point at static, immutable data (string
// literals and functions), so sharing it between threads is sound.
unsafe impl Sync for WorkerVTable {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// Golden layout: changing any of these numbers is an ABI break.
    #[test]
    fn vtable_layout_is_pinned() {
        assert_eq!(size_of::<WorkerVTable>(), 136);
        assert_eq!(TABLE_SIZE_1_0, 72);
        assert_eq!(TABLE_SIZE_2_0, 128);
        assert_eq!((ABI_MAJOR, ABI_MINOR, ABI_MAJOR_OLDEST), (2, 1, 1));
        assert_eq!(align_of::<WorkerVTable>(), 8);
        assert_eq!(offset_of!(WorkerVTable, abi_major), 0);
        assert_eq!(offset_of!(WorkerVTable, abi_minor), 2);
        assert_eq!(offset_of!(WorkerVTable, struct_size), 4);
        assert_eq!(offset_of!(WorkerVTable, capabilities), 8);
        assert_eq!(offset_of!(WorkerVTable, name), 16);
        assert_eq!(offset_of!(WorkerVTable, description), 24);
        assert_eq!(offset_of!(WorkerVTable, create), 32);
        assert_eq!(offset_of!(WorkerVTable, destroy), 40);
        assert_eq!(offset_of!(WorkerVTable, describe), 48);
        assert_eq!(offset_of!(WorkerVTable, gemm_f32), 56);
        assert_eq!(offset_of!(WorkerVTable, gemm_i8), 64);
        assert_eq!(offset_of!(WorkerVTable, time_kernel), 72);
        assert_eq!(offset_of!(WorkerVTable, ops), 80);
        assert_eq!(offset_of!(WorkerVTable, buffer_create), 88);
        assert_eq!(offset_of!(WorkerVTable, buffer_free), 96);
        assert_eq!(offset_of!(WorkerVTable, buffer_write), 104);
        assert_eq!(offset_of!(WorkerVTable, buffer_read), 112);
        assert_eq!(offset_of!(WorkerVTable, run_ops), 120);
        assert_eq!(offset_of!(WorkerVTable, time_peak), 128);
        // A nullable function pointer is one pointer wide.
        assert_eq!(size_of::<Option<GemmF32Fn>>(), size_of::<usize>());
    }

    #[test]
    fn option_and_error_layouts_are_pinned() {
        assert_eq!(size_of::<CreateOptions>(), 48);
        assert_eq!(offset_of!(CreateOptions, struct_size), 0);
        assert_eq!(offset_of!(CreateOptions, threads), 4);
        assert_eq!(offset_of!(CreateOptions, flags), 8);
        assert_eq!(offset_of!(CreateOptions, adapter), 16);
        assert_eq!(offset_of!(CreateOptions, adapter_len), 24);
        assert_eq!(offset_of!(CreateOptions, tile), 28);
        assert_eq!(CreateOptions::new(3).struct_size, 48);
        assert_eq!(CREATE_OPTIONS_1_1_SIZE as usize, offset_of!(CreateOptions, adapter));
        assert_eq!(size_of::<ErrorBuf>(), 16);
        assert_eq!(offset_of!(ErrorBuf, ptr), 0);
        assert_eq!(offset_of!(ErrorBuf, capacity), 8);
        assert_eq!(offset_of!(ErrorBuf, len), 12);
    }

    /// The header's op constants are the op table's (`lockstep_luts::ops::generate`): when the
    /// table changed, this rewrites the header's generated part and fails, so the next run passes
    /// and the change is committed with the table.
    #[test]
    fn the_c_headers_op_constants_are_generated_from_the_op_table() {
        use lockstep_luts::ops::generate::{c_header, C_BEGIN, C_END};
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/lockstep_worker.h");
        let text = std::fs::read_to_string(path).unwrap();
        let (begin, end) = (text.find(C_BEGIN).expect("the begin marker"), text.find(C_END).expect("the end marker"));
        let fresh = format!("{}{}{}", &text[..begin], c_header(), &text[end + C_END.len() + 1..]);
        if fresh != text {
            std::fs::write(path, fresh).unwrap();
            panic!("{path} was stale and has been rewritten from the op table: run the tests again and commit it");
        }
    }

    /// The C header states the same layout: a C compiler checks its static assertions, and its
    /// version, status, capability and op numbers are the Rust ones.
    #[test]
    fn the_c_header_compiles_and_pins_the_layout() {
        let header = concat!(env!("CARGO_MANIFEST_DIR"), "/include/lockstep_worker.h");
        let out = std::process::Command::new("cc")
            .args(["-std=c11", "-fsyntax-only", "-Wall", "-Werror", "-x", "c", header])
            .output()
            .expect("a C compiler `cc` (Rust links with it)");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = std::fs::read_to_string(header).unwrap();
        let define = |name: &str| -> String {
            let line =
                text.lines().find(|l| l.starts_with(&format!("#define {name} "))).unwrap_or_else(|| panic!("{name}"));
            line[format!("#define {name} ").len()..].split("/*").next().unwrap().trim().to_string()
        };
        assert_eq!(define("LOCKSTEP_ABI_MAJOR"), ABI_MAJOR.to_string());
        assert_eq!(define("LOCKSTEP_ABI_MINOR"), ABI_MINOR.to_string());
        assert_eq!(define("LOCKSTEP_ABI_MAJOR_OLDEST"), ABI_MAJOR_OLDEST.to_string());
        assert_eq!(define("LOCKSTEP_NON_FINITE_INPUT"), status::NON_FINITE_INPUT.to_string());
        assert_eq!(define("LOCKSTEP_INTERNAL"), status::INTERNAL.to_string());
        assert_eq!(define("LOCKSTEP_OP_COUNT"), ops::COUNT.to_string());
        assert_eq!(format!("\"{}\"", ENTRY_SYMBOL), define("LOCKSTEP_ENTRY_SYMBOL"));
        assert_eq!(define("LOCKSTEP_CAP_RETIRED"), "((1ull << 8) | (1ull << 9))");
        assert_eq!(caps::RETIRED, (1 << 8) | (1 << 9));
    }

    #[test]
    fn status_codes_are_pinned() {
        let codes = [
            (status::OK, 0, "ok"),
            (status::INVALID_ARGUMENT, 1, "invalid argument"),
            (status::NON_FINITE_INPUT, 2, "non-finite input"),
            (status::UNSUPPORTED, 3, "unsupported"),
            (status::DEVICE_ERROR, 4, "device error"),
            (status::PANIC, 5, "panic"),
            (status::INTERNAL, 6, "internal error"),
        ];
        for (code, value, name) in codes {
            assert_eq!(code, value);
            assert_eq!(status::name(code), name);
        }
        assert_eq!(status::name(99), "unknown status");
        assert_eq!(caps::REQUIRED, 0b11);
        assert_eq!(caps::KERNEL_TIMING, 0b100);
        // No capability in use overlaps the retired bits.
        assert_eq!(caps::PEAK_TIMING, 0b1_0000);
        let used = caps::REQUIRED | caps::KERNEL_TIMING | caps::DEVICE | caps::PEAK_TIMING;
        assert_eq!(used & caps::RETIRED, 0);
        assert_eq!(ENTRY_SYMBOL, "lockstep_worker_entry");
    }
}
