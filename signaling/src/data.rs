//! `/data`: a random slice of FineWeb-Edu's text, read straight from the parquet shards with
//! HTTP range requests.
//!
//! A slice is a window of up to `max_texts` consecutive rows of the `text` column of one row
//! group of one shard, chosen at random. Only the footer (once per shard, then cached) and the
//! `text` column chunk of that row group are fetched: explicit `bytes=a-b` ranges against the
//! length learned from the first response's `Content-Range`, a `206` required, redirects
//! followed, and a `403` from a redirected (signed, expiring) URL answered by resolving the
//! original URL again. Footers and recently decoded row groups are cached within a memory
//! bound. `docs/PROTOCOL.md` describes the response.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::guard::lock;

use arrow_array::cast::AsArray;
use arrow_array::Array;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, TryStreamExt};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use parquet::errors::ParquetError;
use parquet::file::metadata::{FooterTail, ParquetMetaData, ParquetMetaDataReader};
use serde::Serialize;

/// The dataset's public base URL (`sample/10BT`).
pub const FINEWEB_EDU_10BT: &str = "https://huggingface.co/datasets/HuggingFaceFW/fineweb-edu/resolve/main/sample/10BT";

/// The 14 shards of `sample/10BT`.
pub fn fineweb_shards() -> Vec<String> {
    (0..14).map(|i| format!("{i:03}_00000.parquet")).collect()
}

/// Where `/data` reads from and how much it keeps.
#[derive(Clone, Debug)]
pub struct DataConfig {
    /// Base URL; shard `S` is at `{base_url}/{S}`.
    pub base_url: String,
    pub shards: Vec<String>,
    /// Rows per slice at most.
    pub max_texts: usize,
    /// Bytes of text per slice at most (whole rows; at least one row).
    pub max_bytes: usize,
    /// Memory for decoded row groups kept for later slices.
    pub cache_bytes: usize,
    /// Bytes fetched as a first guess at the footer.
    pub footer_guess: u64,
    /// Largest footer metadata a shard may claim: a source that claims more is refused
    /// before anything of that size is fetched.
    pub max_metadata_bytes: u64,
    /// Largest `text` column chunk (compressed, as fetched) and largest decoded row group
    /// (text bytes) one slice may need; a row group past either is refused.
    pub max_chunk_bytes: u64,
    pub max_decoded_bytes: usize,
    /// Each upstream request (connect, headers and body) must finish within this.
    pub request_timeout: std::time::Duration,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            base_url: FINEWEB_EDU_10BT.to_string(),
            shards: fineweb_shards(),
            max_texts: 64,
            max_bytes: 256 * 1024,
            cache_bytes: 64 * 1024 * 1024,
            footer_guess: 64 * 1024,
            // FineWeb-Edu's footers are a few hundred KiB, its `text` chunks tens of MiB.
            max_metadata_bytes: 16 * 1024 * 1024,
            max_chunk_bytes: 256 * 1024 * 1024,
            max_decoded_bytes: 512 * 1024 * 1024,
            request_timeout: std::time::Duration::from_secs(20),
        }
    }
}

/// Why a slice could not be produced.
#[derive(Debug)]
pub struct DataError(pub String);

impl std::fmt::Display for DataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DataError {}

impl From<ParquetError> for DataError {
    fn from(e: ParquetError) -> Self {
        DataError(format!("parquet: {e}"))
    }
}

/// The `/data` response body.
#[derive(Clone, Debug, Serialize)]
pub struct DataSlice {
    pub v: u32,
    pub source: String,
    pub shard: String,
    pub row_group: usize,
    pub rows_in_group: usize,
    pub first_row: usize,
    pub texts: Vec<String>,
    /// HTTP requests and bytes this slice cost (0 when served from the cache).
    pub requests: u64,
    pub bytes: u64,
    pub cached: bool,
}

/// Appends a decoded `text` column's values (an absent value as an empty text); says what the
/// column is when it holds no strings.
pub fn push_texts(column: &dyn Array, texts: &mut Vec<String>) -> Result<(), String> {
    let push = |texts: &mut Vec<String>, value: Option<&str>| texts.push(value.unwrap_or("").to_string());
    if let Some(strings) = column.as_string_opt::<i32>() {
        strings.iter().for_each(|v| push(texts, v));
    } else if let Some(strings) = column.as_string_opt::<i64>() {
        strings.iter().for_each(|v| push(texts, v));
    } else if let Some(strings) = column.as_string_view_opt() {
        strings.iter().for_each(|v| push(texts, v));
    } else {
        return Err(format!("`text` is {}, not a string column", column.data_type()));
    }
    Ok(())
}

