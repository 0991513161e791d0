//! The plugin side: implement [`Worker`], then `export_worker!(MyWorker)`.
//!
//! The generic `extern "C"` functions here are what the macro puts into the table. Each checks
//! its pointers and shape, turns them into slices, calls the safe trait method inside
//! `catch_unwind`, and maps the outcome onto a status code and an error message.

use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::abi::{status, CreateOptions, ErrorBuf, WorkerVTable, ABI_MAJOR, ABI_MINOR};

/// A failed call: a status code from [`crate::status`] and a message for the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerError {
    pub status: i32,
    pub message: String,
}

impl WorkerError {
    pub fn new(status: i32, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }
}

/// What a compute backend implements. Instances are used from one thread at a time.
pub trait Worker: Sized + 'static {
    /// Short name, e.g. `c"cpu"`.
    const NAME: &'static CStr;
    /// One line for listings.
    const DESCRIPTION: &'static CStr;
    /// Flags from [`crate::caps`]; must include [`crate::caps::REQUIRED`].
    const CAPABILITIES: u64;

    fn create(options: &CreateOptions) -> Result<Self, WorkerError>;

    /// One line about the device in use (e.g. the adapter name).
    fn describe(&self) -> String;

    /// `c = a · bᵀ`; slices already have the lengths the shape implies.
    fn gemm_f32(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<(), WorkerError>;

    /// `c = a · bᵀ` over i8 with i32 accumulation.
    fn gemm_i8(&mut self, m: usize, n: usize, k: usize, a: &[i8], b: &[i8], c: &mut [i32]) -> Result<(), WorkerError>;

    /// Seconds per run of the device kernel alone (see [`crate::TimeKernelFn`]). Plugins
    /// with [`crate::caps::KERNEL_TIMING`] implement it.
    fn time_kernel(&mut self, _m: usize, _n: usize, _k: usize, _repeat: usize) -> Result<f64, WorkerError> {
        Err(WorkerError::new(status::UNSUPPORTED, "this plugin does not time its kernel"))
    }

    /// (2.1) Int8 operations per second of the product path in a register-resident loop (see
    /// [`crate::TimePeakFn`]). Plugins with [`crate::caps::PEAK_TIMING`] implement it.
    fn time_peak(&mut self, _repeat: usize) -> Result<f64, WorkerError> {
        Err(WorkerError::new(status::UNSUPPORTED, "this plugin does not time its product path"))
    }

    /// (2.0) The ops this plugin runs, [`crate::ops::bit`] per op; 0: products only, and the
    /// buffer methods below are never called.
    const OPS: u64 = 0;

    /// (2.0) A buffer of `words` words; returns its non-zero handle.
    fn buffer_create(&mut self, _words: usize) -> Result<u64, WorkerError> {
        Err(unsupported_ops())
    }

    /// (2.0) Frees a buffer; unknown handles are ignored.
    fn buffer_free(&mut self, _handle: u64) {}

    /// (2.0) Copies `data` into words `offset ..` of a buffer.
    fn buffer_write(&mut self, _handle: u64, _offset: usize, _data: &[u32]) -> Result<(), WorkerError> {
        Err(unsupported_ops())
    }

    /// (2.0) Copies words `offset ..` of a buffer into `out`.
    fn buffer_read(&mut self, _handle: u64, _offset: usize, _out: &mut [u32]) -> Result<(), WorkerError> {
        Err(unsupported_ops())
    }

    /// (2.0) Runs decoded ops in order (see [`crate::RunOpsFn`]).
    fn run_ops(&mut self, _ops: &[lockstep_luts::ops::Op]) -> Result<(), WorkerError> {
        Err(unsupported_ops())
    }
}

fn unsupported_ops() -> WorkerError {
    WorkerError::new(status::UNSUPPORTED, "this plugin computes products only (no ABI 2 ops)")
}

/// Refuses option flags this ABI version does not define (every plugin's `create` calls it).
pub fn check_create_flags(options: &CreateOptions) -> Result<(), WorkerError> {
    let unknown = options.flags & !crate::abi::create_flags::KNOWN;
    if unknown != 0 {
        return Err(WorkerError::new(status::INVALID_ARGUMENT, format!("unknown option flags {unknown:#x}")));
    }
    Ok(())
}

