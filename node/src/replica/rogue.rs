//! Fault injection: the wrong members a replica can play (`{"cmd":"rogue"}`, `bench audit`).

use super::*;

/// A wrong member's kinds, for fault injection ([`Replica::play_rogue`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rogue {
    /// Every value of its contribution times this factor (`1.001`: a contribution one part in
    /// a thousand off).
    Scale(f32),
    /// The values of one tensor (the token embedding's) sign-flipped.
    FlipTensor,
    /// The contribution computed on another member's batch.
    OthersBatch(PeerId),
    /// The values of its previous contribution sent again (a copy of an honest contribution).
    Stale,
    /// `int8`, `int4`: its residual doubled before each contribution (an f32 `outer:H`
    /// window: its inner optimizer's first moment) — the contribution is what that state gives,
    /// and names it, but its own past did not leave it.
    ForgeState,
}

impl std::str::FromStr for Rogue {
    type Err = String;

    /// `scale:F`, `flip`, `batch:PEER`, `stale`, `state`.
    fn from_str(text: &str) -> Result<Rogue, String> {
        let bad = || format!("`{text}` is not a rogue (scale:F, flip, batch:PEER, stale, state)");
        Ok(match text.split_once(':') {
            None if text == "flip" => Rogue::FlipTensor,
            None if text == "stale" => Rogue::Stale,
            None if text == "state" => Rogue::ForgeState,
            Some(("scale", f)) => Rogue::Scale(f.parse().map_err(|_| bad())?),
            Some(("batch", p)) => Rogue::OthersBatch(p.parse().map_err(|_| bad())?),
            _ => return Err(bad()),
        })
    }
}
