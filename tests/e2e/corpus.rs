//! The packaged corpus end to end: `scripts/corpus.py` (pyarrow, a third-party writer) builds a
//! corpus from a small package tree written here, with the markup, code, a translation and a
//! duplicate document the real packages have; the reader must find the prose and only the
//! prose, the same bits from the directory, from Debian's nginx and from `lockstep signal
//! --corpus` (ranges only), refuse a damaged corpus with a reason, and train bit-identically
//! whichever way the text came.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use lockstep_mesh::corpus::{load, CorpusChoice, CorpusError, CorpusLocation};
use lockstep_signaling::{serve, ServerConfig};
use serde_json::Value;

use crate::common::BIN;
use crate::data_nginx::{access_log, start_nginx};

/// A sentence of plain prose, different for each `i`.
fn prose(i: usize) -> String {
    let subjects = ["The kernel", "A careful reader", "Every package", "The handbook", "This interpreter"];
    let verbs = ["explains", "describes", "keeps", "documents", "compares"];
    let objects =
        ["how memory is shared between tasks", "why the order of operations matters", "what a user should expect"];
    format!(
        "{} {} {} in section number {i}, and the text goes on for a while so that it reads like a paragraph.",
        subjects[i % 5],
        verbs[(i / 5) % 5],
        objects[(i / 25) % 3]
    )
}

/// A paragraph: three sentences (documents shorter than 400 bytes are left out).
fn para(i: usize) -> String {
    format!("{} {} {}", prose(i), prose(i + 1000), prose(i + 2000))
}

/// Writes `relative` under `root` (gzipped when it ends in `.gz`).
fn put(root: &Path, relative: &str, text: &str) {
    let path = root.join(relative);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    if relative.ends_with(".gz") {
        let out = Command::new("gzip")
            .arg("-c")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn();
        let mut child = out.expect("gzip runs");
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let zipped = child.wait_with_output().unwrap();
        std::fs::write(path, zipped.stdout).unwrap();
    } else {
        std::fs::write(path, text).unwrap();
    }
}

/// The package tree: 40 prose documents across the four packages' layouts, and the things the
/// builder must leave out.
fn package_tree(root: &Path) {
    for i in 0..10 {
        let html = format!(
            "<html><head><title>t</title><script>var SCRIPT_MARKER = 1;</script></head><body><nav>NAV MARKER nav</nav>\
             <p>{}</p><pre>for x in range(10): PRE_MARKER(x) {{ }}</pre><p>{} It has <code>inline_code</code> in it.</p></body></html>",
            para(i),
            para(i + 100)
        );
        put(root, &format!("usr/share/doc/python3.11/html/library/page{i}.html"), &html);
        put(
            root,
            &format!("usr/share/doc/debian-handbook/html/en-US/sect{i}.html"),
            &format!("<p>{}</p><p>{}</p>", para(i + 200), para(i + 300)),
        );
        let rst = format!(
            "Title {i}\n========\n\n{}\n\nAn example follows::\n\n    LITERAL_MARKER = 1;\n    more();\n\n.. note::\n\n   DIRECTIVE_MARKER inside a directive.\n\n{}\n",
            para(i + 400),
            para(i + 500)
        );
        put(root, &format!("usr/share/doc/linux-doc-6.1/Documentation/area/doc{i}.rst.gz"), &rst);
        let pod = format!("=head1 NAME\n\nHEAD_MARKER\n\n{} With C<code> and L<perlfunc/open> in it.\n\n    VERBATIM_MARKER();\n\n{}\n", para(i + 600), para(i + 700));
        put(root, &format!("usr/share/perl/5.36.0/pod/perl{i}.pod"), &pod);
    }
    // A translation (skipped by its directory), an index page (by its name), a duplicate of a
    // document (by its text) and a page of code alone (nothing reads like prose).
    put(
        root,
        "usr/share/doc/linux-doc-6.1/Documentation/translations/zh_CN/doc.rst",
        &format!("TRANSLATION_MARKER {}\n", para(900)),
    );
    put(root, "usr/share/doc/python3.11/html/genindex.html", &format!("<p>GENINDEX_MARKER {}</p>", para(901)));
    put(
        root,
        "usr/share/doc/debian-handbook/html/en-US/zz-copy.html",
        &format!("<p>{}</p><p>{}</p>", para(200), para(300)),
    );
    put(root, "usr/share/doc/python3.11/html/code.html", "<p>x = {a: b}; y(); z -> w == 1; $v # c</p>");
}

