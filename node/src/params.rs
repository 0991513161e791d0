//! The model's weights: one flat f32 vector with named tensors at fixed offsets.
//!
//! The order is part of the checkpoint format and of the weight hash (`docs/MODEL.md`):
//! `tok_emb [256, c]`, `pos_emb [t, c]`, then per layer `ln1.g [c]`, `ln1.b [c]`,
//! `attn.qkv.w [3c, c]`, `attn.qkv.b [3c]`, `attn.proj.w [c, c]`, `attn.proj.b [c]`,
//! `ln2.g [c]`, `ln2.b [c]`, `mlp.fc.w [4c, c]`, `mlp.fc.b [4c]`, `mlp.proj.w [c, 4c]`,
//! `mlp.proj.b [c]`, then `lnf.g [c]`, `lnf.b [c]`, `head.w [256, c]`, `head.b [256]`.
//! Matrices are `[out, in]` row-major, so a linear layer is one unit call `x · Wᵀ`.

use std::ops::Range;

use lockstep_luts::rng::SplitMix64;

use crate::config::{ModelConfig, VOCAB};

/// Where one tensor lives in the flat vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub shape: Vec<usize>,
    pub range: Range<usize>,
}

/// Offsets of one block's tensors.
#[derive(Clone, Debug)]
pub struct LayerOffsets {
    pub ln1_g: Range<usize>,
    pub ln1_b: Range<usize>,
    pub qkv_w: Range<usize>,
    pub qkv_b: Range<usize>,
    pub proj_w: Range<usize>,
    pub proj_b: Range<usize>,
    pub ln2_g: Range<usize>,
    pub ln2_b: Range<usize>,
    pub fc_w: Range<usize>,
    pub fc_b: Range<usize>,
    pub fc2_w: Range<usize>,
    pub fc2_b: Range<usize>,
}

/// Offsets of every tensor.
#[derive(Clone, Debug)]
pub struct Layout {
    pub config: ModelConfig,
    pub tok_emb: Range<usize>,
    pub pos_emb: Range<usize>,
    pub layers: Vec<LayerOffsets>,
    pub lnf_g: Range<usize>,
    pub lnf_b: Range<usize>,
    pub head_w: Range<usize>,
    pub head_b: Range<usize>,
    pub tensors: Vec<TensorInfo>,
    pub len: usize,
}

impl Layout {
    pub fn new(config: ModelConfig) -> Layout {
        let c = config.width;
        let mut tensors = Vec::new();
        let mut next = 0;
        let mut take = |name: String, shape: Vec<usize>| {
            let len: usize = shape.iter().product();
            let range = next..next + len;
            next += len;
            tensors.push(TensorInfo { name, shape, range: range.clone() });
            range
        };
        let tok_emb = take("tok_emb".into(), vec![VOCAB, c]);
        let pos_emb = take("pos_emb".into(), vec![config.context, c]);
        let layers = (0..config.layers)
            .map(|l| LayerOffsets {
                ln1_g: take(format!("layers.{l}.ln1.g"), vec![c]),
                ln1_b: take(format!("layers.{l}.ln1.b"), vec![c]),
                qkv_w: take(format!("layers.{l}.attn.qkv.w"), vec![3 * c, c]),
                qkv_b: take(format!("layers.{l}.attn.qkv.b"), vec![3 * c]),
                proj_w: take(format!("layers.{l}.attn.proj.w"), vec![c, c]),
                proj_b: take(format!("layers.{l}.attn.proj.b"), vec![c]),
                ln2_g: take(format!("layers.{l}.ln2.g"), vec![c]),
                ln2_b: take(format!("layers.{l}.ln2.b"), vec![c]),
                fc_w: take(format!("layers.{l}.mlp.fc.w"), vec![4 * c, c]),
                fc_b: take(format!("layers.{l}.mlp.fc.b"), vec![4 * c]),
                fc2_w: take(format!("layers.{l}.mlp.proj.w"), vec![c, 4 * c]),
                fc2_b: take(format!("layers.{l}.mlp.proj.b"), vec![c]),
            })
            .collect();
        let lnf_g = take("lnf.g".into(), vec![c]);
        let lnf_b = take("lnf.b".into(), vec![c]);
        let head_w = take("head.w".into(), vec![VOCAB, c]);
        let head_b = take("head.b".into(), vec![VOCAB]);
        Layout { config, tok_emb, pos_emb, layers, lnf_g, lnf_b, head_w, head_b, tensors, len: next }
    }
}

