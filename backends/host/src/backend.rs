//! A live plugin instance behind safe, typed calls.

use std::ffi::c_void;

use lockstep_worker_api::{caps, status, CreateOptions, ErrorBuf};

use crate::loader::Plugin;

/// Bytes the host lends a plugin for an error message.
const ERROR_CAPACITY: usize = 1024;

/// A failed plugin call: the status code and the plugin's own message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendError {
    pub backend: String,
    pub call: &'static str,
    pub status: i32,
    pub message: String,
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "backend `{}` {} failed ({}): {}", self.backend, self.call, status::name(self.status), self.message)
    }
}

impl std::error::Error for BackendError {}

/// One instance of a plugin. Calls take `&mut self`: an instance serves one caller at a time.
/// After a call reports [`status::PANIC`] the instance is poisoned and refuses further calls.
pub struct Backend {
    plugin: Plugin,
    instance: *mut c_void,
    poisoned: bool,
    /// Tells instances apart for the node's step buffers.
    id: u64,
    /// Surround every output with guard words ([`guarded`]): on while the gate runs.
    guard_outputs: bool,
}

// SAFETY: the ABI lets an instance move between threads as long as one thread uses it at a
// time, which `&mut self` on every call enforces.
unsafe impl Send for Backend {}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("plugin", &self.plugin.name()).field("poisoned", &self.poisoned).finish()
    }
}

struct ErrorStorage {
    bytes: Vec<u8>,
    buf: ErrorBuf,
}

impl ErrorStorage {
    fn new() -> Self {
        let mut bytes = vec![0u8; ERROR_CAPACITY];
        let buf = ErrorBuf { ptr: bytes.as_mut_ptr(), capacity: ERROR_CAPACITY as u32, len: 0 };
        Self { bytes, buf }
    }

    fn message(&self) -> String {
        let len = (self.buf.len as usize).min(self.bytes.len());
        String::from_utf8_lossy(&self.bytes[..len]).into_owned()
    }
}

/// What the host decides for an instance: everything that could change what it computes with
/// reaches the plugin through `CreateOptions`, so the gate sees what will run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstanceOptions {
    /// Threads a CPU plugin may use; 0 for all cores (device plugins ignore it).
    pub threads: u32,
    /// Bits from `lockstep_worker_api::create_flags`.
    pub flags: u64,
    /// Device plugins: the adapter whose name contains this (case-insensitive).
    pub adapter: Option<String>,
    /// Device plugins: the workgroup tile `[tm, tn, wx, wy, kb]`.
    pub tile: Option<[u32; 5]>,
}

impl InstanceOptions {
    pub fn threads(threads: u32) -> Self {
        InstanceOptions { threads, ..InstanceOptions::default() }
    }
}

impl Plugin {
    /// Creates an instance (`threads`: 0 for all cores; GPU plugins ignore it).
    pub fn instantiate(&self, threads: u32) -> Result<Backend, BackendError> {
        self.instantiate_with(threads, 0)
    }

    /// Creates an instance with option `flags` from `lockstep_worker_api::create_flags`.
    pub fn instantiate_with(&self, threads: u32, flags: u64) -> Result<Backend, BackendError> {
        self.instantiate_options(&InstanceOptions { flags, ..InstanceOptions::threads(threads) })
    }

    /// Creates an instance with every option the host decides.
    pub fn instantiate_options(&self, wanted: &InstanceOptions) -> Result<Backend, BackendError> {
        let fail = |status, message| BackendError { backend: self.name().to_string(), call: "create", status, message };
        let device_options = wanted.adapter.is_some() || wanted.tile.is_some();
        if device_options && self.abi_major() == 1 && self.abi_minor() < 2 {
            let why = format!("the plugin speaks ABI 1.{}, which has no adapter or tile options", self.abi_minor());
            return Err(fail(status::UNSUPPORTED, why));
        }
        let adapter = wanted.adapter.as_deref().unwrap_or("");
        let options = CreateOptions {
            flags: wanted.flags,
            adapter: if adapter.is_empty() { std::ptr::null() } else { adapter.as_ptr() },
            adapter_len: adapter.len() as u32,
            tile: wanted.tile.unwrap_or([0; 5]),
            ..CreateOptions::new(wanted.threads)
        };
        let mut instance = std::ptr::null_mut();
        let mut error = ErrorStorage::new();
        let create = self.vtable.create.expect("checked at load");
        // SAFETY: valid options (the adapter text outlives the call), out pointer and error
        // buffer, per the ABI.
        let code = unsafe { create(&options, &mut instance, &mut error.buf) };
        if code != status::OK {
            return Err(fail(code, error.message()));
        }
        if instance.is_null() {
            return Err(fail(status::INTERNAL, "create returned OK but no instance".into()));
        }
        Ok(Backend {
            plugin: self.clone(),
            instance,
            poisoned: false,
            id: lockstep_node::device::new_instance_id(),
            guard_outputs: false,
        })
    }
}

