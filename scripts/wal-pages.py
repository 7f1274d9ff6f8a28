#!/usr/bin/env python3
"""Which B-trees a SQLite write-ahead log's frames belong to: frames, distinct pages and
frames per page, by table or index, and per commit.

Take the copy while Herald runs under load with checkpoints held off, so the log keeps
every frame of the run:

    HERALD_STORE__CHECKPOINT_INTERVAL_MS=600000 scripts/harness.py --duration 15 &
    sleep 11; cp <its data dir>/herald.db <its data dir>/herald.db-wal COPY_DIR/
    scripts/wal-pages.py COPY_DIR

The copy is opened (through its log) from a scratch copy of its own to name each page's
B-tree (SQLite's `dbstat` table)."""

import argparse
import collections
import os
import shutil
import sqlite3
import struct
import tempfile


def frames(wal_path):
    """(page number, is a commit) for every frame of the log's current generation."""
    data = open(wal_path, "rb").read()
    _, _, page_size, _, salt1, salt2, _, _ = struct.unpack(">IIIIIIII", data[:32])
    offset = 32
    while offset + 24 + page_size <= len(data):
        page, commit, s1, s2, _, _ = struct.unpack(">IIIIII", data[offset:offset + 24])
        if (s1, s2) != (salt1, salt2):
            break
        yield page, commit != 0
        offset += 24 + page_size


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("copy_dir", help="a directory holding herald.db and herald.db-wal")
    args = parser.parse_args()
    written = collections.Counter()
    commits = 0
    for page, commit in frames(os.path.join(args.copy_dir, "herald.db-wal")):
        written[page] += 1
        commits += commit
    scratch = tempfile.mkdtemp()
    try:
        for name in ("herald.db", "herald.db-wal"):
            shutil.copy(os.path.join(args.copy_dir, name), scratch)
        db = sqlite3.connect(os.path.join(scratch, "herald.db"))
        owner = dict((page, name) for name, page in db.execute("SELECT name, pageno FROM dbstat"))
        messages = db.execute("SELECT count(*) FROM message").fetchone()[0]
    finally:
        shutil.rmtree(scratch)
    by_tree, pages = collections.Counter(), collections.Counter()
    for page, count in written.items():
        tree = owner.get(page, "(free or header)")
        by_tree[tree] += count
        pages[tree] += 1
    total = sum(written.values())
    print(f"{total} frames in {commits} commits ({total / max(commits, 1):.1f} per commit), "
          f"{messages} messages ({total / max(messages, 1):.2f} frames per message)")
    print(f"{'B-tree':28} {'frames':>8} {'pages':>8} {'per page':>9} {'per commit':>11}")
    for tree, count in by_tree.most_common():
        print(f"{tree:28} {count:8} {pages[tree]:8} {count / pages[tree]:9.2f} {count / max(commits, 1):11.2f}")


if __name__ == "__main__":
    main()
