# Argument checks shared by the cluster submit helpers, the job scripts and scripts/sweep.sh.
# Source it; every check prints "<script>: error: ..." to stderr and exits 2 on bad input.

die() {
    echo "$(basename "$0"): error: $*" >&2
    exit 2
}

# require_positive_int WHAT VALUE   (at most 9 digits, so products like nodes x ranks never overflow)
require_positive_int() {
    [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"
    ((${#2} <= 9)) || die "$1 is too large: '$2' (at most 999999999)"
}

# require_walltime VALUE   (HH:MM:SS, as both qsub -l walltime and sbatch --time accept)
require_walltime() {
    [[ "$1" =~ ^[0-9]+:[0-5][0-9]:[0-5][0-9]$ ]] || die "walltime must be HH:MM:SS, got '$1'"
}

# require_override ARG   a config override `section.key=value` (value parsed as YAML by train.py).
# No whitespace, quotes or commas: overrides travel through `qsub -v`, which splits on commas.
# Nested values are set key by key, e.g. compression.options.local_threshold_interval=16.
require_override() {
    [[ "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*=[^[:space:]\'\",]*$ ]] ||
        die "bad override '$1': expected key.sub=value with no spaces, quotes or commas (e.g. compression.density=0.02)"
}

# require_density VALUE   a number in (0, 1]
require_density() {
    [[ "$1" =~ ^([0-9]*\.)?[0-9]+([eE][-+]?[0-9]+)?$ ]] &&
        awk -v d="$1" 'BEGIN { exit !(d + 0 > 0 && d + 0 <= 1) }' ||
        die "density must be a number in (0, 1], got '$1'"
}

# resolve_config PATH REPO -> prints the config path relative to REPO when it lies inside it, else absolute.
# The job runs from REPO, so relative paths in the printed command lines are relative to the repository root.
resolve_config() {
    local path=$1 repo=$2 abs
    [[ -n "$path" ]] || die "no config given (-c CONFIG)"
    if [[ -f "$path" ]]; then
        abs=$(realpath "$path")
    elif [[ "$path" != /* && -f "$repo/$path" ]]; then
        abs=$(realpath "$repo/$path")
    else
        die "config file '$path' not found (looked in $(pwd)$([[ "$(pwd)" == "$repo" ]] || echo " and in $repo"))"
    fi
    [[ "$abs" =~ ^[^[:space:]\'\",]+$ ]] || die "config path '$abs' must not contain spaces, quotes or commas"
    case "$abs" in
        "$repo"/*) echo "${abs#"$repo"/}" ;;
        *) echo "$abs" ;;
    esac
}

# shell_join ARG... -> one line that a shell reads back as the same words (quotes only where needed).
shell_join() {
    local out="" arg
    for arg in "$@"; do
        if [[ "$arg" =~ ^[A-Za-z0-9_./:=+@%,-]+$ ]]; then
            out+="$arg "
        else
            out+="'${arg//\'/\'\\\'\'}' "
        fi
    done
    echo "${out% }"
}

# require_value OPTION ARGS...   (call as `require_value "$@"` inside an option loop: checks $2 exists)
require_value() {
    (($# >= 2)) && [[ -n "$2" && "$2" != -* ]] || die "option $1 needs a value"
}

# name_override OVERRIDES... -> the value of the last name=... override (the one train.py keeps), or nothing.
name_override() {
    local override name=""
    for override in "$@"; do
        if [[ "$override" == name=* ]]; then
            name=${override#name=}
        fi
    done
    echo "$name"
}

# project_python VENV REPO -> the Python that checks configs on this (login) node: the job's venv if it has
# one, else the repository's .venv (scripts/setup.sh), else python3. It runs from REPO, so the package
# imports from the checkout even where it is not installed.
project_python() {
    local candidate
    for candidate in "$1/bin/python" "$2/.venv/bin/python"; do
        if [[ -x "$candidate" ]]; then
            echo "$candidate"
            return
        fi
    done
    echo python3
}

# check_config PYTHON REPO CONFIG RANKS OVERRIDES...   train.py's own config checks for a run on RANKS ranks
# with these overrides (unknown keys, bad values, a global batch the ranks do not divide), before a job
# waits in a queue: exits 2 with the loader's message if the job would be refused. RANKS = --runs checks
# several runs in one go, read from standard input, one 'RANKS key=value ...' a line (scripts/sweep.sh).
check_config() {
    local python=$1 repo=$2 config=$3 ranks=$4 output status=0
    shift 4
    if [[ "$ranks" == --runs ]]; then
        output=$(cd "$repo" && "$python" -m sparse_asr.training.check_config --config "$config" --runs - "$@" 2>&1) || status=$?
    else
        output=$(cd "$repo" && "$python" -m sparse_asr.training.check_config --config "$config" --world-size "$ranks" "$@" 2>&1) || status=$?
    fi
    ((status == 0)) && return
    ((status == 2)) && die "the config would be refused by train.py:"$'\n'"$(sed 's/^error: /  /' <<<"$output")"
    die "could not run the config check ($python -m sparse_asr.training.check_config, exit $status):"$'\n'"$output"$'\n'"(pass --skip-config-check to submit without it)"
}
