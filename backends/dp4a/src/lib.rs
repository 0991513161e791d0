//! The `dp4a` plugin: WGSL units through the hardware int8 dot product, dot4I8Packed (wgpu).
//! Everything but the product choice lives in `lockstep_gpu`.

lockstep_gpu::gpu_worker!(
    Dp4aWorker,
    c"dp4a",
    c"WGSL units through the hardware int8 dot product, dot4I8Packed (wgpu)",
    lockstep_gpu::Engine::Dp4a
);

lockstep_worker_api::export_worker!(Dp4aWorker);
