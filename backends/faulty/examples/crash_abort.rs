//! The reference units, then, from the first product longer than one block, a plugin that calls abort() (SIGABRT).
//! The gate runs plugins in a child process: this must become a REJECTED verdict, not a dead
//! host.
lockstep_worker_api::export_worker!(lockstep_faulty_plugins::Misbehaving<1>);
