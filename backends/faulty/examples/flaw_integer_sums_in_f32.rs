//! A plugin that accumulates the raw integer product in f32 (`Flaw::IntegerSumsInF32`): right on every input the first battery tried; the
//! stronger battery must reject it.
lockstep_faulty_plugins::flawed_plugin!(c"flaw-integer-sums-in-f32", lockstep_faulty_plugins::Flaw::IntegerSumsInF32);
