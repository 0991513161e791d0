//! A plugin with the `Flaw::SaturatingPairs` bug; the exact gate must reject it.
lockstep_faulty_plugins::flawed_plugin!(c"flaw-saturating-pairs", lockstep_faulty_plugins::Flaw::SaturatingPairs);
