//! The `lut` plugin: WGSL units through the exact int8 product table in a storage buffer (wgpu).
//! Everything but the product choice lives in `lockstep_gpu`.

lockstep_gpu::gpu_worker!(
    LutWorker,
    c"lut",
    c"WGSL units through the exact int8 product table in a storage buffer (wgpu)",
    lockstep_gpu::Engine::Lut
);

lockstep_worker_api::export_worker!(LutWorker);
