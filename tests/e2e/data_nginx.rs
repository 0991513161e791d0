//! `/data` against a real HTTP server: Debian's nginx serves parquet files that pyarrow wrote
//! with FineWeb-Edu's schema (10 columns, `text` first, several row groups, SNAPPY). The texts
//! must be exactly what pyarrow wrote; only the footer and one column chunk may be fetched, in
//! explicit ranges, counted from nginx's own access log; redirects are followed, and a signed
//! URL that starts answering 403 is resolved again. Then a node's data client trains from
//! `/data`, and falls back to the built-in corpus when the server goes away.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use lockstep_mesh::data_client::RemoteSource;
use lockstep_node::data::{DataSource, Origin};
use lockstep_signaling::data::DataConfig;
use lockstep_signaling::{serve, Limits, ServerConfig};
use serde_json::Value;

pub(crate) struct Nginx {
    child: Child,
    dir: PathBuf,
    pub(crate) port: u16,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // A graceful stop takes the workers down too (killing the master would orphan them).
        let conf = self.dir.join("nginx.conf");
        let stopped = Command::new("nginx")
            .args(["-c", conf.to_str().unwrap_or_default(), "-p", self.dir.to_str().unwrap_or_default(), "-s", "stop"])
            .status();
        if !stopped.is_ok_and(|s| s.success()) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn nginx_conf(dir: &Path, port: u16, signature: u32) -> String {
    format!(
        r#"daemon off;
master_process on;
worker_processes 1;
# After a reload the old worker keeps serving its kept-alive connections; give it 2 s at most.
worker_shutdown_timeout 2s;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
user root;
events {{ worker_connections 64; }}
http {{
    log_format lockstep '$request_uri $status $body_bytes_sent "$http_range"';
    access_log {dir}/access.log lockstep;
    server {{
        listen 127.0.0.1:{port};
        root {dir}/www;
        # The dataset's resolve URLs redirect to signed, expiring URLs: so do these.
        location /resolve/ {{
            rewrite ^/resolve/(.*)$ /files/$1?sig={signature} redirect;
        }}
        location /files/ {{
            if ($arg_sig != "{signature}") {{ return 403; }}
        }}
    }}
}}
"#,
        dir = dir.display()
    )
}

pub(crate) fn start_nginx(dir: &Path) -> Nginx {
    let port = free_port();
    std::fs::write(dir.join("nginx.conf"), nginx_conf(dir, port, 1)).unwrap();
    let child = Command::new("nginx")
        .args(["-c", dir.join("nginx.conf").to_str().unwrap(), "-p", dir.to_str().unwrap()])
        .spawn()
        .expect("nginx must be installed (the README's test command installs nginx-light)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nginx did not start: {}",
            std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Nginx { child, dir: dir.to_path_buf(), port }
}

/// Every logged request: (uri, status, body bytes, range header).
pub(crate) fn access_log(dir: &Path) -> Vec<(String, u16, u64, String)> {
    std::fs::read_to_string(dir.join("access.log"))
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let mut parts = line.splitn(4, ' ');
            let uri = parts.next().unwrap().to_string();
            let status = parts.next().unwrap().parse().unwrap();
            let bytes = parts.next().unwrap().parse().unwrap();
            let range = parts.next().unwrap().trim_matches('"').to_string();
            (uri, status, bytes, range)
        })
        .collect()
}

fn http_get(server: SocketAddr, path: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(server).unwrap();
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = String::from_utf8_lossy(&response[9..12]).parse().unwrap();
    (status, serde_json::from_slice(&response[split + 4..]).unwrap())
}

