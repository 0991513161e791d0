//! Small text helpers the panes and dialogs share.

/// `text` cut into rows of at most `width` characters, continuation rows indented by two.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if width <= 4 || chars.len() <= width {
        return vec![text.to_string()];
    }
    let mut rows = vec![chars[..width].iter().collect::<String>()];
    for chunk in chars[width..].chunks(width - 2) {
        rows.push(format!("  {}", chunk.iter().collect::<String>()));
    }
    rows
}

/// `24.6k`, `980`.
pub fn human_count(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.1}M", value / 1e6)
    } else if value >= 1e4 {
        format!("{:.1}k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}

/// `12.3M`, `980k`, `17`.
pub fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.1}G", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1}M", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.0}k", b / 1e3)
    } else {
        format!("{bytes}")
    }
}