/// Requests and body bytes fetched so far.
#[derive(Debug, Default)]
pub struct FetchStats {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
}

/// One remote file read by explicit byte ranges.
#[derive(Clone)]
struct RemoteFile {
    client: reqwest::Client,
    /// The URL to resolve again when a redirect target expires.
    origin: String,
    /// Where the last redirect led (requests go there directly).
    current: Arc<Mutex<String>>,
    len: u64,
    stats: Arc<FetchStats>,
    metadata: Option<Arc<ParquetMetaData>>,
}

/// Fetches `bytes=start-end` (inclusive) of `origin`, going straight to the last redirect
/// target, and re-resolving `origin` once if that target answers 403. Returns the body and the
/// total length from `Content-Range`.
async fn fetch_range(
    client: &reqwest::Client,
    origin: &str,
    current: &Mutex<String>,
    stats: &FetchStats,
    start: u64,
    end: u64,
) -> Result<(Bytes, u64), DataError> {
    let mut url = lock(current).clone();
    for attempt in 0..2 {
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let response = client
            .get(&url)
            .header(reqwest::header::RANGE, format!("bytes={start}-{end}"))
            .send()
            .await
            .map_err(|e| DataError(format!("GET {url}: {e}")))?;
        let status = response.status();
        if status == reqwest::StatusCode::FORBIDDEN && attempt == 0 && url != origin {
            // A signed redirect target expired: resolve the original URL again.
            url = origin.to_string();
            continue;
        }
        if status != reqwest::StatusCode::PARTIAL_CONTENT {
            return Err(DataError(format!(
                "GET {url} bytes={start}-{end}: expected 206 Partial Content, got {status}"
            )));
        }
        let final_url = response.url().to_string();
        let total = response
            .headers()
            .get(reqwest::header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit('/').next())
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| DataError(format!("GET {url}: no usable Content-Range")))?;
        let body = response.bytes().await.map_err(|e| DataError(format!("GET {url}: {e}")))?;
        if body.len() as u64 != end - start + 1 {
            return Err(DataError(format!("GET {url}: asked for {} bytes, got {}", end - start + 1, body.len())));
        }
        stats.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        *lock(current) = final_url;
        return Ok((body, total));
    }
    Err(DataError(format!("GET {origin}: forbidden even after resolving again")))
}

impl RemoteFile {
    async fn get(&self, range: Range<u64>) -> Result<Bytes, DataError> {
        if range.start >= range.end || range.end > self.len {
            return Err(DataError(format!("range {range:?} outside a file of {} bytes", self.len)));
        }
        let (body, _) =
            fetch_range(&self.client, &self.origin, &self.current, &self.stats, range.start, range.end - 1).await?;
        Ok(body)
    }
}

impl AsyncFileReader for RemoteFile {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move { self.get(range).await.map_err(|e| ParquetError::External(Box::new(e))) }.boxed()
    }

    /// Adjacent or nearly adjacent ranges are fetched with one request.
    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            let (Some(start), Some(end)) = (ranges.iter().map(|r| r.start).min(), ranges.iter().map(|r| r.end).max())
            else {
                return Ok(Vec::new());
            };
            let covered: u64 = ranges.iter().map(|r| r.end - r.start).sum();
            if end - start > covered + 64 * 1024 {
                let mut out = Vec::with_capacity(ranges.len());
                for range in ranges {
                    out.push(self.get(range).await.map_err(|e| ParquetError::External(Box::new(e)))?);
                }
                return Ok(out);
            }
            let all = self.get(start..end).await.map_err(|e| ParquetError::External(Box::new(e)))?;
            Ok(ranges.iter().map(|r| all.slice((r.start - start) as usize..(r.end - start) as usize)).collect())
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            self.metadata.clone().ok_or_else(|| ParquetError::General("metadata is loaded before reading".into()))
        }
        .boxed()
    }
}

/// A shard's cached footer.
struct Footer {
    len: u64,
    metadata: Arc<ParquetMetaData>,
    /// Where the last redirect led.
    current: Arc<Mutex<String>>,
}

/// A row group: shard name and index.
type GroupKey = (String, usize);

/// Decoded row groups kept for later slices, oldest evicted first, within a byte bound: each
/// entry is the key, the texts, and their accounted size.
#[derive(Default)]
struct SliceCache {
    entries: VecDeque<(GroupKey, Arc<Vec<String>>, usize)>,
    bytes: usize,
}

impl SliceCache {
    fn get(&self, key: &GroupKey) -> Option<Arc<Vec<String>>> {
        self.entries.iter().find(|(k, _, _)| k == key).map(|(_, v, _)| v.clone())
    }