#[test]
fn data_reads_parquet_over_ranges_from_nginx() {
    let _phase = crate::common::phase(module_path!());
    let dir = std::env::temp_dir().join(format!("lockstep-data-{}", std::process::id()));
    let www = dir.join("www/files");
    std::fs::create_dir_all(&www).unwrap();
    let out = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/make_fineweb.py"))
        .args([www.to_str().unwrap(), "3", "600", "100"])
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "pyarrow writer failed: {}", String::from_utf8_lossy(&out.stderr));
    let manifest: HashMap<String, Value> = serde_json::from_slice(&out.stdout).unwrap();
    for file in manifest.values() {
        assert_eq!(file["columns"], 10);
        assert_eq!(file["codec"], "SNAPPY");
        assert_eq!(file["row_groups"].as_array().unwrap().len(), 6);
    }
    let nginx = start_nginx(&dir);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut shards: Vec<String> = manifest.keys().cloned().collect();
    shards.sort();
    let data = DataConfig {
        base_url: format!("http://127.0.0.1:{}/resolve", nginx.port),
        shards,
        max_texts: 16,
        // These files are small; FineWeb-Edu's are ~2 GB, where the default 64 KiB guess is a
        // sliver. Either way a footer costs at most two requests.
        footer_guess: 4096,
        // No row-group cache here, so every slice reads from nginx (the expiry below must be
        // met by a real request); the cache has its own unit test.
        cache_bytes: 0,
        ..DataConfig::default()
    };
    let config = ServerConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        static_dir: None,
        corpus_dir: None,
        trusted_proxy: None,
        limits: Limits::default(),
        data: Some(data),
        resume_secret: None,
    };
    let server = runtime.block_on(serve(config)).unwrap();
    let addr = server.local_addr;

    let mut warm_uncached_requests = Vec::new();
    let mut slice_fractions = Vec::new();
    let mut seen_shards = std::collections::HashSet::new();
    for round in 0..24 {
        if round == 12 {
            // The signed URLs expire: nginx now wants another signature, and the server must
            // resolve the original URL again when it gets a 403.
            std::fs::write(dir.join("nginx.conf"), nginx_conf(&dir, nginx.port, 2)).unwrap();
            let reload = Command::new("nginx")
                .args(["-c", dir.join("nginx.conf").to_str().unwrap(), "-p", dir.to_str().unwrap(), "-s", "reload"])
                .status()
                .unwrap();
            assert!(reload.success());
            // Wait until the new configuration is the one answering.
            let deadline = Instant::now() + Duration::from_secs(10);
            let old_url = format!("/files/{}?sig=1&probe=1", manifest.keys().next().unwrap());
            loop {
                let mut probe = TcpStream::connect(("127.0.0.1", nginx.port)).unwrap();
                probe
                    .write_all(format!("GET {old_url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
                    .unwrap();
                let mut head = [0u8; 12];
                probe.read_exact(&mut head).unwrap();
                if &head[9..12] == b"403" {
                    break;
                }
                assert!(Instant::now() < deadline, "nginx never picked up the new configuration");
                std::thread::sleep(Duration::from_millis(50));
            }
            // ... and until the old worker, which still serves kept-alive connections with the
            // old signature, is gone (`worker_shutdown_timeout` bounds that).
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let workers = Command::new("pgrep").args(["-P", &nginx.child.id().to_string()]).output().unwrap();
                if String::from_utf8_lossy(&workers.stdout).lines().count() == 1 {
                    break;
                }
                assert!(Instant::now() < deadline, "the old nginx worker never exited");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let (status, slice) = http_get(addr, "/data");
        assert_eq!(status, 200, "{slice}");
        let shard = slice["shard"].as_str().unwrap().to_string();
        let group = slice["row_group"].as_u64().unwrap() as usize;
        let first = slice["first_row"].as_u64().unwrap() as usize;
        let expected = &manifest[&shard]["row_groups"][group];
        let texts = slice["texts"].as_array().unwrap();
        assert!(!texts.is_empty() && texts.len() <= 16);
        for (i, text) in texts.iter().enumerate() {
            assert_eq!(text, &expected[first + i], "{shard} group {group} row {}", first + i);
        }
        let warm_footer = !seen_shards.insert(shard.clone());
        let requests = slice["requests"].as_u64().unwrap();
        if warm_footer && slice["cached"] == false && round < 12 {
            warm_uncached_requests.push(requests);
            // One row group's text column: a small part of the file.
            let size = manifest[&shard]["size"].as_u64().unwrap();
            let bytes = slice["bytes"].as_u64().unwrap();
            assert!(bytes * 4 < size, "a slice of {shard} fetched {bytes} of {size} bytes");
            slice_fractions.push(bytes as f64 / size as f64);
        }
        // A cold shard costs its footer (at most 3 requests) plus the column; after the expiry
        // a slice may pay one 403 and one re-resolved request; never more.
        assert!(requests <= if warm_footer { 3 } else { 4 }, "round {round}: {requests} requests");
    }
    let log = access_log(&nginx.dir);
    let total_size: u64 = manifest.values().map(|f| f["size"].as_u64().unwrap()).sum();
    let log: Vec<_> = log.into_iter().filter(|(uri, ..)| !uri.contains("probe=1")).collect();
    let fetched: u64 = log.iter().map(|(_, _, bytes, _)| bytes).sum();
    let file_requests: Vec<_> = log.iter().filter(|(uri, ..)| uri.starts_with("/files/")).collect();
    // Every file request was an explicit `bytes=a-b` range answered with 206, or a 403 for an
    // expired signature.
    for (uri, status, _, range) in &file_requests {
        if uri.contains("probe=1") {
            continue; // this test's own check that the reload took effect
        }
        assert!(*status == 206 || *status == 403, "{uri}: {status}");
        assert!(
            range.starts_with("bytes=") && !range.starts_with("bytes=-") && !range.ends_with('-'),
            "{uri}: {range}"
        );
    }
    assert!(log.iter().any(|(uri, status, ..)| uri.starts_with("/resolve/") && *status == 302), "no redirect followed");
    assert!(log.iter().any(|(_, status, ..)| *status == 403), "the expiry was never met: {log:?}");
    // With a warm footer, a slice of a new row group costs one range request.
    assert!(!warm_uncached_requests.is_empty());
    assert!(warm_uncached_requests.iter().all(|&r| r == 1), "{warm_uncached_requests:?}");
    let ratio = fetched as f64 / total_size as f64;
    let mean_fraction = slice_fractions.iter().sum::<f64>() / slice_fractions.len() as f64;
    println!(
        "/data: 24 slices, {} requests to nginx, {fetched} bytes fetched of {total_size} in the files ({:.1}%); \
         a warm slice fetched {:.1}% of its file on average in one request",
        log.len(),
        ratio * 100.0,
        mean_fraction * 100.0
    );

    // A node trains from /data, and falls back when the server goes away.
    let mut source = RemoteSource::new(&format!("http://{addr}/data"), 7)
        .unwrap()
        .with_timeouts(Duration::from_secs(2), Duration::from_secs(60));
    assert_eq!(source.probe(), Ok(()), "the demo's check that /data answers");
    let (batch, origin) = source.next_batch(4, 32);
    assert!(matches!(origin, Origin::Remote(_)), "{origin:?}");
    let window = String::from_utf8(batch.tokens[..32].to_vec()).unwrap();
    let all_text: String = manifest
        .values()
        .flat_map(|f| f["row_groups"].as_array().unwrap().iter())
        .flat_map(|g| g.as_array().unwrap())
        .map(|t| t.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n\n");
    assert!(all_text.contains(window.trim_matches('\n')), "{window:?} is not from the files");
    runtime.block_on(server.stop());
    assert!(source.probe().is_err(), "a stopped server does not answer");
    let (_, origin) = source.next_batch(4, 32);
    assert!(matches!(&origin, Origin::Fallback { reason } if reason.contains("built-in")), "{origin:?}");
}
