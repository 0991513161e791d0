//! The tokio adapter: one TCP port for the WebSocket endpoint, static files and `/data`.
//!
//! Each connection's first bytes are peeked to read the HTTP request head: an upgrade to
//! WebSocket becomes a peer of the hub; anything else is a plain HTTP GET (static files,
//! `/healthz`), answered and closed.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::guard::lock;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

use crate::data::{DataConfig, DataService};
use ring::hmac;

use crate::hub::{Hub, Limits, Output, Placement};
use crate::protocol::{parse_client, ErrorCode, GroupName, PeerId, ServerMessage};

/// Largest HTTP request head accepted.
const MAX_HEAD: usize = 8 * 1024;

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub bind: SocketAddr,
    /// Files served over plain HTTP GET.
    pub static_dir: Option<PathBuf>,
    /// A packaged corpus served under `/corpus/` with byte ranges (`lockstep_mesh::corpus`
    /// reads it from there).
    pub corpus_dir: Option<PathBuf>,
    /// The one address whose `X-Forwarded-For` header is believed (a reverse proxy).
    pub trusted_proxy: Option<IpAddr>,
    pub limits: Limits,
    /// Where `/data` reads parquet shards from; `None` turns `/data` off.
    pub data: Option<DataConfig>,
    /// The key resume tokens are signed with (`None`: a random one for this process, so a
    /// member can take its place back after a dropped connection but not after a restart;
    /// `lockstep signal` keeps one in a file so restarts are survived too).
    pub resume_secret: Option<Vec<u8>>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 8787)),
            static_dir: None,
            corpus_dir: None,
            trusted_proxy: None,
            limits: Limits::default(),
            data: Some(DataConfig::default()),
            resume_secret: None,
        }
    }
}

/// A running server.
pub struct ServerHandle {
    pub local_addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    hub: Arc<Mutex<Hub>>,
}

impl ServerHandle {
    /// Peers and groups right now.
    pub fn counts(&self) -> (usize, usize) {
        let hub = lock(&self.hub);
        (hub.peer_count(), hub.group_count())
    }

    /// Stops accepting and waits for the accept loop to end.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// Runs until the accept loop ends (it does not, unless stopped).
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

enum Outgoing {
    Text(String),
    Close,
}

struct Shared {
    hub: Arc<Mutex<Hub>>,
    senders: Mutex<HashMap<PeerId, mpsc::UnboundedSender<Outgoing>>>,
    config: ServerConfig,
    data: Option<Arc<DataService>>,
    /// Signs resume tokens.
    resume_key: hmac::Key,
}

/// What a resume token vouches for: the place `id` in `group`.
fn resume_claim(group: &GroupName, id: PeerId) -> String {
    match group {
        GroupName::Room(code) => format!("room:{code}|{id}"),
        GroupName::Ip(address) => format!("ip:{address}|{id}"),
    }
}

/// Hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Shared {
    /// The token a member shows to take place `id` in `group` back.
    fn resume_token(&self, group: &GroupName, id: PeerId) -> String {
        hex(hmac::sign(&self.resume_key, resume_claim(group, id).as_bytes()).as_ref())
    }

