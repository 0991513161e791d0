//! A plugin that flushes only the final sum (`Flaw::FlushAtEnd`), so a subnormal partial sum
//! survives into the next addition; the stronger battery must reject it.
lockstep_faulty_plugins::flawed_plugin!(c"flaw-flush-at-end", lockstep_faulty_plugins::Flaw::FlushAtEnd);
