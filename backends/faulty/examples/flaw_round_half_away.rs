//! A plugin with the `Flaw::RoundHalfAway` bug; the exact gate must reject it.
lockstep_faulty_plugins::flawed_plugin!(c"flaw-round-half-away", lockstep_faulty_plugins::Flaw::RoundHalfAway);