/// The adapter name the host asked for (ABI 1.2), if any.
pub fn requested_adapter(options: &CreateOptions) -> Result<Option<String>, WorkerError> {
    if options.adapter.is_null() || options.adapter_len == 0 {
        return Ok(None);
    }
    // SAFETY: the ABI makes the host keep `adapter_len` readable bytes at `adapter` for the
    // duration of `create`, which is when plugins call this.
    let bytes = unsafe { std::slice::from_raw_parts(options.adapter, options.adapter_len as usize) };
    let text = std::str::from_utf8(bytes).map_err(|_| invalid("the adapter name is not UTF-8"))?;
    Ok(Some(text.to_string()))
}

/// The tile the host asked for (ABI 1.2): `[tm, tn, wx, wy, kb]`, or `None` for all zero.
pub fn requested_tile(options: &CreateOptions) -> Option<[u32; 5]> {
    (options.tile != [0; 5]).then_some(options.tile)
}

/// Builds the static table for `W`. Used by [`crate::export_worker!`].
pub const fn vtable<W: Worker>() -> WorkerVTable {
    WorkerVTable {
        abi_major: ABI_MAJOR,
        abi_minor: ABI_MINOR,
        struct_size: std::mem::size_of::<WorkerVTable>() as u32,
        capabilities: W::CAPABILITIES,
        name: W::NAME.as_ptr(),
        description: W::DESCRIPTION.as_ptr(),
        create: Some(create::<W>),
        destroy: Some(destroy::<W>),
        describe: Some(describe::<W>),
        gemm_f32: Some(gemm_f32::<W>),
        gemm_i8: Some(gemm_i8::<W>),
        time_kernel: Some(time_kernel::<W>),
        ops: W::OPS,
        buffer_create: Some(buffer_create::<W>),
        buffer_free: Some(buffer_free::<W>),
        buffer_write: Some(buffer_write::<W>),
        buffer_read: Some(buffer_read::<W>),
        run_ops: Some(run_ops::<W>),
        time_peak: Some(time_peak::<W>),
    }
}

/// Exports `$worker` (a [`Worker`]) as this library's plugin entry point.
#[macro_export]
macro_rules! export_worker {
    ($worker:ty) => {
        static LOCKSTEP_WORKER_VTABLE: $crate::WorkerVTable = $crate::plugin::vtable::<$worker>();

        /// The plugin entry point: returns the static function table.
        #[no_mangle]
        pub extern "C" fn lockstep_worker_entry() -> *const $crate::WorkerVTable {
            &LOCKSTEP_WORKER_VTABLE
        }
    };
}

/// Writes `message` into a host-owned buffer, truncated at a character boundary.
///
/// # Safety
/// `error` is null or points at an `ErrorBuf` whose `ptr` is valid for `capacity` bytes.
pub unsafe fn write_error(error: *mut ErrorBuf, message: &str) {
    // SAFETY: the caller promises `error` is null or valid.
    let Some(error) = (unsafe { error.as_mut() }) else { return };
    if error.ptr.is_null() {
        error.len = 0;
        return;
    }
    let mut len = message.len().min(error.capacity as usize);
    while !message.is_char_boundary(len) {
        len -= 1;
    }
    // SAFETY: `ptr` is valid for `capacity ≥ len` bytes, and the regions cannot overlap since
    // `message` is plugin-owned.
    unsafe { std::ptr::copy_nonoverlapping(message.as_ptr(), error.ptr, len) };
    error.len = len as u32;
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs `body` with panics caught, writing any error into `error`.
unsafe fn guarded(error: *mut ErrorBuf, body: impl FnOnce() -> Result<(), WorkerError>) -> i32 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => status::OK,
        Ok(Err(failure)) => {
            // SAFETY: forwarded from our caller's contract.
            unsafe { write_error(error, &failure.message) };
            failure.status
        }
        Err(payload) => {
            let message = format!("plugin panicked: {}", panic_message(payload.as_ref()));
            // SAFETY: forwarded from our caller's contract.
            unsafe { write_error(error, &message) };
            status::PANIC
        }
    }
}

