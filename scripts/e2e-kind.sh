#!/usr/bin/env bash
# End to end on a real cluster: kind, the Kubeflow operators of one backend, the Helm chart, the CPU example.
# CI's e2e workflow (.github/workflows/e2e-kind.yml) runs exactly this script; docs/ci.md says what it proves.
#
#   scripts/e2e-kind.sh                   both backends, one cluster after the other (also: make e2e-kind)
#   scripts/e2e-kind.sh trainjob          one backend: pytorchjob or trainjob
#   scripts/e2e-kind.sh build             only build the images (docker buildx, into the local engine)
#
# For each backend: build the trainer and operator images once (./Dockerfile's `trainer` and `operator`
# targets, without attestations: kind loads plain images only), create a kind cluster, load the images into
# it, install that backend's Kubeflow operators at the versions pinned below, create the benchmark's
# namespace (Pod Security "restricted"), `helm install` the chart with its operator watching that namespace,
# apply manifests/examples/cpu-sweep.yaml there, `kubectl wait --for=condition=Finished`, print the report
# (`gpt2bench report --cluster`), check the outcome with tests/test_kind.py, and delete the cluster: after
# success, failure or Ctrl-C alike (trap). A failed run first writes logs and `kubectl describe` of every
# object to $E2E_ARTIFACTS.
#
# The cluster steps live here only. tests/test_kind.py holds the assertions: run by this script against the
# cluster it made (GPT2BENCH_KIND_KUBECONFIG), or, run by pytest alone, it drives these steps itself:
#   scripts/e2e-kind.sh up BACKEND        create the cluster, load images, install operators, namespace, chart;
#                                         then prints what `env` prints
#   scripts/e2e-kind.sh env [BACKEND]     `export KUBECONFIG=...` of that cluster and `NS=bench`, the namespace its
#                                         operator watches: `eval "$(scripts/e2e-kind.sh env)"`, then step 2 of
#                                         docs/quickstart.md
#   scripts/e2e-kind.sh example           apply the example, wait until it Finished (and Complete), print the report
#   scripts/e2e-kind.sh diagnostics       logs and `kubectl describe` of everything into $E2E_ARTIFACTS
#   scripts/e2e-kind.sh down              delete the cluster (kept with E2E_KEEP=1)
#   scripts/e2e-kind.sh kustomization DIR write the training operator's kustomization (pytorchjob) into DIR
#                                         (manifests/kubeflow/training-operator, with GPT2BENCH_TRAINING_OPERATOR)
#   scripts/e2e-kind.sh helm-args BACKEND print the `helm install` arguments, one a line (tests render them)
#
# Needs bash 4.4 or later (macOS's /bin/bash 3.2 is not enough), docker (a running engine, with buildx, and 4
# CPUs for its kind node: a run's pods request 2 to 2.5 CPUs beside Kubernetes' own), kind, kubectl and helm (on
# PATH, else .tools/bin's from `scripts/install.sh --test`), a Python with gpt2bench and its test extra (the
# checkout's .venv, else python3), and network access for the operators' manifests and base images.
#
# Environment:
#   GPT2BENCH_KIND_IMAGE, GPT2BENCH_KIND_OPERATOR_IMAGE   images already in the local engine: no build
#   GPT2BENCH_KIND_IMAGE_ARCHIVE   a `docker save` archive holding those two images: loaded into kind as it is
#                    (`kind load image-archive`), no build (CI hands its build job's images on this way)
#   GPT2BENCH_TRAINING_OPERATOR, GPT2BENCH_MPI_OPERATOR, GPT2BENCH_TRAINER_V2, GPT2BENCH_TRAINER_V2_NODE_IMAGE
#                    other versions of the operators (defaults below) or of the Trainer v2 cluster's node
#   E2E_CLUSTER      kind cluster name (default gpt2bench-e2e-BACKEND)
#   E2E_WORKDIR      its kubeconfig, rendered files and report (default ${TMPDIR:-/tmp}/E2E_CLUSTER)
#   E2E_ARTIFACTS    diagnostics of a failed run (default E2E_WORKDIR/diagnostics)
#   E2E_TIMEOUT_S    seconds the benchmark may take to finish (default: its planned runs x E2E_SECONDS_PER_RUN)
#   E2E_SECONDS_PER_RUN  what a run may take on the kind node, pod start to results (default 180: an estimate)
#   E2E_PICKUP_S     seconds the operator may take to give the benchmark a status (default 120): none by
#                    then means no operator watches its namespace, and the run stops saying so
#   E2E_BUILD_CACHE  gha: build with the GitHub Actions layer cache (CI; needs the Actions runtime token)
#   E2E_KEEP=1       keep the cluster afterwards (debugging; delete it with `kind delete cluster --name ...`)
#   PYTHON           python with gpt2bench installed (default .venv/bin/python, else python3)
set -euo pipefail

