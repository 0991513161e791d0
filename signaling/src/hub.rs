//! The server's state without I/O: peers, groups, hosts, approvals, relays.
//!
//! Fed with connections, disconnections, client messages and ticks carrying `now`; returns
//! the messages to send and the connections to close. **Architecture Invariant:** nothing here
//! reads a clock or touches a socket, so every rule is unit-tested directly.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::protocol::{ClientMessage, ErrorCode, GroupName, PeerId, ServerMessage, PROTOCOL_VERSION};

/// Bounds on what clients may do.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest accepted text frame.
    pub max_message_bytes: usize,
    /// Members per group.
    pub max_group_size: usize,
    /// Join requests waiting per room.
    pub max_pending_per_room: usize,
    /// Sustained messages per second per connection, and the burst allowed above it.
    pub messages_per_second: u32,
    pub message_burst: u32,
    /// How long a join request waits for the host.
    pub approval_timeout: Duration,
    /// Connections in all.
    pub max_peers: usize,
    /// Connections from one address (members and waiting joiners together), so one address
    /// cannot take the server's connections from everyone else.
    pub max_peers_per_address: usize,
    /// Join requests one address may have waiting in one room, so one address cannot take a
    /// room's request slots from legitimate joiners.
    pub max_pending_per_address: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: 16 * 1024,
            max_group_size: 16,
            max_pending_per_room: 8,
            messages_per_second: 50,
            message_burst: 100,
            approval_timeout: Duration::from_secs(60),
            max_peers: 1024,
            max_peers_per_address: 32,
            max_pending_per_address: 2,
        }
    }
}

/// Where a new connection asks to go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The group of everyone from this public address.
    ByAddress,
    /// `?room=CODE`: join the room, or open it (and host it) if nobody has.
    Room(String),
    /// `?join=CODE`: join an existing room only.
    JoinExisting(String),
    /// `…&resume=ID&token=T`: take back place `id` in a group after the server restarted (or
    /// the connection dropped). The server checks the token (it signed it for this group and
    /// id) before the hub sees this; `room` is `None` for a group by address.
    Resume { room: Option<String>, id: PeerId },
}

/// What the hub wants done.
#[derive(Debug, Default, PartialEq)]
pub struct Output {
    pub sends: Vec<(PeerId, ServerMessage)>,
    /// Connections to close once their sends are flushed.
    pub close: Vec<PeerId>,
}

