//! How a node joins and talks: its configuration and the mesh's WebRTC settings.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lockstep_node::session::{AgreementTiming, StepDeadline};
use lockstep_node::verdict::Verdict;
use webrtc::peer_connection::{PeerConnectionBuilder, SettingEngineBuilder};

use crate::sockets::{self, LinkShim};

/// Bytes a channel may buffer before `send` waits (flow control): a backstop above the
/// node's own in-flight budget ([`IN_FLIGHT_BYTES`]), which the step's traffic waits for first.
pub const SEND_BUFFER_BYTES: usize = 4 * 1024 * 1024;
/// The bytes a node's contributions, repairs and states may have sent and not yet acknowledged,
/// over all its channels together (each channel gets its share): about two thirds of what a
/// consumer uplink of 50 Mbit/s queues (400 ms) before it drops. SCTP recovers from a burst of
/// drops slowly (a retransmission timeout of 1 s at least, then slow start): with 4 MiB a
/// channel, three channels' bursts overflowed such a queue every step and ran at 30% of the
/// line rate (`docs/PERFORMANCE.md`, "In flight"). It caps a channel at budget / RTT (37 MB/s
/// shared at 40 ms): `--in-flight-kib` raises it for fast, long links.
pub const IN_FLIGHT_BYTES: usize = 1536 * 1024;
/// The SCTP receive buffer each end advertises (the crate's default is about 1 MiB, which
/// caps a loopback channel's throughput).
pub const SCTP_RECEIVE_BUFFER_BYTES: u32 = 8 * 1024 * 1024;

/// SCTP packet budget on loopback: below DTLS's 16 KiB record limit.
pub const LOOPBACK_SCTP_MTU: u32 = 16_000;
/// Receive buffer per datagram on loopback.
pub const LOOPBACK_RECEIVE_MTU: usize = 17_000;

/// What a Lockstep node tells the signaling server it is (`?agent=`), so its peers know they
/// may use large SCTP packets with it on loopback.
pub const AGENT: &str = "lockstep";

/// The mesh's connection settings: mDNS off, loopback candidates when binding loopback, 16 KB
/// SCTP packets there when the far side is a Lockstep node (`large_packets`), a bounded send
/// buffer (`send` waits: flow control), a larger SCTP receive window, and a dedicated reactor
/// thread for the connections' drivers.
pub fn channel_settings<A: std::net::ToSocketAddrs>(
    builder: PeerConnectionBuilder<A>,
    loopback: bool,
    large_packets: bool,
) -> PeerConnectionBuilder<A> {
    let mut settings = SettingEngineBuilder::new()
        .with_multicast_dns_mode(rtc::ice::mdns::MulticastDnsMode::Disabled)
        .with_include_loopback_candidate(loopback)
        .with_sctp_max_receive_buffer_size(SCTP_RECEIVE_BUFFER_BYTES);
    if loopback && large_packets {
        // Loopback carries 64 KiB datagrams: SCTP packets as large as a DTLS record allows
        // cut the per-packet work by an order of magnitude. Real networks keep the default
        // (1191 bytes, safe through TURN over IPv6).
        settings = settings.with_sctp_mtu(LOOPBACK_SCTP_MTU).with_receive_mtu(LOOPBACK_RECEIVE_MTU);
    }
    let settings = settings.build();
    builder
        .with_setting_engine(settings)
        .with_data_channel_send_buffer_limit(SEND_BUFFER_BYTES)
        .with_dedicated_reactor_pool_size(1)
}
/// The mesh's WebRTC runtime: tokio, with large UDP socket buffers and `shim` ([`sockets`]).
pub fn mesh_runtime(shim: LinkShim) -> anyhow::Result<Arc<dyn webrtc::runtime::Runtime>> {
    let runtime = webrtc::runtime::default_runtime().context("no async runtime for WebRTC")?;
    Ok(Arc::new(sockets::BufferedRuntime::shaped(runtime, shim)))
}

/// How often the links are tended: pinged, reported, silent ones named, closed ones offered
/// again. (The session says itself when it needs a tick: `Session::next_tick_ms`.)
pub const LINK_TICK: Duration = Duration::from_secs(1);

/// How a node joins and talks.
#[derive(Clone, Debug)]
pub struct MeshConfig {
    /// `ws://HOST:PORT/ws`, with `?room=CODE` or not.
    pub signal_url: String,
    /// The address ICE binds and gathers host candidates on (127.0.0.1 in tests).
    pub bind_ip: IpAddr,
    /// `stun:` / `turn:` URLs; empty on a LAN or loopback.
    pub ice_servers: Vec<String>,
    pub turn_username: String,
    pub turn_credential: String,
    pub expected_phash: u32,
    pub repair_after_ms: u64,
    /// How long the leader waits for a roster member's gradient (`StepDeadline`).
    pub deadline: StepDeadline,
    /// The leader's rule for slow members in elastic windows (`SessionConfig::slow_windows`).
    pub slow_windows: u32,
    /// The run's Raft clock (`SessionConfig::agreement`).
    pub agreement: AgreementTiming,
    /// Whether the next step computes behind a record's commit (`SessionConfig::compute_ahead`).
    pub compute_ahead: bool,
    /// Audits by recomputation: in how many of a thousand steps this member recomputes another
    /// member's contribution (`SessionConfig::audit_rate`).
    pub audit_rate: u32,
    /// Packed runs: how many in a thousand of a state's chunks a routine audit checks
    /// (`SessionConfig::audit_state_part`).
    pub audit_state_part: u32,
    /// How many audits may run at once on this member (`SessionConfig::audit_workers`).
    pub audit_workers: u32,
    /// Routine audits run on spare cycles only (the lowest priority: on a machine its training
    /// keeps busy they may never run); false: at the member's own priority, taking their share.
    pub audits_on_spare_cycles: bool,
    /// This member's id: its own, drawn when the process starts ([`new_member_id`]), carried
    /// in its join request; the signaling server refuses a second claim of a live one.
    pub id: lockstep_node::wire::PeerId,
    /// What computes here, told to every peer: the backend's name and its gate verdict.
    pub backend: String,
    pub verdict: Verdict,
    /// Delay and loss added to every datagram this node sends (benchmarks and tests).
    pub link: LinkShim,
    /// The step's traffic this node may have in flight (sent, not acknowledged) over all its
    /// channels together ([`IN_FLIGHT_BYTES`] by default).
    pub in_flight_bytes: usize,
    /// Where a node that must stop (kicked, a failed compute, a resume it cannot restore)
    /// saves its last committed state before it exits.
    pub ckpt_dir: std::path::PathBuf,
}

/// A fresh member id for this process: 64 bits from the process's random hasher keys, the
/// time and the process id (never 0). A restarted process is a new member.
pub fn new_member_id() -> lockstep_node::wire::PeerId {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    hasher.write_u32(std::process::id());
    // Ids travel in JSON too, where integers past 2^53 lose bits in JavaScript: 53 bits.
    (hasher.finish() & ((1 << 53) - 1)).max(1)
}
