//! Real WebSocket clients through the real server on loopback: grouping by address (clients
//! bound to 127.0.0.1 and 127.0.0.2), the room approval flow, relays, refusals, a flood and a
//! fuzz, static files, and a load run that prints its figures.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use lockstep_signaling::{serve, Limits, ServerConfig, ServerHandle};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{client_async, WebSocketStream};

type Ws = WebSocketStream<TcpStream>;

async fn start(limits: Limits, static_dir: Option<std::path::PathBuf>) -> ServerHandle {
    let config = ServerConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        static_dir,
        corpus_dir: None,
        trusted_proxy: None,
        limits,
        data: None,
        resume_secret: None,
    };
    serve(config).await.expect("server binds on loopback")
}

/// A client whose TCP source address is `from`.
async fn client(server: SocketAddr, from: &str, query: &str) -> Ws {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(server).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (ws, _) = client_async(format!("ws://{server}/ws{query}"), stream).await.expect("handshake");
    ws
}

async fn recv(ws: &mut Ws) -> Value {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(5), ws.next()).await.expect("a message within 5 s");
        match frame {
            Some(Ok(Message::Text(text))) => return serde_json::from_str(text.as_str()).unwrap(),
            Some(Ok(Message::Close(_))) | None => return json!({"type": "closed"}),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return json!({"type": "closed", "error": e.to_string()}),
        }
    }
}

async fn send(ws: &mut Ws, value: Value) {
    ws.send(Message::text(value.to_string())).await.unwrap();
}

/// Receives until a message of `kind` arrives, returning it.
async fn expect(ws: &mut Ws, kind: &str) -> Value {
    for _ in 0..20 {
        let message = recv(ws).await;
        if message["type"] == kind {
            return message;
        }
    }
    panic!("no `{kind}` message arrived");
}

#[tokio::test]
async fn peers_are_grouped_by_address_and_relay_only_inside() {
    let server = start(Limits::default(), None).await;
    let addr = server.local_addr;
    let mut a = client(addr, "127.0.0.1", "").await;
    let welcome_a = expect(&mut a, "welcome").await;
    assert_eq!(welcome_a["group"], json!({"kind": "ip", "name": "127.0.0.1"}));
    let mut b = client(addr, "127.0.0.1", "").await;
    let welcome_b = expect(&mut b, "welcome").await;
    let (id_a, id_b) = (welcome_a["id"].clone(), welcome_b["id"].clone());
    assert_eq!(welcome_b["members"], json!([id_a, id_b]));
    assert_eq!(expect(&mut a, "peer-joined").await["peer"], id_b);
    let mut c = client(addr, "127.0.0.2", "").await;
    let welcome_c = expect(&mut c, "welcome").await;
    assert_eq!(welcome_c["group"], json!({"kind": "ip", "name": "127.0.0.2"}));
    assert_eq!(welcome_c["members"], json!([welcome_c["id"]]));

    send(&mut a, json!({"type": "signal", "to": id_b, "kind": "offer", "data": {"sdp": "v=0"}})).await;
    let relayed = expect(&mut b, "signal").await;
    assert_eq!(relayed, json!({"type": "signal", "from": id_a, "kind": "offer", "data": {"sdp": "v=0"}}));
    send(&mut a, json!({"type": "signal", "to": welcome_c["id"], "kind": "ice", "data": {}})).await;
    let refused = expect(&mut a, "error").await;
    assert_eq!(refused["code"], "not-in-group");

    drop(b);
    assert_eq!(expect(&mut a, "peer-left").await["peer"], id_b);
    server.stop().await;
}

