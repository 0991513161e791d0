//! Text generation from a trained model: greedy at temperature 0, seeded sampling otherwise.
//!
//! Each new token runs the model on the last `min(len, context)` tokens (no cache: the same
//! computation the inference kit does, so both give the same bits) and reads the last row of
//! logits. Greedy takes the first index of the largest logit. Sampling divides the logits by
//! the temperature, takes a softmax with `mathf::exp` and walks the cumulative sum with a
//! 24-bit uniform from SplitMix64.

use lockstep_luts::rng::SplitMix64;

use crate::compute_error::ComputeError;
use crate::config::VOCAB;
use crate::gemm::Gemm;
use crate::mathf;
use crate::model::Model;

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    Greedy,
    Temperature { temperature: f32, seed: u64 },
}

/// The index of the largest value, the first one on ties.
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// Generates `count` tokens after `prompt` (an empty prompt starts from a newline).
pub fn generate(
    model: &Model,
    gemm: &mut dyn Gemm,
    weights: &[f32],
    prompt: &[u8],
    count: usize,
    sampling: Sampling,
) -> Result<Vec<u8>, ComputeError> {
    let context = model.layout.config.context;
    let mut tokens: Vec<u8> = if prompt.is_empty() { vec![b'\n'] } else { prompt.to_vec() };
    let mut rng = match sampling {
        Sampling::Temperature { seed, .. } => Some(SplitMix64::new(seed)),
        Sampling::Greedy => None,
    };
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let window = &tokens[tokens.len().saturating_sub(context)..];
        let fwd = model.forward(gemm, weights, window, 1, window.len())?;
        let last = &fwd.logits[(window.len() - 1) * VOCAB..window.len() * VOCAB];
        let next = match (sampling, rng.as_mut()) {
            (Sampling::Temperature { temperature, .. }, Some(rng)) if temperature > 0.0 => {
                sample(last, temperature, rng)
            }
            _ => argmax(last),
        } as u8;
        out.push(next);
        tokens.push(next);
    }
    Ok(out)
}

fn sample(logits: &[f32], temperature: f32, rng: &mut SplitMix64) -> usize {
    let scaled: Vec<f32> = logits.iter().map(|&l| l / temperature).collect();
    let max = scaled.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let weights: Vec<f32> = scaled.iter().map(|&v| mathf::exp(v - max)).collect();
    let total: f32 = weights.iter().sum();
    let u = (rng.next_u64() >> 40) as f32 / 16_777_216.0 * total;
    let mut acc = 0.0f32;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        if u < acc {
            return i;
        }
    }
    argmax(&weights)
}
