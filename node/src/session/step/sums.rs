//! Chunk owners' sums in `Contributions`: each received (or formed here) by step, record and
//! owner, with who sent it — taken, replaced, checked against the step's owners, served on.

use super::*;

/// Chunk owners: the sums a member holds for one step, every record's together (a bound on
/// what peers can make it keep).
pub const MAX_SUMS: usize = 1024;

/// The owners' sums of one record's chunks, as they came (read once the record is known).
#[derive(Clone, Debug, Default)]
pub(super) struct Sums {
    /// Owner index → its sum's bytes (received, or formed here).
    pub(super) bytes: BTreeMap<u16, Vec<u8>>,
    /// Owner index → who sent the bytes (this member, where it formed them).
    pub(super) from: BTreeMap<u16, PeerId>,
    /// Owner index → the sum read (or formed here, or summed here from the values).
    pub(super) read: BTreeMap<u16, ChunkSum>,
}

impl Contributions {
    /// Chunk owners: owner `owner`'s sum of its chunk of the record `record` names (its bytes,
    /// read when the record is summed). False when one is held already.
    ///
    /// `by_owner`: `from` is that chunk's owner as this member knows the step's owners — its
    /// sum replaces one from anyone else (a sum formed here is never replaced). Sums past
    /// [`MAX_SUMS`] for a step, or longer than a sum of the model can be, are refused.
    pub fn offer_sum(
        &mut self,
        step: u32,
        record: u64,
        owner: u16,
        from: PeerId,
        bytes: Vec<u8>,
        by_owner: bool,
    ) -> bool {
        if bytes.len() > ChunkSum::longest_encoding(self.len) {
            return false;
        }
        let held: usize = self.sums.range((step, 0)..=(step, u64::MAX)).map(|(_, s)| s.bytes.len()).sum();
        let sums = self.sums.entry((step, record)).or_default();
        let replaces = match sums.from.get(&owner) {
            _ if !sums.bytes.contains_key(&owner) => held < MAX_SUMS,
            // Formed here, or its owner's: kept.
            None => false,
            Some(_) if !by_owner || sums.read.contains_key(&owner) => false,
            Some(_) => true,
        };
        if replaces {
            sums.bytes.insert(owner, bytes);
            sums.from.insert(owner, from);
        }
        replaces
    }

    /// Chunk owners: who sent owner `owner`'s sum for `record` of `step` (`None`: formed here,
    /// or none held).
    pub fn sum_from(&self, step: u32, record: u64, owner: u16) -> Option<PeerId> {
        self.sums.get(&(step, record))?.from.get(&owner).copied()
    }

    /// Chunk owners: drops the record's sums not sent by their owner of `owners` (all of them
    /// where the owners are not known), unless this member asked anyone for that one (`asked`:
    /// owner indices); returns which, and who sent each.
    pub fn drop_unsent(&mut self, record: &StepRecord, owners: &[PeerId], asked: &[u16]) -> Vec<(u16, PeerId)> {
        let Some(sums) = self.sums.get_mut(&(record.step, record.digest())) else { return Vec::new() };
        let wrong: Vec<(u16, PeerId)> = sums
            .from
            .iter()
            .filter(|(c, from)| {
                !asked.contains(c) && owners.get(usize::from(**c)) != Some(*from) && !sums.read.contains_key(c)
            })
            .map(|(c, from)| (*c, *from))
            .collect();
        for (c, _) in &wrong {
            sums.bytes.remove(c);
            sums.from.remove(c);
        }
        wrong
    }

    /// Chunk owners: the bytes of owner `owner`'s sum for `record` of `step`, received or formed
    /// here (to send on).
    pub fn sum_bytes(&self, step: u32, record: u64, owner: u16) -> Option<&Vec<u8>> {
        self.sums.get(&(step, record))?.bytes.get(&owner)
    }

    /// Chunk owners: whether owner `owner`'s sum for the record is held or formed here.
    pub fn has_sum(&self, step: u32, record: u64, owner: u16) -> bool {
        self.sums.get(&(step, record)).is_some_and(|s| s.bytes.contains_key(&owner))
    }

    /// Chunk owners: holds an owner's sum formed here, and its bytes.
    pub fn formed(&mut self, step: u32, record: u64, owner: u16, sum: ChunkSum, bytes: Vec<u8>) {
        let sums = self.sums.entry((step, record)).or_default();
        sums.read.insert(owner, sum);
        sums.bytes.insert(owner, bytes);
    }

    /// Chunk owners: owner `owner`'s sum of `record` of `step` as this member applied it (read,
    /// formed here, or summed here from the values).
    pub fn read_sum(&self, step: u32, record: u64, owner: u16) -> Option<&ChunkSum> {
        self.sums.get(&(step, record))?.read.get(&owner)
    }
}