# Empty arrays under `set -u` fail in bash before 4.4 (macOS's /bin/bash is 3.2).
if ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 4))); then
  printf 'e2e-kind: bash %s is too old: 4.4 or later (macOS: brew install bash, then run it with that bash)\n' \
    "$BASH_VERSION" >&2
  exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PATH=$PATH:$ROOT/.tools/bin  # helm and kubectl from scripts/install.sh --test, where none is installed
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
HELM=${HELM:-helm}

# The Kubeflow operators, pinned (docs/quickstart.md's step 0 and operator/controller/followedkinds.py tell users the
# same; tests/test_versions.py keeps them equal). pytorchjob: the training operator v1.9.0 (PyTorchJob
# kubeflow.org/v1) without its own MPIJob (manifests/kubeflow/training-operator), and the MPI operator v0.8.2
# (MPIJob kubeflow.org/v2beta1). trainjob: Kubeflow Trainer v2.3.0 with JobSet, on Kubernetes 1.32 (Trainer v2
# needs 1.31 or later; 1.32 is what upstream's e2e runs).
TRAINING_OPERATOR_KUSTOMIZATION=$ROOT/manifests/kubeflow/training-operator  # its upstream overlay, pinned there
TRAINING_OPERATOR=${GPT2BENCH_TRAINING_OPERATOR:-}  # another upstream overlay in its place
MPI_OPERATOR=${GPT2BENCH_MPI_OPERATOR:-"https://raw.githubusercontent.com/kubeflow/mpi-operator/v0.8.2/deploy/v2beta1/mpi-operator.yaml"}
TRAINER_V2=${GPT2BENCH_TRAINER_V2:-"https://github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0"}
TRAINER_V2_NODE_IMAGE=${GPT2BENCH_TRAINER_V2_NODE_IMAGE:-"kindest/node:v1.32.0"}
TRAINER_V2_NAMESPACE=kubeflow-system  # the overlay's namespace: the Trainer's and JobSet's controllers

# The images the e2e builds: ./Dockerfile targets, tagged for kind only (the chart is pointed at them).
TRAINER_IMAGE=${GPT2BENCH_KIND_IMAGE:-gpt2bench-trainer:e2e}
OPERATOR_IMAGE=${GPT2BENCH_KIND_OPERATOR_IMAGE:-gpt2bench-operator:e2e}

EXAMPLE=$ROOT/manifests/examples/cpu-sweep.yaml
BENCH_NAMESPACE=bench
CHART_NAMESPACE=gpt2bench-system
MIN_NODE_CPUS=4  # the example's pods request 2 CPUs (an MPIJob's 2.5) beside about 1 of Kubernetes' own

log() { printf '\n==> %s\n' "$*" >&2; }
die() { printf 'e2e-kind: %s\n' "$*" >&2; exit 2; }

# Where one cluster's state lives: set from the backend (or E2E_CLUSTER) before any cluster step.
use_cluster() {
  CLUSTER=${E2E_CLUSTER:-gpt2bench-e2e-${1:-pytorchjob}}
  WORKDIR=${E2E_WORKDIR:-${TMPDIR:-/tmp}/$CLUSTER}
  ARTIFACTS=${E2E_ARTIFACTS:-$WORKDIR/diagnostics}
  export KUBECONFIG=$WORKDIR/kubeconfig
}

