#!/usr/bin/env bash
# Build a bundle that an OFFLINE GPU node runs from: one folder and a .tar.gz of it, each under 57 MiB.
#
#   bash scripts/pack_offline.sh [--python 3.12] [--out dist] [--source ../shared/data/an4_sphere.tar.gz]
#                                [--max-utterances N] [--wheel-cache .cache/offline-wheels]
#
# The folder <out>/sparse_asr-offline-py<X.Y>/ holds
#   - the repository's tracked files as they are in this working tree, less docs/ (results), tests/
#     (they need pytest and the SPHERE archive) and DESIGN.md (for developers); 57 MiB because a lent GPU
#     machine receives the checkout and the carried bundle, 64 MiB at most together, and the two are kept
#     under 60 MiB (tests/test_offline_bundle.py checks both). The kept results grow with every run: call the
#     machine from a checkout without them, `git sparse-checkout set --no-cone '/*' '!/docs/results/'`
#     (`git sparse-checkout disable` brings them back),
#   - AN4 as FLAC in datasets/an4/ with manifests/an4_{train,dev,test}.csv pointing at it by relative
#     path (valid wherever the bundle is unpacked; --max-utterances N keeps the N shortest per split),
#   - wheels/: what an image with torch, torchaudio, numpy, pandas, tensorboard, PyYAML and matplotlib
#     lacks (soundfile, cffi, pycparser, Levenshtein, python-Levenshtein, rapidfuzz, mpi4py, mpich, and
#     flashlight-text for evaluate.py's beam decoder),
#     for CPython X.Y on manylinux x86_64 (glibc >= 2.28), downloaded once into --wheel-cache; mpich's
#     without the files no bundle job opens (scripts/offline/slim_mpich.py: 12.7 -> 7.3 MiB),
#   - bootstrap.sh: on the node, `source bootstrap.sh` installs the wheels into .deps/ and sets PATH,
#     LD_LIBRARY_PATH and PYTHONPATH; then e.g. `bash bench/gpu_suite.sh`.
# Exit status: 2 bad arguments, 3 a wheel could not be downloaded, 4 the bundle is too large.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd -P)
source scripts/lib/args.sh

PYTHON_VERSION=3.12
OUT=dist
SOURCE=../shared/data/an4_sphere.tar.gz
MAX_UTTERANCES=0
WHEEL_CACHE=.cache/offline-wheels
MAX_MIB=57
while (($#)); do
    case "$1" in
        --python) require_value "$@"; PYTHON_VERSION=$2; shift 2 ;;
        --out) require_value "$@"; OUT=$2; shift 2 ;;
        --source) require_value "$@"; SOURCE=$2; shift 2 ;;
        --max-utterances) require_value "$@"; MAX_UTTERANCES=$2; shift 2 ;;
        --wheel-cache) require_value "$@"; WHEEL_CACHE=$2; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ "$PYTHON_VERSION" =~ ^3\.[0-9]+$ ]] || die "--python must be a CPython version like 3.12, got '$PYTHON_VERSION'"