    fn put(&mut self, key: GroupKey, texts: Arc<Vec<String>>, limit: usize) {
        let size: usize = texts.iter().map(|t| t.len() + 24).sum();
        if size > limit {
            return;
        }
        while self.bytes + size > limit {
            match self.entries.pop_front() {
                Some((_, _, s)) => self.bytes -= s,
                None => break,
            }
        }
        self.bytes += size;
        self.entries.push_back((key, texts, size));
    }
}

/// A shard's footer, or the lock its first fetch holds (one lock per shard, so a slow or
/// hanging shard never holds up requests for the others).
type FooterSlot = Arc<tokio::sync::Mutex<Option<Arc<Footer>>>>;

/// The `/data` service.
pub struct DataService {
    config: DataConfig,
    client: reqwest::Client,
    footers: Mutex<HashMap<String, FooterSlot>>,
    cache: Mutex<SliceCache>,
    rng: Mutex<u64>,
    pub stats: Arc<FetchStats>,
}

impl DataService {
    pub fn new(config: DataConfig) -> Result<DataService, DataError> {
        if config.shards.is_empty() {
            return Err(DataError("no shards configured".into()));
        }
        // reqwest is built without a default TLS provider: install ring's once.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::limited(8))
            .connect_timeout(config.request_timeout.min(std::time::Duration::from_secs(10)))
            .timeout(config.request_timeout)
            .user_agent(concat!("lockstep/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| DataError(format!("HTTP client: {e}")))?;
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1;
        Ok(DataService {
            config,
            client,
            footers: Mutex::new(HashMap::new()),
            cache: Mutex::new(SliceCache::default()),
            rng: Mutex::new(seed),
            stats: Arc::new(FetchStats::default()),
        })
    }

    pub fn config(&self) -> &DataConfig {
        &self.config
    }

    fn random(&self, bound: usize) -> usize {
        let mut state = lock(&self.rng);
        // xorshift64*
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        (((*state).wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as usize) % bound.max(1)
    }

    fn url(&self, shard: &str) -> String {
        format!("{}/{shard}", self.config.base_url.trim_end_matches('/'))
    }

    /// The shard's footer, from the cache or fetched: one request for the last
    /// `footer_guess` bytes (whose `Content-Range` also gives the length), a second only if
    /// the metadata is longer than the guess.
    async fn footer(&self, shard: &str) -> Result<Arc<Footer>, DataError> {
        let slot = lock(&self.footers).entry(shard.to_string()).or_default().clone();
        let mut cached = slot.lock().await;
        if let Some(footer) = cached.as_ref() {
            return Ok(footer.clone());
        }
        let origin = self.url(shard);
        let current = Arc::new(Mutex::new(origin.clone()));
        // The length is unknown until a response says it: ask for the first byte. An
        // open-ended suffix range would save this, but some hosts refuse those.
        let (_, len) = fetch_range(&self.client, &origin, &current, &self.stats, 0, 0).await?;
        if len < 12 {
            return Err(DataError(format!("{origin}: {len} bytes is too short for parquet")));
        }
        let guess = self.config.footer_guess.min(len);
        let (tail, _) = fetch_range(&self.client, &origin, &current, &self.stats, len - guess, len - 1).await?;
        let footer_tail = FooterTail::try_from(&tail[tail.len() - 8..])?;
        let meta_len = footer_tail.metadata_length() as u64;
        if meta_len + 8 > len {
            return Err(DataError(format!("{origin}: footer says {meta_len} metadata bytes in a {len}-byte file")));
        }
        if meta_len > self.config.max_metadata_bytes {
            return Err(DataError(format!(
                "{origin}: footer claims {meta_len} metadata bytes, more than the {} this server accepts",
                self.config.max_metadata_bytes
            )));
        }
        let metadata_bytes = if meta_len + 8 <= guess {
            tail.slice((guess - 8 - meta_len) as usize..(guess - 8) as usize)
        } else {
            let start = len - 8 - meta_len;
            fetch_range(&self.client, &origin, &current, &self.stats, start, len - 9).await?.0
        };
        let metadata = Arc::new(ParquetMetaDataReader::decode_metadata(&metadata_bytes)?);
        let footer = Arc::new(Footer { len, metadata, current });
        *cached = Some(footer.clone());
        Ok(footer)
    }

    /// All `text` values of one row group.
    async fn row_group_texts(&self, shard: &str, footer: &Footer, row_group: usize) -> Result<Vec<String>, DataError> {
        let options = ArrowReaderOptions::new();
        let arrow_metadata = ArrowReaderMetadata::try_new(footer.metadata.clone(), options)?;
        let text_index =
            arrow_metadata.schema().index_of("text").map_err(|_| DataError(format!("{shard} has no `text` column")))?;
        let file = RemoteFile {
            client: self.client.clone(),
            origin: self.url(shard),
            current: footer.current.clone(),
            len: footer.len,
            stats: self.stats.clone(),
            metadata: Some(footer.metadata.clone()),
        };
        let group = footer.metadata.row_group(row_group);
        let chunk = group.columns().iter().find(|c| c.column_path().string() == "text");
        let (fetched, decoded) = chunk.map_or((0, 0), |c| (c.compressed_size(), c.uncompressed_size()));
        if fetched.max(0) as u64 > self.config.max_chunk_bytes
            || decoded.max(0) as u64 > self.config.max_decoded_bytes as u64
        {
            return Err(DataError(format!(
                "{shard} row group {row_group}: its `text` chunk is {fetched} bytes ({decoded} decoded), more than the \
                 {} ({} decoded) this server fetches for one slice",
                self.config.max_chunk_bytes, self.config.max_decoded_bytes
            )));
        }
        let mask = ProjectionMask::roots(footer.metadata.file_metadata().schema_descr(), [text_index]);
        let stream = ParquetRecordBatchStreamBuilder::new_with_metadata(file, arrow_metadata)
            .with_projection(mask)
            .with_row_groups(vec![row_group])
            .with_batch_size(8192)
            .build()?;
        // Decoded as it streams, counted against the bound (the footer's sizes may lie).
        let mut stream = std::pin::pin!(stream);
        let mut texts = Vec::new();
        let mut decoded_bytes = 0usize;
        while let Some(batch) = stream.try_next().await? {
            let before = texts.len();
            push_texts(batch.column(0).as_ref(), &mut texts).map_err(|why| DataError(format!("{shard}: {why}")))?;
            decoded_bytes += texts[before..].iter().map(String::len).sum::<usize>();
            if decoded_bytes > self.config.max_decoded_bytes {
                return Err(DataError(format!(
                    "{shard} row group {row_group}: more than {} bytes of text decoded; refused",
                    self.config.max_decoded_bytes
                )));
            }
        }
        Ok(texts)
    }

    /// Every `text` value of `shard`, row group by row group (each within the same bounds as
    /// a slice's): how the packaged corpus is read over HTTP (`corpus.rs`).
    pub async fn all_texts(&self, shard: &str) -> Result<Vec<String>, DataError> {
        let footer = self.footer(shard).await?;
        let mut texts = Vec::new();
        for row_group in 0..footer.metadata.num_row_groups() {
            texts.extend(self.row_group_texts(shard, &footer, row_group).await?);
        }
        Ok(texts)
    }

    /// A random slice.
    pub async fn slice(&self) -> Result<DataSlice, DataError> {
        let shard = self.config.shards[self.random(self.config.shards.len())].clone();
        let before = (self.stats.requests.load(Ordering::Relaxed), self.stats.bytes.load(Ordering::Relaxed));
        let footer = self.footer(&shard).await?;
        let groups = footer.metadata.num_row_groups();
        if groups == 0 {
            return Err(DataError(format!("{shard} has no row groups")));
        }
        let row_group = self.random(groups);
        let key = (shard.clone(), row_group);
        let cached = lock(&self.cache).get(&key);
        let texts = match cached.clone() {
            Some(texts) => texts,
            None => {
                let texts = Arc::new(self.row_group_texts(&shard, &footer, row_group).await?);
                lock(&self.cache).put(key, texts.clone(), self.config.cache_bytes);
                texts
            }
        };
        let rows = texts.len();
        let window = self.config.max_texts.min(rows).max(1);
        let first_row = if rows > window { self.random(rows - window + 1) } else { 0 };
        let mut out = Vec::new();
        let mut bytes = 0;
        for text in texts.iter().skip(first_row).take(window) {
            if !out.is_empty() && bytes + text.len() > self.config.max_bytes {
                break;
            }
            bytes += text.len();
            out.push(text.clone());
        }
        let after = (self.stats.requests.load(Ordering::Relaxed), self.stats.bytes.load(Ordering::Relaxed));
        Ok(DataSlice {
            v: 1,
            source: self.url(&shard),
            shard,
            row_group,
            rows_in_group: rows,
            first_row,
            texts: out,
            requests: after.0 - before.0,
            bytes: after.1 - before.1,
            cached: cached.is_some(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slice_cache_stays_within_its_bound() {
        let mut cache = SliceCache::default();
        let group = |n: usize| Arc::new(vec!["x".repeat(100); n]);
        cache.put(("a".into(), 0), group(4), 1000); // 4 · 124 = 496 bytes
        cache.put(("a".into(), 1), group(3), 1000); // 372: 868 in all
        assert!(cache.get(&("a".into(), 0)).is_some());
        cache.put(("b".into(), 0), group(2), 1000); // 248: the oldest goes
        assert!(cache.get(&("a".into(), 0)).is_none());
        assert!(cache.get(&("a".into(), 1)).is_some() && cache.get(&("b".into(), 0)).is_some());
        assert!(cache.bytes <= 1000);
        cache.put(("c".into(), 0), group(20), 1000); // larger than the bound: not kept
        assert!(cache.get(&("c".into(), 0)).is_none());
        let mut off = SliceCache::default();
        off.put(("a".into(), 0), group(1), 0);
        assert!(off.get(&("a".into(), 0)).is_none());
    }

    /// A source on 127.0.0.1 that answers range requests over `file`, or (`hang`) accepts
    /// connections and never answers. Serves until the test ends.
    fn source(file: Vec<u8>, hang: bool) -> String {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let address = listener.local_addr().expect("an address");
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                if hang {
                    held.push(stream);
                    continue;
                }
                let mut request = [0u8; 4096];
                let n = stream.read(&mut request).unwrap_or(0);
                let head = String::from_utf8_lossy(&request[..n]);
                let range =
                    head.lines().find_map(|l| l.strip_prefix("range: bytes=").or(l.strip_prefix("Range: bytes=")));
                let (start, end) = range
                    .and_then(|r| r.trim().split_once('-'))
                    .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
                    .unwrap_or((0, file.len() - 1));
                let body = &file[start..=end.min(file.len() - 1)];
                let head = format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{}/{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    start + body.len() - 1,
                    file.len(),
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(body);
            }
        });
        format!("http://{address}")
    }

    fn config(base_url: String, shards: &[&str]) -> DataConfig {
        DataConfig {
            base_url,
            shards: shards.iter().map(|s| s.to_string()).collect(),
            request_timeout: std::time::Duration::from_millis(800),
            ..DataConfig::default()
        }
    }

    #[tokio::test]
    async fn a_footer_claiming_more_metadata_than_the_bound_is_refused_before_it_is_fetched() {
        // 1 KiB of nothing, then a footer tail claiming 200 MB of metadata: `[u32 len]PAR1`.
        let mut file = vec![0u8; 1024];
        file.extend_from_slice(&200_000_000u32.to_le_bytes());
        file.extend_from_slice(b"PAR1");
        let service = DataService::new(DataConfig {
            max_metadata_bytes: 512,
            ..config(source(file.clone(), false), &["a.parquet"])
        })
        .expect("a service");
        let error = service.footer("a.parquet").await.err().expect("refused");
        assert!(error.0.contains("metadata bytes in a 1032-byte file"), "{error}");
        // A claim within the file but past the bound names the bound.
        file.truncate(1024);
        file.extend_from_slice(&1000u32.to_le_bytes());
        file.extend_from_slice(b"PAR1");
        let service =
            DataService::new(DataConfig { max_metadata_bytes: 512, ..config(source(file, false), &["b.parquet"]) })
                .expect("a service");
        let error = service.footer("b.parquet").await.err().expect("refused");
        assert!(
            error.0.contains("footer claims 1000 metadata bytes, more than the 512 this server accepts"),
            "{error}"
        );
        assert_eq!(service.stats.requests.load(Ordering::Relaxed), 2, "the claimed metadata was never fetched");
    }

    #[tokio::test]
    async fn a_hanging_shard_times_out_and_holds_up_no_other_shard() {
        let base = source(Vec::new(), true);
        let service = Arc::new(DataService::new(config(base, &["a.parquet", "b.parquet"])).expect("a service"));
        let began = std::time::Instant::now();
        let (a, b) = tokio::join!(service.footer("a.parquet"), service.footer("b.parquet"));
        let took = began.elapsed();
        for error in [a.err().expect("a times out"), b.err().expect("b times out")] {
            assert!(error.0.contains("GET"), "{error}");
        }
        // Both ran at once: one timeout (0.8 s), not two in a row.
        assert!(took < std::time::Duration::from_millis(1500), "{took:?}");
    }

    #[test]
    fn shard_names_are_fineweb_s() {
        let shards = fineweb_shards();
        assert_eq!(shards.len(), 14);
        assert_eq!(shards[0], "000_00000.parquet");
        assert_eq!(shards[13], "013_00000.parquet");
    }
}
