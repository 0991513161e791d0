//! The `/data` client: batches from a signaling server's `/data`, falling back to the built-in
//! corpus.
//!
//! It lives here, beside the other adapters, because it does I/O and reads a clock; `node`
//! only sees a [`DataSource`]. Requests go through reqwest (the HTTP client the signaling
//! server already uses) on a thread of the source's own, with its own small runtime, so the
//! source works the same from a blocking compute thread, a plain thread or an async task.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use lockstep_luts::rng::SplitMix64;
use lockstep_node::data::{sample, Batch, CorpusSource, DataSource, Origin};

/// Why one `/data` request brought no texts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchError {
    /// The URL is not an `http://` URL this client can use.
    Url(String),
    /// No answer within the timeout (connecting, or the whole response).
    Timeout(Duration),
    /// The connection was refused or failed.
    Connect(String),
    /// The server answered an error status, with its reason when it gave one.
    Status { code: u16, reason: String },
    /// The body is not the JSON `/data` answers with.
    Body(String),
    /// The fetcher thread is gone (it could not start).
    Fetcher(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::Url(url) => write!(f, "`{url}` is not an http:// URL"),
            FetchError::Timeout(after) => write!(f, "/data did not answer within {:.1} s", after.as_secs_f64()),
            FetchError::Connect(why) => write!(f, "cannot connect to /data: {why}"),
            FetchError::Status { code, reason } => write!(f, "/data answered {code}: {reason}"),
            FetchError::Body(why) => write!(f, "bad /data body: {why}"),
            FetchError::Fetcher(why) => write!(f, "the /data client could not start: {why}"),
        }
    }
}

impl std::error::Error for FetchError {}

/// One slice of texts and where it came from.
type Slice = (Vec<u8>, String);

/// A request to the fetcher thread: where to send the answer.
type Request = mpsc::Sender<Result<Slice, FetchError>>;

/// Batches from a signaling server's `/data` (plain `http://` to the server, which does the
/// HTTPS and parquet work): one slice per batch, windows drawn from it with the node's seeded
/// generator. When the server is unreachable, slow (`timeout`) or answers an error, the batch
/// comes from the built-in corpus instead, the origin says why, and the remote is tried again
/// only after `retry_after`.
pub struct RemoteSource {
    url: String,
    timeout: Duration,
    retry_after: Duration,
    next_try: Option<Instant>,
    last_error: Option<FetchError>,
    /// The sampler; its state is the source's (what a checkpoint carries).
    rng: SplitMix64,
    fallback: CorpusSource,
    requests: Option<mpsc::Sender<(Request, Duration)>>,
}

impl RemoteSource {
    /// `url` is `http://HOST:PORT/data`.
    pub fn new(url: &str, seed: u64) -> Result<RemoteSource, FetchError> {
        if !url.starts_with("http://") || reqwest::Url::parse(url).is_err() {
            return Err(FetchError::Url(url.to_string()));
        }
        Ok(RemoteSource {
            url: url.to_string(),
            timeout: Duration::from_secs(3),
            retry_after: Duration::from_secs(30),
            next_try: None,
            last_error: None,
            rng: SplitMix64::new(seed ^ 0x7265_6d6f_7465_0000),
            fallback: CorpusSource::builtin(seed),
            requests: None,
        })
    }

    pub fn with_timeouts(mut self, timeout: Duration, retry_after: Duration) -> Self {
        self.timeout = timeout;
        self.retry_after = retry_after;
        self
    }

    /// Whether `/data` answers with a slice of texts now (one `GET`; the slice is dropped).
    pub fn probe(&mut self) -> Result<(), FetchError> {
        self.fetch().map(|_| ())
    }

    /// One `GET` through the fetcher thread (started on first use).
    fn fetch(&mut self) -> Result<Slice, FetchError> {
        if self.requests.is_none() {
            self.requests = Some(spawn_fetcher(self.url.clone())?);
        }
        let requests = self.requests.as_ref().expect("just started");
        let (tx, rx) = mpsc::channel();
        if requests.send((tx, self.timeout)).is_err() {
            self.requests = None;
            return Err(FetchError::Fetcher("the fetcher thread stopped".into()));
        }
        // The request itself is bounded by `timeout`; the margin covers the thread hand-off.
        match rx.recv_timeout(self.timeout + Duration::from_secs(1)) {
            Ok(result) => result,
            Err(_) => Err(FetchError::Timeout(self.timeout)),
        }
    }
}

