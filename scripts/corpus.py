#!/usr/bin/env python3
"""Builds Lockstep's packaged training corpus from Debian documentation packages.

Reads the packages unpacked under SRC (`dpkg -x` of each .deb), keeps the running English
prose of every document (HTML pages, reStructuredText, POD), drops what can be told apart as
code (HTML `<pre>`, rST literal blocks and directives, POD verbatim paragraphs, and any
paragraph that does not read like sentences), de-duplicates by document, and writes
FineWeb-Edu-shaped parquet (the `text` column and FineWeb-Edu's metadata columns, zstd, row
groups of about 4 MB) to OUT: `train_00000.parquet`, ... and `heldout.parquet`, split by
document (a document's SHA-256 decides), plus `manifest.json`. `docs/DATA.md` says why these
packages and how the split is made.

Usage: corpus.py SRC OUT [--heldout-min-bytes N] (the tests build small corpora with a small N)
"""

import gzip
import hashlib
import html.parser
import json
import os
import re
import sys

import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP_BYTES = 4 << 20
SHARD_BYTES = 12 << 20
# About one document in sixteen is held out, and never less than this.
HELDOUT_MIN_BYTES = 1 << 20
MIN_DOCUMENT_BYTES = 400


def reads_like_prose(paragraph):
    """A paragraph of sentences: mostly letters and spaces, several words, few code marks."""
    words = paragraph.split()
    if len(words) < 6:
        return False
    letters = sum(c.isalpha() or c == " " for c in paragraph)
    if letters < 0.82 * len(paragraph):
        return False
    code_marks = sum(paragraph.count(m) for m in ("{", "}", ";", "()", "->", "==", "$", "::", "_", "/*", "#", "<", ">"))
    if code_marks > max(2, len(words) // 12):
        return False
    lowercase_words = sum(w[:1].islower() for w in words)
    return lowercase_words >= 0.5 * len(words)


def normalise(paragraphs):
    kept = []
    for p in paragraphs:
        p = re.sub(r"\s+", " ", p).strip()
        if reads_like_prose(p):
            kept.append(p)
    return "\n\n".join(kept)


class HtmlProse(html.parser.HTMLParser):
    """Paragraphs of an HTML page's text, outside <pre>, <script>, <style>, <code> blocks and
    navigation."""

    SKIP = {"pre", "script", "style", "head", "nav", "table", "code", "kbd", "samp"}
    BREAK = {"p", "div", "li", "dd", "dt", "h1", "h2", "h3", "h4", "h5", "h6", "br", "section", "blockquote", "tr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth = 0
        self.paragraphs = []
        self.current = []

    def flush(self):
        if self.current:
            self.paragraphs.append("".join(self.current))
            self.current = []

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            # Inline code inside a sentence stays part of it; only whole blocks are dropped.
            if tag in ("code", "kbd", "samp"):
                return
            self.depth += 1
        elif tag in self.BREAK:
            self.flush()

    def handle_endtag(self, tag):
        if tag in self.SKIP and tag not in ("code", "kbd", "samp"):
            self.depth = max(0, self.depth - 1)
        elif tag in self.BREAK:
            self.flush()

    def handle_data(self, data):
        if self.depth == 0:
            self.current.append(data)


def html_text(raw):
    parser = HtmlProse()
    parser.feed(raw)
    parser.flush()
    return normalise(parser.paragraphs)


RST_MARKUP = re.compile(r":[a-z:]+:`([^`<]*)(<[^>]*>)?`|``([^`]*)``|`([^`<]*)(<[^>]*>)?`_*|\*\*([^*]*)\*\*|\*([^*]*)\*")


def rst_text(raw):
    """rST: paragraphs outside literal blocks (after `::`), directives and tables."""
    paragraphs, current = [], []
    skipping_indent = None
    for line in raw.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if skipping_indent is not None:
            if stripped and indent <= skipping_indent:
                skipping_indent = None
            else:
                continue
        if not stripped:
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        if stripped.startswith(".. ") or stripped.endswith("::"):
            # A directive's body or a literal block follows, indented deeper.
            if current and stripped.endswith("::") and not stripped.startswith(".."):
                current.append(stripped[:-1])
            if current:
                paragraphs.append(" ".join(current))
                current = []
            skipping_indent = indent
            continue
        if re.fullmatch(r"[=\-~^*+#`'\"_.:]{3,}", stripped) or stripped.startswith(("|", "+-", "+=")):
            current = []
            continue
        current.append(stripped)
    if current:
        paragraphs.append(" ".join(current))
    return normalise(RST_MARKUP.sub(lambda m: next(g for g in m.groups() if g is not None) if any(m.groups()) else "", p) for p in paragraphs)


POD_CODE = re.compile(r"([A-Z])<<+\s(.*?)\s>+>|([A-Z])<([^<>]*)>")


def pod_code(match):
    """A POD formatting code's text: `L<text|link>` its text, `L<name/section>` "section in
    name", `X<>` and `Z<>` nothing, any other code its content."""
    letter = match.group(1) or match.group(3)
    content = match.group(2) if match.group(1) else match.group(4)
    if letter in "XZ":
        return ""
    if letter == "L":
        if "|" in content:
            return content.split("|")[0]
        if "/" in content:
            name, section = content.split("/", 1)
            section = section.strip('"')
            return f"{section} in {name}" if name else section
    return content


def pod_text(raw):
    """POD: ordinary paragraphs; commands and verbatim (indented) paragraphs are dropped."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", raw):
        if not block.strip() or block.startswith((" ", "\t", "=")):
            continue
        text = block
        for _ in range(3):
            text = POD_CODE.sub(pod_code, text)
        paragraphs.append(text)
    return normalise(paragraphs)


def documents(src):
    """(package, path, text) of every document, in a fixed order."""
    sources = [
        ("python3.11-doc", "usr/share/doc/python3.11/html", (".html",), html_text),
        ("debian-handbook", "usr/share/doc/debian-handbook/html/en-US", (".html",), html_text),
        ("linux-doc-6.1", "usr/share/doc/linux-doc-6.1/Documentation", (".rst", ".rst.gz", ".txt", ".txt.gz"), rst_text),
        ("perl-doc", "usr/share/perl", (".pod",), pod_text),
    ]
    for package, root, suffixes, extract in sources:
        top = os.path.join(src, root)
        for directory, dirs, files in os.walk(top):
            dirs.sort()
            # Translations are not English; the Python docs' generated index pages are lists.
            dirs[:] = [d for d in dirs if d not in ("translations", "_sources", "_static", "genindex")]
            for name in sorted(files):
                if not name.endswith(suffixes) or name.startswith(("genindex", "py-modindex", "search")):
                    continue
                path = os.path.join(directory, name)
                data = gzip.open(path).read() if name.endswith(".gz") else open(path, "rb").read()
                yield package, os.path.relpath(path, src), extract(data.decode("utf-8", "replace"))


def main():
    args = sys.argv[1:]
    heldout_min = HELDOUT_MIN_BYTES
    if "--heldout-min-bytes" in args:
        at = args.index("--heldout-min-bytes")
        heldout_min = int(args[at + 1])
        del args[at : at + 2]
    if len(args) != 2:
        sys.exit("usage: corpus.py SRC OUT [--heldout-min-bytes N]")
    src, out = args
    seen = set()
    rows = []
    for package, path, text in documents(src):
        if len(text.encode()) < MIN_DOCUMENT_BYTES:
            continue
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        rows.append({"package": package, "path": path, "text": text, "digest": digest})

    if len(rows) < 2:
        sys.exit(f"corpus.py: {len(rows)} documents of prose under {src}: are the packages unpacked there?")
    # Held out by document: the documents whose digest falls in the lowest sixteenth, then more
    # in digest order until at least heldout_min bytes are held out (a training document is
    # never also held out: de-duplication came first).
    order = sorted(range(len(rows)), key=lambda i: rows[i]["digest"])
    heldout, held_bytes = set(), 0
    for rank, i in enumerate(order):
        if rank >= len(order) // 16 and held_bytes >= heldout_min:
            break
        heldout.add(i)
        held_bytes += len(rows[i]["text"].encode())

    os.makedirs(out, exist_ok=True)
    for stale in os.listdir(out):
        if stale.endswith(".parquet"):
            os.remove(os.path.join(out, stale))
    train = [r for i, r in enumerate(rows) if i not in heldout]
    held = [r for i, r in enumerate(rows) if i in heldout]
    shards = []
    shard, shard_bytes = [], 0
    for r in train:
        shard.append(r)
        shard_bytes += len(r["text"].encode())
        if shard_bytes >= SHARD_BYTES:
            shards.append(shard)
            shard, shard_bytes = [], 0
    if shard:
        shards.append(shard)
    files = []
    for n, part in enumerate(shards):
        files.append(write(os.path.join(out, f"train_{n:05}.parquet"), part))
    files.append(write(os.path.join(out, "heldout.parquet"), held))
    manifest = {
        "packages": sorted({r["package"] for r in rows}),
        "documents": len(rows),
        "train_documents": len(train),
        "heldout_documents": len(held),
        "train_bytes": sum(len(r["text"].encode()) for r in train),
        "heldout_bytes": sum(len(r["text"].encode()) for r in held),
        "files": files,
    }
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(json.dumps({k: v for k, v in manifest.items() if k != "files"}))


def write(path, part):
    """One FineWeb-Edu-shaped parquet file: text, id, dump, url, file_path, language,
    language_score, token_count, score, int_score."""
    texts = [r["text"] for r in part]
    table = pa.table(
        {
            "text": pa.array(texts, pa.string()),
            "id": pa.array([f"<urn:lockstep:{r['digest'][:32]}>" for r in part], pa.string()),
            "dump": pa.array(["debian-bookworm-docs"] * len(part), pa.string()),
            "url": pa.array([f"file:///{r['path']}" for r in part], pa.string()),
            "file_path": pa.array([r["package"] for r in part], pa.string()),
            "language": pa.array(["en"] * len(part), pa.string()),
            "language_score": pa.array([1.0] * len(part), pa.float64()),
            # Tokens are bytes in Lockstep's model.
            "token_count": pa.array([len(t.encode()) for t in texts], pa.int64()),
            "score": pa.array([3.0] * len(part), pa.float64()),
            "int_score": pa.array([3] * len(part), pa.int64()),
        }
    )
    average = max(1, sum(len(t.encode()) for t in texts) // max(1, len(texts)))
    pq.write_table(table, path, compression="zstd", row_group_size=max(1, ROW_GROUP_BYTES // average))
    return {"name": os.path.basename(path), "rows": len(part), "bytes": os.path.getsize(path)}


if __name__ == "__main__":
    main()
