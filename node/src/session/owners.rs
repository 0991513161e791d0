//! Chunk owners in the session (`docs/OWNERS.md`, `--exchange owners`): a member sends every
//! other its contribution's header and each owner only its chunk; an owner sums its chunk of a
//! step's record once the record reaches it (replicated, or committed) and sends the sum to
//! everyone; a member applies the step from the owners' sums laid end to end.
//!
//! The owners of step `s` are the roster of step `s − 1`'s committed record, in its order:
//! every member that applied it knows them. A member that does not (the run's first step, or
//! the first after a push, or a resume whose record it did not see) sends its contribution
//! whole, and sums a step from whole contributions.
//!
//! Every chunk's values are held twice: each author's by the author and the chunk's owner, and
//! an owner's own chunk by the owner and its successor (the next owner, which it sends that
//! chunk to). So one member lost — an owner before its sum went out — loses no values. What does
//! not come is asked for: an owner's sum of anyone who holds it; after that the chunk's values,
//! of anyone who holds them, summed here; past that, a resume.

use super::*;
use crate::sync::owners::{chunk, owned_pieces};
use crate::sync::{Compression, Exchange, Reduced};
use crate::wire::{Chunk, Header, SumMessage};
use step::ChunkOffer;

/// Repair rounds for a step's missing chunk sums before the chunks' values are asked for (of
/// anyone, to sum here), and rounds in all before a resume.
const SUM_ROUNDS: u32 = 2;
const ROUNDS_BEFORE_RESUME: u32 = 5;

/// A member waiting for a committed step's chunk sums.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SumWait {
    pub step: u32,
    /// When the wait began, and when the last round asked.
    pub since_ms: u64,
    pub last_ms: Option<u64>,
    pub rounds: u32,
}

impl Session {
    /// Whether the run's contributions go to chunk owners.
    pub(super) fn owners_run(&self) -> bool {
        self.run.is_some_and(|r| r.sync.exchange == Exchange::Owners)
    }

    /// The owners of `step`, where the run has them and this member knows them (the roster of
    /// the record it applied last, for the step after it); at least two.
    pub(super) fn owners_of(&self, step: u32) -> Option<Vec<PeerId>> {
        if !self.owners_run() {
            return None;
        }
        let (at, roster) = self.taking.last_roster.as_ref()?;
        (*at + 1 == step && roster.len() >= 2).then(|| roster.clone())
    }

    /// Our contribution to `targets`: with the step's owners known, a header to each and its
    /// chunk to each owner (the header returned: it is what we hold ours by too); else whole.
    pub(super) fn send_contribution(&mut self, gradient: &Gradient, targets: &[PeerId]) -> Option<Header> {
        let Some(owners) = self.owners_of(gradient.step) else {
            for &to in targets {
                self.send(to, Message::Gradient(gradient.clone()));
            }
            return None;
        };
        let header = gradient.header();
        let me = self.config.me;
        let n = owners.len();
        // Our own chunk (we own one) goes to our successor: a second copy of its values.
        let own = owners.iter().position(|o| *o == me);
        let successor = own.map(|c| owners[(c + 1) % n]);
        for &to in targets {
            self.send(to, Message::Header { author: me, header: header.clone() });
            let theirs = owners.iter().position(|o| *o == to).map(|c| owned_pieces(n, c));
            let ours = own.filter(|_| successor == Some(to)).map(|c| owned_pieces(n, c));
            for pieces in theirs.into_iter().chain(ours).filter(|p| !p.is_empty()) {
                self.send(to, Message::Chunk(Chunk::of(gradient, me, pieces)));
            }
        }
        Some(header)
    }

    /// The pieces of `author`'s contribution to `step` this member takes: those it owns, and
    /// its predecessor's own chunk (where `author` is that predecessor); `None` while it does
    /// not know the step's owners.
    fn takes_pieces(&self, step: u32, author: PeerId, pieces: &std::ops::Range<usize>) -> Option<bool> {
        let me = self.config.me;
        let owners = self.owners_of(step)?;
        let n = owners.len();
        let Some(c) = owners.iter().position(|o| *o == me) else { return Some(false) };
        let predecessor = (c + n - 1) % n;
        Some(owned_pieces(n, c) == *pieces || owners[predecessor] == author && owned_pieces(n, predecessor) == *pieces)
    }