# The tools a command needs (default: all of them), and a running Docker engine.
require() {
  local tool
  [ $# -gt 0 ] || set -- docker kind kubectl "$HELM" "$PYTHON"
  for tool in "$@"; do
    command -v "$tool" >/dev/null || die "$tool is not installed (docs/ci.md lists what the e2e needs)"
  done
  docker info --format '{{.ServerVersion}}' >/dev/null 2>&1 || die "no Docker engine is reachable (docker info failed)"
}

# No provenance or SBOM attestation: `kind load` fails on an image that carries one when Docker uses the
# containerd image store ("content digest ... not found", kind issues 3795 and 4236), the default on current
# runners and Docker Desktop. With E2E_BUILD_CACHE=gha, layers come from and go to the Actions cache.
build_image() {
  local target=$1 image=$2 cache=()
  if [ "${E2E_BUILD_CACHE:-}" = gha ]; then
    cache=(--cache-from "type=gha,scope=e2e-$target" --cache-to "type=gha,scope=e2e-$target,mode=max")
  elif [ -n "${E2E_BUILD_CACHE:-}" ]; then
    die "E2E_BUILD_CACHE must be gha or unset, got '$E2E_BUILD_CACHE'"
  fi
  log "building $image (Dockerfile target $target)"
  docker buildx build --load --provenance=false --sbom=false "${cache[@]}" --target "$target" -t "$image" "$ROOT"
}

build_images() {
  [ -n "${GPT2BENCH_KIND_IMAGE:-}" ] || build_image trainer "$TRAINER_IMAGE"
  [ -n "${GPT2BENCH_KIND_OPERATOR_IMAGE:-}" ] || build_image operator "$OPERATOR_IMAGE"
  # Later steps and backends reuse them instead of building again.
  export GPT2BENCH_KIND_IMAGE=$TRAINER_IMAGE GPT2BENCH_KIND_OPERATOR_IMAGE=$OPERATOR_IMAGE
}

# The training operator without its MPIJob (manifests/kubeflow/training-operator says why), its upstream
# overlay replaced by $GPT2BENCH_TRAINING_OPERATOR where set.
write_kustomization() {
  mkdir -p "$1"
  local line
  while IFS= read -r line; do
    if [ -n "$TRAINING_OPERATOR" ] && [[ "$line" == "  - github.com/kubeflow/training-operator.git/"* ]]; then
      line="  - $TRAINING_OPERATOR"
    fi
    printf '%s\n' "$line"
  done <"$TRAINING_OPERATOR_KUSTOMIZATION/kustomization.yaml" >"$1/kustomization.yaml"
  cp "$TRAINING_OPERATOR_KUSTOMIZATION/init-container.yaml" "$1/"  # its configMapGenerator's file
}

# As docs/quickstart.md's step 0 pastes them (with $ROOT/ before the kustomization's path).
install_pytorchjob() {
  local kustomization=$TRAINING_OPERATOR_KUSTOMIZATION
  if [ -n "$TRAINING_OPERATOR" ]; then
    kustomization=$WORKDIR/training-operator
    write_kustomization "$kustomization"
  fi
  log "installing the training operator (${TRAINING_OPERATOR:-$kustomization}) and the MPI operator ($MPI_OPERATOR)"
  kubectl apply --server-side -k "$kustomization"
  kubectl apply --server-side -f "$MPI_OPERATOR"
  kubectl -n kubeflow rollout status deployment/training-operator --timeout=300s
  kubectl -n mpi-operator rollout status deployment/mpi-operator --timeout=300s
}

# Trainer v2 as its installation guide says, ready as its own e2e waits (the chart's runtimes then go in
# through Trainer's validating webhook).
install_trainjob() {
  log "installing Kubeflow Trainer v2 ($TRAINER_V2)"
  kubectl apply --server-side -k "$TRAINER_V2"
  kubectl -n "$TRAINER_V2_NAMESPACE" wait deployment/kubeflow-trainer-controller-manager \
    --for=condition=Available --timeout=300s
  kubectl -n "$TRAINER_V2_NAMESPACE" wait pods --all --for=condition=Ready --timeout=300s
}

# The chart's `helm install` arguments: the images loaded into kind, and an operator that watches the
# benchmark's namespace (by default it watches only its own, where nothing would reconcile the example);
# with Trainer v2, the chart's ClusterTrainingRuntimes (they name the loaded trainer image). `helm-args`
# prints them; tests/test_install_paths.py renders the chart with exactly these and runs the example against
# the operator they make.
chart_args() {
  CHART_ARGS=(gpt2bench "$ROOT/helm/gpt2bench" --namespace "$CHART_NAMESPACE" --create-namespace
    --wait --timeout 5m
    --set "operator.watchNamespace=$BENCH_NAMESPACE"
    --set "image.repository=${OPERATOR_IMAGE%:*}" --set "image.tag=${OPERATOR_IMAGE##*:}"
    --set image.pullPolicy=Never
    --set "trainerImage.repository=${TRAINER_IMAGE%:*}" --set "trainerImage.tag=${TRAINER_IMAGE##*:}")
  if [ "$1" = trainjob ]; then CHART_ARGS+=(--set trainerRuntimes.install=true); fi
}

install_chart() {
  chart_args "$1"
  log "helm install gpt2bench (operator $OPERATOR_IMAGE watching namespace $BENCH_NAMESPACE, trainer $TRAINER_IMAGE)"
  "$HELM" install "${CHART_ARGS[@]}"
}

# The benchmark's namespace, enforcing Pod Security "restricted"; before the chart, whose Role goes in it.
bench_namespace() {
  log "creating namespace $BENCH_NAMESPACE (Pod Security restricted)"
  kubectl create namespace "$BENCH_NAMESPACE"
  kubectl label namespace "$BENCH_NAMESPACE" pod-security.kubernetes.io/enforce=restricted
}

# The images into the cluster: from GPT2BENCH_KIND_IMAGE_ARCHIVE (a `docker save` of both, CI's hand-over
# from its build job), else from the local engine.
load_images() {
  if [ -n "${GPT2BENCH_KIND_IMAGE_ARCHIVE:-}" ]; then
    kind load image-archive "$GPT2BENCH_KIND_IMAGE_ARCHIVE" --name "$CLUSTER"
    return
  fi
  build_images
  local image
  for image in "$TRAINER_IMAGE" "$OPERATOR_IMAGE"; do kind load docker-image "$image" --name "$CLUSTER"; done
}

up() {
  local backend=$1 node_image=()
  case "$backend" in pytorchjob | trainjob) ;; *) die "unknown backend '$backend' (pytorchjob or trainjob)" ;; esac
  [ "$backend" = trainjob ] && node_image=(--image "$TRAINER_V2_NODE_IMAGE")
  mkdir -p "$WORKDIR"
  log "creating kind cluster $CLUSTER ($backend; kubeconfig $KUBECONFIG)"
  kind create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG" "${node_image[@]}" --wait 180s
  node_cpus
  load_images
  "install_$backend"
  bench_namespace
  install_chart "$backend"
  log "ready: the operator watches namespace $BENCH_NAMESPACE. Before docs/quickstart.md's step 2:"
  # shellcheck disable=SC2016 # the $( ) is for the user's shell
  printf 'eval "$(%s env %s)"\n' "$0" "$backend" >&2
}

