//! A plugin built against ABI 1.2: the table of that version (80 bytes, major 1) and products
//! only. A host of ABI 2 must still load it, as a product-only backend.
use lockstep_faulty_plugins::ReferenceWorker;
use lockstep_worker_api::WorkerVTable;

static OLD_TABLE: WorkerVTable = {
    let mut table = lockstep_worker_api::plugin::vtable::<ReferenceWorker>();
    table.abi_major = 1;
    table.abi_minor = 2;
    table.struct_size = std::mem::offset_of!(WorkerVTable, ops) as u32;
    // What follows the 1.2 table in memory is not the plugin's to offer: fill it with values a
    // host that read past `struct_size` would trip over.
    table.ops = u64::MAX;
    table
};

#[no_mangle]
pub extern "C" fn lockstep_worker_entry() -> *const WorkerVTable {
    &OLD_TABLE
}
