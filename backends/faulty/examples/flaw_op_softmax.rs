//! An ABI 2 plugin whose units are exact and whose ops follow the definition, except one: its
//! causal softmax takes the platform's `f32::exp` instead of the definition's `mathf::exp` — the
//! plausible slip of a port that "uses the standard library" (the mutant `softmax-libm-exp`).
//! The gate must reject it, naming the op.
lockstep_faulty_plugins::mutant_plugin!(
    c"flaw-op-softmax",
    c"exact units, softmax through the platform's exp (test fixture)",
    Ok::<_, WorkerError>(Some(lockstep_faulty_plugins::mutants::Mutation::Op(
        lockstep_faulty_plugins::mutants::OpMutation::SoftmaxLibmExp
    )))
);