#[tokio::test]
async fn room_joins_need_the_hosts_approval() {
    let server = start(Limits::default(), None).await;
    let addr = server.local_addr;
    let mut host = client(addr, "127.0.0.1", "?room=garden").await;
    let welcome = expect(&mut host, "welcome").await;
    assert_eq!(welcome["host"], welcome["id"]);
    assert_eq!(welcome["group"], json!({"kind": "room", "name": "garden"}));

    let mut joiner = client(addr, "127.0.0.2", "?join=garden").await;
    let waiting = expect(&mut joiner, "waiting").await;
    let request = expect(&mut host, "join-request").await;
    assert_eq!(request["peer"], waiting["id"]);
    assert_eq!(request["address"], "127.0.0.2");
    send(&mut host, json!({"type": "approve", "peer": waiting["id"]})).await;
    let admitted = expect(&mut joiner, "welcome").await;
    assert_eq!(admitted["members"], json!([welcome["id"], waiting["id"]]));
    assert_eq!(expect(&mut host, "peer-joined").await["peer"], waiting["id"]);

    // A second joiner is denied, told why, and disconnected.
    let mut unwanted = client(addr, "127.0.0.3", "?room=garden").await;
    let waiting2 = expect(&mut unwanted, "waiting").await;
    expect(&mut host, "join-request").await;
    send(&mut host, json!({"type": "deny", "peer": waiting2["id"], "reason": "private garden"})).await;
    assert_eq!(expect(&mut unwanted, "denied").await["reason"], "private garden");
    assert_eq!(recv(&mut unwanted).await["type"], "closed");

    // Only the host decides.
    send(&mut joiner, json!({"type": "approve", "peer": 12345})).await;
    assert_eq!(expect(&mut joiner, "error").await["code"], "not-host");

    // A join to a room nobody opened is refused.
    let mut lost = client(addr, "127.0.0.4", "?join=nowhere").await;
    let error = expect(&mut lost, "error").await;
    assert_eq!(error["code"], "no-such-room");
    assert_eq!(error["fatal"], true);

    // When the host leaves, the oldest member hosts.
    drop(host);
    assert_eq!(expect(&mut joiner, "host-changed").await["host"], waiting["id"]);
    server.stop().await;
}

#[tokio::test]
async fn unanswered_requests_time_out_with_a_message() {
    let limits = Limits { approval_timeout: Duration::from_millis(600), ..Limits::default() };
    let server = start(limits, None).await;
    let mut host = client(server.local_addr, "127.0.0.1", "?room=slow").await;
    expect(&mut host, "welcome").await;
    let mut joiner = client(server.local_addr, "127.0.0.2", "?room=slow").await;
    expect(&mut joiner, "waiting").await;
    let denied = expect(&mut joiner, "denied").await;
    assert!(denied["reason"].as_str().unwrap().contains("did not answer"), "{denied}");
    server.stop().await;
}