    /// `author`'s header from `from`: its own, or another's — from the leader, or a repair this
    /// member asked for of a committed record's contribution (the record's digest says which is
    /// right).
    pub(super) fn on_header(&mut self, from: PeerId, author: PeerId, header: Header) {
        if !self.owners_run() {
            return self.ignore(from, Ignored::NotOwners);
        }
        if self.roster.is_observer(author) {
            return self.ignore(from, Ignored::ContributionFromObserver);
        }
        let step = header.step;
        let repairing = self.taking.repairs.step == step && self.taking.repairs.attempts > 0;
        // Another's header is taken from the leader (it names it in its record), or asked for.
        if from != author && !repairing && self.leader() != Some(from) {
            return self.ignore(from, Ignored::HeaderNotAsked { step, author });
        }
        if !self.collects(step) {
            return self.ignore(from, Ignored::NotCollected { step });
        }
        let offer = self.contributions.offer_header(author, header);
        if from != author && offer == Offer::Accepted {
            self.event(Event::Repaired { step, peer: author });
        }
        self.offered(author, step, offer);
    }

    /// Whether contributions to `step` are held here now (the next two steps).
    pub(super) fn collects(&self, step: u32) -> bool {
        self.configured && step > self.taking.applied && step <= self.taking.applied + 2
    }

    pub(super) fn on_chunk(&mut self, from: PeerId, chunk: Chunk) {
        if !self.owners_run() {
            return self.ignore(from, Ignored::NotOwners);
        }
        let (step, author) = (chunk.step, chunk.author);
        let asked = self.taking.chunks_asked.contains(&(step, author, chunk.first, chunk.end));
        if from != author && !asked {
            return self.ignore(from, Ignored::ChunkRefused { step, author, why: ChunkOffer::NotOwned });
        }
        // An applied step's pieces only where asked for (an audit compares them).
        if !self.collects(step) && !asked {
            return self.ignore(from, Ignored::NotCollected { step });
        }
        // Only the pieces this member takes, where it knows the step's owners (a chunk may come
        // before it applied the step before it, which names them: held, checked against the
        // header), or pieces it asked for.
        let known = self.taking.last_roster.as_ref().is_some_and(|(at, _)| at + 1 >= step);
        let takes = self.takes_pieces(step, author, &chunk.pieces());
        if !asked && known && takes != Some(true) {
            return self.ignore(from, Ignored::ChunkRefused { step, author, why: ChunkOffer::NotOwned });
        }
        match self.contributions.offer_chunk(chunk) {
            ChunkOffer::Accepted => {
                // An audit that waited for these values compares them now.
                let at = self.audits.awaiting_values.iter().position(|(r, _, _)| r.step == step && r.target == author);
                if let Some(at) = at.filter(|_| self.contributions.whole_of(step, author).is_some()) {
                    let (running, recomputed, _) = self.audits.awaiting_values.remove(at);
                    self.compare(running, recomputed);
                    self.next_check();
                }
            }
            // Held until its header comes (asked of its author if it does not).
            ChunkOffer::NoHeader => {}
            why => self.ignore(from, Ignored::ChunkRefused { step, author, why }),
        }
    }

    pub(super) fn on_chunk_sum(&mut self, from: PeerId, sum: SumMessage) {
        if !self.owners_run() {
            return self.ignore(from, Ignored::NotOwners);
        }
        let SumMessage { step, record, owner, owners: _, bytes } = sum;
        if !self.collects(step) {
            return self.ignore(from, Ignored::NotCollected { step });
        }
        // From the owner itself, or — asked for — from anyone. Where this member knows the
        // step's owners it checks at once (and never takes another's sum of its own chunk);
        // where it does not yet, when the sum is used.
        let known = self.owners_of(step);
        let by_owner = known.as_ref().and_then(|o| o.get(usize::from(owner))) == Some(&from);
        let asked = self.taking.sums_asked.contains(&(step, record, owner));
        let ours = known.as_ref().and_then(|o| o.get(usize::from(owner))) == Some(&self.config.me);
        if known.is_some() && (ours || !by_owner && !asked) {
            return self.ignore(from, Ignored::NotTheOwner { step, owner });
        }
        self.contributions.offer_sum(step, record, owner, from, bytes, by_owner);
    }

