//! The inference kit: one self-contained HTML file with the model code in JavaScript
//! (`node/kit/kit.js`) and the weights base64-embedded. It makes no network access of any
//! kind: no external reference, and a Content-Security-Policy of `default-src 'none'`.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use crate::config::{TOKENIZER_NAME, VOCAB};
use crate::trainer::TrainState;

const TEMPLATE: &str = include_str!("../kit/kit.html");
const SCRIPT: &str = include_str!("../kit/kit.js");

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
        .replace("{{WEIGHTS}}", &STANDARD.encode(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kit_references_nothing_outside_itself() {
        let run = crate::config::RunConfig {
            model: crate::config::ModelConfig { width: 8, context: 4, layers: 1, heads: 1 },
            batch: 1,
            steps: 1,
            lr: 0.001,
            seed: 1,
            sync: crate::sync::SyncConfig::SEED,
            corpus: 0,
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