/// The thread that owns the HTTP client and a one-thread runtime for it.
fn spawn_fetcher(url: String) -> Result<mpsc::Sender<(Request, Duration)>, FetchError> {
    // reqwest is built without a default TLS provider; `/data` is plain http, but the client
    // builder wants one installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| FetchError::Fetcher(e.to_string()))?;
    let client = reqwest::Client::builder().build().map_err(|e| FetchError::Fetcher(e.to_string()))?;
    let (tx, rx) = mpsc::channel::<(Request, Duration)>();
    std::thread::Builder::new()
        .name("data-client".into())
        .spawn(move || {
            for (answer, timeout) in rx {
                let result = runtime.block_on(get(&client, &url, timeout));
                let _ = answer.send(result);
            }
        })
        .map_err(|e| FetchError::Fetcher(e.to_string()))?;
    Ok(tx)
}

async fn get(client: &reqwest::Client, url: &str, timeout: Duration) -> Result<Slice, FetchError> {
    let classify = |e: reqwest::Error| {
        if e.is_timeout() {
            FetchError::Timeout(timeout)
        } else if e.is_connect() {
            FetchError::Connect(std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string()))
        } else {
            FetchError::Body(e.to_string())
        }
    };
    let response = client.get(url).timeout(timeout).send().await.map_err(classify)?;
    let status = response.status();
    let body = response.bytes().await.map_err(classify)?;
    let json: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
        if status.is_success() {
            FetchError::Body(e.to_string())
        } else {
            FetchError::Status { code: status.as_u16(), reason: "no reason given".into() }
        }
    })?;
    if status != reqwest::StatusCode::OK {
        let reason = json["error"].as_str().unwrap_or("no reason given").to_string();
        return Err(FetchError::Status { code: status.as_u16(), reason });
    }
    let texts = json["texts"].as_array().ok_or_else(|| FetchError::Body("no `texts`".into()))?;
    let mut text = Vec::new();
    for t in texts {
        text.extend_from_slice(t.as_str().ok_or_else(|| FetchError::Body("a text is not a string".into()))?.as_bytes());
        text.extend_from_slice(b"\n\n");
    }
    let origin = format!(
        "{} row group {} rows {}..",
        json["shard"].as_str().unwrap_or("?"),
        json["row_group"].as_u64().unwrap_or(0),
        json["first_row"].as_u64().unwrap_or(0)
    );
    Ok((text, origin))
}

impl DataSource for RemoteSource {
    fn next_batch(&mut self, batch: usize, seq: usize) -> (Batch, Origin) {
        let now = Instant::now();
        let waiting = self.next_try.is_some_and(|t| now < t);
        let outcome = match (&self.last_error, waiting) {
            (Some(error), true) => Err(error.clone()),
            _ => self.fetch(),
        };
        match outcome {
            Ok((text, origin)) if text.len() > seq + 1 => {
                self.next_try = None;
                let out = sample(&text, &mut self.rng, batch, seq);
                (out, Origin::Remote(origin))
            }
            Ok((text, _)) => {
                let (out, _) = self.fallback.next_batch(batch, seq);
                (out, Origin::Fallback { reason: format!("the /data slice had only {} bytes", text.len()) })
            }
            Err(error) => {
                if !waiting {
                    self.last_error = Some(error.clone());
                    self.next_try = Some(now + self.retry_after);
                }
                let (out, _) = self.fallback.next_batch(batch, seq);
                (out, Origin::Fallback { reason: format!("{error}; using the built-in corpus") })
            }
        }
    }

    fn state(&self) -> u64 {
        self.rng.state()
    }

    fn restore(&mut self, state: u64) {
        self.rng = SplitMix64::new(state);
    }

    fn describe(&self) -> String {
        format!("{} (falling back to the built-in corpus)", self.url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_server_is_named_as_a_timeout() {
        // A listener that accepts and never answers.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let url = format!("http://{}/data", listener.local_addr().expect("an address"));
        let mut source = RemoteSource::new(&url, 1)
            .expect("an http URL")
            .with_timeouts(Duration::from_millis(300), Duration::from_secs(60));
        let (_, origin) = source.next_batch(2, 8);
        let Origin::Fallback { reason } = origin else { panic!("{origin:?}") };
        assert!(reason.starts_with("/data did not answer within 0.3 s"), "{reason}");
        drop(listener);
    }

    #[test]
    fn a_closed_port_is_named_as_a_refused_connection() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("addr").port();
        let mut source = RemoteSource::new(&format!("http://127.0.0.1:{port}/data"), 1).expect("an http URL");
        let error = source.probe().expect_err("nothing listens there");
        assert!(matches!(error, FetchError::Connect(_)), "{error:?}");
    }

    #[test]
    fn only_http_urls_are_taken() {
        assert!(matches!(RemoteSource::new("https://example.invalid/data", 1), Err(FetchError::Url(_))));
        assert!(matches!(RemoteSource::new("not a url", 1), Err(FetchError::Url(_))));
    }
}
