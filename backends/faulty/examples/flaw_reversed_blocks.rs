//! A plugin with the `Flaw::ReversedBlocks` bug; the exact gate must reject it.
lockstep_faulty_plugins::flawed_plugin!(c"flaw-reversed-blocks", lockstep_faulty_plugins::Flaw::ReversedBlocks);
