//! Admission at a run's own shapes (`docs/TRUST.md`).
//!
//! The gate's battery multiplies small matrices; a fault that appears only at a run's sizes
//! passes it (`tc` on an H100 was admitted 79/79 and wrote zeros into a GPT-2-sized product once
//! the run's buffers outgrew one binding). So a backend is admitted a second time before it takes
//! part in a run — the run's start, a join, a hot-swap: it trains one whole step of the run's
//! configuration with every op it computes checked, before the next runs, against the definition
//! recomputed from the same inputs ([`crate::audit::Audit::Every`], what `lockstep bisect`
//! does). The products are recomputed by a referee, the CPU mirror on every core (an admitted
//! plugin: the reference's bits at its speed); the element-wise ops by the reference itself.
//! A backend that departs is refused with the op, the buffer, the word and both values.

use crate::compute_error::{AuditFailure, ComputeError};
use crate::config::{ConfigError, RunConfig};
use crate::data::DataSource;
use crate::gemm::Gemm;
use crate::sync::{ContributeError, SyncConfig};
use crate::trainer::Trainer;
use crate::verdict::Verdict;

/// What one admission at a run's shapes found.
pub struct ShapesChecked {
    /// The backend checked, given back.
    pub gemm: Box<dyn Gemm + Send>,
    /// The referee, given back for the next check.
    pub referee: Box<dyn Gemm + Send>,
    pub verdict: Result<ShapesAdmitted, ShapesRefused>,
}

/// Every op of one step at the run's shapes followed the definition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShapesAdmitted {
    /// The step's ops the check went through (every one of them the backend computes was
    /// recomputed and compared).
    pub ops: usize,
}

/// How a backend fared at a run's shapes, as reported: admitted (and the check's seconds, timed by
/// whoever ran it), or why not.
pub type AtRunShapes = Result<(ShapesAdmitted, f64), ShapesRefused>;

/// Why a backend may not take part in a run it passed the gate for.
#[derive(Clone, Debug, PartialEq)]
pub enum ShapesRefused {
    /// An op's output departed from the definition: which op, buffer and word, both values.
    Departed(AuditFailure),
    /// The step could not be computed at these shapes at all (out of memory, a refusal).
    Failed(String),
    /// The run's settings are not a run.
    Config(ConfigError),
}

impl std::fmt::Display for ShapesRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShapesRefused::Departed(failure) => {
                write!(f, "refused at the run's own shapes: {} (backend: {})", failure.mismatch, failure.backend)
            }
            ShapesRefused::Failed(why) => write!(f, "refused at the run's own shapes: a step could not run: {why}"),
            ShapesRefused::Config(e) => write!(f, "refused at the run's own shapes: {e}"),
        }
    }
}

impl std::error::Error for ShapesRefused {}

impl ShapesRefused {
    /// The refusal as a gate verdict (what a node tells its peers, wire `-9`): rejected at the
    /// case "the run's shapes", the op and the bits in its detail.
    pub fn verdict(&self) -> Verdict {
        let (case, detail) = match self {
            ShapesRefused::Departed(f) => (format!("the run's shapes, op #{} ({})", f.mismatch.call, f.mismatch.op), {
                let m = &f.mismatch;
                format!(
                    "{} word(s) of buffer {} differ; first, word {}: the definition gives {:#010x}, the backend {:#010x}",
                    m.differing, m.buffer, m.index, m.expected_bits, m.actual_bits
                )
            }),
            ShapesRefused::Failed(why) => ("the run's shapes".to_string(), why.clone()),
            ShapesRefused::Config(e) => ("the run's shapes".to_string(), e.to_string()),
        };
        Verdict::Rejected { case, detail }
    }
}

