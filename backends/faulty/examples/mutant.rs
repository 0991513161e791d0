//! One mutant of the reference per process: the units and every op of the reference, with the
//! one departure `LOCKSTEP_MUTANT` names (`lockstep_faulty_plugins::mutants::MUTANTS`), or none
//! with `LOCKSTEP_MUTANT=none` (the harness's control, which the gate must admit). An unknown or
//! missing name refuses to create. `tests/e2e/cli.rs` gates every mutant.
lockstep_faulty_plugins::mutant_plugin!(
    c"mutant",
    c"the reference with one mutation, named by LOCKSTEP_MUTANT (test fixture)",
    lockstep_faulty_plugins::mutants::from_env()
);