fn build(src: &Path, out: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/corpus.py");
    let built = Command::new("python3")
        .arg(script)
        .args([src.to_str().unwrap(), out.to_str().unwrap(), "--heldout-min-bytes", "1500"])
        .output()
        .expect("python3 runs");
    assert!(built.status.success(), "corpus.py failed: {}", String::from_utf8_lossy(&built.stderr));
    serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// The status line and headers of a GET with a `Range` header.
fn get_range(addr: std::net::SocketAddr, path: &str, range: &str) -> (u16, String, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\nRange: {range}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    (head[9..12].parse().unwrap(), head, response[split + 4..].to_vec())
}

#[test]
fn the_packaged_corpus_is_prose_and_reads_the_same_from_a_directory_nginx_and_the_signaling_server() {
    let _phase = crate::common::phase(module_path!());
    let dir = std::env::temp_dir().join(format!("lockstep-corpus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = dir.join("src");
    let out = dir.join("www/corpus");
    package_tree(&src);
    let manifest = build(&src, &out);

    // 40 documents of prose; the copy, the translation, the index and the code page are gone.
    assert_eq!(manifest["documents"], 40, "{manifest}");
    assert_eq!(
        manifest["packages"],
        serde_json::json!(["debian-handbook", "linux-doc-6.1", "perl-doc", "python3.11-doc"])
    );
    let held = manifest["heldout_documents"].as_u64().unwrap();
    assert!((1..40).contains(&held) && manifest["heldout_bytes"].as_u64().unwrap() >= 1500, "{manifest}");
    // FineWeb-Edu's columns, zstd, as pyarrow reads them back.
    let schema = Command::new("python3")
        .args(["-c", "import sys, pyarrow.parquet as pq; f = pq.ParquetFile(sys.argv[1]); print(','.join(f.schema_arrow.names), f.metadata.row_group(0).column(0).compression)"])
        .arg(out.join("train_00000.parquet"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&schema.stdout).trim(),
        "text,id,dump,url,file_path,language,language_score,token_count,score,int_score ZSTD"
    );

    let local = load(&CorpusLocation::Dir(out.clone())).expect("the corpus reads from its directory");
    let train = String::from_utf8(local.train().to_vec()).unwrap();
    let heldout = String::from_utf8(local.heldout().to_vec()).unwrap();
    for marker in [
        "SCRIPT_MARKER",
        "NAV MARKER",
        "PRE_MARKER",
        "LITERAL_MARKER",
        "DIRECTIVE_MARKER",
        "HEAD_MARKER",
        "VERBATIM_MARKER",
        "TRANSLATION_MARKER",
        "GENINDEX_MARKER",
        "y();",
    ] {
        assert!(!train.contains(marker) && !heldout.contains(marker), "{marker} is not prose");
    }
    // Every paragraph of prose is in exactly one side, whole (held out by document).
    for i in (0..10).flat_map(|i| [i, i + 100, i + 200, i + 300, i + 400, i + 500, i + 600, i + 700]) {
        let sentence = prose(i);
        assert!(train.contains(&sentence) != heldout.contains(&sentence), "sentence {i}: {sentence}");
    }
    assert!(train.contains("It has inline_code in it.") || heldout.contains("It has inline_code in it."));
    assert!(
        train.contains("With code and open in perlfunc in it.")
            || heldout.contains("With code and open in perlfunc in it.")
    );
    assert_eq!(train.matches(&prose(200)).count() + heldout.matches(&prose(200)).count(), 1, "the copy was dropped");

    // Debian's nginx serves the same files: the same corpus, read by ranges only.
    let nginx = start_nginx(&dir);
    let over_nginx = load(&CorpusLocation::Url(format!("http://127.0.0.1:{}/corpus", nginx.port))).expect("over nginx");
    assert_eq!(over_nginx, local, "the corpus over nginx is the directory's");
    let parquet_requests: Vec<_> = access_log(&dir).into_iter().filter(|(uri, ..)| uri.ends_with(".parquet")).collect();
    assert!(!parquet_requests.is_empty());
    for (uri, status, _, range) in &parquet_requests {
        assert!(*status == 206 && range.starts_with("bytes="), "{uri}: {status} {range}");
    }

    // So does the signaling server, under /corpus/ with byte ranges.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let config = ServerConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        corpus_dir: Some(out.clone()),
        data: None,
        ..ServerConfig::default()
    };
    let server = runtime.block_on(serve(config)).unwrap();
    let addr = server.local_addr;
    let url = format!("http://{addr}/corpus");
    let over_signal = load(&CorpusLocation::Url(url.clone())).expect("over the signaling server");
    assert_eq!(over_signal, local, "the corpus over the signaling server is the directory's");
    let file = std::fs::read(out.join("heldout.parquet")).unwrap();
    let (status, head, body) = get_range(addr, "/corpus/heldout.parquet", "bytes=4-11");
    assert_eq!(status, 206, "{head}");
    assert!(head.contains(&format!("Content-Range: bytes 4-11/{}", file.len())), "{head}");
    assert_eq!(body, &file[4..12]);
    let (status, head, _) = get_range(addr, "/corpus/heldout.parquet", &format!("bytes={}-", file.len()));
    assert_eq!(status, 416, "{head}");
    let (status, ..) = get_range(addr, "/corpus/../corpus/manifest.json", "bytes=0-1");
    assert_eq!(status, 404, "a path out of the corpus is not served");

    // A member's batches are the same whichever way its corpus came: two trainers, one from
    // the directory and one over HTTP, end every step with the same weight hash.
    let hashes = |corpus: &str| -> Vec<String> {
        let run = ["--width", "32", "--context", "32", "--layers", "1", "--heads", "2", "--batch", "4", "--steps", "3"];
        let output = Command::new(BIN)
            .args(["train", "--backend", "cpu", "--threads", "1", "--json", "--eval-batches", "1", "--corpus", corpus])
            .args(run)
            .output()
            .unwrap();
        assert!(output.status.success(), "train --corpus {corpus}: {}", String::from_utf8_lossy(&output.stderr));
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v.get("whash").or_else(|| v.get("heldout_loss_bits")).map(|h| h.to_string()))
            .collect()
    };
    let from_dir = hashes(out.to_str().unwrap());
    assert_eq!(from_dir.len(), 4, "{from_dir:?}");
    assert_eq!(hashes(&url), from_dir);
    assert_ne!(hashes("builtin"), from_dir, "the built-in text draws other batches");
    runtime.block_on(server.stop());

    // A damaged corpus is refused with the reason, never read as something else.
    let damaged = |name: &str, damage: &dyn Fn(&Path)| -> CorpusError {
        let copy: PathBuf = dir.join(name);
        copy_dir(&out, &copy);
        damage(&copy);
        load(&CorpusLocation::Dir(copy)).expect_err(name)
    };
    let error = damaged("truncated", &|d| {
        let bytes = std::fs::read(d.join("train_00000.parquet")).unwrap();
        std::fs::write(d.join("train_00000.parquet"), &bytes[..bytes.len() / 2]).unwrap();
    });
    assert!(matches!(error, CorpusError::Mismatch { .. }), "{error}");
    let error = damaged("garbled", &|d| {
        let len = std::fs::metadata(d.join("train_00000.parquet")).unwrap().len() as usize;
        std::fs::write(d.join("train_00000.parquet"), vec![7u8; len]).unwrap();
    });
    assert!(matches!(error, CorpusError::Parquet { .. }), "{error}");
    let error = damaged("bad-manifest", &|d| std::fs::write(d.join("manifest.json"), b"{\"files\": 3}").unwrap());
    assert!(matches!(error, CorpusError::Manifest { .. }), "{error}");
    let error = damaged("escaping-manifest", &|d| {
        let text = std::fs::read_to_string(d.join("manifest.json")).unwrap();
        std::fs::write(d.join("manifest.json"), text.replace("\"train_00000.parquet\"", "\"../train_00000.parquet\""))
            .unwrap();
    });
    assert!(matches!(error, CorpusError::Manifest { .. }), "{error}");
    let error = damaged("not-built", &|d| std::fs::remove_file(d.join("manifest.json")).unwrap());
    assert!(
        matches!(&error, CorpusError::NotBuilt { .. }) && error.to_string().contains("scripts/corpus.sh"),
        "{error}"
    );
    // Named outright, a corpus that is not there is an error; `builtin` and URLs parse.
    assert!(matches!("ftp://x/corpus".parse::<CorpusChoice>(), Err(CorpusError::Location(_))));
    let missing = dir.join("nowhere").to_str().unwrap().to_string();
    assert!(missing.parse::<CorpusChoice>().unwrap().load().is_err());
    let output = Command::new(BIN).args(["train", "--steps", "1", "--corpus", &missing]).output().unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("scripts/corpus.sh"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    drop(nginx);
    let _ = std::fs::remove_dir_all(&dir);
}