/// Non-finite operands are refused before the plugin sees them, so a refused call writes
/// nothing (the ABI's promise, `include/lockstep_worker.h`), however the plugin splits its work.
fn refuse_non_finite(a: &[f32], b: &[f32]) -> Result<(), WorkerError> {
    use lockstep_luts::units::{first_non_finite, Operand, UnitError};
    for (values, operand) in [(a, Operand::A), (b, Operand::B)] {
        if let Some(index) = first_non_finite(values) {
            let error = UnitError::NonFinite { operand, index, bits: values[index].to_bits() };
            return Err(WorkerError::new(status::NON_FINITE_INPUT, error.to_string()));
        }
    }
    Ok(())
}

fn invalid(message: impl Into<String>) -> WorkerError {
    WorkerError::new(status::INVALID_ARGUMENT, message)
}

/// Element count of an `rows × cols` operand, refusing overflow.
fn elements(rows: u32, cols: u32) -> Result<usize, WorkerError> {
    (rows as usize).checked_mul(cols as usize).ok_or_else(|| invalid(format!("shape {rows} × {cols} overflows")))
}

/// A slice from a host pointer, refusing null for non-empty data.
///
/// # Safety
/// A non-null `ptr` must be valid for `len` elements for the call's duration.
unsafe fn slice<'a, T>(ptr: *const T, len: usize, what: &str) -> Result<&'a [T], WorkerError> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: non-null and valid for `len` elements by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// # Safety
/// As [`slice`], and the memory must not be aliased during the call.
unsafe fn slice_mut<'a, T>(ptr: *mut T, len: usize, what: &str) -> Result<&'a mut [T], WorkerError> {
    if len == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: non-null, valid and unaliased for `len` elements by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// # Safety
/// A non-null `instance` must come from `create::<W>` and not have been destroyed.
unsafe fn instance<'a, W>(instance: *mut c_void) -> Result<&'a mut W, WorkerError> {
    // SAFETY: by the caller's contract the pointer is null or a live `W`.
    unsafe { instance.cast::<W>().as_mut() }.ok_or_else(|| invalid("instance is null"))
}

unsafe extern "C" fn create<W: Worker>(
    options: *const CreateOptions,
    out: *mut *mut c_void,
    error: *mut ErrorBuf,
) -> i32 {
    // SAFETY: the host passes valid pointers or null, which the body checks.
    unsafe {
        guarded(error, || {
            let given = options.as_ref().ok_or_else(|| invalid("options are null"))?;
            if given.struct_size < crate::abi::CREATE_OPTIONS_1_1_SIZE {
                return Err(invalid(format!("options struct_size {} is too small", given.struct_size)));
            }
            if out.is_null() {
                return Err(invalid("out pointer is null"));
            }
            // Fields past the host's `struct_size` keep their defaults.
            let mut options = CreateOptions::new(0);
            let size = (given.struct_size as usize).min(std::mem::size_of::<CreateOptions>());
            std::ptr::copy_nonoverlapping(
                (given as *const CreateOptions).cast::<u8>(),
                (&mut options as *mut CreateOptions).cast::<u8>(),
                size,
            );
            options.struct_size = std::mem::size_of::<CreateOptions>() as u32;
            let worker = W::create(&options)?;
            *out = Box::into_raw(Box::new(worker)).cast();
            Ok(())
        })
    }
}

unsafe extern "C" fn destroy<W: Worker>(instance: *mut c_void) {
    if instance.is_null() {
        return;
    }
    // A panic in a destructor is swallowed: there is nobody to report it to.
    // SAFETY: the host hands back a pointer from `create::<W>` exactly once.
    let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(instance.cast::<W>()) })));
}

unsafe extern "C" fn describe<W: Worker>(instance_ptr: *mut c_void, out: *mut ErrorBuf) -> i32 {
    // SAFETY: pointers come from the host under the ABI's contract.
    unsafe {
        guarded(std::ptr::null_mut(), || {
            let worker = instance::<W>(instance_ptr)?;
            write_error(out, &worker.describe());
            Ok(())
        })
    }
}