# A node with fewer CPUs than the example's pods request leaves them Pending until their deadline: stop now.
node_cpus() {
  local cpus
  cpus=$(kubectl get nodes -o jsonpath='{.items[0].status.allocatable.cpu}')
  case "$cpus" in
    "") return 0 ;;  # not told: the runs will say so
    *m) cpus=$((${cpus%m} / 1000)) ;;
  esac
  [ "$cpus" -ge "$MIN_NODE_CPUS" ] || die "the kind node has $cpus CPUs, the CPU example needs $MIN_NODE_CPUS (a \
run's pods request 2, an MPIJob's 2.5, beside Kubernetes' own): give Docker more CPUs (Docker Desktop: Settings, \
Resources)"
}

# The cluster's kubeconfig and the namespace its operator watches, as shell lines (step 2 of docs/quickstart.md
# uses $NS).
print_env() {
  printf 'export KUBECONFIG=%q\nNS=%s\n' "$KUBECONFIG" "$BENCH_NAMESPACE"
}

# The CPU example as released, but with imagePullPolicy Never (its image is the one loaded into kind) and one
# round (repeats 1; maxRepeats, minEffect, budget dropped): its 10 configurations once each, a fixed length well
# inside the job's timeout on a 4-core runner. Rounds and repeat-until-decided are the operator's logic, proven
# against the emulator (tests/test_until_decided.py, tests/test_operator_kopf.py); here the cluster path is.
example() {
  local name
  name=$("$PYTHON" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["metadata"]["name"])' "$EXAMPLE")
  log "applying $EXAMPLE in namespace $BENCH_NAMESPACE"
  mkdir -p "$WORKDIR"
  "$PYTHON" -c 'import sys, yaml; b = yaml.safe_load(open(sys.argv[1])); b["spec"]["imagePullPolicy"] = "Never"
b["spec"]["sweep"]["repeats"] = 1
for key in ("maxRepeats", "minEffect", "budget"): b["spec"]["sweep"].pop(key, None)
print(yaml.safe_dump(b))' "$EXAMPLE" >"$WORKDIR/example.yaml"
  kubectl apply -n "$BENCH_NAMESPACE" -f "$WORKDIR/example.yaml"
  wait_finished "$name" "${E2E_TIMEOUT_S:-$(wait_seconds "$WORKDIR/example.yaml")}"
  kubectl get -n "$BENCH_NAMESPACE" gpt2benchmark "$name" -o wide
  "$PYTHON" -m gpt2bench report --cluster "$name" -n "$BENCH_NAMESPACE" --output "$WORKDIR/report" --quiet
  cat "$WORKDIR/report/results.md"  # the recommendation, then every run's figures
}

