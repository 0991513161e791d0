#!/usr/bin/env python3
"""Writes small parquet files with FineWeb-Edu's schema (10 columns, `text` first) using
pyarrow, SNAPPY-compressed, several row groups each, and a JSON manifest of what it wrote.

usage: make_fineweb.py OUT_DIR FILES ROWS ROWS_PER_GROUP
"""
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

WORDS = ("the quick brown fox jumps over lazy dogs while students learn physics chemistry history "
         "and mathematics in a library full of books about rivers mountains and distant stars").split()


def text_for(file_index, row):
    # Deterministic, distinct, varied lengths (roughly 200 B to 3 KB).
    n = 40 + (file_index * 7919 + row * 104729) % 500
    words = [WORDS[(file_index * 31 + row * 17 + i * 13) % len(WORDS)] for i in range(n)]
    return f"Document {file_index}-{row}. " + " ".join(words) + "."


def main():
    out, files, rows, per_group = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    os.makedirs(out, exist_ok=True)
    manifest = {}
    for f in range(files):
        texts = [text_for(f, r) for r in range(rows)]
        table = pa.table({
            "text": pa.array(texts, pa.string()),
            "id": pa.array([f"<urn:uuid:{f:04d}-{r:08d}>" for r in range(rows)], pa.string()),
            "dump": pa.array(["CC-MAIN-2024-10"] * rows, pa.string()),
            "url": pa.array([f"https://example.org/{f}/{r}/" + "p" * (r % 200) for r in range(rows)], pa.string()),
            "file_path": pa.array([f"s3://commoncrawl/crawl-data/segment-{f}/warc/{r:06d}.warc.gz" for r in range(rows)], pa.string()),
            "language": pa.array(["en"] * rows, pa.string()),
            "language_score": pa.array([0.9 + (r % 10) / 100 for r in range(rows)], pa.float64()),
            "token_count": pa.array([len(t) // 4 for t in texts], pa.int64()),
            "score": pa.array([2.5 + (r % 7) / 3 for r in range(rows)], pa.float64()),
            "int_score": pa.array([2 + r % 4 for r in range(rows)], pa.int64()),
        })
        name = f"{f:03d}_00000.parquet"
        path = os.path.join(out, name)
        pq.write_table(table, path, row_group_size=per_group, compression="snappy")
        meta = pq.ParquetFile(path).metadata
        groups = []
        start = 0
        for g in range(meta.num_row_groups):
            count = meta.row_group(g).num_rows
            groups.append(texts[start:start + count])
            start += count
        manifest[name] = {"size": os.path.getsize(path), "row_groups": groups,
                          "columns": meta.num_columns, "codec": meta.row_group(0).column(0).compression}
    json.dump(manifest, sys.stdout)


if __name__ == "__main__":
    main()
