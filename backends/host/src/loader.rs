//! Loading plugin files: typed errors, no unloading, fresh copies for hot-swaps.

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use lockstep_worker_api::{
    caps, EntryFn, WorkerVTable, ABI_MAJOR, ABI_MAJOR_OLDEST, ENTRY_SYMBOL, TABLE_SIZE_1_0, TABLE_SIZE_2_0,
};

/// Backend names that resolve to plugins built with the workspace.
pub const BUILTIN_BACKENDS: &[&str] = &["cpu", "lut", "dp4a", "tc"];

/// Why a plugin file was refused. Nothing from a refused file is ever called again.
#[derive(Debug)]
pub enum LoadError {
    /// The file cannot be read or copied.
    Io { path: PathBuf, source: std::io::Error },
    /// The dynamic loader refused the file (not a shared library, wrong architecture, …).
    NotALibrary { path: PathBuf, message: String },
    /// The library has no `lockstep_worker_entry` symbol.
    MissingEntry { path: PathBuf, message: String },
    /// The entry returned a null table.
    NullTable { path: PathBuf },
    /// The table's ABI major version is not ours.
    AbiMajor { path: PathBuf, found: u16, expected: u16 },
    /// The table is smaller than a v1 table.
    TableTooSmall { path: PathBuf, found: u32, needed: u32 },
    /// A required function pointer is null.
    MissingFunction { path: PathBuf, function: &'static str },
    /// A required capability flag is missing.
    MissingCapability { path: PathBuf, flags: u64 },
    /// The name or description is null or not UTF-8.
    BadMetadata { path: PathBuf },
    /// A backend name that is neither a built-in nor a path, or a built-in that is not built.
    NotFound { name: String, searched: Vec<PathBuf> },
}

/// Where 2.0's fields begin: the largest table a 1.x plugin has.
const TABLE_SIZE_2_0_START: u32 = std::mem::offset_of!(WorkerVTable, ops) as u32;

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Io { path, source } => write!(f, "cannot read plugin {}: {source}", path.display()),
            LoadError::NotALibrary { path, message } => {
                write!(f, "{} is not a loadable shared library: {message}", path.display())
            }
            LoadError::MissingEntry { path, message } => write!(
                f,
                "{} is a shared library but not a lockstep plugin: no `{ENTRY_SYMBOL}` symbol ({message})",
                path.display()
            ),
            LoadError::NullTable { path } => write!(f, "{}: the plugin entry returned a null table", path.display()),
            LoadError::AbiMajor { path, found, expected } => write!(
                f,
                "{}: plugin ABI major version {found}, this host speaks {ABI_MAJOR_OLDEST} to {expected}; rebuild the plugin against worker-api {expected}.x",
                path.display()
            ),
            LoadError::TableTooSmall { path, found, needed } => write!(
                f,
                "{}: plugin table is {found} bytes, its ABI version needs at least {needed}",
                path.display()
            ),
            LoadError::MissingFunction { path, function } => {
                write!(f, "{}: plugin table has no `{function}` function", path.display())
            }
            LoadError::MissingCapability { path, flags } => {
                write!(f, "{}: plugin lacks required capabilities {flags:#x}", path.display())
            }
            LoadError::BadMetadata { path } => write!(f, "{}: plugin name or description is null or not UTF-8", path.display()),
            LoadError::NotFound { name, searched } => {
                write!(f, "backend `{name}` not found; looked for ")?;
                let list: Vec<String> = searched.iter().map(|p| p.display().to_string()).collect();
                write!(f, "{} (build the workspace first, or give a path)", list.join(", "))
            }
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A loaded, checked plugin. The library stays mapped for the life of the process.
#[derive(Clone, Debug)]
pub struct Plugin {
    pub(crate) vtable: &'static WorkerVTable,
    name: String,
    description: String,
    path: PathBuf,
}

impl Plugin {
    /// Opens `path` and checks it. The library is never unloaded: unloading a Rust cdylib that
    /// used thread-locals is unsound, and a plugin's code may still be on some stack.
    pub fn load(path: &Path) -> Result<Plugin, LoadError> {
        let path_buf = path.to_path_buf();
        if let Err(source) = std::fs::metadata(path) {
            return Err(LoadError::Io { path: path_buf, source });
        }
        // SAFETY: loading a library runs its initialisers. A plugin is trusted code once the
        // user names it; what we can check (symbol, version, layout) we check below.
        let library = unsafe { libloading::Library::new(path) }
            .map_err(|error| LoadError::NotALibrary { path: path_buf.clone(), message: error.to_string() })?;
        let library: &'static libloading::Library = Box::leak(Box::new(library));
        // SAFETY: the symbol's type is fixed by the ABI.
        let entry = unsafe { library.get::<EntryFn>(ENTRY_SYMBOL.as_bytes()) }
            .map_err(|error| LoadError::MissingEntry { path: path_buf.clone(), message: error.to_string() })?;
        // SAFETY: the entry takes no arguments and returns a pointer to a static table.
        let table = unsafe { entry() };
        if table.is_null() {
            return Err(LoadError::NullTable { path: path_buf });
        }
        // Read the header before trusting the rest of the table.
        // SAFETY: every table version starts with `abi_major: u16, abi_minor: u16,
        // struct_size: u32`; the pointer is non-null and points into the library's statics.
        let (major, size) = unsafe { ((*table).abi_major, (*table).struct_size) };
        if !(ABI_MAJOR_OLDEST..=ABI_MAJOR).contains(&major) {
            return Err(LoadError::AbiMajor { path: path_buf, found: major, expected: ABI_MAJOR });
        }
        // A 1.x table ends where 2.0's fields begin: whatever follows it is not ours to read.
        let (needed, most) =
            if major == 1 { (TABLE_SIZE_1_0, TABLE_SIZE_2_0_START) } else { (TABLE_SIZE_2_0, u32::MAX) };
        if size < needed {
            return Err(LoadError::TableTooSmall { path: path_buf, found: size, needed });
        }
        // An older minor version's table is shorter than ours: copy what it has into a table
        // whose later fields are null (absent), and use only the copy.
        let mut owned = std::mem::MaybeUninit::<WorkerVTable>::zeroed();
        let copied = (size.min(most) as usize).min(std::mem::size_of::<WorkerVTable>());
        // SAFETY: the plugin's table is `size` bytes (its `struct_size`), of which we copy at
        // most our own table's size into our zeroed table; all-zero bytes are a valid table
        // (null pointers, `None` functions, zero integers).
        let vtable: &'static WorkerVTable = unsafe {
            std::ptr::copy_nonoverlapping(table.cast::<u8>(), owned.as_mut_ptr().cast::<u8>(), copied);
            Box::leak(Box::new(owned.assume_init()))
        };
        let functions = [
            ("create", vtable.create.is_some()),
            ("destroy", vtable.destroy.is_some()),
            ("describe", vtable.describe.is_some()),
            ("gemm_f32", vtable.gemm_f32.is_some()),
            ("gemm_i8", vtable.gemm_i8.is_some()),
        ];
        if let Some((function, _)) = functions.iter().find(|(_, present)| !present) {
            return Err(LoadError::MissingFunction { path: path_buf, function });
        }
        if vtable.capabilities & caps::REQUIRED != caps::REQUIRED {
            return Err(LoadError::MissingCapability { path: path_buf, flags: caps::REQUIRED & !vtable.capabilities });
        }
        let text = |pointer: *const std::ffi::c_char| -> Option<String> {
            if pointer.is_null() {
                return None;
            }
            // SAFETY: non-null, and the ABI says it points at a static NUL-terminated string.
            unsafe { CStr::from_ptr(pointer) }.to_str().ok().map(str::to_owned)
        };
        let (Some(name), Some(description)) = (text(vtable.name), text(vtable.description)) else {
            return Err(LoadError::BadMetadata { path: path_buf });
        };
        Ok(Plugin { vtable, name, description, path: path_buf })
    }

