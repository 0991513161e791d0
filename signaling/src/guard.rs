//! A mutex lock that survives a poisoned mutex.

/// Locks a mutex, carrying on with the state as it is if a thread panicked while holding it
/// (a panic there is a bug, but the server keeps serving everyone else).
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