/// Trains one step of `run` on `gemm` from the run's initial weights and `data`'s first batch,
/// every op the backend computes checked against the definition (products by `referee`), and
/// gives both back with the verdict. Nothing of the step stays on the backend.
pub fn check_at_run_shapes(
    run: &RunConfig,
    gemm: Box<dyn Gemm + Send>,
    referee: Box<dyn Gemm + Send>,
    data: Box<dyn DataSource>,
) -> ShapesChecked {
    // One optimizer step of the run's model and batch: how the group syncs does not change
    // which ops a step runs or their shapes (an `outer:H` window is H of them).
    let run = RunConfig { sync: SyncConfig::SEED, ..*run };
    if let Err(e) = run.validate() {
        return ShapesChecked { gemm, referee, verdict: Err(ShapesRefused::Config(e)) };
    }
    let mut trainer = Trainer::new(run, gemm, data).expect("validated above");
    trainer.set_audit_all(true);
    trainer.set_referee(Some(referee));
    let verdict = match trainer.step() {
        Ok(report) => Ok(ShapesAdmitted { ops: report.audited.map_or(0, |(last, _)| last + 1) }),
        Err(ContributeError::Compute(ComputeError::Audit(failure))) => Err(ShapesRefused::Departed(failure)),
        Err(e) => Err(ShapesRefused::Failed(e.to_string())),
    };
    let referee = trainer.set_referee(None).expect("set above");
    ShapesChecked { gemm: trainer.into_gemm(), referee, verdict }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::data::CorpusSource;

    /// The reference units as products, and the same with every output past `exact` of a
    /// product +0 (a kernel sized for the wrong limit).
    struct Units {
        exact: usize,
    }

    impl Gemm for Units {
        fn gemm_nt(
            &mut self,
            m: usize,
            n: usize,
            k: usize,
            a: &[f32],
            b: &[f32],
            c: &mut [f32],
        ) -> Result<(), ComputeError> {
            let out = lockstep_luts::gemm_nt(m, n, k, a, b).map_err(ComputeError::backend)?;
            c.copy_from_slice(&out);
            c.iter_mut().skip(self.exact).for_each(|x| *x = 0.0);
            Ok(())
        }

        fn label(&self) -> String {
            format!("units, exact below {} outputs", self.exact)
        }

        fn units(&self) -> bool {
            true
        }
    }

    fn run() -> RunConfig {
        RunConfig { model: ModelConfig { width: 32, context: 32, layers: 1, heads: 2 }, batch: 2, ..RunConfig::DEFAULT }
    }

    fn check(exact: usize) -> ShapesChecked {
        let data = Box::new(CorpusSource::builtin(7));
        check_at_run_shapes(&run(), Box::new(Units { exact }), Box::new(Units { exact: usize::MAX }), data)
    }

    #[test]
    fn a_backend_right_at_every_size_is_admitted_at_the_run_shapes() {
        let checked = check(usize::MAX);
        let admitted = checked.verdict.expect("the reference's own products");
        // The host runs a product-only backend's other ops: the products were checked, the
        // last of them late in the step (the weights' gradients).
        assert!(admitted.ops > 10, "{admitted:?}");
        assert!(checked.gemm.label().starts_with("units"), "the backend comes back");
    }

    #[test]
    fn a_backend_wrong_past_a_size_is_refused_with_the_op_and_the_bits() {
        // The run's largest products (32 × 32 × 2 rows of 256 logits: 16,384 outputs) pass 4,096;
        // a gate-sized product does not.
        let mut small = Units { exact: 4096 };
        let (a, b) = (vec![0.5f32; 37 * 200], vec![0.25f32; 53 * 200]);
        let mut c = vec![0.0f32; 37 * 53];
        small.gemm_nt(37, 53, 200, &a, &b, &mut c).unwrap();
        assert_eq!(c, lockstep_luts::gemm_nt(37, 53, 200, &a, &b).unwrap(), "right below its limit");
        let Err(ShapesRefused::Departed(failure)) = check(4096).verdict else { panic!("admitted") };
        let m = &failure.mismatch;
        assert_eq!(m.op, "matmul");
        assert!(m.index >= 4096, "the first wrong word is past the limit: {m:?}");
        assert_eq!(m.actual_bits, 0);
        assert_ne!(m.expected_bits, 0);
        let Verdict::Rejected { case, detail } = ShapesRefused::Departed(failure.clone()).verdict() else {
            panic!("a refusal is a rejection")
        };
        assert_eq!(case, format!("the run's shapes, op #{} (matmul)", m.call));
        assert!(detail.contains(&format!("the definition gives {:#010x}, the backend 0x00000000", m.expected_bits)));
    }
}
