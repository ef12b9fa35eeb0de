"""Rewrite the mpich wheel without what the offline bundle never uses (used by scripts/pack_offline.sh).

    python scripts/offline/slim_mpich.py WHEEL

A lent GPU machine receives the checkout and the bundle, 64 MiB at most together, and mpich's wheel is a
quarter of the bundle. mpi4py loads libmpi.so.12 (the MPICH ABI; bootstrap.sh sets MPI4PY_LIBMPI to it) and
jobs start with `mpiexec` (hydra, which starts hydra_pmi_proxy on each node), so the bundle drops:
libmpi_abi (the MPI-5 standard ABI: a second 13 MB copy of the library), the C headers, the compiler
wrappers and the other launchers. Every other file is kept byte for byte, and RECORD lists exactly the
files that remain, so `pip install` checks the wheel as it would the original. Rewrites WHEEL in place
and prints the sizes before and after.
"""
from __future__ import annotations

import argparse
import re
import sys
import zipfile
from pathlib import Path

# Paths inside <name>.data/data/ that a bundle job never opens.
DROP = re.compile(r"include/.*|lib/libmpi_abi\.so.*"
                  r"|bin/(mpicc|mpic\+\+|mpicxx|mpif77|mpif90|mpifort)(_abi)?"
                  r"|bin/(mpirun|mpiexec\.hydra|mpiexec\.gforker|hydra_nameserver|hydra_persist)")
KEEP = ("lib/libmpi.so.12", "bin/mpiexec", "bin/hydra_pmi_proxy")  # what bootstrap.sh and mpiexec need


def slim(wheel: Path) -> tuple[int, int]:
    """Rewrite `wheel` without the DROP members; returns its size in bytes before and after."""
    before = wheel.stat().st_size
    with zipfile.ZipFile(wheel) as source:
        infos = source.infolist()
        data = re.compile(r"[^/]+\.data/data/(.*)")
        dropped = {i.filename for i in infos if (m := data.fullmatch(i.filename)) and DROP.fullmatch(m.group(1))}
        kept_data = {m.group(1) for i in infos if (m := data.fullmatch(i.filename)) and i.filename not in dropped}
        missing = [name for name in KEEP if name not in kept_data]
        if missing or not dropped:
            raise SystemExit(f"slim_mpich.py: error: {wheel} is not the mpich wheel this script knows "
                             f"(missing {missing}, {len(dropped)} members to drop)")
        record = next(i for i in infos if i.filename.endswith(".dist-info/RECORD"))
        rows = [row for row in source.read(record).decode().splitlines()
                if row and row.split(",")[0] not in dropped]
        partial = wheel.with_name(wheel.name + ".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as target:
            for info in infos:
                if info.filename in dropped:
                    continue
                payload = "\n".join(rows).encode() + b"\n" if info is record else source.read(info)
                target.writestr(info, payload, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    partial.replace(wheel)
    return before, wheel.stat().st_size


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel", type=Path)
    args = parser.parse_args(argv)
    before, after = slim(args.wheel)
    print(f"[slim_mpich] {args.wheel.name}: {before / 2**20:.2f} MiB -> {after / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
