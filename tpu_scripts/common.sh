# Shared options, settings and helpers of the TPU scripts, sourced with the script's arguments.
# A script may set OPTIONS first: a pattern of the options it takes besides these (kept in ARGS).
set -euo pipefail
shopt -s extglob

COMMON_HELP="Options of every TPU script:
  --dry-run    print each gcloud command instead of running it (or set DRY_RUN=1)
  -h, --help   print this help and exit
Settings, from the environment: TPU_NAME (default t5lite), ZONE (us-central2-b),
ACCELERATOR_TYPE (v4-8), RUNTIME_VERSION (tpu-ubuntu2204-base), PROJECT (gcloud's configured
project), REPO_URL (unset: setup.sh copies this checkout), REMOTE_DIR (t5lite)."

# The calling script's header comment, then the options and settings all scripts share.
usage() {
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  echo "$COMMON_HELP"
}

# Refuses bad input in one line with exit code 2, before any gcloud command runs.
refuse() {
  echo "$(basename "$0"): $1" >&2
  exit 2
}

# --help anywhere on the line prints the usage and runs nothing, whatever else is there.
for arg in "$@"; do
  if [[ "$arg" == -h || "$arg" == --help ]]; then usage; exit 0; fi
done
DRY_RUN="${DRY_RUN:-0}"
ARGS=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    *) if [[ -n "${OPTIONS:-}" && "$arg" == @($OPTIONS) ]]; then ARGS+=("$arg")
       else refuse "unknown option '$arg'; see $0 --help"; fi ;;
  esac
done

TPU_NAME="${TPU_NAME:-t5lite}"
ZONE="${ZONE:-us-central2-b}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v4-8}"
RUNTIME_VERSION="${RUNTIME_VERSION:-tpu-ubuntu2204-base}"
PROJECT="${PROJECT:-$(gcloud config get-value project 2>/dev/null || echo YOUR_PROJECT)}"
REPO_URL="${REPO_URL:-}"
REMOTE_DIR="${REMOTE_DIR:-t5lite}"

run() {
  if [[ "$DRY_RUN" == "1" ]]; then
    printf '%q ' "$@"; echo
  else
    "$@"
  fi
}

# Runs a shell command on every worker of the slice (all hosts run the same program).
on_all_workers() {
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" --worker=all --command="$1"
}
