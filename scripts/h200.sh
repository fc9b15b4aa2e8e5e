#!/usr/bin/env bash
# One device call: build the extension, run the GPU test suite, the sanitizers, the
# validation table and the benchmark, writing logs and records under $OUT.
#   bash scripts/h200.sh [all|test|heads|quant|sanitizers|exhaustive|bench|quick|model|sweep|ncu|probe|cluster-racecheck|stage][,...]  (default all)
# Modes joined by commas run in one call, in this file's order (e.g. sweep,probe,model).
# bench: BENCH_ARGS (e.g. "--ops rms_norm_bwd --dtypes bf16") go to harness.bench;
#        BENCH_APPEND=1 appends to a copy of the committed records; BENCH_RESUME=FILE
#        continues a run of record an earlier call's budget cut (its records.jsonl brought
#        back, kept in the tree): the same call again until the bench says it is complete.
# test: the GPU tier (README's pytest; TEST_FILES, TEST_K: those files, that -k filter) and
#       the validation table (SKIP_VALIDATE=1: not it).
# sanitizers: memcheck and racecheck of the CUDA forward (a call of their own: serial).
# quant: memcheck and racecheck of test_quant's CUDA cases (the fp8 forward).
# heads: memcheck of test_heads, then scripts/heads_probe.py forward, --backward and
#        --backward --per-head (HEADS_PROBE_ARGS go to each).
# exhaustive: the exhaustive tier (pytest -m exhaustive); test,exhaustive and sanitizers:
#       the whole suite, in two calls.
# model: python -m harness.model (MODEL_ARGS go to it), records under $OUT/model.
# sweep: a sweep build (RMSNORM_SWEEP_CONFIGS=1: the CUDA sweep-only configs compiled too);
#        SWEEP_ARGS (e.g. "--dtypes bf16 --shapes 32768x4097") go to harness.sweep;
#        SWEEP_VARIANT="name:DEFINE=V,..." sweeps a variant of the forward source too
#        (SWEEP_VARIANT_K: the pytest -k filter of its configs' check).
# ncu: NCU_CASES (e.g. "bf16:2048x65536 fp32:10922x12288") profiled, our kernels and peers
#      named in NCU_IMPLS (default triton,cuda,quack), one launch each; NCU_SECTIONS (e.g.
#      "WarpStateStats SourceCounters") adds those sections (stall reasons) to the metrics;
#      NCU_ARGS go to scripts/ncu_one.py (forced configs: --cuda-configs, --triton-configs);
#      NCU_OP (default rms_norm) names the op.
# backward: the backward's GPU tests, its CUDA kernels under memcheck and racecheck
#        (SKIP_RACECHECK=1: not racecheck; RACECHECK_BWD_K: its pytest -k filter instead of
#        the default), and scripts/bwd_probe.py (BWD_PROBE_ARGS go to it; SKIP_BWD_PROBE=1:
#        not it). BWD_TEST_K: the GPU tests' pytest -k filter instead of the default.
#        VARIANTS="v1:NAME=VALUE ..." (name:DEFINE=V[,DEFINE=V]) builds each
#        variant of the backward source (scripts/variant_build.py, while the tests run) and
#        probes it too (VARIANT_PROBE_ARGS).
# probe: scripts/compile_probe.py (PROBE_ARGS go to it): our Triton kernel alone and inside
#        torch.compile.
# cluster-racecheck: scripts/racecheck_cluster_probe.cu built and run with three starts of
#        the cluster sum, plain (its sums checked) and under racecheck.
# At most 8 files come back from a device call: build.log, run.log (every other step's
# output, appended) and the benchmark's results/ (records, report). The plots (five an op)
# are removed at the end, since with them the records did not come back; they are redrawn
# here from the records (python -m harness.plot). KEEP_PLOTS=1 keeps them.
# Needs: a CUDA GPU, nvcc, torch, triton. Optional wheels in .whl/ (liger-kernel, ...)
# are installed to /tmp/site first, and FlashInfer's trimmed package (.fi/) unpacked there.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-all}"
# mode NAME: whether this call runs NAME (all runs test and bench)
mode() { [[ ",$MODE," == *",$1,"* ]]; }
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the repo's packages, for scripts/*.py
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
PY=python3
status=0
step() { echo; echo "=== $* ($(date +%T))"; }
# build_variant SOURCE "name:DEFINE=V[,DEFINE=V]" [DEFINE=V ...]: SOURCE recompiled with the
# defines (those given after the spec first) into build/variants/name by
# scripts/variant_build.py, its output in /tmp/variant-name.log
build_variant() {
  local source=$1 spec=$2 d defs args=()
  shift 2
  IFS=, read -ra defs <<<"${spec#*:}"
  for d in "$@" "${defs[@]}"; do args+=(--define "$d"); done
  $PY scripts/variant_build.py --source "$source" "${args[@]}" --out "build/variants/${spec%%:*}" \
    >"/tmp/variant-${spec%%:*}.log" 2>&1
}