#[allow(clippy::too_many_arguments)] // the C signature
unsafe extern "C" fn gemm_f32<W: Worker>(
    instance_ptr: *mut c_void,
    m: u32,
    n: u32,
    k: u32,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    error: *mut ErrorBuf,
) -> i32 {
    // SAFETY: pointers come from the host under the ABI's contract; the body checks them.
    unsafe {
        guarded(error, || {
            let worker = instance::<W>(instance_ptr)?;
            let a = slice(a, elements(m, k)?, "A")?;
            let b = slice(b, elements(n, k)?, "B")?;
            refuse_non_finite(a, b)?;
            let c = slice_mut(c, elements(m, n)?, "C")?;
            worker.gemm_f32(m as usize, n as usize, k as usize, a, b, c)
        })
    }
}

#[allow(clippy::too_many_arguments)] // the C signature
unsafe extern "C" fn gemm_i8<W: Worker>(
    instance_ptr: *mut c_void,
    m: u32,
    n: u32,
    k: u32,
    a: *const i8,
    b: *const i8,
    c: *mut i32,
    error: *mut ErrorBuf,
) -> i32 {
    // SAFETY: pointers come from the host under the ABI's contract; the body checks them.
    unsafe {
        guarded(error, || {
            let worker = instance::<W>(instance_ptr)?;
            let a = slice(a, elements(m, k)?, "A")?;
            let b = slice(b, elements(n, k)?, "B")?;
            let c = slice_mut(c, elements(m, n)?, "C")?;
            worker.gemm_i8(m as usize, n as usize, k as usize, a, b, c)
        })
    }
}

unsafe extern "C" fn time_kernel<W: Worker>(
    instance_ptr: *mut c_void,
    m: u32,
    n: u32,
    k: u32,
    repeat: u32,
    out_seconds: *mut f64,
    error: *mut ErrorBuf,
) -> i32 {
    // SAFETY: pointers come from the host under the ABI's contract; the body checks them.
    unsafe {
        guarded(error, || {
            let worker = instance::<W>(instance_ptr)?;
            if out_seconds.is_null() {
                return Err(invalid("out_seconds is null"));
            }
            if m == 0 || n == 0 || k == 0 || repeat == 0 {
                return Err(invalid("time_kernel needs a non-empty shape and repeat ≥ 1"));
            }
            *out_seconds = worker.time_kernel(m as usize, n as usize, k as usize, repeat as usize)?;
            Ok(())
        })
    }
}

unsafe extern "C" fn time_peak<W: Worker>(
    instance_ptr: *mut c_void,
    repeat: u32,
    out_ops_per_second: *mut f64,
    error: *mut ErrorBuf,
) -> i32 {
    // SAFETY: pointers come from the host under the ABI's contract; the body checks them.
    unsafe {
        guarded(error, || {
            let worker = instance::<W>(instance_ptr)?;
            if out_ops_per_second.is_null() {
                return Err(invalid("out_ops_per_second is null"));
            }
            if repeat == 0 {
                return Err(invalid("time_peak needs repeat ≥ 1"));
            }
            *out_ops_per_second = worker.time_peak(repeat as usize)?;
            Ok(())
        })
    }
}

fn words(n: u64) -> Result<usize, WorkerError> {
    usize::try_from(n).map_err(|_| invalid(format!("{n} words do not fit this machine")))
}

unsafe extern "C" fn buffer_create<W: Worker>(
    instance_ptr: *mut c_void,
    count: u64,
    out: *mut u64,
    error: *mut ErrorBuf,
) -> i32 {
    // SAFETY: pointers come from the host under the ABI's contract; the body checks them.
    unsafe {
        guarded(error, || {
            let worker = instance::<W>(instance_ptr)?;
            let out = out.as_mut().ok_or_else(|| invalid("out pointer is null"))?;
            *out = worker.buffer_create(words(count)?)?;
            Ok(())
        })
    }
}

