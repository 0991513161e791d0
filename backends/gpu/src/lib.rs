//! Shared wgpu plumbing of the GPU plugins (`lut`, `dp4a`, `tc`).
//!
//! [`GpuUnits`] owns one device and queue, a pipeline cache keyed by kernel, the product
//! table (LUT plugin) and grow-only buffers. An ABI 1 unit call quantizes on the host with
//! `lockstep_quantize` (bit-identical to the reference), uploads the int8 blocks and
//! exponents, runs the `gemm_units` kernel from `lockstep_shaders` (exact i32 block sums and
//! the contraction-proof epilogue on the GPU), and reads C back. ABI 2 (the `step` module)
//! keeps the host's buffers on the device and runs whole op sequences there, quantizing on the
//! device too.
//!
//! **Adapter choice**: the highest-ranked adapter (discrete, integrated, virtual, then
//! software) unless the host names a substring of another's name ([`GpuOptions::adapter`],
//! from `CreateOptions`; nothing is read from the environment). With
//! [`GpuOptions::hardware_only`] a software adapter (Mesa lavapipe, SwiftShader) is refused.
//! The DP4A product needs the adapter's integer dot product (Vulkan 1.3 or
//! `VK_KHR_shader_integer_dot_product`); without it creation fails instead of silently running
//! naga's polyfill. The `tc` engine ([`Engine::Tc`]) also needs an int8 cooperative-matrix
//! shape from the driver ([`int8_cooperative_shapes`]) and runs its tiled unit kernel as SPIR-V
//! (the `coop` module); without them creation fails with what each adapter lacks.

pub mod coop;
mod units;

/// The op type of ABI 2, for the plugin macro.
pub use lockstep_luts::ops::Op as StepOp;
pub use units::{
    create_for_plugin, int8_cooperative_shapes, requested_tile, worker_error, AdapterSummary, Engine, GpuError,
    GpuOptions, GpuUnits,
};

/// Defines a plugin worker type over [`GpuUnits`] for one product; the plugin crate then
/// calls `lockstep_worker_api::export_worker!` on it.
#[macro_export]
macro_rules! gpu_worker {
    ($ty:ident, $name:expr, $description:expr, $engine:expr) => {
        /// The plugin instance: one GPU device running the units.
        pub struct $ty {
            units: $crate::GpuUnits,
        }

        impl lockstep_worker_api::plugin::Worker for $ty {
            const NAME: &'static std::ffi::CStr = $name;
            const DESCRIPTION: &'static std::ffi::CStr = $description;
            const CAPABILITIES: u64 = lockstep_worker_api::caps::REQUIRED
                | lockstep_worker_api::caps::KERNEL_TIMING
                | lockstep_worker_api::caps::PEAK_TIMING
                | lockstep_worker_api::caps::DEVICE;

            fn create(
                options: &lockstep_worker_api::CreateOptions,
            ) -> Result<Self, lockstep_worker_api::plugin::WorkerError> {
                Ok(Self { units: $crate::create_for_plugin($engine, options)? })
            }

            fn describe(&self) -> String {
                self.units.describe()
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
                self.units.gemm_f32(m, n, k, a, b, c).map_err($crate::worker_error)
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
                self.units.gemm_i8(m, n, k, a, b, c).map_err($crate::worker_error)
            }

            fn time_kernel(
                &mut self,
                m: usize,
                n: usize,
                k: usize,
                repeat: usize,
            ) -> Result<f64, lockstep_worker_api::plugin::WorkerError> {
                self.units.time_kernel(m, n, k, repeat).map_err($crate::worker_error)
            }

            fn time_peak(&mut self, repeat: usize) -> Result<f64, lockstep_worker_api::plugin::WorkerError> {
                self.units.time_peak(repeat).map_err($crate::worker_error)
            }

            const OPS: u64 = lockstep_worker_api::ops::ALL;

            fn buffer_create(&mut self, words: usize) -> Result<u64, lockstep_worker_api::plugin::WorkerError> {
                self.units.buffer_create(words).map_err($crate::worker_error)
            }

            fn buffer_free(&mut self, handle: u64) {
                self.units.buffer_free(handle)
            }

            fn buffer_write(
                &mut self,
                handle: u64,
                offset: usize,
                data: &[u32],
            ) -> Result<(), lockstep_worker_api::plugin::WorkerError> {
                self.units.buffer_write(handle, offset, data).map_err($crate::worker_error)
            }

            fn buffer_read(
                &mut self,
                handle: u64,
                offset: usize,
                out: &mut [u32],
            ) -> Result<(), lockstep_worker_api::plugin::WorkerError> {
                self.units.buffer_read(handle, offset, out).map_err($crate::worker_error)
            }

            fn run_ops(&mut self, ops: &[$crate::StepOp]) -> Result<(), lockstep_worker_api::plugin::WorkerError> {
                self.units.run_ops(ops).map_err($crate::worker_error)
            }
        }
    };
}
