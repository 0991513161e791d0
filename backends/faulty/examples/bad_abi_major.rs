//! A plugin whose table claims ABI major version 3 (a future one); the loader must refuse it.
use lockstep_faulty_plugins::ReferenceWorker;
use lockstep_worker_api::WorkerVTable;

static FUTURE_TABLE: WorkerVTable = {
    let mut table = lockstep_worker_api::plugin::vtable::<ReferenceWorker>();
    table.abi_major = 3;
    table
};

#[no_mangle]
pub extern "C" fn lockstep_worker_entry() -> *const WorkerVTable {
    &FUTURE_TABLE
}
