//! A plugin built against ABI 2.0: that version's table (128 bytes, no `time_peak`), claiming
//! the 2.1 capability all the same.
//! A host of ABI 2.1 must load it whole and read nothing past it.
use lockstep_faulty_plugins::ReferenceWorker;
use lockstep_worker_api::WorkerVTable;

static TABLE_2_0: WorkerVTable = {
    let mut table = lockstep_worker_api::plugin::vtable::<ReferenceWorker>();
    table.abi_minor = 0;
    table.struct_size = std::mem::offset_of!(WorkerVTable, time_peak) as u32;
    table.capabilities |= lockstep_worker_api::caps::PEAK_TIMING;
    table
};

#[no_mangle]
pub extern "C" fn lockstep_worker_entry() -> *const WorkerVTable {
    &TABLE_2_0
}