# How long a benchmark may take: the most runs it can plan (every round up to sweep.maxRepeats, the breakdown
# round included) x E2E_SECONDS_PER_RUN.
wait_seconds() {
  local runs
  runs=$("$PYTHON" -c 'import sys
from gpt2bench.plan import plan_runs
from gpt2bench.specification.validation import load_benchmarks_file
(benchmark,) = load_benchmarks_file(sys.argv[1])
print(len(plan_runs(benchmark, rounds=benchmark.spec.sweep.max_repeats)))' "$1")
  echo $((runs * ${E2E_SECONDS_PER_RUN:-180}))
}

# First a status within $E2E_PICKUP_S seconds (none: no operator watches the namespace, and waiting longer
# cannot help); then `kubectl wait --for=condition=Finished`, which comes back when the sweep ends either way
# (waiting for Complete hung until the timeout when no run succeeded), at most $2 seconds; then it must be
# Complete: some run has results.
wait_finished() {
  local pickup=$((SECONDS + ${E2E_PICKUP_S:-120})) complete
  log "waiting for the operator to take gpt2benchmark/$1 (at most ${E2E_PICKUP_S:-120} s)"
  until [ -n "$(kubectl get -n "$BENCH_NAMESPACE" gpt2benchmark "$1" -o jsonpath='{.status.phase}')" ]; do
    if [ "$SECONDS" -ge "$pickup" ]; then
      kubectl get deployments -A -l app.kubernetes.io/component=operator \
        -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}: {.spec.template.spec.containers[0].args}{"\n"}{end}' >&2 || true
      die "gpt2benchmark/$1 has no status after ${E2E_PICKUP_S:-120} s: no operator watches namespace $BENCH_NAMESPACE (operators above)"
    fi
    sleep 2
  done
  log "waiting for gpt2benchmark/$1 to finish (at most $2 s)"
  kubectl wait -n "$BENCH_NAMESPACE" --for=condition=Finished "gpt2benchmark/$1" --timeout="${2}s" ||
    die "gpt2benchmark/$1 did not finish within $2 s"
  complete=$(kubectl get -n "$BENCH_NAMESPACE" gpt2benchmark "$1" \
    -o jsonpath='{.status.conditions[?(@.type=="Complete")].status}')
  if [ "$complete" != True ]; then
    kubectl get -n "$BENCH_NAMESPACE" gpt2benchmark "$1" -o yaml >&2
    die "gpt2benchmark/$1 failed: no run succeeded"
  fi
}

