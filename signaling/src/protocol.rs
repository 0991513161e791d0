//! The signaling protocol: JSON text frames, versioned. `docs/PROTOCOL.md` is the reference.
//!
//! **Architecture Invariant:** no message can carry weights or gradients. Frames are text
//! only (binary frames are refused), at most [`Limits::max_message_bytes`](crate::Limits) long,
//! and the only free-form payload, `signal.data`, is relayed for WebRTC offers, answers and ICE
//! candidates between members of one group.

use serde::{Deserialize, Serialize};

/// The protocol version this server speaks; `hello.v` must match.
pub const PROTOCOL_VERSION: u32 = 1;

/// A peer id, assigned by the server, unique for the server's lifetime.
pub type PeerId = u64;

/// What a client may send.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ClientMessage {
    /// Optional first message: checks the protocol version.
    Hello {
        v: u32,
    },
    /// A WebRTC handshake message for another member of the group.
    Signal {
        to: PeerId,
        kind: SignalKind,
        data: serde_json::Value,
    },
    /// The room host admits a pending joiner.
    Approve {
        peer: PeerId,
    },
    /// The room host turns a pending joiner away.
    Deny {
        peer: PeerId,
        #[serde(default)]
        reason: Option<String>,
    },
    Ping {},
}

/// The WebRTC handshake messages the server relays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SignalKind {
    Offer,
    Answer,
    Ice,
}

/// How a group was formed.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "kebab-case")]
pub enum GroupName {
    /// Everyone connecting from one public address.
    Ip(String),
    /// An explicit room code.
    Room(String),
}

/// What the server sends.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ServerMessage {
    /// You are in: your id, your group, its host and its members (you included, oldest first),
    /// and the token that lets you resume this place after the server restarts.
    Welcome {
        v: u32,
        id: PeerId,
        group: GroupName,
        host: PeerId,
        members: Vec<PeerId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resume: Option<String>,
        /// What each member that said so is (`?agent=`), as `[id, agent]` pairs.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        agents: Vec<(PeerId, String)>,
    },
    /// Your join request is waiting for the room host's approval.
    Waiting {
        id: PeerId,
        room: String,
    },
    /// (To the host.) Someone asks to join your room.
    JoinRequest {
        peer: PeerId,
        address: String,
    },
    /// The room turned you away; the connection closes after this.
    Denied {
        reason: String,
    },
    PeerJoined {
        peer: PeerId,
        /// What the newcomer said it is (`?agent=`), when it said: a Lockstep node says
        /// `lockstep` (so the mesh may use large SCTP packets on loopback), a browser nothing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<String>,
    },
    PeerLeft {
        peer: PeerId,
    },
    /// The group has a new host (the previous one left).
    HostChanged {
        host: PeerId,
    },
    /// A relayed WebRTC handshake message.
    Signal {
        from: PeerId,
        kind: SignalKind,
        data: serde_json::Value,
    },
    Pong,
    /// Something you sent was refused; the connection stays open unless `fatal`.
    Error {
        code: ErrorCode,
        message: String,
        fatal: bool,
    },
}

/// Machine-readable error codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorCode {
    BadJson,
    UnknownType,
    BinaryNotAllowed,
    TooLarge,
    RateLimited,
    VersionMismatch,
    NotInGroup,
    NotHost,
    NoSuchRoom,
    NoSuchRequest,
    GroupFull,
    TooManyRequests,
    ServerFull,
    BadRequest,
    /// A connection claimed an id a live connection holds: refused (and its holder told).
    IdInUse,
}

impl ServerMessage {
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        ServerMessage::Error { code, message: message.into(), fatal: false }
    }

    pub fn fatal(code: ErrorCode, message: impl Into<String>) -> Self {
        ServerMessage::Error { code, message: message.into(), fatal: true }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("server messages always serialize")
    }
}