unsafe extern "C" fn buffer_free<W: Worker>(instance_ptr: *mut c_void, handle: u64) {
    // SAFETY: the instance pointer comes from the host under the ABI's contract.
    unsafe {
        guarded(std::ptr::null_mut(), || {
            instance::<W>(instance_ptr)?.buffer_free(handle);
            Ok(())
        });
    }
}

unsafe extern "C" fn buffer_write<W: Worker>(
    instance_ptr: *mut c_void,
    handle: u64,
    offset: u64,
    src: *const u32,
    count: u64,
    error: *mut ErrorBuf,
) -> i32 {
    // SAFETY: pointers come from the host under the ABI's contract; the body checks them.
    unsafe {
        guarded(error, || {
            let worker = instance::<W>(instance_ptr)?;
            let data = slice(src, words(count)?, "src")?;
            worker.buffer_write(handle, words(offset)?, data)
        })
    }
}

unsafe extern "C" fn buffer_read<W: Worker>(
    instance_ptr: *mut c_void,
    handle: u64,
    offset: u64,
    dst: *mut u32,
    count: u64,
    error: *mut ErrorBuf,
) -> i32 {
    // SAFETY: pointers come from the host under the ABI's contract; the body checks them.
    unsafe {
        guarded(error, || {
            let worker = instance::<W>(instance_ptr)?;
            let out = slice_mut(dst, words(count)?, "dst")?;
            worker.buffer_read(handle, words(offset)?, out)
        })
    }
}

unsafe extern "C" fn run_ops<W: Worker>(
    instance_ptr: *mut c_void,
    ops: *const crate::ops::OpCall,
    count: u32,
    error: *mut ErrorBuf,
) -> i32 {
    // SAFETY: pointers come from the host under the ABI's contract; the body checks them.
    unsafe {
        guarded(error, || {
            let worker = instance::<W>(instance_ptr)?;
            let calls = slice(ops, count as usize, "ops")?;
            // Every record is decoded first, so a malformed one is reported wherever it is.
            let decoded = calls
                .iter()
                .enumerate()
                .map(|(i, call)| crate::ops::decode(call).map_err(|e| invalid(format!("op #{i}: {e}"))))
                .collect::<Result<Vec<_>, _>>()?;
            let unsupported = decoded.iter().enumerate().find(|(_, op)| W::OPS & crate::ops::bit(op.code()) == 0);
            if let Some((i, op)) = unsupported {
                return Err(WorkerError::new(status::UNSUPPORTED, format!("op #{i}: {} is not supported", op.name())));
            }
            worker.run_ops(&decoded)
        })
    }
}

#[cfg(test)]
#[allow(clippy::undocumented_unsafe_blocks)] // the tests drive the raw ABI with buffers they own
mod tests {
    use super::*;
    use crate::caps;

    struct Echo;

    impl Worker for Echo {
        const NAME: &'static CStr = c"echo";
        const DESCRIPTION: &'static CStr = c"test worker";
        const CAPABILITIES: u64 = caps::REQUIRED;

        fn create(options: &CreateOptions) -> Result<Self, WorkerError> {
            if options.threads == 99 {
                panic!("ninety-nine threads");
            }
            if options.threads == 12 {
                // Reports what the device options arrived as.
                let seen = format!("{:?} {:?}", requested_adapter(options)?, requested_tile(options));
                return Err(WorkerError::new(status::UNSUPPORTED, seen));
            }
            Ok(Echo)
        }

        fn describe(&self) -> String {
            "echo device".into()
        }

        fn gemm_f32(
            &mut self,
            _m: usize,
            _n: usize,
            k: usize,
            a: &[f32],
            _b: &[f32],
            c: &mut [f32],
        ) -> Result<(), WorkerError> {
            if k == 7 {
                return Err(WorkerError::new(status::DEVICE_ERROR, "seven is unlucky"));
            }
            c.iter_mut().zip(a).for_each(|(out, x)| *out = *x);
            Ok(())
        }