# unxz_to FILE.xz OUT WHAT: a committed (xz'd) records file decompressed to OUT, by
# Python's lzma (the device image need not have xz); where it fails, WHAT (the switch that
# asked for it) is said not to append and the call fails
unxz_to() {
  $PY -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$1" "$2" &&
    return 0
  echo "$3: the committed records did not decompress; not appended"
  status=1
  return 1
}

# racecheck_verdict LOG: errors in our kernels fail the call; warnings in them are counted
# (the cluster kernels' mbarrier.init against the mbarrier's later accesses, ordered by the
# cluster barrier, which racecheck does not model: docs/notebook/15-defects-round-3.md, v54,
# and the cluster-racecheck mode) and PyTorch's own kernels' reports (the reference's
# reductions) are not ours. The whole log goes to $OUT.
racecheck_verdict() {
  local errors warnings
  errors=$(grep -c "Error: Race reported.*rms_norm" "$1" || true)
  warnings=$(grep -c "Warning: Race reported.*rms_norm" "$1" || true)
  echo "racecheck in our kernels: $errors errors, $warnings warnings"
  cp "$1" "$OUT/"
  [[ "$errors" == 0 ]] || status=1
}

# Optional peers, carried as wheels (the device machine has no registry); fetch them here
# with scripts/fetch_peer_wheels.sh:
#   .whl/  liger-kernel (pure Python)
#   .qk1/, .qk3/, .qk4/, .qk2/  QuACK and its CuTe DSL. Its CUDA 13 library wheel (92 MB)
#   is repacked as a .tar.xz of its files (61 MB) in parts (.qk1, .qk3, .qk4), too large
#   together beside the working tree: the first carried with .qk2 (QuACK's other wheels),
#   .fi and .whl in a call of its own (with other work, or `bash scripts/h200.sh stage`),
#   the others with the real call to the still warm machine (within its 30 s).
#   .fi/  FlashInfer's norms (scripts/trim_flashinfer.py: flashinfer.norm and what it reads,
#   3 MB), unpacked into /tmp/site; it needs QuACK's DSL whole (.qk1-.qk4), both paths:
#   with .qk2's cutlass-dsl wheels but not their library, `import flashinfer` fails ("No
#   CTK flavor installed").
mkdir -p /tmp/qk
for d in .qk[0-9]* .fi; do [[ -d $d ]] && cp "$d"/* /tmp/qk/; done
mode stage && { ls -la /tmp/qk; exit 0; }
# the parts joined once the last has come (the joined file reads whole: a zip, or an xz'd
# tar to its end)
for part in /tmp/qk/*.part-aa; do
  [[ -e "$part" ]] || continue
  whole=${part%.part-aa}
  cat "$whole".part-* >"$whole.joined"
  if $PY -c "import sys, tarfile, zipfile; p = sys.argv[1]
zipfile.ZipFile(p).testzip() if sys.argv[2].endswith('.whl') else tarfile.open(p).getmembers()" \
    "$whole.joined" "$whole" 2>/dev/null; then
    mv "$whole.joined" "$whole" && rm "$whole".part-*
  else
    rm "$whole.joined"; echo "$(basename "$whole"): $(ls "$whole".part-* | wc -l) parts here, not all yet"
  fi
done
wheels=$(ls .whl/*.whl /tmp/qk/*.whl 2>/dev/null)
if [[ -n "$wheels" ]]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $wheels && export RMSNORM_SITE_DIRS=/tmp/site
fi
# the repacked wheels unpacked after pip, which replaces a package's folder whole (QuACK's
# library adds its files to the folder its other wheels share)
for tarball in /tmp/qk/*.tar.xz; do
  [[ -e "$tarball" ]] || continue
  case $(basename "$tarball") in
    flashinfer*) rm -rf /tmp/site/flashinfer /tmp/site/flashinfer_python-*.dist-info ;;
  esac
  $PY -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
    "$tarball" /tmp/site && export RMSNORM_SITE_DIRS=/tmp/site
done
for tarball in /tmp/qk/flashinfer*.tar.xz; do
  [[ -e "$tarball" ]] || continue
  # flashinfer_cuda's first call builds norm.cu (ninja, nvcc; ~/.cache/flashinfer), whose
  # headers include cublasLt.h and curand's: from torch's nvidia wheels where the toolkit
  # lacks them
  if [[ ! -e "$CUDA_HOME/include/cublasLt.h" ]]; then
    nv=$($PY -c "import glob, nvidia
print(min((h for d in nvidia.__path__ for h in glob.glob(d + '/*/include/cublasLt.h')), default=''))" 2>/dev/null)
    [[ -n "$nv" ]] && export FLASHINFER_EXTRA_CUDAFLAGS="-isystem ${nv%/cublasLt.h}"
  fi
