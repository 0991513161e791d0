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

/// Sets `trainer` up to make the next contribution as `rogue` makes it (`provider`: where
/// another member's batch comes from); whether that contribution will be wrong (a stale one
/// is known wrong only once it is made).
pub(super) fn arm(
    rogue: Option<Rogue>,
    trainer: &mut Trainer,
    provider: &mut dyn Provider,
) -> Result<bool, ReplicaError> {
    if let Some(Rogue::OthersBatch(peer)) = rogue {
        // Its batch of this step is another member's.
        let mut other = provider.data_source(node_data_seed(run_seed(trainer), peer)).map_err(ReplicaError::Data)?;
        other.seek(u64::from(trainer.step_count()));
        trainer.replace_data(other);
    }
    let tamper = match rogue {
        Some(Rogue::Scale(factor)) => Some(Tamper::Scale(factor)),
        Some(Rogue::FlipTensor) => Some(Tamper::Negate(crate::params::Layout::new(trainer.run_config().model).tok_emb)),
        Some(Rogue::ForgeState) => Some(Tamper::ForgeResidual(2.0)),
        _ => None,
    };
    let wrong = tamper.is_some() || matches!(rogue, Some(Rogue::OthersBatch(_)));
    trainer.tamper(tamper);
    let sync = trainer.run_config().sync;
    let f32_window = sync.compression == crate::sync::Compression::None && sync.mode.steps_per_sync() > 1;
    if rogue == Some(Rogue::ForgeState) && f32_window {
        // An f32 window has no residual: its optimizer's first moment doubled instead, before
        // the window runs from it and names it.
        trainer.forge_moments(2.0);
    }
    Ok(wrong)
}