        fn gemm_i8(
            &mut self,
            _m: usize,
            _n: usize,
            _k: usize,
            _a: &[i8],
            _b: &[i8],
            _c: &mut [i32],
        ) -> Result<(), WorkerError> {
            panic!("boom")
        }
    }

    crate::export_worker!(Echo);

    fn error_buf(storage: &mut [u8]) -> ErrorBuf {
        ErrorBuf { ptr: storage.as_mut_ptr(), capacity: storage.len() as u32, len: 0 }
    }

    /// What `create` saw of the device options, given `options` (threads 12 makes `Echo` say).
    fn seen_options(options: &CreateOptions) -> String {
        let table = unsafe { &*lockstep_worker_entry() };
        let mut storage = [0u8; 256];
        let mut error = error_buf(&mut storage);
        let mut handle = std::ptr::null_mut();
        let code = unsafe { table.create.unwrap()(options, &mut handle, &mut error) };
        assert_eq!(code, status::UNSUPPORTED);
        String::from_utf8(storage[..error.len as usize].to_vec()).unwrap()
    }

    #[test]
    fn device_options_arrive_and_an_older_hosts_smaller_options_get_the_defaults() {
        let name = b"NVIDIA";
        let mut options = CreateOptions::new(12);
        options.adapter = name.as_ptr();
        options.adapter_len = name.len() as u32;
        options.tile = [4, 4, 16, 16, 2];
        assert_eq!(seen_options(&options), r#"Some("NVIDIA") Some([4, 4, 16, 16, 2])"#);
        // An ABI 1.1 host passes 16 bytes: what lies past them is never read.
        options.struct_size = crate::abi::CREATE_OPTIONS_1_1_SIZE;
        assert_eq!(seen_options(&options), "None None");
        options.struct_size = crate::abi::CREATE_OPTIONS_1_1_SIZE - 1;
        let table = unsafe { &*lockstep_worker_entry() };
        let mut storage = [0u8; 256];
        let mut error = error_buf(&mut storage);
        let mut handle = std::ptr::null_mut();
        let code = unsafe { table.create.unwrap()(&options, &mut handle, &mut error) };
        assert_eq!(code, status::INVALID_ARGUMENT);
    }

    #[test]
    fn exported_table_round_trip() {
        let table = unsafe { &*lockstep_worker_entry() };
        assert_eq!(table.abi_major, ABI_MAJOR);
        assert_eq!(table.struct_size as usize, std::mem::size_of::<WorkerVTable>());
        let mut storage = [0u8; 64];
        let mut error = error_buf(&mut storage);
        let mut handle = std::ptr::null_mut();
        let options = CreateOptions::new(1);
        let code = unsafe { table.create.unwrap()(&options, &mut handle, &mut error) };
        assert_eq!(code, status::OK);

        let a = [1.0f32, 2.0];
        let mut c = [0.0f32; 2];
        let code =
            unsafe { table.gemm_f32.unwrap()(handle, 2, 1, 1, a.as_ptr(), a.as_ptr(), c.as_mut_ptr(), &mut error) };
        assert_eq!(code, status::OK);
        assert_eq!(c, [1.0, 2.0]);

        // An error status carries its message.
        let code =
            unsafe { table.gemm_f32.unwrap()(handle, 0, 0, 7, a.as_ptr(), a.as_ptr(), c.as_mut_ptr(), &mut error) };
        assert_eq!(code, status::DEVICE_ERROR);
        assert_eq!(&storage[..error.len as usize], b"seven is unlucky");

        // A panic becomes a status, not an abort.
        let mut storage = [0u8; 64];
        let mut error = error_buf(&mut storage);
        let (qa, mut qc) = ([1i8], [0i32]);
        let code =
            unsafe { table.gemm_i8.unwrap()(handle, 1, 1, 1, qa.as_ptr(), qa.as_ptr(), qc.as_mut_ptr(), &mut error) };
        assert_eq!(code, status::PANIC);
        assert_eq!(&storage[..error.len as usize], b"plugin panicked: boom");

        // Null data for a non-empty shape is refused, not dereferenced.
        let code = unsafe {
            table.gemm_f32.unwrap()(handle, 1, 1, 1, std::ptr::null(), a.as_ptr(), c.as_mut_ptr(), &mut error)
        };
        assert_eq!(code, status::INVALID_ARGUMENT);

        unsafe { table.destroy.unwrap()(handle) };
    }

    /// ABI 2 through the raw table of a products-only worker: every buffer call and `run_ops`
    /// answer `unsupported` (the worker's `OPS` is 0), and malformed records are refused with
    /// `invalid argument` before the worker sees them.
    #[test]
    fn abi_2_calls_of_a_products_only_worker_are_refused_cleanly() {
        let table = unsafe { &*lockstep_worker_entry() };
        assert_eq!(table.ops, 0);
        let mut storage = [0u8; 128];
        let mut error = error_buf(&mut storage);
        let mut handle = std::ptr::null_mut();
        let code = unsafe { table.create.unwrap()(&CreateOptions::new(1), &mut handle, &mut error) };
        assert_eq!(code, status::OK);
        let message =
            |storage: &[u8], error: &ErrorBuf| String::from_utf8(storage[..error.len as usize].to_vec()).unwrap();

        let mut buffer = 0u64;
        let code = unsafe { table.buffer_create.unwrap()(handle, 16, &mut buffer, &mut error) };
        assert_eq!(code, status::UNSUPPORTED);
        assert!(message(&storage, &error).contains("products only"), "{}", message(&storage, &error));
        let words = [0u32; 4];
        let code = unsafe { table.buffer_write.unwrap()(handle, 1, 0, words.as_ptr(), 4, &mut error) };
        assert_eq!(code, status::UNSUPPORTED);

        // A known op the worker does not offer.
        let gelu = crate::ops::encode(&lockstep_luts::ops::Op::Gelu(lockstep_luts::ops::Gelu {
            len: 4,
            x: lockstep_luts::ops::Span::new(1, 0),
            y: lockstep_luts::ops::Span::new(2, 0),
        }));
        let code = unsafe { table.run_ops.unwrap()(handle, &gelu, 1, &mut error) };
        assert_eq!(code, status::UNSUPPORTED);
        assert!(message(&storage, &error).contains("op #0: gelu is not supported"), "{}", message(&storage, &error));
        // An unknown code, then unknown flags: refused as malformed, naming the record.
        let unknown = crate::ops::OpCall { code: 99, ..gelu };
        let code = unsafe { table.run_ops.unwrap()(handle, [gelu, unknown].as_ptr(), 2, &mut error) };
        assert_eq!(code, status::INVALID_ARGUMENT);
        assert!(message(&storage, &error).contains("op #1: unknown op code 99"), "{}", message(&storage, &error));
        let flagged = crate::ops::OpCall { flags: 1, ..gelu };
        let code = unsafe { table.run_ops.unwrap()(handle, &flagged, 1, &mut error) };
        assert_eq!(code, status::INVALID_ARGUMENT);
        // Null records with a count.
        let code = unsafe { table.run_ops.unwrap()(handle, std::ptr::null(), 3, &mut error) };
        assert_eq!(code, status::INVALID_ARGUMENT);
        unsafe { table.destroy.unwrap()(handle) };
    }

    #[test]
    fn panicking_create_and_short_buffers() {
        let table = unsafe { &*lockstep_worker_entry() };
        let mut storage = [0u8; 20];
        let mut error = error_buf(&mut storage);
        let mut handle = std::ptr::null_mut();
        let options = CreateOptions::new(99);
        let code = unsafe { table.create.unwrap()(&options, &mut handle, &mut error) };
        assert_eq!(code, status::PANIC);
        assert!(handle.is_null());
        // Truncated to the buffer, at a character boundary.
        assert_eq!(&storage[..error.len as usize], b"plugin panicked: nin");
        let mut tiny = [0u8; 2];
        let mut error = error_buf(&mut tiny);
        unsafe { write_error(&mut error, "é!") };
        assert_eq!(error.len, 2);
        let mut tiny = [0u8; 1];
        let mut error = error_buf(&mut tiny);
        unsafe { write_error(&mut error, "é") };
        assert_eq!(error.len, 0);
    }
}