impl Output {
    fn send(&mut self, to: PeerId, message: ServerMessage) {
        self.sends.push((to, message));
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum GroupKey {
    Ip(String),
    Room(String),
}

impl GroupKey {
    fn name(&self) -> GroupName {
        match self {
            GroupKey::Ip(address) => GroupName::Ip(address.clone()),
            GroupKey::Room(code) => GroupName::Room(code.clone()),
        }
    }
}

#[derive(Debug)]
struct Group {
    /// Oldest first; the first is the host.
    members: Vec<PeerId>,
    /// Join requests waiting for the host, oldest first, with when they arrived.
    pending: Vec<(PeerId, Instant)>,
}

#[derive(Debug)]
struct Peer {
    address: String,
    group: GroupKey,
    pending: bool,
    /// What the peer said it is (`?agent=`).
    agent: Option<String>,
}

/// An agent name: 1–32 letters, digits, `-`, `_` or `.`.
pub fn valid_agent(agent: &str) -> bool {
    !agent.is_empty() && agent.len() <= 32 && agent.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Makes `id` a member of `group`: the others hear of it, the newcomer is welcomed.
fn admit(group: &mut Group, key: &GroupKey, id: PeerId, peers: &HashMap<PeerId, Peer>, out: &mut Output) {
    let agent = peers.get(&id).and_then(|p| p.agent.clone());
    for &member in &group.members {
        out.send(member, ServerMessage::PeerJoined { peer: id, agent: agent.clone() });
    }
    group.members.push(id);
    welcome(group, key, id, peers, out);
}

fn welcome(group: &Group, key: &GroupKey, id: PeerId, peers: &HashMap<PeerId, Peer>, out: &mut Output) {
    let agents = group
        .members
        .iter()
        .filter_map(|m| peers.get(m).and_then(|p| p.agent.clone()).map(|agent| (*m, agent)))
        .collect();
    let welcome = ServerMessage::Welcome {
        v: PROTOCOL_VERSION,
        id,
        group: key.name(),
        host: group.members[0],
        members: group.members.clone(),
        resume: None,
        agents,
    };
    out.send(id, welcome);
}

/// The largest id: ids travel in JSON, where JavaScript reads integers exactly up to 2^53.
pub const MAX_ID: PeerId = 1 << 53;

/// The whole server state.
#[derive(Debug)]
pub struct Hub {
    limits: Limits,
    peers: HashMap<PeerId, Peer>,
    groups: HashMap<GroupKey, Group>,
    next_id: PeerId,
}

/// Room codes: 1–64 characters of letters, digits, `-` and `_`.
pub fn valid_room_code(code: &str) -> bool {
    !code.is_empty() && code.len() <= 64 && code.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl Hub {
    pub fn new(limits: Limits) -> Self {
        Hub::numbering_from(limits, 1)
    }

    /// A hub whose own ids (for connections that bring none) start at `first`: a server gives a
    /// random start, so a restarted one does not hand out the ids of its first life again.
    pub fn numbering_from(limits: Limits, first: PeerId) -> Self {
        Hub { limits, peers: HashMap::new(), groups: HashMap::new(), next_id: first }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// A new connection from `address`. On refusal the error is the one message to send
    /// before closing.
    pub fn connect(
        &mut self,
        address: &str,
        placement: Placement,
        now: Instant,
    ) -> Result<(PeerId, Output), ServerMessage> {
        self.connect_as(address, placement, None, None, now)
    }

    /// [`Hub::connect`] for a peer that said what it is (`agent`, already validated) and
    /// brings its own id (`own`: a member's id is its own; one that brings none, a browser
    /// page, is given a fresh one). A second claim of an id a live connection holds is refused
    /// (`ErrorCode::IdInUse`), never obeyed.
    pub fn connect_as(
        &mut self,
        address: &str,
        placement: Placement,
        agent: Option<String>,
        own: Option<PeerId>,
        now: Instant,
    ) -> Result<(PeerId, Output), ServerMessage> {
        if let Some(id) = own {
            if id == 0 || id > MAX_ID {
                return Err(ServerMessage::fatal(ErrorCode::BadRequest, format!("id {id} is not in 1..=2^53")));
            }
            if self.peers.contains_key(&id) {
                return Err(ServerMessage::fatal(
                    ErrorCode::IdInUse,
                    format!("node {id} is connected already: a second claim of a live id is refused"),
                ));
            }
            if matches!(placement, Placement::Resume { id: place, .. } if place != id) {
                return Err(ServerMessage::fatal(
                    ErrorCode::BadRequest,
                    "a resume for another id than the one claimed",
                ));
            }
        }
        if self.peers.len() >= self.limits.max_peers {
            return Err(ServerMessage::fatal(ErrorCode::ServerFull, "the server has no room for more connections"));
        }
        let from_here = self.peers.values().filter(|p| p.address == address).count();
        if from_here >= self.limits.max_peers_per_address {
            return Err(ServerMessage::fatal(
                ErrorCode::TooManyRequests,
                format!("{address} already has {from_here} connections, the most one address may have"),
            ));
        }
        let key = match &placement {
            Placement::ByAddress | Placement::Resume { room: None, .. } => GroupKey::Ip(address.to_string()),
            Placement::Room(code) | Placement::JoinExisting(code) | Placement::Resume { room: Some(code), .. } => {
                if !valid_room_code(code) {
                    return Err(ServerMessage::fatal(
                        ErrorCode::BadRequest,
                        "a room code is 1–64 letters, digits, `-` or `_`",
                    ));
                }
                GroupKey::Room(code.clone())
            }
        };
        let exists = self.groups.contains_key(&key);
        if let Placement::JoinExisting(code) = &placement {
            if !exists {
                return Err(ServerMessage::fatal(ErrorCode::NoSuchRoom, format!("there is no room `{code}`")));
            }
        }
        let mut out = Output::default();
        if let Placement::Resume { id, .. } = placement {
            return self.resume(address, key, id, agent).map(|out| (id, out));
        }
        let id = match own {
            Some(id) => id,
            None => self.fresh_id(),
        };
        match (&key, exists) {
            (GroupKey::Room(code), true) => {
                let group = self.groups.get_mut(&key).expect("exists");
                if group.members.len() >= self.limits.max_group_size {
                    return Err(ServerMessage::fatal(ErrorCode::GroupFull, format!("room `{code}` is full")));
                }
                let waiting_from_here = group
                    .pending
                    .iter()
                    .filter(|(p, _)| self.peers.get(p).is_some_and(|p| p.address == address))
                    .count();
                if waiting_from_here >= self.limits.max_pending_per_address {
                    return Err(ServerMessage::fatal(
                        ErrorCode::TooManyRequests,
                        format!("{address} already has {waiting_from_here} join requests waiting in room `{code}`"),
                    ));
                }
                if group.pending.len() >= self.limits.max_pending_per_room {
                    return Err(ServerMessage::fatal(
                        ErrorCode::TooManyRequests,
                        format!("room `{code}` has too many join requests waiting; try later"),
                    ));
                }
                group.pending.push((id, now));
                let host = group.members[0];
                out.send(id, ServerMessage::Waiting { id, room: code.clone() });
                out.send(host, ServerMessage::JoinRequest { peer: id, address: address.to_string() });
                self.peers.insert(id, Peer { address: address.to_string(), group: key, pending: true, agent });
            }
            _ => {
                let group = self
                    .groups
                    .entry(key.clone())
                    .or_insert_with(|| Group { members: Vec::new(), pending: Vec::new() });
                if group.members.len() >= self.limits.max_group_size {
                    return Err(ServerMessage::fatal(ErrorCode::GroupFull, "your group is full"));
                }
                self.peers.insert(id, Peer { address: address.to_string(), group: key.clone(), pending: false, agent });
                admit(group, &key, id, &self.peers, &mut out);
            }
        }
        Ok((id, out))
    }

    /// An id for a connection that brought none: the next of the server's counter not in use.
    fn fresh_id(&mut self) -> PeerId {
        while self.next_id == 0 || self.next_id > MAX_ID || self.peers.contains_key(&self.next_id) {
            self.next_id = if self.next_id >= MAX_ID { 1 } else { self.next_id + 1 };
        }
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Place `id` back among `key`'s members (ordered by id, so the oldest member — the host —
    /// is the same after a restart as before it); the others hear of it, and of a host change.
    fn resume(
        &mut self,
        address: &str,
        key: GroupKey,
        id: PeerId,
        agent: Option<String>,
    ) -> Result<Output, ServerMessage> {
        if id == 0 || self.peers.contains_key(&id) {
            return Err(ServerMessage::fatal(ErrorCode::BadRequest, format!("node {id} is connected already")));
        }
        let group =
            self.groups.entry(key.clone()).or_insert_with(|| Group { members: Vec::new(), pending: Vec::new() });
        if group.members.len() >= self.limits.max_group_size {
            return Err(ServerMessage::fatal(ErrorCode::GroupFull, "your group is full"));
        }
        let host_before = group.members.first().copied();
        let mut out = Output::default();
        for &member in &group.members {
            out.send(member, ServerMessage::PeerJoined { peer: id, agent: agent.clone() });
        }
        let at = group.members.partition_point(|&m| m < id);
        group.members.insert(at, id);
        if host_before.is_some_and(|h| h != group.members[0]) {
            for &member in group.members.iter().filter(|&&m| m != id) {
                out.send(member, ServerMessage::HostChanged { host: group.members[0] });
            }
        }
        self.peers.insert(id, Peer { address: address.to_string(), group: key.clone(), pending: false, agent });
        welcome(group, &key, id, &self.peers, &mut out);
        Ok(out)
    }

    /// A connection went away (closed, failed, or was closed by us).
    pub fn disconnect(&mut self, id: PeerId) -> Output {
        let mut out = Output::default();
        let Some(peer) = self.peers.remove(&id) else { return out };
        let Some(group) = self.groups.get_mut(&peer.group) else { return out };
        if peer.pending {
            group.pending.retain(|(p, _)| *p != id);
            if let Some(&host) = group.members.first() {
                out.send(host, ServerMessage::PeerLeft { peer: id });
            }
            return out;
        }
        let was_host = group.members.first() == Some(&id);
        group.members.retain(|p| *p != id);
        for &member in &group.members {
            out.send(member, ServerMessage::PeerLeft { peer: id });
        }
        match group.members.first().copied() {
            None => {
                // The last member left: the room closes, and whoever waited is told.
                for (waiting, _) in std::mem::take(&mut group.pending) {
                    out.send(waiting, ServerMessage::Denied { reason: "the host left and the room closed".into() });
                    out.close.push(waiting);
                    self.peers.remove(&waiting);
                }
                self.groups.remove(&peer.group);
            }
            Some(new_host) if was_host => {
                for &member in &group.members {
                    out.send(member, ServerMessage::HostChanged { host: new_host });
                }
                // The successor inherits the waiting requests.
                for &(waiting, _) in &group.pending {
                    let address = self.peers.get(&waiting).map(|p| p.address.clone()).unwrap_or_default();
                    out.send(new_host, ServerMessage::JoinRequest { peer: waiting, address });
                }
            }
            Some(_) => {}
        }
        out
    }

    /// A message from a connected peer.
    pub fn message(&mut self, from: PeerId, message: ClientMessage) -> Output {
        let mut out = Output::default();
        let Some(peer) = self.peers.get(&from) else { return out };
        match message {
            ClientMessage::Ping {} => out.send(from, ServerMessage::Pong),
            ClientMessage::Hello { v } => {
                if v != PROTOCOL_VERSION {
                    out.send(
                        from,
                        ServerMessage::fatal(
                            ErrorCode::VersionMismatch,
                            format!("this server speaks protocol {PROTOCOL_VERSION}, not {v}"),
                        ),
                    );
                    out.close.push(from);
                }
            }
            ClientMessage::Signal { to, kind, data } => {
                let same_group = !peer.pending
                    && to != from
                    && self.peers.get(&to).is_some_and(|p| !p.pending && p.group == peer.group);
                if same_group {
                    out.send(to, ServerMessage::Signal { from, kind, data });
                } else {
                    out.send(
                        from,
                        ServerMessage::error(ErrorCode::NotInGroup, format!("peer {to} is not a member of your group")),
                    );
                }
            }
            ClientMessage::Approve { peer: joiner } => self.decide(from, joiner, None, &mut out),
            ClientMessage::Deny { peer: joiner, reason } => {
                self.decide(from, joiner, Some(reason.unwrap_or_else(|| "the host declined".into())), &mut out)
            }
        }
        out
    }

    /// Approve (`denial` is `None`) or deny a join request, if `host` hosts the joiner's room.
    fn decide(&mut self, host: PeerId, joiner: PeerId, denial: Option<String>, out: &mut Output) {
        let key = self.peers[&host].group.clone();
        let Some(group) = self.groups.get_mut(&key) else { return };
        if !matches!(key, GroupKey::Room(_)) || group.members.first() != Some(&host) {
            out.send(host, ServerMessage::error(ErrorCode::NotHost, "only the room's host approves or denies joins"));
            return;
        }
        let Some(position) = group.pending.iter().position(|(p, _)| *p == joiner) else {
            out.send(
                host,
                ServerMessage::error(ErrorCode::NoSuchRequest, format!("peer {joiner} is not waiting to join")),
            );
            return;
        };
        if denial.is_none() && group.members.len() >= self.limits.max_group_size {
            out.send(
                host,
                ServerMessage::error(ErrorCode::GroupFull, "the room is full; deny or wait for someone to leave"),
            );
            return;
        }
        group.pending.remove(position);
        match denial {
            Some(reason) => {
                out.send(joiner, ServerMessage::Denied { reason });
                out.close.push(joiner);
                self.peers.remove(&joiner);
            }
            None => {
                admit(group, &key, joiner, &self.peers, out);
                if let Some(p) = self.peers.get_mut(&joiner) {
                    p.pending = false;
                }
            }
        }
    }

    /// Expires join requests older than the approval timeout.
    pub fn tick(&mut self, now: Instant) -> Output {
        let mut out = Output::default();
        let timeout = self.limits.approval_timeout;
        let mut expired = Vec::new();
        for group in self.groups.values_mut() {
            let host = group.members.first().copied();
            group.pending.retain(|&(peer, since)| {
                let keep = now.duration_since(since) < timeout;
                if !keep {
                    expired.push((peer, host));
                }
                keep
            });
        }
        for (peer, host) in expired {
            out.send(
                peer,
                ServerMessage::Denied { reason: format!("the host did not answer within {} s", timeout.as_secs()) },
            );
            out.close.push(peer);
            if let Some(host) = host {
                out.send(host, ServerMessage::PeerLeft { peer });
            }
            self.peers.remove(&peer);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::SignalKind;

    fn hub() -> Hub {
        Hub::new(Limits { max_group_size: 3, max_pending_per_room: 2, ..Limits::default() })
    }

    fn sent_to(out: &Output, peer: PeerId) -> Vec<&ServerMessage> {
        out.sends.iter().filter(|(p, _)| *p == peer).map(|(_, m)| m).collect()
    }

    #[test]
    fn one_address_cannot_take_every_connection_or_every_request_slot() {
        let limits = Limits { max_peers_per_address: 3, max_pending_per_address: 1, ..Limits::default() };
        let mut h = Hub::new(limits);
        let now = Instant::now();
        let room = || Placement::Room("r".into());
        let (host, _) = h.connect("192.0.2.1", room(), now).unwrap();
        // One waiting request from an address; a second from it is refused, others still fit.
        h.connect("198.51.100.9", room(), now).unwrap();
        let refused = h.connect("198.51.100.9", room(), now).unwrap_err();
        assert!(
            matches!(&refused, ServerMessage::Error { code: ErrorCode::TooManyRequests, fatal: true, message }
                if message.contains("join requests waiting in room `r`")),
            "{refused:?}"
        );
        let (other, out) = h.connect("203.0.113.5", room(), now).unwrap();
        assert_eq!(
            sent_to(&out, host),
            vec![&ServerMessage::JoinRequest { peer: other, address: "203.0.113.5".into() }]
        );
        // Connections per address: the fourth from one address is refused, others connect.
        for _ in 0..2 {
            h.connect("198.51.100.9", Placement::ByAddress, now).unwrap();
        }
        let refused = h.connect("198.51.100.9", Placement::ByAddress, now).unwrap_err();
        assert!(matches!(refused, ServerMessage::Error { code: ErrorCode::TooManyRequests, fatal: true, .. }));
        assert!(h.connect("203.0.113.6", Placement::ByAddress, now).is_ok());
        assert_eq!(h.peer_count(), 6);
    }

    #[test]
    fn resumed_members_keep_their_ids_and_the_oldest_is_host_again() {
        let mut h = hub();
        let now = Instant::now();
        let resume = |id| Placement::Resume { room: Some("r".into()), id };
        // After a restart the members come back in any order.
        let (b, out) = h.connect("10.0.0.2", resume(7), now).unwrap();
        assert_eq!(b, 7);
        assert!(matches!(sent_to(&out, 7)[0], ServerMessage::Welcome { host: 7, members, .. } if members == &vec![7]));
        let (a, out) = h.connect("10.0.0.1", resume(4), now).unwrap();
        assert_eq!(a, 4);
        assert_eq!(
            sent_to(&out, 7),
            vec![&ServerMessage::PeerJoined { peer: 4, agent: None }, &ServerMessage::HostChanged { host: 4 }]
        );
        assert!(
            matches!(sent_to(&out, 4)[0], ServerMessage::Welcome { host: 4, members, .. } if members == &vec![4, 7])
        );
        // A place already taken is refused; the hub's own ids skip the ones in use.
        assert!(matches!(
            h.connect("10.0.0.9", resume(7), now),
            Err(ServerMessage::Error { code: ErrorCode::BadRequest, .. })
        ));
        let (joiner, out) = h.connect("10.0.0.3", Placement::Room("r".into()), now).unwrap();
        assert_eq!(joiner, 1);
        assert_eq!(sent_to(&out, 4), vec![&ServerMessage::JoinRequest { peer: 1, address: "10.0.0.3".into() }]);
        let mut numbered = Hub::numbering_from(Limits::default(), 4);
        assert_eq!(numbered.connect("10.0.0.1", resume(5), now).unwrap().0, 5);
        assert_eq!(numbered.connect("10.0.0.2", Placement::ByAddress, now).unwrap().0, 4);
        assert_eq!(numbered.connect("10.0.0.2", Placement::ByAddress, now).unwrap().0, 6, "5 is in use");
    }

    /// A member's id is its own: the hub takes it, refuses a second claim of a live one (a
    /// restarted server handing a newcomer a live member's id is what this prevents), and
    /// takes it again once its holder is gone.
    #[test]
    fn members_bring_their_own_ids_and_a_live_one_cannot_be_claimed_twice() {
        let mut h = hub();
        let now = Instant::now();
        let own = |h: &mut Hub, address: &str, id| h.connect_as(address, Placement::ByAddress, None, Some(id), now);
        let (a, _) = own(&mut h, "10.0.0.1", 0xdead_beef).unwrap();
        assert_eq!(a, 0xdead_beef);
        let refused = own(&mut h, "10.0.0.1", 0xdead_beef).unwrap_err();
        assert!(matches!(refused, ServerMessage::Error { code: ErrorCode::IdInUse, fatal: true, .. }), "{refused:?}");
        assert!(matches!(own(&mut h, "10.0.0.1", 0), Err(ServerMessage::Error { code: ErrorCode::BadRequest, .. })));
        assert!(matches!(own(&mut h, "10.0.0.1", MAX_ID + 1), Err(ServerMessage::Error { .. })));
        // A connection without an id of its own is numbered around the claimed ones.
        let (b, _) = h.connect("10.0.0.1", Placement::ByAddress, now).unwrap();
        assert_eq!(b, 1);
        h.disconnect(a);
        assert_eq!(own(&mut h, "10.0.0.1", 0xdead_beef).unwrap().0, 0xdead_beef, "free again");
    }

    #[test]
    fn same_address_same_group() {
        let mut h = hub();
        let now = Instant::now();
        let (a, _) = h.connect("10.0.0.1", Placement::ByAddress, now).unwrap();
        let (b, out) = h.connect("10.0.0.1", Placement::ByAddress, now).unwrap();
        let (c, out_c) = h.connect("10.0.0.2", Placement::ByAddress, now).unwrap();
        assert_eq!(sent_to(&out, a), vec![&ServerMessage::PeerJoined { peer: b, agent: None }]);
        assert!(
            matches!(sent_to(&out, b)[0], ServerMessage::Welcome { members, host, .. } if members == &vec![a, b] && *host == a)
        );
        assert!(matches!(sent_to(&out_c, c)[0], ServerMessage::Welcome { members, .. } if members == &vec![c]));
        // Relays stay inside the group.
        let relayed =
            h.message(a, ClientMessage::Signal { to: b, kind: SignalKind::Offer, data: serde_json::json!("sdp") });
        assert_eq!(
            relayed.sends,
            vec![(b, ServerMessage::Signal { from: a, kind: SignalKind::Offer, data: serde_json::json!("sdp") })]
        );
        let refused = h.message(a, ClientMessage::Signal { to: c, kind: SignalKind::Ice, data: serde_json::json!({}) });
        assert!(matches!(&refused.sends[0], (p, ServerMessage::Error { code: ErrorCode::NotInGroup, .. }) if *p == a));
        let to_self = h.message(a, ClientMessage::Signal { to: a, kind: SignalKind::Ice, data: serde_json::json!({}) });
        assert!(matches!(&to_self.sends[0].1, ServerMessage::Error { code: ErrorCode::NotInGroup, .. }));
    }

    #[test]
    fn room_joins_wait_for_the_host() {
        let mut h = hub();
        let now = Instant::now();
        let (host, out) = h.connect("1.1.1.1", Placement::Room("r".into()), now).unwrap();
        assert!(matches!(sent_to(&out, host)[0], ServerMessage::Welcome { host: h0, .. } if *h0 == host));
        let (joiner, out) = h.connect("2.2.2.2", Placement::Room("r".into()), now).unwrap();
        assert_eq!(sent_to(&out, joiner), vec![&ServerMessage::Waiting { id: joiner, room: "r".into() }]);
        assert_eq!(sent_to(&out, host), vec![&ServerMessage::JoinRequest { peer: joiner, address: "2.2.2.2".into() }]);
        // A pending joiner cannot relay, and a non-host cannot approve.
        let out =
            h.message(joiner, ClientMessage::Signal { to: host, kind: SignalKind::Offer, data: serde_json::json!(1) });
        assert!(matches!(&out.sends[0].1, ServerMessage::Error { code: ErrorCode::NotInGroup, .. }));
        let out = h.message(joiner, ClientMessage::Approve { peer: joiner });
        assert!(matches!(&out.sends[0].1, ServerMessage::Error { code: ErrorCode::NotHost, .. }));
        let out = h.message(host, ClientMessage::Approve { peer: joiner });
        assert!(
            matches!(sent_to(&out, joiner)[0], ServerMessage::Welcome { members, .. } if members == &vec![host, joiner])
        );
        assert_eq!(sent_to(&out, host), vec![&ServerMessage::PeerJoined { peer: joiner, agent: None }]);
        let out = h.message(host, ClientMessage::Approve { peer: joiner });
        assert!(matches!(&out.sends[0].1, ServerMessage::Error { code: ErrorCode::NoSuchRequest, .. }));

        let (late, _) = h.connect("3.3.3.3", Placement::Room("r".into()), now).unwrap();
        let out = h.message(host, ClientMessage::Deny { peer: late, reason: Some("no".into()) });
        assert_eq!(sent_to(&out, late), vec![&ServerMessage::Denied { reason: "no".into() }]);
        assert_eq!(out.close, vec![late]);
        assert_eq!(h.peer_count(), 2);
    }

    #[test]
    fn unknown_rooms_full_rooms_and_request_floods_are_refused() {
        let mut h = hub();
        let now = Instant::now();
        let code = |r: Result<(PeerId, Output), ServerMessage>| match r {
            Err(ServerMessage::Error { code, fatal: true, .. }) => code,
            other => panic!("{other:?}"),
        };
        assert_eq!(code(h.connect("a", Placement::JoinExisting("nope".into()), now)), ErrorCode::NoSuchRoom);
        assert_eq!(code(h.connect("a", Placement::Room("bad code!".into()), now)), ErrorCode::BadRequest);
        let (host, _) = h.connect("a", Placement::Room("r".into()), now).unwrap();
        let (p1, _) = h.connect("b", Placement::JoinExisting("r".into()), now).unwrap();
        let (_p2, _) = h.connect("c", Placement::Room("r".into()), now).unwrap();
        assert_eq!(code(h.connect("d", Placement::Room("r".into()), now)), ErrorCode::TooManyRequests);
        h.message(host, ClientMessage::Approve { peer: p1 });
        for i in 0..2 {
            h.connect(&format!("ip{i}"), Placement::ByAddress, now).unwrap();
        }
        let (x, _) = h.connect("same", Placement::ByAddress, now).unwrap();
        h.connect("same", Placement::ByAddress, now).unwrap();
        h.connect("same", Placement::ByAddress, now).unwrap();
        assert_eq!(code(h.connect("same", Placement::ByAddress, now)), ErrorCode::GroupFull);
        assert!(x > 0);
    }

    #[test]
    fn host_leaving_hands_over_and_empty_rooms_close() {
        let mut h = hub();
        let now = Instant::now();
        let (host, _) = h.connect("a", Placement::Room("r".into()), now).unwrap();
        let (second, _) = h.connect("b", Placement::Room("r".into()), now).unwrap();
        h.message(host, ClientMessage::Approve { peer: second });
        let (waiting, _) = h.connect("c", Placement::Room("r".into()), now).unwrap();
        let out = h.disconnect(host);
        assert!(sent_to(&out, second).contains(&&ServerMessage::HostChanged { host: second }));
        assert!(sent_to(&out, second).contains(&&ServerMessage::JoinRequest { peer: waiting, address: "c".into() }));
        // The successor can decide; then the last member leaves and the room closes.
        let (other, _) = h.connect("d", Placement::Room("r".into()), now).unwrap();
        let out = h.disconnect(second);
        assert_eq!(h.group_count(), 0);
        for peer in [waiting, other] {
            assert!(matches!(sent_to(&out, peer)[0], ServerMessage::Denied { reason } if reason.contains("host left")));
            assert!(out.close.contains(&peer));
        }
        assert_eq!(h.peer_count(), 0);
    }

    #[test]
    fn unanswered_requests_time_out() {
        let mut h = Hub::new(Limits { approval_timeout: Duration::from_secs(5), ..Limits::default() });
        let t0 = Instant::now();
        let (host, _) = h.connect("a", Placement::Room("r".into()), t0).unwrap();
        let (joiner, _) = h.connect("b", Placement::Room("r".into()), t0).unwrap();
        assert_eq!(h.tick(t0 + Duration::from_secs(4)), Output::default());
        let out = h.tick(t0 + Duration::from_secs(5));
        assert!(
            matches!(sent_to(&out, joiner)[0], ServerMessage::Denied { reason } if reason.contains("did not answer"))
        );
        assert_eq!(sent_to(&out, host), vec![&ServerMessage::PeerLeft { peer: joiner }]);
        assert_eq!(out.close, vec![joiner]);
    }

    #[test]
    fn version_mismatch_closes() {
        let mut h = hub();
        let (a, _) = h.connect("a", Placement::ByAddress, Instant::now()).unwrap();
        assert_eq!(h.message(a, ClientMessage::Hello { v: 1 }), Output::default());
        let out = h.message(a, ClientMessage::Hello { v: 2 });
        assert!(matches!(&out.sends[0].1, ServerMessage::Error { code: ErrorCode::VersionMismatch, fatal: true, .. }));
        assert_eq!(out.close, vec![a]);
    }
}
