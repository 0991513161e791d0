//! The inference kit: one self-contained HTML file with the model code in JavaScript
//! (`node/kit/kit.js`) and the weights base64-embedded. It makes no network access of any
//! kind: no external reference, and a Content-Security-Policy of `default-src 'none'`.

use crate::config::{TOKENIZER_NAME, VOCAB};
use crate::trainer::TrainState;

const TEMPLATE: &str = include_str!("../kit/kit.html");
const SCRIPT: &str = include_str!("../kit/kit.js");

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The kit for `state`'s weights, with `prompt` pre-filled.
pub fn render(state: &TrainState, prompt: &str) -> String {
    let m = state.run.model;
    let config = format!(
        "{{\"width\":{},\"context\":{},\"layers\":{},\"heads\":{},\"vocab\":{VOCAB},\"tokenizer\":\"{TOKENIZER_NAME}\",\"step\":{},\"parameters\":{}}}",
        m.width,
        m.context,
        m.layers,
        m.heads,
        state.step,
        state.weights.len()
    );
    let bytes: Vec<u8> = state.weights.iter().flat_map(|w| w.to_le_bytes()).collect();
    TEMPLATE
        .replace("{{CONFIG}}", &config)
        .replace("{{PROMPT}}", &escape_html(prompt))
        .replace("{{SCRIPT}}", SCRIPT)
        .replace("{{WEIGHTS}}", &base64(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (raw, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), encoded);
        }
    }

    #[test]
    fn the_kit_references_nothing_outside_itself() {
        let run = crate::config::RunConfig {
            model: crate::config::ModelConfig { width: 8, context: 4, layers: 1, heads: 1 },
            batch: 1,
            steps: 1,
            lr: 0.001,
            seed: 1,
            sync: crate::sync::SyncConfig::SEED,
        };
        let layout = crate::params::Layout::new(run.model);
        let state = TrainState {
            run,
            step: 0,
            weights: crate::params::init(&layout, 1),
            adam: crate::adam::Adam::new(layout.len),
            data_state: 0,
            sync: Default::default(),
        };
        let html = render(&state, "<b>&");
        assert!(html.contains("&lt;b&gt;&amp;"));
        assert!(!html.contains("{{"), "a placeholder was left unfilled");
        for forbidden in [
            "http://",
            "https://",
            "//cdn",
            "fetch(",
            "XMLHttpRequest",
            "WebSocket",
            "import(",
            "src=\"",
            "@import",
            "url(",
        ] {
            assert!(!html.contains(forbidden), "the kit mentions `{forbidden}`");
        }
        assert!(html.contains("default-src 'none'"));
    }
}