impl Backend {
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    pub fn name(&self) -> &str {
        self.plugin.name()
    }

    /// The plugin's capability flags (`lockstep_worker_api::caps`).
    pub fn plugin_capabilities(&self) -> u64 {
        self.plugin.capabilities()
    }

    /// One line about the device the instance uses.
    pub fn describe(&self) -> String {
        let mut out = ErrorStorage::new();
        let describe = self.plugin.vtable.describe.expect("checked at load");
        // SAFETY: live instance and valid buffer.
        let code = unsafe { describe(self.instance, &mut out.buf) };
        if code == status::OK {
            out.message()
        } else {
            format!("(describe failed: {})", status::name(code))
        }
    }

    fn check_usable(&self, call: &'static str) -> Result<(), BackendError> {
        if self.poisoned {
            return Err(BackendError {
                backend: self.name().to_string(),
                call,
                status: status::PANIC,
                message: "instance is poisoned by an earlier panic".into(),
            });
        }
        Ok(())
    }

    fn finish(&mut self, call: &'static str, code: i32, error: &ErrorStorage) -> Result<(), BackendError> {
        if code == status::OK {
            return Ok(());
        }
        if code == GUARD_HIT {
            // The plugin wrote outside the output it was given: nothing it says can be
            // trusted any more.
            self.poisoned = true;
            return Err(BackendError {
                backend: self.name().to_string(),
                call,
                status: status::INTERNAL,
                message: format!(
                    "the plugin wrote outside the output it was given (the {GUARD_WORDS} guard words after or before it changed)"
                ),
            });
        }
        if code == status::PANIC {
            self.poisoned = true;
        }
        Err(BackendError { backend: self.name().to_string(), call, status: code, message: error.message() })
    }

    fn shape(&self, call: &'static str, m: usize, n: usize, k: usize) -> Result<(u32, u32, u32), BackendError> {
        let to_u32 = |v: usize| u32::try_from(v).ok();
        match (to_u32(m), to_u32(n), to_u32(k)) {
            (Some(m), Some(n), Some(k)) => Ok((m, n, k)),
            _ => Err(BackendError {
                backend: self.name().to_string(),
                call,
                status: status::INVALID_ARGUMENT,
                message: format!("shape {m}×{n}×{k} does not fit the ABI's u32"),
            }),
        }
    }

