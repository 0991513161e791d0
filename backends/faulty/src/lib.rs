//! Deliberately wrong implementations of the units, each a plausible bug, so tests can show
//! that the exact gate rejects them. Each `examples/flaw_*.rs` builds one into a cdylib
//! plugin; `examples/bad_*.rs` are plugins broken at the ABI level instead; `examples/mutant.rs`
//! is any one of the [`mutants`] catalogue's mutants of the reference.
//!
//! [`coopmat`] locates the Vulkan driver the `tc` backend's tests run on.
//!
//! Nothing here is used by the product.

pub mod coopmat;
mod flaws;
pub mod mutants;

pub use flaws::{flawed_gemm, flawed_gemm_i8, Flaw};

use lockstep_luts::units::BLOCK;

/// The reference units behind the ABI, correct and slow: the base of the ABI-level fixtures.
pub struct ReferenceWorker;

impl lockstep_worker_api::plugin::Worker for ReferenceWorker {
    const NAME: &'static std::ffi::CStr = c"reference-fixture";
    const DESCRIPTION: &'static std::ffi::CStr = c"the reference units behind the ABI (test fixture)";
    const CAPABILITIES: u64 = lockstep_worker_api::caps::REQUIRED;

    fn create(_: &lockstep_worker_api::CreateOptions) -> Result<Self, lockstep_worker_api::plugin::WorkerError> {
        Ok(ReferenceWorker)
    }

    fn describe(&self) -> String {
        "test fixture".into()
    }

    fn gemm_f32(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<(), lockstep_worker_api::plugin::WorkerError> {
        let out = lockstep_luts::gemm_nt(m, n, k, a, b).map_err(|e| {
            lockstep_worker_api::plugin::WorkerError::new(lockstep_worker_api::status::NON_FINITE_INPUT, e.to_string())
        })?;
        c.copy_from_slice(&out);
        Ok(())
    }

    fn gemm_i8(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[i8],
        b: &[i8],
        c: &mut [i32],
    ) -> Result<(), lockstep_worker_api::plugin::WorkerError> {
        c.copy_from_slice(&lockstep_luts::gemm_i8_nt(m, n, k, a, b));
        Ok(())
    }
}

/// Defines and exports a plugin computing the units with `$flaw`.
#[macro_export]
macro_rules! flawed_plugin {
    ($name:literal, $flaw:expr) => {
        use lockstep_worker_api::plugin::{Worker, WorkerError};
        use lockstep_worker_api::{caps, status, CreateOptions};

        struct Flawed;

        impl Worker for Flawed {
            const NAME: &'static std::ffi::CStr = $name;
            const DESCRIPTION: &'static std::ffi::CStr = c"deliberately wrong units (test fixture)";
            const CAPABILITIES: u64 = caps::REQUIRED;

            fn create(_: &CreateOptions) -> Result<Self, WorkerError> {
                Ok(Flawed)
            }

            fn describe(&self) -> String {
                "test fixture".into()
            }

            fn gemm_f32(
                &mut self,
                m: usize,
                n: usize,
                k: usize,
                a: &[f32],
                b: &[f32],
                c: &mut [f32],
            ) -> Result<(), WorkerError> {
                $crate::flawed_gemm($flaw, m, n, k, a, b, c).map_err(|e| WorkerError::new(status::NON_FINITE_INPUT, e))
            }

            fn gemm_i8(
                &mut self,
                m: usize,
                n: usize,
                k: usize,
                a: &[i8],
                b: &[i8],
                c: &mut [i32],
            ) -> Result<(), WorkerError> {
                $crate::flawed_gemm_i8($flaw, m, n, k, a, b, c);
                Ok(())
            }
        }

        lockstep_worker_api::export_worker!(Flawed);
    };
}

/// How a [`Misbehaving`] plugin goes wrong, from the first product with `k` past one block (the
/// gate's earliest cases pass, so the failure comes mid-battery, as a real bug would).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehaviour {
    /// Dereferences a null pointer: SIGSEGV.
    Segfault,
    /// `abort()`: SIGABRT.
    Abort,
    /// Writes one element past the output it was given (the result itself is right).
    Overrun,
    /// Never returns.
    Hang,
}

/// The reference units with a [`Misbehaviour`] (`examples/crash_*.rs`, `overrun_*`, `hang_*`).
pub struct Misbehaving<const M: u8>;

impl<const M: u8> Misbehaving<M> {
    const BEHAVIOUR: Misbehaviour = match M {
        0 => Misbehaviour::Segfault,
        1 => Misbehaviour::Abort,
        2 => Misbehaviour::Overrun,
        _ => Misbehaviour::Hang,
    };
}

impl<const M: u8> lockstep_worker_api::plugin::Worker for Misbehaving<M> {
    const NAME: &'static std::ffi::CStr = c"misbehaving-fixture";
    const DESCRIPTION: &'static std::ffi::CStr =
        c"the reference units, then a crash, an overrun or a hang (test fixture)";
    const CAPABILITIES: u64 = lockstep_worker_api::caps::REQUIRED;

    fn create(_: &lockstep_worker_api::CreateOptions) -> Result<Self, lockstep_worker_api::plugin::WorkerError> {
        Ok(Misbehaving)
    }

    fn describe(&self) -> String {
        format!("test fixture: {:?}", Self::BEHAVIOUR)
    }

    fn gemm_f32(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<(), lockstep_worker_api::plugin::WorkerError> {
        ReferenceWorker.gemm_f32(m, n, k, a, b, c)?;
        if k > BLOCK {
            match Self::BEHAVIOUR {
                Misbehaviour::Segfault => {
                    let null: *mut f32 = std::ptr::null_mut();
                    // SAFETY: none — the fixture's whole point is to crash its host here.
                    unsafe { std::ptr::write_volatile(null, 1.0) };
                }
                Misbehaviour::Abort => std::process::abort(),
                Misbehaviour::Overrun => {
                    // SAFETY: none — one element past the caller's buffer, the bug this fixture is.
                    unsafe { std::ptr::write_volatile(c.as_mut_ptr().add(c.len()), 1.0) };
                }
                Misbehaviour::Hang => loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                },
            }
        }
        Ok(())
    }

    fn gemm_i8(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[i8],
        b: &[i8],
        c: &mut [i32],
    ) -> Result<(), lockstep_worker_api::plugin::WorkerError> {
        ReferenceWorker.gemm_i8(m, n, k, a, b, c)
    }
}