# Logs and `kubectl describe` of every object, for a failed run (CI uploads $ARTIFACTS).
diagnostics() {
  log "writing diagnostics of $CLUSTER to $ARTIFACTS"
  mkdir -p "$ARTIFACTS/describe" "$ARTIFACTS/logs"
  kind export logs "$ARTIFACTS/kind" --name "$CLUSTER" >/dev/null 2>&1 || true
  kubectl get all,events -A -o wide >"$ARTIFACTS/get-all.txt" 2>&1 || true
  kubectl get gpt2benchmarks -A -o yaml >"$ARTIFACTS/gpt2benchmarks.yaml" 2>&1 || true
  local resource namespace pod
  for resource in $(kubectl api-resources --verbs=list -o name 2>/dev/null); do
    kubectl describe "$resource" -A >"$ARTIFACTS/describe/$resource.txt" 2>&1 || true
  done
  kubectl get pods -A -o jsonpath='{range .items[*]}{.metadata.namespace} {.metadata.name}{"\n"}{end}' 2>/dev/null |
    while read -r namespace pod; do
      kubectl logs -n "$namespace" "$pod" --all-containers --prefix >"$ARTIFACTS/logs/$namespace.$pod.log" 2>&1 || true
      kubectl logs -n "$namespace" "$pod" --all-containers --prefix --previous \
        >"$ARTIFACTS/logs/$namespace.$pod.previous.log" 2>/dev/null || rm -f "$ARTIFACTS/logs/$namespace.$pod.previous.log"
    done || true  # a cluster that never came up has no pods to list
}

down() {
  if [ -n "${E2E_KEEP:-}" ]; then
    log "keeping cluster $CLUSTER (E2E_KEEP): KUBECONFIG=$KUBECONFIG; kind delete cluster --name $CLUSTER"
    return 0
  fi
  log "deleting kind cluster $CLUSTER"
  kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
}

# tests/test_kind.py's assertions against the cluster this run made.
check() {
  log "checking $1 with tests/test_kind.py"
  GPT2BENCH_KIND_KUBECONFIG=$KUBECONFIG GPT2BENCH_KIND_BACKEND=$1 GPT2BENCH_KIND_REPORT=$WORKDIR/report \
    "$PYTHON" -m pytest -q -m kind -p no:cacheprovider "$ROOT/tests/test_kind.py" -k "$1"
}

finish() {
  local rc=$?
  trap - EXIT INT TERM
  set +e  # collect and delete whatever fails
  if [ "$rc" -ne 0 ]; then diagnostics; fi
  down
  exit "$rc"
}

# One backend, whole: its own cluster, deleted by the EXIT trap however the run ends (Ctrl-C included).
run_backend() {
  use_cluster "$1"
  trap finish EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true  # a cluster left by a killed run
  rm -rf "$WORKDIR/report"
  up "$1"
  example
  check "$1"
  log "$1: passed"
}

main() {
  local command=${1:-all}
  case "$command" in
    build) require docker; build_images ;;
    up) [ $# -eq 2 ] || die "usage: $0 up BACKEND"; require; use_cluster "$2"; up "$2" ;;
    example) use_cluster; example ;;
    env) use_cluster "${2:-}"; print_env ;;
    diagnostics) use_cluster; diagnostics ;;
    down) use_cluster; down ;;
    kustomization) [ $# -eq 2 ] || die "usage: $0 kustomization DIR"; write_kustomization "$2" ;;
    helm-args)
      [ $# -eq 2 ] || die "usage: $0 helm-args BACKEND"
      case "$2" in pytorchjob | trainjob) ;; *) die "unknown backend '$2' (pytorchjob or trainjob)" ;; esac
      chart_args "$2"
      printf '%s\n' "${CHART_ARGS[@]}"
      ;;
    all | pytorchjob | trainjob)
      local backends=(pytorchjob trainjob) backend
      [ "$command" = all ] || backends=("$@")
      require
      build_images
      # Each backend in a subshell: its own EXIT trap deletes its cluster before the next one starts.
      for backend in "${backends[@]}"; do (run_backend "$backend"); done
      ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
    *) die "unknown command '$command' (see $0 --help)" ;;
  esac
}

main "$@"