/// A standard-normal-like draw from 12 uniforms (Irwin–Hall): additions only, so every
/// platform draws the same bits.
fn normal(rng: &mut SplitMix64) -> f32 {
    let mut sum = 0.0f32;
    for _ in 0..12 {
        sum += (rng.next_u64() >> 40) as f32 / 16_777_216.0;
    }
    sum - 6.0
}

/// Seeded GPT-2-style initialisation: weights `N(0, 0.02)`, residual projections
/// `N(0, 0.02 / √(2·layers))`, embeddings `N(0, 0.02)`, LayerNorm gains 1, biases 0.
pub fn init(layout: &Layout, seed: u64) -> Vec<f32> {
    let mut weights = vec![0.0f32; layout.len];
    let mut rng = SplitMix64::new(seed ^ 0x696e_6974_0000_0000);
    let residual_std = 0.02 / (2.0 * layout.config.layers as f32).sqrt();
    let mut fill = |range: &Range<usize>, std: f32, weights: &mut [f32]| {
        for w in &mut weights[range.clone()] {
            *w = normal(&mut rng) * std;
        }
    };
    fill(&layout.tok_emb, 0.02, &mut weights);
    fill(&layout.pos_emb, 0.02, &mut weights);
    for layer in &layout.layers {
        weights[layer.ln1_g.clone()].fill(1.0);
        fill(&layer.qkv_w, 0.02, &mut weights);
        fill(&layer.proj_w, residual_std, &mut weights);
        weights[layer.ln2_g.clone()].fill(1.0);
        fill(&layer.fc_w, 0.02, &mut weights);
        fill(&layer.fc2_w, residual_std, &mut weights);
    }
    weights[layout.lnf_g.clone()].fill(1.0);
    fill(&layout.head_w, 0.02, &mut weights);
    weights
}

/// The weight hash `whash`: 32-bit FNV-1a over the hashes of 4096-weight chunks of the weights'
/// little-endian bytes (`lockstep_luts::hash`; chunked so that threads and GPUs can share it),
/// the chunks hashed on every core.
pub fn weight_hash(weights: &[f32]) -> u32 {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    lockstep_luts::hash::chunked_f32(weights, threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_model_has_the_documented_size() {
        let layout = Layout::new(ModelConfig::DEFAULT);
        // 256·c + t·c + layers·(12c² + 13c) + 2c + 256·c + 256 with c = t = 128, 4 layers.
        assert_eq!(layout.len, 875_520);
        // Tensors tile the vector exactly, in order.
        let mut next = 0;
        for tensor in &layout.tensors {
            assert_eq!(tensor.range.start, next, "{}", tensor.name);
            assert_eq!(tensor.range.len(), tensor.shape.iter().product::<usize>());
            next = tensor.range.end;
        }
        assert_eq!(next, layout.len);
    }

    #[test]
    fn init_is_seeded_and_plausible() {
        let layout = Layout::new(ModelConfig { width: 32, context: 16, layers: 2, heads: 2 });
        let a = init(&layout, 7);
        assert_eq!(weight_hash(&a), weight_hash(&init(&layout, 7)));
        assert_ne!(weight_hash(&a), weight_hash(&init(&layout, 8)));
        let emb = &a[layout.tok_emb.clone()];
        let mean = emb.iter().map(|&x| f64::from(x)).sum::<f64>() / emb.len() as f64;
        let var = emb.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / emb.len() as f64;
        assert!(mean.abs() < 0.002 && (var.sqrt() - 0.02).abs() < 0.002, "mean {mean} std {}", var.sqrt());
        assert!(a[layout.layers[0].ln1_g.clone()].iter().all(|&g| g == 1.0));
        assert!(a[layout.head_b.clone()].iter().all(|&b| b == 0.0));
    }
}
