//! A plugin that answers a repeated call with the same operand addresses from a cache (`Flaw::CacheByAddress`): right on every input the first battery tried; the
//! stronger battery must reject it.
lockstep_faulty_plugins::flawed_plugin!(c"flaw-cache-by-address", lockstep_faulty_plugins::Flaw::CacheByAddress);
