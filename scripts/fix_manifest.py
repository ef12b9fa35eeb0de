"""Repair the file paths of a manifest after the data moved (ours or the legacy two-column form).

    # replace a path prefix
    python scripts/fix_manifest.py an4_train_manifest.csv --old-root /scratch/snx3000/shigang --new-root /my/data
    # or find every file by name under a directory tree
    python scripts/fix_manifest.py manifests/an4_train.csv --search-root /my/data/an4
    # only report the files that do not exist
    python scripts/fix_manifest.py manifests/an4_train.csv --check

Every path of every row is checked (both paths of a legacy row). Rows whose file cannot be found
are printed with their line number and never dropped. If any remain, nothing is written and the
exit status is 1, unless --allow-missing (then they are written with their best-guess path).
The result goes to --out, or replaces the manifest in place (atomically).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


from sparse_asr.data.manifest import ManifestError, build_index, fix_paths, read_raw, write_raw


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("manifest", help="manifest CSV to repair")
    parser.add_argument("--old-root", help="path prefix to replace (with --new-root)")
    parser.add_argument("--new-root", help="what replaces --old-root")
    parser.add_argument("--search-root", help="find files that still do not exist by file name under this directory")
    parser.add_argument("--out", help="write the repaired manifest here (default: replace the input)")
    parser.add_argument("--allow-missing", action="store_true",
                        help="write even if some files cannot be found (exit 0)")
    parser.add_argument("--check", action="store_true", help="only report missing files; write nothing")
    args = parser.parse_args(argv)
    if (args.old_root is None) != (args.new_root is None):
        parser.error("--old-root and --new-root go together")
    if not args.check and args.old_root is None and args.search_root is None:
        parser.error("give --old-root/--new-root, --search-root, or --check")

    try:
        raw = read_raw(args.manifest)
        index = None
        if args.search_root is not None:
            index = build_index(args.search_root)
            indexed = sum(map(len, index.values()))
            print(f"indexed {indexed} file{'s' * (indexed != 1)} under {args.search_root}")
        fixed, report = fix_paths(raw, args.out, args.old_root, args.new_root, index)
    except (ManifestError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    for line, path, reason in report.unresolved:
        print(f"{raw.path}:{line}: cannot find {path} ({reason})", file=sys.stderr)
    print(f"{raw.path}: {report.rows} rows ({raw.format} format), {report.paths} paths: "
          f"{report.rewritten} prefix-rewritten, {report.found} found by name, {len(report.unresolved)} not found")
    if args.check:
        return 1 if report.unresolved and not args.allow_missing else 0
    if report.unresolved and not args.allow_missing:
        missing = len(report.unresolved)
        print(f"nothing written: {missing} file{'s' * (missing != 1)} not found (pass --allow-missing to write anyway)",
              file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else raw.path
    written = write_raw(fixed, out)
    print(f"{'wrote' if written else 'unchanged'} {out} ({len(fixed.rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