    pub(super) fn on_sum_request(&mut self, from: PeerId, step: u32, record: u64, owner: u16, owners: u16) {
        // Only a sum formed here or sent by its owner is served on.
        let sender = self.contributions.sum_from(step, record, owner);
        let owner_is = self.owners_of(step).and_then(|o| o.get(usize::from(owner)).copied());
        if sender.is_some() && sender != owner_is {
            return self.ignore(from, Ignored::SumNotHeld);
        }
        match self.contributions.sum_bytes(step, record, owner) {
            Some(bytes) => {
                let bytes = bytes.clone();
                self.send(from, Message::ChunkSum(SumMessage { step, record, owner, owners, bytes }));
            }
            None => self.ignore(from, Ignored::SumNotHeld),
        }
    }

    /// Who holds chunk `c` of `author`'s contribution besides its author, among `owners`: its
    /// owner, or — the owner's own chunk — the owner's successor.
    pub(super) fn holder(owners: &[PeerId], author: PeerId, c: usize) -> PeerId {
        if owners[c] == author {
            owners[(c + 1) % owners.len()]
        } else {
            owners[c]
        }
    }

    /// Tells the leader of the pieces this member holds for others (as an owner, or its
    /// predecessor's own chunk) of the contributions to the next two steps, once each (again
    /// to a new leader).
    pub(super) fn tell_held(&mut self) {
        if !self.owners_run() || !self.configured || self.stopped.is_some() {
            return;
        }
        let (me, now, again) = (self.config.me, self.timing.now_ms(), self.config.repair_after_ms);
        let leader = self.leader();
        for step in self.taking.applied + 1..=self.taking.applied + 2 {
            let Some(owners) = self.owners_of(step) else { continue };
            let authors: Vec<PeerId> = self.contributions.at(step).map(|(p, _)| p).filter(|p| *p != me).collect();
            for author in authors {
                for c in 0..owners.len() {
                    let pieces = owned_pieces(owners.len(), c);
                    if pieces.is_empty() || Self::holder(&owners, author, c) != me {
                        continue;
                    }
                    let first = pieces.start as u8;
                    // Told again after one repair interval, then two, four, eight: a step that
                    // waits long (a slow or cut link elsewhere) is not flooded with acks.
                    let told = self.taking.acked.get(&(step, author, first)).copied();
                    if told.is_some_and(|(t, times)| now.saturating_sub(t) < again << times.min(3))
                        || !self.contributions.holds_part(step, author, pieces.clone())
                    {
                        continue;
                    }
                    let times = told.map_or(0, |(_, times)| times + 1);
                    self.taking.acked.insert((step, author, first), (now, times));
                    match leader {
                        Some(l) if l == me => {
                            self.taking.acks.insert((step, author, me, first));
                        }
                        Some(l) => {
                            let end = pieces.end as u8;
                            self.send(l, Message::ChunkHeld { step, author, first, end });
                        }
                        None => {
                            self.taking.acked.remove(&(step, author, first));
                        }
                    }
                }
            }
        }
    }

    /// (Leader) whether every chunk of `author`'s contribution to `step` is held by another
    /// member than its author — its owner, or the owner's successor, as they told, or this
    /// leader, which fetches what a holder gone or late lacks (`nudge_holders`): then its values
    /// outlive any one member. A contribution not held so is not named.
    pub(super) fn held_twice(&self, step: u32, author: PeerId) -> bool {
        let me = self.config.me;
        let Some(owners) = self.owners_of(step) else {
            // A whole step: another's values here (held by its header alone — a repair's answer
            // in a chunk owners' run — it names values no member may hold: its author's gone,
            // nobody could take the record). Ours go out whole (`appends.rs` keeps a record
            // naming them from being appended where they are not).
            return author == me || self.contributions.holds_whole(step, author);
        };
        let acks = &self.taking.acks;
        (0..owners.len()).all(|c| {
            let pieces = owned_pieces(owners.len(), c);
            let holder = Self::holder(&owners, author, c);
            pieces.is_empty()
                || acks.contains(&(step, author, holder, pieces.start as u8))
                || author != me && self.contributions.holds_part(step, author, pieces)
        })
    }

    /// (Leader) whether a chunk of our own contribution to `step` has no holder but us: our
    /// successor, which holds our own chunk, is gone. Named, it would be one copy — ours — and a
    /// record naming it could outlive us with nobody able to take it; the step goes without it
    /// (`propose` does not wait for it).
    pub(super) fn own_held_once(&self, step: u32) -> bool {
        let Some(owners) = self.owners_of(step) else { return false };
        let me = self.config.me;
        (0..owners.len()).any(|c| {
            let holder = Self::holder(&owners, me, c);
            holder != me && !owned_pieces(owners.len(), c).is_empty() && !self.members.contains(&holder)
        })
    }

