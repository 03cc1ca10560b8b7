# Shared settings and helpers for the TPU scripts. Override any variable in the environment.
# With --dry-run (or DRY_RUN=1) every command is printed instead of run.
set -euo pipefail
TPU_NAME="${TPU_NAME:-t5lite}"
ZONE="${ZONE:-us-central2-b}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v4-8}"
RUNTIME_VERSION="${RUNTIME_VERSION:-tpu-ubuntu2204-base}"
PROJECT="${PROJECT:-$(gcloud config get-value project 2>/dev/null || echo YOUR_PROJECT)}"
REPO_URL="${REPO_URL:-}"
REMOTE_DIR="${REMOTE_DIR:-t5lite}"
DRY_RUN="${DRY_RUN:-0}"
ARGS=()
for arg in "$@"; do
  if [[ "$arg" == "--dry-run" ]]; then DRY_RUN=1; else ARGS+=("$arg"); fi
done

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