    fn resume_token_matches(&self, group: &GroupName, id: PeerId, token: &str) -> bool {
        let Some(tag) = (0..token.len())
            .step_by(2)
            .map(|i| token.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
            .collect::<Option<Vec<u8>>>()
        else {
            return false;
        };
        hmac::verify(&self.resume_key, resume_claim(group, id).as_bytes(), &tag).is_ok()
    }

    fn dispatch(&self, out: Output) {
        let senders = lock(&self.senders);
        for (peer, mut message) in out.sends {
            if let ServerMessage::Welcome { id, group, resume, .. } = &mut message {
                *resume = Some(self.resume_token(group, *id));
            }
            if let Some(tx) = senders.get(&peer) {
                let _ = tx.send(Outgoing::Text(message.to_json()));
            }
        }
        for peer in out.close {
            if let Some(tx) = senders.get(&peer) {
                let _ = tx.send(Outgoing::Close);
            }
        }
    }
}

/// 32 random bytes from the system's generator.
pub fn random_secret() -> std::io::Result<Vec<u8>> {
    let mut secret = vec![0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
        .map_err(|_| std::io::Error::other("no system randomness for the resume secret"))?;
    Ok(secret)
}

/// Binds and starts serving in the background.
pub async fn serve(config: ServerConfig) -> std::io::Result<ServerHandle> {
    let listener = TcpListener::bind(config.bind).await?;
    let local_addr = listener.local_addr()?;
    // The hub's own ids start at a random place, so a restarted server does not hand out its
    // first life's ids again (members bring their own).
    let first_id = u64::from_le_bytes(random_secret()?[..8].try_into().expect("8 bytes")) % (1 << 40) + 1;
    let hub = Arc::new(Mutex::new(Hub::numbering_from(config.limits.clone(), first_id)));
    let data = match &config.data {
        Some(data) => Some(Arc::new(
            DataService::new(data.clone()).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.0))?,
        )),
        None => None,
    };
    let secret = match &config.resume_secret {
        Some(secret) => secret.clone(),
        None => random_secret()?,
    };
    let resume_key = hmac::Key::new(hmac::HMAC_SHA256, &secret);
    let shared = Arc::new(Shared { hub: hub.clone(), senders: Mutex::new(HashMap::new()), config, data, resume_key });
    let (shutdown, mut stopped) = oneshot::channel();
    let ticker = shared.clone();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                _ = tick.tick() => {
                    let out = lock(&ticker.hub).tick(Instant::now());
                    ticker.dispatch(out);
                }
                accepted = listener.accept() => {
                    if let Ok((stream, peer)) = accepted {
                        let shared = shared.clone();
                        tokio::spawn(async move { handle_connection(shared, stream, peer).await });
                    }
                }
            }
        }
    });
    Ok(ServerHandle { local_addr, shutdown: Some(shutdown), task, hub })
}

/// A parsed HTTP request head.
#[derive(Debug)]
struct Head {
    method: String,
    path: String,
    query: HashMap<String, String>,
    headers: HashMap<String, String>,
    len: usize,
}

fn parse_head(bytes: &[u8]) -> Option<Head> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let text = std::str::from_utf8(&bytes[..end]).ok()?;
    let mut lines = text.split("\r\n");
    let mut request = lines.next()?.split(' ');
    let method = request.next()?.to_string();
    let target = request.next()?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k.to_string(), v.to_string())
        })
        .collect();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some(Head { method, path: path.to_string(), query, headers, len: end })
}

