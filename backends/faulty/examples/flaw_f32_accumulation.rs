//! A plugin with the `Flaw::F32Accumulation` bug; the exact gate must reject it.
lockstep_faulty_plugins::flawed_plugin!(c"flaw-f32-accumulation", lockstep_faulty_plugins::Flaw::F32Accumulation);