    /// Asks `author` for all of its contribution to `step` (an audit compares it), taken as a
    /// chunk of every piece.
    pub(super) fn ask_whole(&mut self, step: u32, author: PeerId) {
        let end = crate::sync::owners::PIECES as u8;
        self.taking.chunks_asked.insert((step, author, 0, end));
        self.send(author, Message::ChunkRequest { step, author, first: 0, end });
    }

    /// What went missing of the next step before its record, asked for again once a repair
    /// interval: the header of a chunk that came without one (of its author), and the pieces
    /// this member holds for others of the contributions whose header came without them.
    pub(super) fn chase_parts(&mut self) {
        if !self.owners_run() || !self.configured || self.stopped.is_some() {
            return;
        }
        let (step, now, me) = (self.taking.applied + 1, self.timing.now_ms(), self.config.me);
        match self.taking.chased {
            Some((s, at)) if s == step && now.saturating_sub(at) < self.config.repair_after_ms => return,
            Some((s, _)) if s == step => {}
            _ => return self.taking.chased = Some((step, now)),
        }
        self.taking.chased = Some((step, now));
        for author in self.contributions.early_authors(step) {
            if self.members.contains(&author) {
                self.send(author, Message::RepairRequest { step, peer: author });
            }
        }
        let Some(owners) = self.owners_of(step) else { return };
        let authors: Vec<PeerId> = self.contributions.at(step).map(|(p, _)| p).filter(|p| *p != me).collect();
        for author in authors {
            for c in 0..owners.len() {
                let pieces = owned_pieces(owners.len(), c);
                if pieces.is_empty()
                    || Self::holder(&owners, author, c) != me
                    || self.contributions.holds_part(step, author, pieces.clone())
                    || !self.members.contains(&author)
                {
                    continue;
                }
                let (first, end) = (pieces.start as u8, pieces.end as u8);
                self.taking.chunks_asked.insert((step, author, first, end));
                self.send(author, Message::ChunkRequest { step, author, first, end });
            }
        }
    }

    /// (Leader, waiting) for each chunk of a contribution here that its holder has not said it
    /// holds: a holder connected is sent the header (it then asks the author for the pieces it
    /// lacks, [`Session::chase_parts`]: a header or chunk lost to a cut); a holder gone, or any
    /// past the step's deadline (`late`), is not waited for — the leader asks the author for
    /// those pieces and holds them itself, the second copy. Our own contribution has no second
    /// copy but its holders': past the deadline, a holder connected that has not said it holds
    /// its chunk is sent the header and the chunk again (both may have been lost to a cut, and
    /// no member may be left to wait for but us).
    pub(super) fn nudge_holders(&mut self, step: u32, late: bool) {
        let Some(owners) = self.owners_of(step) else { return };
        let me = self.config.me;
        let held: Vec<(PeerId, Header)> = self.contributions.at(step).map(|(p, h)| (p, h.header.clone())).collect();
        for (author, header) in held {
            for c in 0..owners.len() {
                let pieces = owned_pieces(owners.len(), c);
                let holder = Self::holder(&owners, author, c);
                let told = self.taking.acks.contains(&(step, author, holder, pieces.start as u8));
                if pieces.is_empty() || told || holder == author {
                    continue;
                }
                if author == me {
                    let resend = late && self.members.contains(&holder);
                    if let Some(chunk) = resend.then(|| self.contributions.chunk_of(step, me, pieces)).flatten() {
                        self.send(holder, Message::Header { author, header: header.clone() });
                        self.send(holder, Message::Chunk(chunk));
                    }
                    continue;
                }
                if self.contributions.holds_part(step, author, pieces.clone()) {
                    continue;
                }
                if holder != me && self.members.contains(&holder) && !late {
                    self.send(holder, Message::Header { author, header: header.clone() });
                } else if self.members.contains(&author) {
                    let (first, end) = (pieces.start as u8, pieces.end as u8);
                    self.taking.chunks_asked.insert((step, author, first, end));
                    self.send(author, Message::ChunkRequest { step, author, first, end });
                }
            }
        }
    }

