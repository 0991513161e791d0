//! A plugin that picks the next block exponent for a block whose largest magnitude is exactly 127·2^e (`Flaw::BoundaryExponent`): right on every input the first battery tried; the
//! stronger battery must reject it.
lockstep_faulty_plugins::flawed_plugin!(c"flaw-boundary-exponent", lockstep_faulty_plugins::Flaw::BoundaryExponent);