done

step "environment"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
$PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
echo "commit: ${RMSNORM_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"

mode sweep && export RMSNORM_SWEEP_CONFIGS=1
# A warm machine keeps the last call's build: rebuild only when the sources or the build
# switches changed (the hash of what the extension is compiled from), not because the
# working tree was copied anew.
src_hash=$(cat setup.py cuda_impl/csrc/*.* cuda_impl/csrc/tuning/* | sha256sum | cut -c1-16)-${RMSNORM_SWEEP_CONFIGS:-0}
if [[ -f build/.src-hash && "$(cat build/.src-hash)" == "$src_hash" ]] && ls cuda_impl/_C*.so >/dev/null 2>&1; then
  step "build: unchanged since this machine's last build ($src_hash), kept"
else
  step "build (setup.py, -Xptxas -v${RMSNORM_SWEEP_CONFIGS:+, sweep-only configs})"
  start=$(date +%s%N)
  RMSNORM_PTXAS_VERBOSE=1 $PY setup.py build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  echo "build seconds: $(( ($(date +%s%N) - start) / 1000000 ))e-3"
  echo "kernels: $(grep -c 'Compiling entry' "$OUT/build.log")"
  grep -E "spill (stores|loads)" "$OUT/build.log" | grep -v " 0 bytes spill stores, 0 bytes spill loads" || echo "no spills"
  mkdir -p build && echo "$src_hash" >build/.src-hash
fi

if mode all || mode test || mode exhaustive; then
  # test: the GPU tier, README's `python -m pytest` (every op, kernel path and shipped
  # config; the exhaustive tier deselected by pyproject's addopts); exhaustive: that tier,
  # `-m exhaustive` (every sweep candidate, the builds). Both spread over TEST_WORKERS
  # processes (pytest-xdist, in the device's image) sharing the GPU.
  step "pytest (GPU$(mode exhaustive && echo ", the exhaustive tier"))"
  pytest_sel=(-n "${TEST_WORKERS:-8}")
  mode exhaustive && pytest_sel+=(-m exhaustive)
  # TEST_FILES (e.g. "tests/test_numerics.py tests/test_configs.py") and TEST_K (a pytest -k
  # filter): those tests, not the whole tier
  [[ -n "${TEST_K:-}" ]] && pytest_sel+=(-k "$TEST_K")
  # shellcheck disable=SC2086
  $PY -m pytest -q -p no:cacheprovider -rfEs --durations=15 "${pytest_sel[@]}" ${TEST_FILES:-} 2>&1 |
    grep -v "^DEBUG " || status=1
fi
if (mode all || mode test) && [[ "${SKIP_VALIDATE:-0}" != 1 ]]; then
  step "validation table"
  $PY -m harness.validate 2>&1 || status=1
fi
if mode heads; then
  # heads: test_heads' CUDA kernels under memcheck (the profiler's one-kernel tests left
  # out: they fail under the sanitizer), then scripts/heads_probe.py forward, backward and
  # backward with a weight row a head (HEADS_PROBE_ARGS, e.g. "--shapes 4096x32x128", go to
  # each)
  step "memcheck of test_heads"
  compute-sanitizer --tool memcheck --error-exitcode 9 --kernel-regex kns=rms_norm \
    $PY -m pytest -q -p no:cacheprovider -n 0 -m "" tests/test_heads.py \
    -k "not one_kernel and not one_pass" 2>&1 | tail -15
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
  for args in "" "--backward" "--backward --per-head"; do
    step "heads_probe ${args:-(forward)}"
    # shellcheck disable=SC2086
    $PY scripts/heads_probe.py $args ${HEADS_PROBE_ARGS:-} 2>&1 || status=1
  done
fi
if mode quant; then
  # quant: the quantised forward's CUDA kernels (rms_norm_quant_kernel) under memcheck, and
  # racecheck of its forms whose barriers share memory (the row sums, a group's max past a
  # warp)
  step "memcheck of test_quant"
  compute-sanitizer --tool memcheck --error-exitcode 9 --kernel-regex kns=rms_norm \
    $PY -m pytest -q -p no:cacheprovider -n 0 -m "" tests/test_quant.py -k cuda 2>&1 | tail -15
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
  step "racecheck of test_quant"
  compute-sanitizer --tool racecheck --kernel-regex kns=rms_norm \
    $PY -m pytest -q -p no:cacheprovider -n 0 -m "" tests/test_quant.py \
    -k "cuda and (group or token or bounded)" 2>&1 | grep -v "^DEBUG" >/tmp/racecheck-quant.log ||
    status=1
  tail -6 /tmp/racecheck-quant.log
  racecheck_verdict /tmp/racecheck-quant.log
fi
if mode all || mode sanitizers; then
  # only our kernels are instrumented (PyTorch's own reductions in the reference are not ours)
  SAN="--kernel-regex kns=rms_norm"
  compute-sanitizer $SAN /bin/true >/dev/null 2>&1 || { echo "(no kernel filter)"; SAN=""; }
  # SKIP_MEMCHECK=1, SKIP_RACECHECK=1: not that one (each a few minutes, serial)
  if [[ "${SKIP_MEMCHECK:-0}" != 1 ]]; then
  step "compute-sanitizer memcheck, our kernels only (cuda numerics + errors)"
  # the profiler (CUPTI) sees no kernels under the sanitizer: its test runs in pytest above
  compute-sanitizer --tool memcheck --error-exitcode 9 $SAN $PY -m pytest -q -p no:cacheprovider -n 0 -m "" \
    tests/test_numerics.py tests/test_errors.py tests/test_configs.py tests/test_fused_add.py \
    -k "cuda and not kernel_info_is_what_runs" 2>&1 | grep -v "^DEBUG" | tail -60 || status=1
  fi
  if [[ "${SKIP_RACECHECK:-0}" != 1 ]]; then
  step "compute-sanitizer racecheck (odd/strided/wide cases, every forced config but the variants)"
  # Judged on our kernels alone: when the filter is not accepted, PyTorch's own reduction
  # (the reference's mean) reports hazards that are not ours.
  compute-sanitizer --tool racecheck $SAN $PY -m pytest -q -p no:cacheprovider -n 0 -m "" \
    tests/test_numerics.py tests/test_configs.py tests/test_fused_add.py \
    -k "cuda and (n4095 or strided or offset or n17- or m4099 or n131072 or n262144 or 4d or (config and var0))" \
    2>&1 | grep -v "^DEBUG" >/tmp/racecheck.log || status=1
  tail -40 /tmp/racecheck.log
  racecheck_verdict /tmp/racecheck.log
  fi
fi

if mode all || mode bench || mode quick; then
  step "benchmark"
  flag=""; mode quick && flag="--quick"
  # BENCH_APPEND=1: the committed records first, this run's appended (the report takes the
  # last record of each shape and implementation): a run of one op beside the others'
  if [[ "${BENCH_APPEND:-0}" == 1 ]]; then
    mkdir -p "$OUT/results"
    unxz_to results/h200/records.jsonl.xz "$OUT/results/records.jsonl" BENCH_APPEND &&
      flag+=" --append"
  fi
  # BENCH_RESUME=FILE: a run of record that spans calls. FILE (records.jsonl, or .xz) is what
  # an earlier call of the same BENCH_ARGS brought back, kept in the tree; this call measures
  # what it lacks (harness.bench --resume) and brings the whole file back again
  if [[ -n "${BENCH_RESUME:-}" ]]; then
    mkdir -p "$OUT/results"
    if [[ "$BENCH_RESUME" == *.xz ]]; then
      unxz_to "$BENCH_RESUME" "$OUT/results/records.jsonl" BENCH_RESUME
    elif [[ -f "$BENCH_RESUME" ]]; then
      cp "$BENCH_RESUME" "$OUT/results/records.jsonl"
    else
      echo "BENCH_RESUME: $BENCH_RESUME is not a file here; the run starts afresh"
    fi
    flag+=" --resume"
  fi
  # shellcheck disable=SC2086
  $PY -m harness.bench $flag ${BENCH_ARGS:-} --require-gpu --budget-s "${BENCH_BUDGET_S:-480}" \
    --out "$OUT/results" 2>&1 || status=1
fi
if mode model; then
  step "the whole-model answer"
  # shellcheck disable=SC2086
  # MODEL_APPEND=1: appended to a copy of the committed model records (a run of some shapes)
  margs=""
  if [[ "${MODEL_APPEND:-0}" == 1 ]]; then
    mkdir -p "$OUT/model"
    unxz_to results/h200/model/records.jsonl.xz "$OUT/model/records.jsonl" MODEL_APPEND &&
      margs="--append"
  fi
  # shellcheck disable=SC2086
  $PY -m harness.model --require-gpu ${MODEL_ARGS:-} $margs --out "$OUT/model" 2>&1 || status=1
fi
if mode sweep; then
  # SWEEP_VARIANT="name:DEFINE=V[,DEFINE=V]": the forward source rebuilt with those defines
  # (and the sweep-only configs), built (niced) while the default build's sweep runs, whose
  # wide rows keep the GPU busy a launch at a time; then its configs checked against the
  # reference (SWEEP_VARIANT_K: the pytest -k filter) and the same sweep timed on it for the
  # CUDA kernel, beside the default build's
  if [[ -n "${SWEEP_VARIANT:-}" ]]; then
    vname=${SWEEP_VARIANT%%:*}
    (renice -n 19 "$BASHPID" >/dev/null
     build_variant 'cuda_impl/csrc/forward*.cu' "$SWEEP_VARIANT" RMSNORM_SWEEP_CONFIGS=1) &
    variant_build=$!
  fi
  step "every compiled fused config, sweep-only ones included, against the reference"
  $PY -m pytest -q -p no:cacheprovider -n 0 -m "" tests/test_fused_add.py -k cuda_fused_every_config 2>&1 | tail -5 || status=1
  step "sweep of launch configs"
  # shellcheck disable=SC2086
  $PY -m harness.sweep ${SWEEP_ARGS:-} --budget-s "${SWEEP_BUDGET_S:-420}" --out "$OUT/sweep.jsonl" 2>&1 || status=1
  if [[ -n "${SWEEP_VARIANT:-}" ]]; then
    step "variant $SWEEP_VARIANT of the forward: its build, every config against the reference, sweep"
    if wait "$variant_build"; then
      CUDA_IMPL_LIBRARY="build/variants/$vname/_C.so" timeout 300 $PY -m pytest -q -p no:cacheprovider -n 0 -m "" \
        tests/test_configs.py tests/test_fused_add.py -k "${SWEEP_VARIANT_K:-cuda and config}" 2>&1 | tail -5 || status=1
      # shellcheck disable=SC2086
      CUDA_IMPL_LIBRARY="build/variants/$vname/_C.so" $PY -m harness.sweep ${SWEEP_ARGS:-} \
        --kernels cuda --budget-s "${SWEEP_BUDGET_S:-420}" --out "$OUT/sweep-$vname.jsonl" \
        2>&1 || status=1
    else
      tail -20 "/tmp/variant-$vname.log"; status=1
    fi
  fi
fi
if mode ncu; then
  step "Nsight Compute (clock control off), one launch per kernel"
  metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
  metrics+=,dram__throughput.avg.pct_of_peak_sustained_elapsed
  metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
  metrics+=,launch__occupancy_limit_registers,launch__block_size,launch__grid_size
  sections=()
  for sec in ${NCU_SECTIONS:-}; do sections+=(--section "$sec"); done
  for case in ${NCU_CASES:-bf16:32768x4096}; do
    ncu --clock-control none --profile-from-start off --metrics "$metrics" ${sections[@]+"${sections[@]}"} \
      $PY scripts/ncu_one.py --op "${NCU_OP:-rms_norm}" --impls "${NCU_IMPLS:-triton,cuda,quack}" ${NCU_ARGS:-} \
      --dtype "${case%%:*}" --shape "${case#*:}" 2>&1 | grep -v "^==PROF==" || status=1
  done
fi
if mode backward; then
  declare -A variant_pid=()
  for v in ${VARIANTS:-}; do
    build_variant cuda_impl/csrc/rms_norm_backward.cu "$v" &
    variant_pid[${v%%:*}]=$!
  done
  step "pytest (GPU): the backward, and the fused add's gradients and split kernel"
  $PY -m pytest -q -p no:cacheprovider -rfEs tests/test_backward.py tests/test_fused_add.py \
    -k "${BWD_TEST_K:-backward or grad or split or odd}" 2>&1 | grep -v "^DEBUG " | tail -30 || status=1
  SAN="--kernel-regex kns=rms_norm"
  step "compute-sanitizer memcheck, the CUDA backward"
  compute-sanitizer --tool memcheck --error-exitcode 9 $SAN $PY -m pytest -q -p no:cacheprovider -n 0 -m "" \
    tests/test_backward.py -k "cuda and not compile" 2>&1 | grep -v "^DEBUG" | tail -8 || status=1
  if [[ "${SKIP_RACECHECK:-0}" != 1 ]]; then
    step "compute-sanitizer racecheck, the CUDA backward"
    # fp16 left to memcheck: its kernels are bf16's code with another T (the same shared
    # memory traffic), and racecheck took 343 s with all three dtypes
    compute-sanitizer --tool racecheck $SAN $PY -m pytest -q -p no:cacheprovider -n 0 -m "" \
      tests/test_backward.py -k "${RACECHECK_BWD_K:-cuda and not torch.float16- and (1031x4096 or 4095 or 4097 or 700x8192 or 32771 or 65536 or 16384 or layouts or determin)}" \
      2>&1 | grep -v "^DEBUG" >/tmp/racecheck-bwd.log || status=1
    tail -6 /tmp/racecheck-bwd.log
    racecheck_verdict /tmp/racecheck-bwd.log
  fi
  # the variants built first, so that no compile shares the CPU with a timed probe
  declare -A variant_rc=()
  for name in "${!variant_pid[@]}"; do
    wait "${variant_pid[$name]}"
    variant_rc[$name]=$?
  done
  if [[ "${SKIP_BWD_PROBE:-0}" != 1 ]]; then
    step "the backward kernels alone (a tuning probe, not a record)"
    # shellcheck disable=SC2086
    $PY scripts/bwd_probe.py ${BWD_PROBE_ARGS:-} 2>&1 || status=1
  fi
  for v in ${VARIANTS:-}; do
    name=${v%%:*}
    step "variant $v (the probe again, on its build)"
    [[ "${variant_rc[$name]:-1}" == 0 ]] || { tail -20 "/tmp/variant-$name.log"; status=1; continue; }
    # shellcheck disable=SC2086
    CUDA_IMPL_LIBRARY="build/variants/$name/_C.so" $PY scripts/bwd_probe.py \
      ${VARIANT_PROBE_ARGS:-${BWD_PROBE_ARGS:-}} 2>&1 || status=1
  done
fi
if mode cluster-racecheck; then
  # the cluster sum's racecheck warnings, a race or the tool's model of the barriers: the
  # shipped start beside a CTA barrier after the init and a releasing cluster arrive, each
  # run plain (sums checked) and under racecheck (scripts/racecheck_cluster_probe.cu)
  step "the cluster sum: three starts, plain and under racecheck"
  torch_dir=$($PY -c "import torch, os; print(os.path.dirname(torch.__file__))")
  mkdir -p build
  nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I"$torch_dir/include" \
    -o build/racecheck_cluster_probe scripts/racecheck_cluster_probe.cu || status=1
  for m in 0 1 2; do build/racecheck_cluster_probe "$m" || status=1; done
  for m in 0 1 2; do
    echo "--- start $m under racecheck"
    compute-sanitizer --tool racecheck --print-limit 8 build/racecheck_cluster_probe "$m" 4 1 2>&1 |
      sed -E 's/\(const float ?\*, float ?\*\)//' || status=1
  done
fi
if mode probe; then
  step "our Triton kernel alone and inside torch.compile"
  # shellcheck disable=SC2086
  $PY scripts/compile_probe.py ${PROBE_ARGS:-} 2>&1 || status=1
fi
[[ "${KEEP_PLOTS:-0}" == 1 ]] || find "$OUT" -name '*.png' -delete
exit $status