    /// `from` holds pieces `first..end` of `author`'s contribution to `step`: kept where they
    /// are what `from` holds of it among the step's owners, of a contribution held here.
    pub(super) fn on_chunk_held(&mut self, from: PeerId, step: u32, author: PeerId, first: u8, end: u8) {
        let Some(owners) = self.owners_of(step).filter(|_| self.collects(step)) else {
            return self.ignore(from, Ignored::NotCollected { step });
        };
        let pieces = usize::from(first)..usize::from(end);
        let c = (0..owners.len()).find(|&c| owned_pieces(owners.len(), c) == pieces);
        let fits = c.is_some_and(|c| Self::holder(&owners, author, c) == from);
        if !fits || self.contributions.get(step, author).is_none() {
            return self.ignore(from, Ignored::ChunkRefused { step, author, why: ChunkOffer::NotOwned });
        }
        self.taking.acks.insert((step, author, from, first));
    }

    pub(super) fn on_chunk_request(&mut self, from: PeerId, step: u32, author: PeerId, first: u8, end: u8) {
        let pieces = usize::from(first)..usize::from(end);
        match self.contributions.chunk_of(step, author, pieces) {
            Some(chunk) => self.send(from, Message::Chunk(chunk)),
            None => self.ignore(from, Ignored::RepairNotHeld),
        }
    }

    /// Asks everyone (but us) for the pieces of chunk `c` of `owners` of the record's
    /// contributions whose values there are not here.
    fn ask_chunks(&mut self, record: &StepRecord, owners: usize, c: usize) {
        let me = self.config.me;
        let len = self.contributions.len();
        let pieces = owned_pieces(owners, c);
        let (first, end) = (pieces.start as u8, pieces.end as u8);
        let ask: Vec<PeerId> = self.members.iter().copied().filter(|p| *p != me).collect();
        for author in self.contributions.lacking_part(record, chunk(len, owners, c)) {
            self.taking.chunks_asked.insert((record.step, author, first, end));
            for &to in &ask {
                self.send(to, Message::ChunkRequest { step: record.step, author, first, end });
            }
            self.event(Event::RepairRequested { step: record.step, peer: author });
        }
    }

    /// (Owner) forms and sends its sum of the next step's record — the committed one, or the
    /// one being replicated — once it holds its chunk of every contribution the record names;
    /// a committed record's pieces that are not here are asked for (of anyone).
    pub(super) fn form_sums(&mut self) {
        if !self.owners_run() || !self.configured || self.pending.is_some() || self.stopped.is_some() {
            return;
        }
        let step = self.taking.applied + 1;
        let committed = self.taking.queue.iter().find_map(|q| match q {
            Queued::Step { record, .. } if record.step == step => Some(record.clone()),
            _ => None,
        });
        let replicated = self
            .agreement
            .as_ref()
            .and_then(Agreement::next_uncommitted_step)
            .map(|(record, _, _)| record)
            .filter(|r| r.step == step);
        for (record, is_committed) in [(committed, true), (replicated, false)] {
            if let Some(record) = record {
                self.form_sum(&record, is_committed);
            }
        }
    }

    fn form_sum(&mut self, record: &StepRecord, committed: bool) {
        let me = self.config.me;
        let Some(owners) = self.owners_of(record.step) else { return };
        let Some(c) = owners.iter().position(|o| *o == me) else { return };
        let (len, step, digest) = (self.contributions.len(), record.step, record.digest());
        let range = chunk(len, owners.len(), c);
        if range.is_empty() || record.contributions.is_empty() || self.contributions.has_sum(step, digest, c as u16) {
            return;
        }
        if !self.contributions.holds(record) {
            return; // a header is missing: the commit's repairs bring it
        }
        let Some(mut sum) = self.contributions.chunk_sum(record, range) else {
            if committed {
                self.ask_parts(record, c);
            }
            return;
        };
        let limit = match self.run.map(|r| r.sync.compression.values_as()) {
            Some(Compression::Int4) => crate::sync::INT4_LIMIT,
            _ => i8::MAX,
        };
        let weight: u64 = record.contributions.iter().map(|n| u64::from(n.weight)).sum();
        if self.audits.prints.wrong_owner {
            // Fault injection: one value of a block not empty one step nearer zero (or off
            // zero), within every bound — a sum no decoder refuses.
            let block = sum.grid.iter().position(|&g| g != crate::sync::EMPTY_BLOCK);
            if let Some(value) = block.map(|b| b * lockstep_luts::units::BLOCK) {
                sum.sum[value] += if sum.sum[value] > 0 { -1 } else { 1 };
            }
        }
        let bytes = sum.encode(limit, weight);
        self.contributions.formed(step, digest, c as u16, sum, bytes.clone());
        let message = SumMessage { step, record: digest, owner: c as u16, owners: owners.len() as u16, bytes };
        for to in self.taking_part(step) {
            self.send(to, Message::ChunkSum(message.clone()));
        }
    }

