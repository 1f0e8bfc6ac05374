"""The training corpus: permissively licensed Python source found on the machine.

Sources are the standard library (PSF-2.0) and installed distributions whose
metadata declares a permissive licence. Files are attributed to distributions
through their RECORD files, so every file used has a known licence; files no
RECORD claims are skipped. Whole distributions are held out for evaluation.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
import sysconfig
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

PERMISSIVE = re.compile(
    r"\b(MIT|BSD|Apache|PSF|Python Software Foundation|ISC|Unlicense|Zlib|HPND|0BSD|CC0|Public Domain|Historical Permission)\b",
    re.IGNORECASE,
)
COPYLEFT = re.compile(r"\b(GPL|AGPL|LGPL|MPL|Mozilla|EPL|Eclipse|CDDL|Proprietary|Commercial|SSPL|BUSL)\b", re.IGNORECASE)

# Held out from training by name: also installed beside vLLM's CPU build, so
# benchmarks on the CPU machine can cut tasks from code the model never saw.
HELD_OUT = ("httpx", "httpcore", "anyio", "click", "jinja2", "rich", "attrs", "yarl", "starlette", "idna")

MAX_FILE_BYTES = 200_000
MIN_FILE_BYTES = 200


@dataclass
class Distribution:
    name: str
    license: str
    files: list[Path] = field(default_factory=list)

    @property
    def permissive(self) -> bool:
        return bool(PERMISSIVE.search(self.license)) and not COPYLEFT.search(self.license)


def _license_of(metadata: Path) -> str:
    headers = HeaderParser().parsestr(metadata.read_text(errors="replace"))
    expr = headers.get("License-Expression")
    if expr:
        return expr.strip()
    classifiers = [c.split("::")[-1].strip() for c in headers.get_all("Classifier") or [] if c.startswith("License ::")]
    if classifiers:
        return "; ".join(classifiers)
    lic = (headers.get("License") or "").strip().splitlines()
    return lic[0][:80] if lic else "UNKNOWN"


def find_distributions(site_packages: Path) -> list[Distribution]:
    dists = []
    for info in sorted(site_packages.glob("*.dist-info")):
        meta = info / "METADATA"
        record = info / "RECORD"
        if not meta.exists() or not record.exists():
            continue
        name = info.name.split("-")[0].lower().replace("_", "-")
        dist = Distribution(name=name, license=_license_of(meta))
        with open(record, newline="", errors="replace") as f:
            for row in csv.reader(f):
                if row and row[0].endswith(".py") and not row[0].startswith(".."):
                    dist.files.append(site_packages / row[0])
        dists.append(dist)
    return dists


def stdlib_distribution() -> Distribution:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        p
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts and "test" not in p.parts and "tests" not in p.parts and "idlelib" not in p.parts
    ]
    return Distribution(name="python-stdlib", license="PSF-2.0", files=sorted(files))


@dataclass
class Corpus:
    train: dict[str, list[tuple[str, str]]]  # distribution -> [(relative path, text)]
    held_out: dict[str, list[tuple[str, str]]]
    licenses: dict[str, str]
    skipped: dict[str, str]  # distribution -> why

    def stats(self) -> dict:
        def size(d):
            return sum(len(t) for files in d.values() for _, t in files)

        return {
            "train_distributions": len(self.train),
            "train_files": sum(len(v) for v in self.train.values()),
            "train_chars": size(self.train),
            "held_out_distributions": sorted(self.held_out),
            "held_out_files": sum(len(v) for v in self.held_out.values()),
            "held_out_chars": size(self.held_out),
        }


def _read(path: Path) -> str | None:
    try:
        size = path.stat().st_size
        if not MIN_FILE_BYTES <= size <= MAX_FILE_BYTES:
            return None
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    # Generated tables and minified blobs teach nothing about code.
    lines = text.count("\n") + 1
    if len(text) / lines > 120:
        return None
    return text


def collect(site_packages: list[Path] | None = None, include_stdlib: bool = True) -> Corpus:
    site_packages = site_packages or [Path(sysconfig.get_paths()["purelib"])]
    dists = [d for sp in site_packages for d in find_distributions(sp)]
    if include_stdlib:
        dists.append(stdlib_distribution())
    train: dict[str, list[tuple[str, str]]] = {}
    held: dict[str, list[tuple[str, str]]] = {}
    licenses: dict[str, str] = {}
    skipped: dict[str, str] = {}
    seen: set[str] = set()
    for dist in dists:
        if not dist.permissive:
            skipped[dist.name] = f"licence not permissive or unknown: {dist.license}"
            continue
        files = []
        for path in dist.files:
            text = _read(path)
            if text is None:
                continue
            digest = hashlib.sha1(text.encode()).hexdigest()
            if digest in seen:  # vendored copies
                continue
            seen.add(digest)
            root = next((p for p in path.parents if p.name in ("site-packages", "dist-packages") or p.name.startswith("python3")), None)
            rel = str(path.relative_to(root)) if root else path.name
            files.append((rel, text))
        if not files:
            continue
        licenses[dist.name] = dist.license
        (held if dist.name in HELD_OUT else train)[dist.name] = files
    return Corpus(train=train, held_out=held, licenses=licenses, skipped=skipped)


def cap(dist_files: dict[str, list[tuple[str, str]]], max_chars: int, seed: int) -> dict[str, list[tuple[str, str]]]:
    """A random subset of files of at most max_chars characters, kept by distribution."""
    import random

    items = [(d, i) for d, files in dist_files.items() for i in range(len(files))]
    random.Random(seed).shuffle(items)
    kept: dict[str, list[tuple[str, str]]] = {}
    total = 0
    for d, i in items:
        text = dist_files[d][i]
        if total + len(text[1]) > max_chars:
            continue
        kept.setdefault(d, []).append(text)
        total += len(text[1])
    return kept


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
