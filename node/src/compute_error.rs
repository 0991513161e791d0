//! Why a step's compute failed: the backend's own error kept whole, or the live audit's
//! finding. Every compute trait of the crate (`Gemm`, `Device`) fails with [`ComputeError`].

use std::sync::Arc;

use lockstep_luts::UnitError;

/// Why a step's products failed: the run stops with it, it never continues with zeros.
#[derive(Clone, Debug)]
pub enum ComputeError {
    /// The backend failed or refused a call (the host's typed error, kept whole).
    Backend(Arc<dyn std::error::Error + Send + Sync>),
    /// A live audit recomputed one product with the reference units and a bit differed.
    Audit(AuditFailure),
    /// The reference units refused operands an audit gave them.
    Reference(UnitError),
}

impl ComputeError {
    /// Wraps a backend's own error.
    pub fn backend(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        ComputeError::Backend(Arc::new(error))
    }

    /// The audit's finding, when that is what stopped the step.
    pub fn audit(&self) -> Option<&AuditFailure> {
        match self {
            ComputeError::Audit(failure) => Some(failure),
            _ => None,
        }
    }
}

impl std::fmt::Display for ComputeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ComputeError::Backend(error) => write!(f, "{error}"),
            ComputeError::Audit(failure) => write!(f, "{failure}"),
            ComputeError::Reference(error) => write!(f, "audit reference failed: {error}"),
        }
    }
}

impl std::error::Error for ComputeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Transparent: the backend's error is what this one says, so its chain goes on with
            // that error's source (returning the error itself would say it twice).
            ComputeError::Backend(error) => error.source(),
            ComputeError::Audit(_) => None,
            ComputeError::Reference(error) => Some(error),
        }
    }
}

/// A live audit's mismatch, with the step it stopped and what computed the product.
#[derive(Clone, Debug, PartialEq)]
pub struct AuditFailure {
    /// The step being computed (1-based), 0 when the audit ran outside a step.
    pub step: u32,
    pub mismatch: AuditMismatch,
    /// The audited backend's label.
    pub backend: String,
}

impl std::fmt::Display for AuditFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step {}: live audit failed, the run stops: {} (backend: {})", self.step, self.mismatch, self.backend)
    }
}

/// What an audit found: one op of a step recomputed by the reference disagreed.
#[derive(Clone, Debug, PartialEq)]
pub struct AuditMismatch {
    /// The op's position in the step's sequence.
    pub call: usize,
    pub op: &'static str,
    /// The buffer (backend handle) holding the first differing word.
    pub buffer: u64,
    /// Word index of the first difference in that buffer.
    pub index: usize,
    pub expected_bits: u32,
    pub actual_bits: u32,
    /// How many words of that buffer differ.
    pub differing: usize,
}

impl std::fmt::Display for AuditMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "op #{} ({}) differs from the CPU reference in {} word(s); first at word {} of buffer {}: expected {:#010x}, got {:#010x}",
            self.call, self.op, self.differing, self.index, self.buffer, self.expected_bits, self.actual_bits
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend's error is said once along the chain a binary prints (`anyhow`'s `{:#}` walks
    /// `source`): a wrapped error that showed its backend's message and also returned it as its
    /// source printed it two and three times.
    #[test]
    fn a_backend_error_is_said_once_along_its_chain() {
        let error = ComputeError::backend(std::io::Error::other("op #5: matmul: non-finite input"));
        let mut chain = vec![error.to_string()];
        let mut source = std::error::Error::source(&error);
        while let Some(e) = source {
            chain.push(e.to_string());
            source = e.source();
        }
        assert_eq!(chain, ["op #5: matmul: non-finite input"]);
    }
}
