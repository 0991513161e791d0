//! A shared library that is not a plugin: it exports a function, but not the entry symbol.

#[no_mangle]
pub extern "C" fn lockstep_something_else() -> i32 {
    42
}