/// Reads the request head without consuming it (the WebSocket handshake reads it again).
async fn peek_head(stream: &TcpStream) -> Option<Head> {
    let mut buf = vec![0u8; MAX_HEAD];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = tokio::time::timeout_at(deadline.into(), stream.peek(&mut buf)).await.ok()?.ok()?;
        if n == 0 {
            return None;
        }
        if let Some(head) = parse_head(&buf[..n]) {
            return Some(head);
        }
        if n == MAX_HEAD {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn handle_connection(shared: Arc<Shared>, stream: TcpStream, peer: SocketAddr) {
    // Signaling messages are small and latency-bound: do not let Nagle hold them back.
    let _ = stream.set_nodelay(true);
    let Some(head) = peek_head(&stream).await else { return };
    let upgrade = head.headers.get("upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if upgrade {
        let address = client_address(&shared.config, peer.ip(), &head);
        websocket_session(shared, stream, head, address).await;
    } else {
        let _ = http_response(&shared, stream, head).await;
    }
}

/// The client's public address: the TCP peer, or `X-Forwarded-For`'s first entry when the
/// peer is the configured trusted proxy.
fn client_address(config: &ServerConfig, peer: IpAddr, head: &Head) -> String {
    if config.trusted_proxy == Some(peer) {
        if let Some(forwarded) = head.headers.get("x-forwarded-for") {
            if let Some(first) = forwarded.split(',').next().map(str::trim).filter(|s| s.parse::<IpAddr>().is_ok()) {
                return first.to_string();
            }
        }
    }
    peer.to_string()
}

/// A token bucket: `rate` per second, `burst` at most.
struct RateLimit {
    tokens: f64,
    rate: f64,
    burst: f64,
    last: Instant,
    last_complaint: Option<Instant>,
}

impl RateLimit {
    fn allow(&mut self, now: Instant) -> bool {
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// At most one complaint a second, so a flood is not answered with a flood.
    fn should_complain(&mut self, now: Instant) -> bool {
        let due = self.last_complaint.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1));
        if due {
            self.last_complaint = Some(now);
        }
        due
    }
}

async fn websocket_session(shared: Arc<Shared>, stream: TcpStream, head: Head, address: String) {
    let limits = shared.config.limits.clone();
    // Frames up to twice the limit are read so the sender can be told; larger ones end the
    // connection inside the WebSocket layer.
    let ws_config = WebSocketConfig {
        max_message_size: Some(limits.max_message_bytes * 2),
        max_frame_size: Some(limits.max_message_bytes * 2),
        ..WebSocketConfig::default()
    };
    let Ok(mut ws) = tokio_tungstenite::accept_async_with_config(stream, Some(ws_config)).await else { return };
    let placement = match (head.query.get("resume"), head.query.get("token")) {
        (Some(id), Some(token)) => {
            let room = head.query.get("room").or(head.query.get("join")).cloned();
            let group = room.clone().map_or_else(|| GroupName::Ip(address.clone()), GroupName::Room);
            match id.parse::<PeerId>() {
                Ok(id) if shared.resume_token_matches(&group, id, token) => Placement::Resume { room, id },
                _ => {
                    let refusal = ServerMessage::fatal(
                        ErrorCode::BadRequest,
                        "the resume token does not match this place (the server's resume secret changed?)",
                    );
                    let _ = ws.send(Message::text(refusal.to_json())).await;
                    let _ = ws.close(None).await;
                    return;
                }
            }
        }
        _ => {
            if let Some(code) = head.query.get("join") {
                Placement::JoinExisting(code.clone())
            } else if let Some(code) = head.query.get("room") {
                Placement::Room(code.clone())
            } else {
                Placement::ByAddress
            }
        }
    };
    let agent = head.query.get("agent").filter(|a| crate::hub::valid_agent(a)).cloned();
    let own = match head.query.get("id").map(|id| id.parse::<PeerId>()) {
        None => None,
        Some(Ok(id)) => Some(id),
        Some(Err(_)) => Some(0), // refused by the hub, saying why
    };
    let connected = lock(&shared.hub).connect_as(&address, placement, agent, own, Instant::now());
    let (id, first) = match connected {
        Ok(ok) => ok,
        Err(refusal) => {
            if let (ServerMessage::Error { code: ErrorCode::IdInUse, .. }, Some(id)) = (&refusal, own) {
                // Reported, not obeyed: the live holder hears someone claimed its id.
                let notice = ServerMessage::error(
                    ErrorCode::IdInUse,
                    format!("a connection from {address} claimed your id {id}; it was refused"),
                );
                if let Some(tx) = lock(&shared.senders).get(&id) {
                    let _ = tx.send(Outgoing::Text(notice.to_json()));
                }
            }
            let _ = ws.send(Message::text(refusal.to_json())).await;
            let _ = ws.close(None).await;
            return;
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    lock(&shared.senders).insert(id, tx);
    shared.dispatch(first);

    let mut rate = RateLimit {
        tokens: f64::from(limits.message_burst),
        rate: f64::from(limits.messages_per_second),
        burst: f64::from(limits.message_burst),
        last: Instant::now(),
        last_complaint: None,
    };
    let reply = |ws_message: ServerMessage| Message::text(ws_message.to_json());
    loop {
        tokio::select! {
            outgoing = rx.recv() => match outgoing {
                Some(Outgoing::Text(text)) => {
                    if ws.send(Message::text(text)).await.is_err() {
                        break;
                    }
                }
                Some(Outgoing::Close) | None => {
                    let _ = ws.close(None).await;
                    break;
                }
            },
            incoming = ws.next() => {
                let now = Instant::now();
                let frame = match incoming {
                    Some(Ok(frame)) => frame,
                    _ => break,
                };
                let answer = match frame {
                    Message::Text(text) => {
                        if !rate.allow(now) {
                            rate.should_complain(now).then(|| reply(ServerMessage::error(
                                ErrorCode::RateLimited,
                                format!("more than {} messages a second; message dropped", limits.messages_per_second),
                            )))
                        } else if text.len() > limits.max_message_bytes {
                            Some(reply(ServerMessage::error(
                                ErrorCode::TooLarge,
                                format!("message of {} bytes; the limit is {}", text.len(), limits.max_message_bytes),
                            )))
                        } else {
                            match parse_client(text.as_str()) {
                                Ok(message) => {
                                    let out = lock(&shared.hub).message(id, message);
                                    shared.dispatch(out);
                                    None
                                }
                                Err(error) => Some(reply(error)),
                            }
                        }
                    }
                    Message::Binary(_) => Some(reply(ServerMessage::error(
                        ErrorCode::BinaryNotAllowed,
                        "binary frames are not accepted: the server relays signaling only, never data",
                    ))),
                    Message::Close(_) => break,
                    _ => None,
                };
                if let Some(answer) = answer {
                    if ws.send(answer).await.is_err() {
                        break;
                    }
                }
            }
        }
    }
    lock(&shared.senders).remove(&id);
    let out = lock(&shared.hub).disconnect(id);
    shared.dispatch(out);
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "wasm" => "application/wasm",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// A static file under `root` for a URL path, refusing anything that escapes it.
fn static_file(root: &Path, url_path: &str) -> Option<PathBuf> {
    let relative = url_path.trim_start_matches('/');
    let relative = if relative.is_empty() { "index.html" } else { relative };
    let candidate = Path::new(relative);
    if candidate.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    let path = root.join(candidate);
    path.is_file().then_some(path)
}

async fn write_response(stream: &mut TcpStream, status: &str, content_type: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.shutdown().await
}

/// The byte range a `Range` header asks of a file of `len` bytes: `bytes=a-b`, `bytes=a-` or
/// `bytes=-n` (one range only); `None` when it asks for none of the file (416).
fn byte_range(header: &str, len: u64) -> Option<std::ops::RangeInclusive<u64>> {
    let spec = header.trim().strip_prefix("bytes=")?;
    let (start, end) = spec.split_once('-')?;
    let (start, end) = match (start.trim(), end.trim()) {
        ("", suffix) => {
            let n: u64 = suffix.parse().ok()?;
            (len.checked_sub(n.min(len))?, len.checked_sub(1)?)
        }
        (start, "") => (start.parse().ok()?, len.checked_sub(1)?),
        (start, end) => (start.parse().ok()?, end.parse::<u64>().ok()?.min(len.checked_sub(1)?)),
    };
    (start <= end && end < len).then_some(start..=end)
}

/// A file of the corpus, whole (200) or the range asked for (206), `Accept-Ranges` either way.
async fn write_range(stream: &mut TcpStream, path: &Path, range: Option<&str>) -> std::io::Result<()> {
    use tokio::io::AsyncSeekExt;
    let mut file = tokio::fs::File::open(path).await?;
    let len = file.metadata().await?.len();
    let (status, span) = match range {
        None => ("200 OK", 0..=len.saturating_sub(1)),
        Some(header) => match byte_range(header, len) {
            Some(span) => ("206 Partial Content", span),
            None => {
                let head = format!(
                    "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                stream.write_all(head.as_bytes()).await?;
                return stream.shutdown().await;
            }
        },
    };
    let body_len = if len == 0 { 0 } else { span.end() - span.start() + 1 };
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {}\r\nContent-Length: {body_len}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n",
        content_type(path)
    );
    if range.is_some() {
        head.push_str(&format!("Content-Range: bytes {}-{}/{len}\r\n", span.start(), span.end()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    file.seek(std::io::SeekFrom::Start(*span.start())).await?;
    let mut body = file.take(body_len);
    tokio::io::copy(&mut body, stream).await?;
    stream.shutdown().await
}

async fn http_response(shared: &Shared, mut stream: TcpStream, head: Head) -> std::io::Result<()> {
    let config = &shared.config;
    // Consume the head we peeked.
    let mut consumed = vec![0u8; head.len];
    stream.read_exact(&mut consumed).await?;
    if head.method != "GET" && head.method != "HEAD" {
        return write_response(&mut stream, "405 Method Not Allowed", "text/plain", b"only GET\n").await;
    }
    if head.path == "/healthz" {
        return write_response(&mut stream, "200 OK", "text/plain", b"ok\n").await;
    }
    if head.path == "/data" {
        let json = "application/json";
        return match &shared.data {
            None => {
                write_response(&mut stream, "404 Not Found", json, br#"{"error":"this server has no data source"}"#)
                    .await
            }
            Some(data) => match data.slice().await {
                Ok(slice) => {
                    let body = serde_json::to_vec(&slice).expect("slices serialize");
                    write_response(&mut stream, "200 OK", json, &body).await
                }
                Err(error) => {
                    let body = serde_json::json!({"error": format!("the data source failed: {error}")}).to_string();
                    write_response(&mut stream, "502 Bad Gateway", json, body.as_bytes()).await
                }
            },
        };
    }
    if let (Some(root), Some(name)) = (&config.corpus_dir, head.path.strip_prefix("/corpus/")) {
        if let Some(path) = static_file(root, name).filter(|_| !name.is_empty()) {
            return write_range(&mut stream, &path, head.headers.get("range").map(String::as_str)).await;
        }
    }
    if let Some(root) = &config.static_dir {
        if let Some(path) = static_file(root, &head.path) {
            let body = tokio::fs::read(&path).await?;
            return write_response(&mut stream, "200 OK", content_type(&path), &body).await;
        }
    }
    write_response(&mut stream, "404 Not Found", "text/plain", b"not found\n").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_parse() {
        let raw = b"GET /ws?room=abc&x HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nX-Forwarded-For: 9.9.9.9, 10.0.0.1\r\n\r\nrest";
        let head = parse_head(raw).unwrap();
        assert_eq!(head.method, "GET");
        assert_eq!(head.path, "/ws");
        assert_eq!(head.query.get("room").map(String::as_str), Some("abc"));
        assert_eq!(head.query.get("x").map(String::as_str), Some(""));
        assert_eq!(head.headers.get("upgrade").map(String::as_str), Some("websocket"));
        assert_eq!(head.len, raw.len() - 4);
        assert!(parse_head(b"GET / HTTP/1.1\r\nHost: h\r\n").is_none());
        let trusted = ServerConfig { trusted_proxy: Some("127.0.0.1".parse().unwrap()), ..ServerConfig::default() };
        assert_eq!(client_address(&trusted, "127.0.0.1".parse().unwrap(), &head), "9.9.9.9");
        assert_eq!(client_address(&trusted, "127.0.0.2".parse().unwrap(), &head), "127.0.0.2");
        assert_eq!(client_address(&ServerConfig::default(), "127.0.0.1".parse().unwrap(), &head), "127.0.0.1");
    }

    #[test]
    fn range_headers_name_the_bytes_they_ask_for() {
        for (header, len, expect) in [
            ("bytes=0-0", 10, Some(0..=0)),
            ("bytes=2-5", 10, Some(2..=5)),
            ("bytes=8-20", 10, Some(8..=9)),
            ("bytes=4-", 10, Some(4..=9)),
            ("bytes=-3", 10, Some(7..=9)),
            ("bytes=-30", 10, Some(0..=9)),
            ("bytes=10-12", 10, None),
            ("bytes=5-2", 10, None),
            ("bytes=0-0", 0, None),
            ("items=0-1", 10, None),
            ("bytes=a-b", 10, None),
        ] {
            assert_eq!(byte_range(header, len), expect, "{header} of {len}");
        }
    }

    #[test]
    fn static_paths_cannot_escape() {
        let root = std::env::temp_dir().join(format!("lockstep-static-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("index.html"), "hi").unwrap();
        assert_eq!(static_file(&root, "/"), Some(root.join("index.html")));
        assert_eq!(static_file(&root, "/../etc/passwd"), None);
        assert_eq!(static_file(&root, "/nope.html"), None);
        assert_eq!(static_file(&root, "//etc/passwd"), None);
    }
}
