//! The tile decides which invocation computes an output, never the order of its additions:
//! every tile of `lockstep_shaders::TILES`, with both products, gives the reference's bits.
//! Runs on the adapter wgpu finds (lavapipe in CI); failing to create one fails the test.

use lockstep_gpu::{Engine, GpuOptions, GpuUnits};
use lockstep_luts::rng::SplitMix64;
use lockstep_shaders::TILES;

/// One product: `m, n, k`, then A and B.
type Case = (usize, usize, usize, Vec<f32>, Vec<f32>);

#[test]
fn every_tile_and_product_gives_the_reference_bits() {
    let mut rng = SplitMix64::new(0x711e);
    // Shapes that leave partial tiles in both directions, several blocks, a short last block.
    let cases: Vec<Case> = [(70, 45, 100), (129, 17, 64), (5, 260, 33)]
        .into_iter()
        .enumerate()
        .map(|(i, (m, n, k))| {
            let scale = [1.0f32, 1e-36, 3e30][i];
            let a = (0..m * k).map(|_| rng.next_signed_unit() * scale).collect();
            let b = (0..n * k).map(|_| rng.next_signed_unit()).collect();
            (m, n, k, a, b)
        })
        .collect();
    for product in [Engine::Lut, Engine::Dp4a] {
        for &tile in TILES {
            let options = GpuOptions { tile: Some(tile), ..GpuOptions::default() };
            let mut units = GpuUnits::new(product, &options).unwrap_or_else(|e| panic!("{product:?}: {e}"));
            assert_eq!(units.tile(), tile);
            for (m, n, k, a, b) in &cases {
                let (m, n, k) = (*m, *n, *k);
                let expected = lockstep_luts::gemm_nt(m, n, k, a, b).unwrap();
                let mut c = vec![f32::NAN; m * n];
                units.gemm_f32(m, n, k, a, b, &mut c).unwrap();
                let differ = expected.iter().zip(&c).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                assert_eq!(differ, 0, "{product:?} {tile:?} {m}x{n}x{k}: {differ} elements differ");
            }
        }
    }
}

#[test]
fn kernel_timing_runs_and_reports_a_positive_time() {
    let mut units = GpuUnits::new(Engine::Dp4a, &GpuOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let seconds = units.time_kernel(64, 64, 64, 2).unwrap();
    assert!(seconds > 0.0 && seconds.is_finite());
    // The unit still gives the reference bits afterwards (the timing used its own buffers'
    // contents, not stale state the next call could see).
    let a: Vec<f32> = (0..64 * 64).map(|i| (i % 17) as f32 - 8.0).collect();
    let mut c = vec![0f32; 64 * 64];
    units.gemm_f32(64, 64, 64, &a, &a, &mut c).unwrap();
    assert_eq!(c, lockstep_luts::gemm_nt(64, 64, 64, &a, &a).unwrap());
}
