# Set up an offline bundle made by scripts/pack_offline.sh (this file is its bootstrap.sh), on a node
# without internet whose Python has torch, torchaudio, numpy, pandas, tensorboard, PyYAML, matplotlib.
#
#   source bootstrap.sh                         # bash; sets the variables below in this shell
#   PYTHON=/path/to/python3 source bootstrap.sh # another interpreter than python3
#   eval "$(bash bootstrap.sh)"                 # the same: run as a program it prints the export lines
#
# The first time, the bundled wheels are installed into .deps/ with
# `pip install --no-index --no-deps --prefix .deps` (--target would drop mpich's bin/ and lib/), then
# imported and `mpiexec -n 2` is tried. Every time: PATH gets .deps' bin (mpiexec), LD_LIBRARY_PATH its
# lib (libmpi), MPI4PY_LIBMPI names that libmpi (mpi4py would otherwise take any libmpi it finds in the
# interpreter's prefix first), and PYTHONPATH gets the wheels' site-packages and the bundle root, so
# `import sparse_asr` finds the package without an (editable) install, which would need a build step.
# Messages go to stderr, export lines to stdout.

_sparse_asr_bootstrap() {
    local bundle python want have missing prefix stamp site lib bin pin name version
    bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
    python=${PYTHON:-python3}
    prefix=$bundle/.deps

    if ! command -v "$python" >/dev/null; then
        _sparse_asr_fail "no Python '$python' on PATH (set PYTHON=/path/to/python3)"
        return 1
    fi
    want=$(cat "$bundle/wheels/PYTHON_VERSION") || { _sparse_asr_fail "$bundle/wheels/PYTHON_VERSION is missing"; return 1; }
    have=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [[ "$have" != "$want" ]]; then
        _sparse_asr_fail "the bundled wheels are for Python $want, but $python is Python $have: build a bundle for it" \
             "where there is internet: bash scripts/pack_offline.sh --python $have"
        return 1
    fi
    while read -r pin; do
        name=${pin%%==*} version=${pin#*==}
        if ! ls "$bundle/wheels" | grep -q -i -E "^${name//-/[-_]}-${version//./\\.}-"; then
            _sparse_asr_fail "no wheel of $pin (for Python $want) in $bundle/wheels: the bundle is incomplete"
            return 1
        fi
    done < "$bundle/wheels/requirements.txt"
    missing=$("$python" -c 'import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' \
        torch torchaudio numpy pandas tensorboard yaml matplotlib)
    if [[ -n "$missing" ]]; then
        _sparse_asr_fail "$python lacks $missing: the bundle brings only what an image with PyTorch usually lacks"
        return 1
    fi

    stamp="$want $(command -v "$python") $(cat "$bundle/wheels/requirements.txt" | tr '\n' ' ')"
    if [[ ! -f "$prefix/.installed" || "$(cat "$prefix/.installed")" != "$stamp" ]]; then
        echo "bootstrap.sh: installing the bundled wheels into $prefix" >&2
        rm -rf "$prefix"
        # --ignore-installed: also when the interpreter has some of them already (they would be skipped).
        PIP_USER=0 PIP_REQUIRE_VIRTUALENV=0 "$python" -m pip install --quiet --no-index --no-deps \
            --ignore-installed --no-warn-script-location --disable-pip-version-check --prefix "$prefix" \
            "$bundle"/wheels/*.whl >&2 ||
            { _sparse_asr_fail "pip could not install the bundled wheels (message above)"; return 1; }
    fi
    # Where pip put them depends on the interpreter's install scheme (e.g. Debian's local/, dist-packages).
    site=$(find "$prefix" -path '*-packages/mpi4py/__init__.py' -print -quit)
    lib=$(find "$prefix" -name 'libmpi.so.12' -print -quit)
    bin=$(find "$prefix" -name mpiexec -type f -print -quit)
    if [[ -z "$site" || -z "$lib" || -z "$bin" ]]; then
        _sparse_asr_fail "the install in $prefix lacks mpi4py, libmpi.so.12 or mpiexec"
        return 1
    fi
    site=$(dirname "$(dirname "$site")") lib=$(dirname "$lib") bin=$(dirname "$bin")
    _sparse_asr_prepend PATH "$bin"
    _sparse_asr_prepend LD_LIBRARY_PATH "$lib"
    _sparse_asr_prepend PYTHONPATH "$site"
    _sparse_asr_prepend PYTHONPATH "$bundle"
    export MPI4PY_LIBMPI=$lib/libmpi.so.12

    if [[ ! -f "$prefix/.installed" ]]; then  # check once, right after installing
        "$python" -c 'import Levenshtein, soundfile, sparse_asr
from mpi4py import MPI
print(f"bootstrap.sh: soundfile {soundfile.__version__} (libsndfile {soundfile.__libsndfile_version__}), "
      f"Levenshtein, sparse_asr from {sparse_asr.__file__}, mpi4py with {MPI.Get_library_version().splitlines()[0]}")' >&2 ||
            { _sparse_asr_fail "the installed wheels do not import (message above)"; return 1; }
        mpiexec -n 2 "$python" -c 'from mpi4py import MPI; assert MPI.COMM_WORLD.Get_size() == 2' >&2 ||
            { _sparse_asr_fail "mpiexec -n 2 failed (message above)"; return 1; }
        echo "$stamp" > "$prefix/.installed"
        echo "bootstrap.sh: ready; mpiexec -n 2 works" >&2
    fi
    printf 'export %s=%q\n' PATH "$PATH" LD_LIBRARY_PATH "$LD_LIBRARY_PATH" PYTHONPATH "$PYTHONPATH" \
        MPI4PY_LIBMPI "$MPI4PY_LIBMPI"
}

_sparse_asr_fail() {
    echo "bootstrap.sh: error: $*" >&2
}

_sparse_asr_prepend() {  # _sparse_asr_prepend VARIABLE DIR: put DIR first unless it is there already
    case ":${!1:-}:" in
        *":$2:"*) ;;
        *) export "$1=$2${!1:+:${!1}}" ;;
    esac
}

_sparse_asr_bootstrap
_sparse_asr_status=$?
unset -f _sparse_asr_bootstrap _sparse_asr_fail _sparse_asr_prepend
if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
    return "$_sparse_asr_status"
fi
exit "$_sparse_asr_status"
