//! A browser in the mesh: real headless Chromium opens a page served by a real `lockstep
//! signal --static`, joins the group by address, answers a Lockstep node's offer, and the two
//! exchange messages larger than 48 KB both ways over loopback — the page, which says nothing of
//! what computes on it, is told the run as an observer and sent one resume (a checkpoint in
//! 48 KB frames) and the page sends a 60,000-byte gradient
//! message back, which the node's session receives and refuses by name. Large SCTP packets stay
//! between Lockstep nodes: a browser, which says no `agent`, gets the default packet size.

use std::path::Path;
use std::process::Command;

use crate::common::{signal_server_with, Node};

#[test]
fn a_browser_joins_the_mesh_and_exchanges_large_messages_with_a_node() {
    let _phase = crate::common::phase(module_path!());
    let pages = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/browser");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let signal = signal_server_with(port, None, &["--static".into(), pages.clone().into()]);
    let mut node = Node::spawn(&signal, "cpu");
    node.command(serde_json::json!({"cmd": "start", "steps": 100000, "width": 32, "context": 32, "layers": 1,
        "heads": 2, "batch": 4}));
    node.wait_for("a running run", |e| e["event"] == "weights", 30);

    let out = Command::new("python3")
        .arg(pages.join("peer_webdriver.py"))
        .arg(format!("http://127.0.0.1:{port}/peer.html"))
        .arg("60")
        .output()
        .expect("python3 runs the WebDriver script");
    let shown = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{shown}");
    let result: serde_json::Value = serde_json::from_str(shown.lines().last().unwrap_or("")).expect(&shown);
    assert_eq!(result["label"], "lockstep", "{result}");
    assert_eq!(result["state"], "open", "the channel must survive large messages: {result}");
    assert_eq!(result["errors"], serde_json::json!([]), "{result}");
    let received: Vec<u64> = result["received"].as_array().unwrap().iter().filter_map(|n| n.as_u64()).collect();
    assert!(received.iter().any(|&n| n > 48_000), "node → browser: a frame over 48 KB: {result}");
    let browser = result["id"].as_u64().unwrap();
    // Browser → node: the 60,000-byte gradient arrived whole and the session refused it by name
    // (the page watches the run: it is no member, its contribution is none).
    node.wait_for(
        "the browser's gradient",
        |e| {
            e["event"] == "ignored"
                && e["from"] == browser
                && e["why"].as_str().is_some_and(|w| w.contains("contribution"))
        },
        20,
    );
    let link = node.wait_for(
        "bytes from the browser",
        |e| e["event"] == "link" && e["peer"] == browser && e["bytes_in"].as_u64() >= Some(60_000),
        20,
    );
    assert!(link["bytes_in"].as_u64().unwrap() >= 60_000, "{link}");
}