/// Parses a client frame, telling apart malformed JSON from well-formed JSON of an unknown
/// type or shape.
pub fn parse_client(text: &str) -> Result<ClientMessage, ServerMessage> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| ServerMessage::error(ErrorCode::BadJson, format!("not valid JSON: {e}")))?;
    let known = ["hello", "signal", "approve", "deny", "ping"];
    match value.get("type").and_then(|t| t.as_str()) {
        None => return Err(ServerMessage::error(ErrorCode::BadJson, "a message needs a string `type`")),
        Some(kind) if !known.contains(&kind) => {
            return Err(ServerMessage::error(ErrorCode::UnknownType, format!("unknown message type `{kind}`")))
        }
        Some(_) => {}
    }
    serde_json::from_value(value)
        .map_err(|e| ServerMessage::error(ErrorCode::BadJson, format!("malformed message: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_wire_forms() {
        let welcome = ServerMessage::Welcome {
            v: 1,
            id: 3,
            group: GroupName::Room("abc".into()),
            host: 1,
            members: vec![1, 3],
            resume: None,
            agents: Vec::new(),
        };
        assert_eq!(
            welcome.to_json(),
            r#"{"type":"welcome","v":1,"id":3,"group":{"kind":"room","name":"abc"},"host":1,"members":[1,3]}"#
        );
        let welcome = ServerMessage::Welcome {
            v: 1,
            id: 3,
            group: GroupName::Ip("192.0.2.1".into()),
            host: 1,
            members: vec![1, 3],
            resume: Some("ab".into()),
            agents: vec![(1, "lockstep".to_string())],
        };
        assert_eq!(
            welcome.to_json(),
            r#"{"type":"welcome","v":1,"id":3,"group":{"kind":"ip","name":"192.0.2.1"},"host":1,"members":[1,3],"resume":"ab","agents":[[1,"lockstep"]]}"#
        );
        let parsed: ServerMessage = serde_json::from_str(&welcome.to_json()).expect("reads back");
        assert_eq!(parsed, welcome);
        assert_eq!(
            ServerMessage::PeerJoined { peer: 5, agent: Some("lockstep".into()) }.to_json(),
            r#"{"type":"peer-joined","peer":5,"agent":"lockstep"}"#
        );
        assert_eq!(
            ServerMessage::JoinRequest { peer: 4, address: "127.0.0.2".into() }.to_json(),
            r#"{"type":"join-request","peer":4,"address":"127.0.0.2"}"#
        );
        assert_eq!(
            ServerMessage::error(ErrorCode::NotInGroup, "x").to_json(),
            r#"{"type":"error","code":"not-in-group","message":"x","fatal":false}"#
        );
        assert_eq!(
            parse_client(r#"{"type":"signal","to":2,"kind":"ice","data":{"candidate":"c"}}"#).unwrap(),
            ClientMessage::Signal { to: 2, kind: SignalKind::Ice, data: serde_json::json!({"candidate": "c"}) }
        );
        assert_eq!(parse_client(r#"{"type":"deny","peer":9}"#).unwrap(), ClientMessage::Deny { peer: 9, reason: None });
    }

    #[test]
    fn bad_input_is_classified() {
        let code = |text: &str| match parse_client(text) {
            Err(ServerMessage::Error { code, .. }) => code,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(code("{"), ErrorCode::BadJson);
        assert_eq!(code("[1,2]"), ErrorCode::BadJson);
        assert_eq!(code(r#"{"type":7}"#), ErrorCode::BadJson);
        assert_eq!(code(r#"{"type":"weights","data":[1,2,3]}"#), ErrorCode::UnknownType);
        assert_eq!(code(r#"{"type":"signal","to":"x"}"#), ErrorCode::BadJson);
        assert_eq!(code(r#"{"type":"signal","to":1,"kind":"gradient","data":1}"#), ErrorCode::BadJson);
        assert_eq!(code(r#"{"type":"ping","extra":1}"#), ErrorCode::BadJson);
    }
}
