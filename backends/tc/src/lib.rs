//! The `tc` plugin: the units' block sums on int8 cooperative matrices (tensor cores), as
//! SPIR-V passed through wgpu; the rest of the step as `dp4a`. Offered only where the driver
//! reports an s8 × s8 → s32 cooperative-matrix shape (`docs/TENSOR_CORES.md`). Everything but
//! the engine's choice lives in `lockstep_gpu`.

lockstep_gpu::gpu_worker!(
    TcWorker,
    c"tc",
    c"units on int8 cooperative matrices (tensor cores) through SPIR-V passthrough, the rest as dp4a (wgpu)",
    lockstep_gpu::Engine::Tc
);

lockstep_worker_api::export_worker!(TcWorker);