#[tokio::test]
async fn floods_and_garbage_get_errors_and_others_are_unaffected() {
    let limits = Limits { messages_per_second: 20, message_burst: 40, max_message_bytes: 4096, ..Limits::default() };
    let server = start(limits, None).await;
    let addr = server.local_addr;
    let mut bystander = client(addr, "127.0.0.9", "").await;
    expect(&mut bystander, "welcome").await;
    let mut noisy = client(addr, "127.0.0.1", "").await;
    expect(&mut noisy, "welcome").await;

    // Garbage of every kind: each gets an error naming the problem, the connection stays.
    let cases: Vec<(Message, &str)> = vec![
        (Message::text("{not json"), "bad-json"),
        (Message::text("[]"), "bad-json"),
        (Message::text(r#"{"type":"gradient","data":[1,2,3]}"#), "unknown-type"),
        (Message::text(r#"{"type":"signal","to":"everyone"}"#), "bad-json"),
        (Message::binary(vec![0u8; 64]), "binary-not-allowed"),
        (Message::text(format!(r#"{{"type":"ping","pad":"{}"}}"#, "x".repeat(5000))), "too-large"),
    ];
    for (frame, code) in cases {
        noisy.send(frame).await.unwrap();
        assert_eq!(expect(&mut noisy, "error").await["code"], code);
    }
    // Seeded fuzz: random printable junk and random JSON-ish fragments.
    let mut seed = 0x1234_5678u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..30 {
        let len = (next() % 200) as usize;
        const ALPHABET: &[u8] = b" {}[]\":,0123456789abcdefghijklmnopqrstuvwxyz";
        let junk: String = (0..len).map(|_| char::from(ALPHABET[(next() % ALPHABET.len() as u64) as usize])).collect();
        noisy.send(Message::text(junk)).await.unwrap();
        let reply = recv(&mut noisy).await;
        assert_ne!(reply["type"], "closed", "the server hung up on fuzz input");
    }
    send(&mut noisy, json!({"type": "ping"})).await;
    expect(&mut noisy, "pong").await;

    // A flood: the burst goes through, the rest is dropped with (few) rate-limit errors.
    tokio::time::sleep(Duration::from_secs(3)).await; // refill the bucket
    for _ in 0..200 {
        send(&mut noisy, json!({"type": "ping"})).await;
    }
    let mut pongs = 0;
    let mut limited = 0;
    while let Ok(Some(Ok(frame))) = tokio::time::timeout(Duration::from_millis(500), noisy.next()).await {
        if let Message::Text(text) = frame {
            let v: Value = serde_json::from_str(text.as_str()).unwrap();
            if v["type"] == "pong" {
                pongs += 1;
            } else if v["code"] == "rate-limited" {
                limited += 1;
            }
        }
    }
    assert!((40..100).contains(&pongs), "{pongs} pongs");
    assert!((1..=3).contains(&limited), "{limited} rate-limit errors");

    // The bystander never noticed.
    send(&mut bystander, json!({"type": "ping"})).await;
    assert_eq!(recv(&mut bystander).await["type"], "pong");

    // A frame far beyond the limit ends that connection, and only that one.
    let _ = noisy.send(Message::text("y".repeat(64 * 1024))).await;
    assert_eq!(recv(&mut noisy).await["type"], "closed");
    send(&mut bystander, json!({"type": "ping"})).await;
    assert_eq!(recv(&mut bystander).await["type"], "pong");
    server.stop().await;
}

#[tokio::test]
async fn static_files_are_served() {
    let dir = std::env::temp_dir().join(format!("lockstep-static-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("index.html"), "<h1>lockstep</h1>").unwrap();
    let server = start(Limits::default(), Some(dir)).await;
    let get = |path: &'static str| async move {
        let mut stream = TcpStream::connect(server.local_addr).await.unwrap();
        stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    };
    let index = get("/").await;
    assert!(
        index.starts_with("HTTP/1.1 200 OK") && index.contains("text/html") && index.ends_with("<h1>lockstep</h1>"),
        "{index}"
    );
    assert!(get("/../../etc/passwd").await.starts_with("HTTP/1.1 404"));
    assert!(get("/healthz").await.ends_with("ok\n"));
    server.stop().await;
}

/// 200 peers in 50 rooms of 4, with joins approved by each room's host, a round of relays,
/// and everyone leaving. Prints its figures; asserts only correctness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_200_peers_in_50_groups() {
    // 200 machines played from two addresses: the per-address cap is lifted for them.
    let server = start(Limits { max_peers_per_address: 1024, ..Limits::default() }, None).await;
    let addr = server.local_addr;
    let started = Instant::now();
    let mut rooms = Vec::new();
    for r in 0..50 {
        let code = format!("room-{r}");
        let mut host = client(addr, "127.0.0.1", &format!("?room={code}")).await;
        expect(&mut host, "welcome").await;
        let mut members = Vec::new();
        for _ in 0..3 {
            let mut joiner = client(addr, "127.0.0.2", &format!("?join={code}")).await;
            let waiting = expect(&mut joiner, "waiting").await;
            expect(&mut host, "join-request").await;
            send(&mut host, json!({"type": "approve", "peer": waiting["id"]})).await;
            let welcome = expect(&mut joiner, "welcome").await;
            members.push((joiner, welcome["id"].clone()));
        }
        rooms.push((host, members));
    }
    let joined = started.elapsed();
    assert_eq!(server.counts(), (200, 50));

    let relay_started = Instant::now();
    let mut relays = 0;
    for (host, members) in &mut rooms {
        for (_, id) in members.iter() {
            send(host, json!({"type": "signal", "to": id, "kind": "offer", "data": {"sdp": "x".repeat(200)}})).await;
            relays += 1;
        }
        for (joiner, _) in members.iter_mut() {
            expect(joiner, "signal").await;
        }
    }
    let relayed = relay_started.elapsed();
    drop(rooms);
    for _ in 0..100 {
        if server.counts() == (0, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(server.counts(), (0, 0), "every peer and group is gone after everyone left");
    println!(
        "load: 200 peers in 50 rooms joined (with host approval) in {:.0} ms ({:.0} joins/s); {relays} relays delivered in {:.0} ms ({:.0}/s)",
        joined.as_secs_f64() * 1e3,
        200.0 / joined.as_secs_f64(),
        relayed.as_secs_f64() * 1e3,
        f64::from(relays) / relayed.as_secs_f64()
    );
    server.stop().await;
}

#[tokio::test]
async fn forwarded_for_is_believed_only_from_the_trusted_proxy() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let config = ServerConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        static_dir: None,
        corpus_dir: None,
        trusted_proxy: Some("127.0.0.1".parse().unwrap()),
        limits: Limits::default(),
        data: None,
        resume_secret: None,
    };
    let server = serve(config).await.unwrap();
    let addr = server.local_addr;
    let via = |from: &'static str| async move {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        let stream = socket.connect(addr).await.unwrap();
        let mut request = format!("ws://{addr}/ws").into_client_request().unwrap();
        request.headers_mut().insert("X-Forwarded-For", "203.0.113.7, 10.0.0.1".parse().unwrap());
        client_async(request, stream).await.unwrap().0
    };
    // Through the proxy: grouped by the forwarded client address.
    let mut proxied = via("127.0.0.1").await;
    assert_eq!(expect(&mut proxied, "welcome").await["group"], json!({"kind": "ip", "name": "203.0.113.7"}));
    // Anyone else claiming a forwarded address is grouped by their own.
    let mut direct = via("127.0.0.2").await;
    assert_eq!(expect(&mut direct, "welcome").await["group"], json!({"kind": "ip", "name": "127.0.0.2"}));
    server.stop().await;
}

#[tokio::test]
async fn one_address_cannot_lock_others_out_of_the_server_or_a_room() {
    let limits = Limits { max_peers_per_address: 3, max_pending_per_address: 1, ..Limits::default() };
    let server = start(limits, None).await;
    let addr = server.local_addr;
    let mut host = client(addr, "127.0.0.1", "?room=r").await;
    expect(&mut host, "welcome").await;
    // 127.0.0.3 asks once and waits; its second request is refused with the reason.
    let mut first = client(addr, "127.0.0.3", "?join=r").await;
    expect(&mut first, "waiting").await;
    let mut second = client(addr, "127.0.0.3", "?join=r").await;
    let refused = expect(&mut second, "error").await;
    assert_eq!(refused["code"], "too-many-requests", "{refused}");
    assert!(refused["message"].as_str().unwrap().contains("join requests waiting in room `r`"), "{refused}");
    // Another address still gets in line.
    let mut other = client(addr, "127.0.0.4", "?join=r").await;
    expect(&mut other, "waiting").await;
    // Connections: 127.0.0.3 holds one; two more fit, the next is refused; others connect.
    let _a = client(addr, "127.0.0.3", "").await;
    let _b = client(addr, "127.0.0.3", "").await;
    let mut over = client(addr, "127.0.0.3", "").await;
    let refused = expect(&mut over, "error").await;
    assert_eq!(refused["code"], "too-many-requests", "{refused}");
    let mut elsewhere = client(addr, "127.0.0.5", "").await;
    expect(&mut elsewhere, "welcome").await;
}