[[ "$MAX_UTTERANCES" =~ ^[0-9]+$ ]] || die "--max-utterances must be an integer >= 0, got '$MAX_UTTERANCES'"
[[ -e "$SOURCE" || "$SOURCE" =~ ^(https?|ftp|file):// ]] || die "AN4 source '$SOURCE' does not exist"
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || die "$REPO is not a git checkout (the bundle takes its tracked files)"

# Wheels for the node. Versions: requirements.txt's pins where it has one; the others are what
# scripts/setup.sh installs beside them (tests/test_offline_bundle.py checks both against .venv).
PINS=()
for name in soundfile python-Levenshtein mpi4py mpich flashlight-text; do
    pin=$(grep -i -E "^$name==" requirements.txt) || die "requirements.txt does not pin $name"
    pin=${pin%%[[:space:]#]*}  # less a trailing comment
    PINS+=("$pin")
done
PINS+=(cffi==2.1.1 pycparser==3.12 Levenshtein==0.27.5 rapidfuzz==3.14.6)

bash scripts/setup.sh
PY=.venv/bin/python
NAME=sparse_asr-offline-py$PYTHON_VERSION
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd -P)
BUILD=$OUT/.$NAME.partial  # built here, moved into place at the end
rm -rf "$BUILD"
mkdir -p "$BUILD/wheels"
trap 'rm -rf "$BUILD"' EXIT

echo "pack_offline.sh: tracked files -> $BUILD"
git ls-files -z | while IFS= read -r -d '' file; do  # tracked files that exist (a deleted one is skipped)
    [[ "$file" == docs/* || "$file" == tests/* || "$file" == DESIGN.md ]] ||
        { [[ -e "$file" || -L "$file" ]] && printf '%s\0' "$file"; }
done | tar --null -T - -cf - | tar -xf - -C "$BUILD"

echo "pack_offline.sh: wheels for CPython $PYTHON_VERSION: ${PINS[*]}"
CACHE=$WHEEL_CACHE/cp${PYTHON_VERSION/./}
mkdir -p "$CACHE"
WHEEL_ARGS=(--quiet --disable-pip-version-check --no-deps --only-binary=:all: --implementation cp
            --python-version "$PYTHON_VERSION" --platform manylinux_2_28_x86_64
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
if ! .venv/bin/pip download "${WHEEL_ARGS[@]}" --no-index --find-links "$CACHE" -d "$BUILD/wheels" \
        "${PINS[@]}" >/dev/null 2>&1; then
    for pin in "${PINS[@]}"; do  # one at a time, so that a missing wheel is named
        .venv/bin/pip download "${WHEEL_ARGS[@]}" -d "$CACHE" "$pin" || {
            echo "pack_offline.sh: error: could not download a wheel of $pin for CPython $PYTHON_VERSION," \
                 "manylinux x86_64 (pip's message above: no such wheel on the index, or no network)" >&2
            exit 3
        }
    done
    .venv/bin/pip download "${WHEEL_ARGS[@]}" --no-index --find-links "$CACHE" -d "$BUILD/wheels" "${PINS[@]}"
fi
"$PY" scripts/offline/slim_mpich.py "$BUILD"/wheels/mpich-*.whl  # only what mpiexec and mpi4py load
printf '%s\n' "${PINS[@]}" > "$BUILD/wheels/requirements.txt"
echo "$PYTHON_VERSION" > "$BUILD/wheels/PYTHON_VERSION"

echo "pack_offline.sh: AN4 as FLAC from $SOURCE"
"$PY" scripts/offline/an4_flac.py --source "$SOURCE" --data-dir datasets --out "$BUILD" \
    --max-utterances "$MAX_UTTERANCES"

cp scripts/offline/bootstrap.sh "$BUILD/bootstrap.sh"
cat > "$BUILD/BUNDLE.md" <<EOF
# $NAME

Built $(date -u +%Y-%m-%dT%H:%M:%SZ) by scripts/pack_offline.sh from commit $(git describe --always --dirty)
($( ((MAX_UTTERANCES)) && echo "the $MAX_UTTERANCES shortest utterances of each AN4 split" || echo "all of AN4")).

On a node without internet whose Python $PYTHON_VERSION has torch, torchaudio, numpy, pandas,
tensorboard, PyYAML and matplotlib (x86_64 Linux, glibc >= 2.28):

    tar xzf $NAME.tar.gz && cd $NAME
    source bootstrap.sh          # PYTHON=/path/to/python3 source bootstrap.sh for another interpreter
    bash bench/gpu_suite.sh      # or train.py, evaluate.py, bench/*.py as in README.md

Wheels (wheels/requirements.txt): ${PINS[*]}.
AN4 (CMU; licence in datasets/LICENSE.an4) as FLAC in datasets/an4/, manifests in manifests/.
EOF

check_size() {  # check_size PATH -> the bytes of the files under PATH (or of the file) in MiB; exit 4 if too many
    local bytes
    bytes=$(find "$1" -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%d", s }')
    if ((bytes >= MAX_MIB * 1048576)); then
        echo "pack_offline.sh: error: $1 holds $bytes bytes, the limit is $MAX_MIB MiB" >&2
        exit 4
    fi
    awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1048576 }'
}
folder_mib=$(check_size "$BUILD")
rm -rf "${OUT:?}/$NAME" "$OUT/$NAME.tar.gz"
mv "$BUILD" "$OUT/$NAME"
trap - EXIT
tar -C "$OUT" --sort=name --owner=0 --group=0 --numeric-owner -czf "$OUT/$NAME.tar.gz" "$NAME"
tar_mib=$(check_size "$OUT/$NAME.tar.gz")
echo "pack_offline.sh: $OUT/$NAME ($folder_mib MiB) and $OUT/$NAME.tar.gz ($tar_mib MiB)"