    /// (Owner) the pieces of chunk `c` not here a repair interval after their record committed,
    /// asked of anyone (again each interval).
    fn ask_parts(&mut self, record: &StepRecord, c: usize) {
        let now = self.timing.now_ms();
        let after = self.config.repair_after_ms;
        match self.taking.parts_asked {
            Some((step, since)) if step == record.step && now.saturating_sub(since) >= after => {}
            Some((step, _)) if step == record.step => return,
            _ => return self.taking.parts_asked = Some((record.step, now)),
        }
        self.taking.parts_asked = Some((record.step, now));
        let owners = self.owners_of(record.step).map_or(1, |o| o.len());
        self.ask_chunks(record, owners, c);
    }

    /// The record's mean and loss from the owners' sums (or from whole contributions where
    /// this member does not know the step's owners); `None` while something is missing, asked
    /// for meanwhile.
    pub(super) fn reduce_committed(&mut self, record: &StepRecord) -> Option<(Reduced, f32)> {
        // An owner forms and sends its own sum before it applies the step (it may hold every
        // other sum already, and would sum its chunk here without sending it).
        self.form_sums();
        let owners = self.owners_of(record.step).unwrap_or_default();
        let digest = record.digest();
        let asked: Vec<u16> =
            self.taking.sums_asked.iter().filter(|(s, r, _)| *s == record.step && *r == digest).map(|a| a.2).collect();
        for (owner, from) in self.contributions.drop_unsent(record, &owners, &asked) {
            self.ignore(from, Ignored::NotTheOwner { step: record.step, owner });
        }
        let owners = owners.len().max(1);
        match self.contributions.reduce_owned(record, owners) {
            Ok(reduced) => {
                self.taking.sum_wait = None;
                Some(reduced)
            }
            Err(lacking) => {
                for (owner, from, why) in lacking.refused {
                    self.ignore(from, Ignored::ChunkSumRefused { step: record.step, owner, why });
                }
                self.ask_sums(record, owners, &lacking.chunks);
                None
            }
        }
    }

    /// Asks for the chunk sums of a committed record that did not come: after a repair
    /// interval, of their owners and the leader; then of everyone; then the chunks' pieces, of
    /// everyone, to sum here; past that, a resume.
    fn ask_sums(&mut self, record: &StepRecord, owners: usize, chunks: &[u16]) {
        let now = self.timing.now_ms();
        let after = self.config.repair_after_ms;
        let step = record.step;
        let wait = match self.taking.sum_wait {
            Some(w) if w.step == step => w,
            _ => SumWait { step, since_ms: now, last_ms: None, rounds: 0 },
        };
        let due = match wait.last_ms {
            None => now.saturating_sub(wait.since_ms) >= after,
            Some(last) => now.saturating_sub(last) >= after << wait.rounds.min(4),
        };
        self.taking.sum_wait = Some(wait);
        if !due {
            return;
        }
        if wait.rounds >= ROUNDS_BEFORE_RESUME {
            self.taking.sum_wait = None;
            return self.catch_up();
        }
        self.taking.sum_wait = Some(SumWait { last_ms: Some(now), rounds: wait.rounds + 1, ..wait });
        let me = self.config.me;
        let known = self.owners_of(step);
        let digest = record.digest();
        if wait.rounds < SUM_ROUNDS && known.is_some() {
            let leader = self.leader().filter(|l| *l != me);
            for &owner in chunks {
                let mut ask: Vec<PeerId> = match wait.rounds {
                    0 => known.iter().flat_map(|o| o.get(usize::from(owner)).copied()).chain(leader).collect(),
                    _ => self.members.iter().copied().collect(),
                };
                ask.dedup();
                ask.retain(|p| *p != me && self.members.contains(p));
                self.taking.sums_asked.insert((step, digest, owner));
                for to in ask {
                    let request = Message::SumRequest { step, record: digest, owner, owners: owners as u16 };
                    self.send(to, request);
                }
            }
            return;
        }
        // The values themselves, of anyone who holds them, to sum here.
        for &owner in chunks {
            self.ask_chunks(record, owners, usize::from(owner));
        }
    }
}