    /// Copies `path` to a unique file name and loads the copy, so a rebuilt plugin at the
    /// same path is really loaded anew (the dynamic loader would hand back the mapped one).
    pub fn load_fresh_copy(path: &Path) -> Result<Plugin, LoadError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!("lockstep-plugins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|source| LoadError::Io { path: dir.clone(), source })?;
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("plugin");
        let extension = path.extension().and_then(|s| s.to_str()).unwrap_or("so");
        let copy = dir.join(format!("{stem}-{}.{extension}", COUNTER.fetch_add(1, Ordering::Relaxed)));
        std::fs::copy(path, &copy).map_err(|source| LoadError::Io { path: path.to_path_buf(), source })?;
        Plugin::load(&copy)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn abi_major(&self) -> u16 {
        self.vtable.abi_major
    }

    /// The ops the plugin runs on its own buffers (ABI 2; 0 for a 1.x plugin).
    pub fn ops(&self) -> u64 {
        self.vtable.ops
    }

    pub fn abi_minor(&self) -> u16 {
        self.vtable.abi_minor
    }

    pub fn capabilities(&self) -> u64 {
        self.vtable.capabilities
    }
}

/// The file name of a built-in backend's library on this platform.
pub fn builtin_file_name(name: &str) -> String {
    format!("{}lockstep_backend_{name}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// Turns `NAME|PATH` into a plugin file: a built-in name is looked up in `$LOCKSTEP_PLUGIN_DIR`,
/// then beside the running executable and in its parent (where cargo puts cdylibs relative to
/// test binaries); anything else is a path.
pub fn resolve_plugin(name_or_path: &str) -> Result<PathBuf, LoadError> {
    if !BUILTIN_BACKENDS.contains(&name_or_path) {
        return Ok(PathBuf::from(name_or_path));
    }
    let file = builtin_file_name(name_or_path);
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os("LOCKSTEP_PLUGIN_DIR") {
        dirs.push(PathBuf::from(dir));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            dirs.push(dir.to_path_buf());
            if let Some(parent) = dir.parent() {
                dirs.push(parent.to_path_buf());
            }
        }
    }
    let candidates: Vec<PathBuf> = dirs.iter().map(|dir| dir.join(&file)).collect();
    candidates
        .iter()
        .find(|path| path.is_file())
        .cloned()
        .ok_or(LoadError::NotFound { name: name_or_path.to_string(), searched: candidates })
}