    /// The unit `c = a · bᵀ` (`a`: m × k, `b`: n × k, `c`: m × n).
    pub fn gemm_f32_into(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<(), BackendError> {
        const CALL: &str = "gemm_f32";
        self.check_usable(CALL)?;
        let (m32, n32, k32) = self.shape(CALL, m, n, k)?;
        assert!(
            a.len() == m * k && b.len() == n * k && c.len() == m * n,
            "gemm_f32: buffer lengths do not match {m}×{n}×{k}"
        );
        let mut error = ErrorStorage::new();
        let gemm = self.plugin.vtable.gemm_f32.expect("checked at load");
        let instance = self.instance;
        let code = guarded(self.guard_outputs, c, |out| {
            // SAFETY: buffers are valid for the shape's lengths (asserted) and `out` is exclusive.
            unsafe { gemm(instance, m32, n32, k32, a.as_ptr(), b.as_ptr(), out, &mut error.buf) }
        });
        self.finish(CALL, code, &error)
    }

    /// Guard every output with canary words (while gating: [`crate::gate::run_gate`] turns it
    /// on for its calls and back off).
    pub fn set_output_guards(&mut self, on: bool) {
        self.guard_outputs = on;
    }

    /// Unique in this process.
    pub fn instance_id(&self) -> u64 {
        self.id
    }

    /// Whether the plugin runs every op a training step needs on its own buffers (ABI 2).
    pub fn has_step_ops(&self) -> bool {
        let needed = lockstep_worker_api::ops::ALL;
        self.plugin.abi_major() >= 2 && self.plugin.ops() & needed == needed
    }

    /// An ABI 2 entry of a usable instance, or why not: a poisoned instance, or a plugin of
    /// ABI 1 (whose table has no such entry).
    fn abi2_entry<F>(&self, call: &'static str, entry: Option<F>) -> Result<F, BackendError> {
        self.check_usable(call)?;
        entry.filter(|_| self.plugin.abi_major() >= 2).ok_or_else(|| BackendError {
            backend: self.name().to_string(),
            call,
            status: status::UNSUPPORTED,
            message: "the plugin has no ABI 2 buffers".into(),
        })
    }

    /// (ABI 2) A plugin-owned buffer of `words` words.
    pub fn create_buffer(&mut self, words: usize) -> Result<u64, BackendError> {
        const CALL: &str = "buffer_create";
        let create = self.abi2_entry(CALL, self.plugin.vtable.buffer_create)?;
        let mut error = ErrorStorage::new();
        let mut handle = 0u64;
        // SAFETY: the instance is live, `handle` and the error buffer outlive the call.
        let code = unsafe { create(self.instance, words as u64, &mut handle, &mut error.buf) };
        self.finish(CALL, code, &error)?;
        Ok(handle)
    }

    /// (ABI 2) Frees a buffer.
    pub fn free_buffer(&mut self, handle: u64) {
        if let Some(free) = self.plugin.vtable.buffer_free.filter(|_| !self.poisoned && self.plugin.abi_major() >= 2) {
            // SAFETY: the instance is live.
            unsafe { free(self.instance, handle) };
        }
    }

    /// (ABI 2) Copies `data` into words `offset ..` of a buffer.
    pub fn write_buffer(&mut self, handle: u64, offset: usize, data: &[u32]) -> Result<(), BackendError> {
        const CALL: &str = "buffer_write";
        let write = self.abi2_entry(CALL, self.plugin.vtable.buffer_write)?;
        let mut error = ErrorStorage::new();
        // SAFETY: `data` is valid for its length for the call.
        let code =
            unsafe { write(self.instance, handle, offset as u64, data.as_ptr(), data.len() as u64, &mut error.buf) };
        self.finish(CALL, code, &error)
    }

    /// (ABI 2) Copies words `offset ..` of a buffer into `out`.
    pub fn read_buffer(&mut self, handle: u64, offset: usize, out: &mut [u32]) -> Result<(), BackendError> {
        const CALL: &str = "buffer_read";
        let read = self.abi2_entry(CALL, self.plugin.vtable.buffer_read)?;
        let mut error = ErrorStorage::new();
        let (instance, len) = (self.instance, out.len() as u64);
        let code = guarded(self.guard_outputs, out, |ptr| {
            // SAFETY: `ptr` is valid and exclusive for `len` words for the call.
            unsafe { read(instance, handle, offset as u64, ptr, len, &mut error.buf) }
        });
        self.finish(CALL, code, &error)
    }

    /// (ABI 2) Runs ops in order, all in one call.
    pub fn run_ops(&mut self, ops: &[lockstep_luts::ops::Op]) -> Result<(), BackendError> {
        const CALL: &str = "run_ops";
        let run = self.abi2_entry(CALL, self.plugin.vtable.run_ops)?;
        let calls: Vec<_> = ops.iter().map(lockstep_worker_api::ops::encode).collect();
        let count = u32::try_from(calls.len()).map_err(|_| BackendError {
            backend: self.name().to_string(),
            call: CALL,
            status: status::INVALID_ARGUMENT,
            message: format!("{} ops in one call", calls.len()),
        })?;
        let mut error = ErrorStorage::new();
        // SAFETY: `calls` is valid for `count` records for the call.
        let code = unsafe { run(self.instance, calls.as_ptr(), count, &mut error.buf) };
        self.finish(CALL, code, &error)
    }

    /// [`Backend::gemm_f32_into`] into a new vector.
    pub fn gemm_f32(&mut self, m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Result<Vec<f32>, BackendError> {
        let mut c = vec![0.0; m * n];
        self.gemm_f32_into(m, n, k, a, b, &mut c)?;
        Ok(c)
    }

    /// Seconds per run of the plugin's device kernel alone, on an `m × n × k` unit (plugins
    /// with `caps::KERNEL_TIMING`); `UNSUPPORTED` otherwise.
    pub fn time_kernel(&mut self, m: usize, n: usize, k: usize, repeat: u32) -> Result<f64, BackendError> {
        const CALL: &str = "time_kernel";
        self.check_usable(CALL)?;
        let (m, n, k) = self.shape(CALL, m, n, k)?;
        let supported = self.plugin.capabilities() & caps::KERNEL_TIMING != 0;
        let Some(time) = self.plugin.vtable.time_kernel.filter(|_| supported) else {
            return Err(BackendError {
                backend: self.name().to_string(),
                call: CALL,
                status: status::UNSUPPORTED,
                message: "the plugin does not time its kernel".into(),
            });
        };
        let mut seconds = 0f64;
        let mut error = ErrorStorage::new();
        // SAFETY: live instance, valid out pointer and error buffer, per the ABI.
        let code = unsafe { time(self.instance, m, n, k, repeat, &mut seconds, &mut error.buf) };
        self.finish(CALL, code, &error)?;
        Ok(seconds)
    }

    /// Int8 operations per second of the plugin's product path in a register-resident loop,
    /// `repeat` times (ABI 2.1, [`caps::PEAK_TIMING`]): the ceiling its kernel is set against.
    pub fn time_peak(&mut self, repeat: u32) -> Result<f64, BackendError> {
        const CALL: &str = "time_peak";
        self.check_usable(CALL)?;
        let supported = self.plugin.capabilities() & caps::PEAK_TIMING != 0;
        let Some(time) = self.plugin.vtable.time_peak.filter(|_| supported) else {
            return Err(BackendError {
                backend: self.name().to_string(),
                call: CALL,
                status: status::UNSUPPORTED,
                message: "the plugin does not time its product path".into(),
            });
        };
        let mut rate = 0f64;
        let mut error = ErrorStorage::new();
        // SAFETY: live instance, valid out pointer and error buffer, per the ABI.
        let code = unsafe { time(self.instance, repeat, &mut rate, &mut error.buf) };
        self.finish(CALL, code, &error)?;
        Ok(rate)
    }

    /// The raw integer unit over the full i8 range.
    pub fn gemm_i8(&mut self, m: usize, n: usize, k: usize, a: &[i8], b: &[i8]) -> Result<Vec<i32>, BackendError> {
        const CALL: &str = "gemm_i8";
        self.check_usable(CALL)?;
        let (m32, n32, k32) = self.shape(CALL, m, n, k)?;
        assert!(a.len() == m * k && b.len() == n * k, "gemm_i8: buffer lengths do not match {m}×{n}×{k}");
        let mut c = vec![0i32; m * n];
        let mut error = ErrorStorage::new();
        let gemm = self.plugin.vtable.gemm_i8.expect("checked at load");
        let instance = self.instance;
        let code = guarded(self.guard_outputs, &mut c, |out| {
            // SAFETY: buffers are valid for the shape's lengths and `out` is exclusive.
            unsafe { gemm(instance, m32, n32, k32, a.as_ptr(), b.as_ptr(), out, &mut error.buf) }
        });
        self.finish(CALL, code, &error)?;
        Ok(c)
    }
}

/// Words of canary on either side of every output a plugin writes.
const GUARD_WORDS: usize = 16;
/// Not a status any plugin may return: [`guarded`]'s report of a changed canary.
const GUARD_HIT: i32 = i32::MIN;

/// A 32-bit output word, compared by its bits (a NaN canary must equal itself).
trait Word: Copy {
    fn to_word(self) -> u32;
    fn from_word(word: u32) -> Self;
}

impl Word for f32 {
    fn to_word(self) -> u32 {
        self.to_bits()
    }
    fn from_word(word: u32) -> Self {
        f32::from_bits(word)
    }
}

impl Word for i32 {
    fn to_word(self) -> u32 {
        self as u32
    }
    fn from_word(word: u32) -> Self {
        word as i32
    }
}

impl Word for u32 {
    fn to_word(self) -> u32 {
        self
    }
    fn from_word(word: u32) -> Self {
        word
    }
}

/// The canary's bits (a NaN with a payload no computation makes).
const CANARY: u32 = 0x7fc0_dead;

/// With `on`, runs `call` on an output with guard words on either side (a copy of `out` in a
/// larger allocation), copies the result back if the call succeeded, and returns its status, or
/// [`GUARD_HIT`] when a guard word changed: a plugin that writes one element past (or before)
/// its output is caught instead of corrupting the host's memory unseen. Without, `call` writes
/// `out` itself (no copy on the hot path of an admitted plugin).
fn guarded<T: Word>(on: bool, out: &mut [T], call: impl FnOnce(*mut T) -> i32) -> i32 {
    if !on {
        return call(out.as_mut_ptr());
    }
    let mut padded = vec![T::from_word(CANARY); out.len() + 2 * GUARD_WORDS];
    padded[GUARD_WORDS..GUARD_WORDS + out.len()].copy_from_slice(out);
    let code = call(padded[GUARD_WORDS..].as_mut_ptr());
    let (before, rest) = padded.split_at(GUARD_WORDS);
    let (inside, after) = rest.split_at(out.len());
    if before.iter().chain(after).any(|w| w.to_word() != CANARY) {
        return GUARD_HIT;
    }
    // A refused call leaves the host's output as it was, whatever the plugin wrote.
    if code == status::OK {
        out.copy_from_slice(inside);
    }
    code
}

impl Drop for Backend {
    fn drop(&mut self) {
        let destroy = self.plugin.vtable.destroy.expect("checked at load");
        // SAFETY: the instance came from this plugin's `create` and is destroyed once.
        unsafe { destroy(self.instance) };
    }
}
