#!/usr/bin/env bash
# one-off device call (not committed)
set -uo pipefail
export RMSNORM_GIT_SHA=62237c2f7221649da33060d9068a557c21215eb9
export CUDA_HOME=/usr/local/cuda PYTHONPATH=$PWD PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/run.log") 2>&1
step() { echo; echo "=== $* ($(date +%T))"; }
if [[ "${1:-}" == test ]]; then
  step build
  python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
  grep -c "Compiling entry" $OUT/build.log
  step tests
  timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_op.py tests/test_configs.py tests/test_errors.py tests/test_module.py 2>&1 | grep -v "^DEBUG" | tail -25
  step numerics cuda+triton
  timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_numerics.py 2>&1 | tail -6
  step memcheck
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 --kernel-regex kns=rms_norm python3 -m pytest -q -p no:cacheprovider tests/test_configs.py tests/test_numerics.py -k "cuda and (var32 or 4096 or 8192 or strided or offset)" 2>&1 | grep -v "^DEBUG" | tail -8
  step racecheck
  timeout 80 compute-sanitizer --tool racecheck --kernel-regex kns=rms_norm python3 -m pytest -q -p no:cacheprovider tests/test_configs.py -k "cuda and var32" 2>&1 | grep -c "Race reported"
  step done
else
  wheels=$(ls .whl/*.whl 2>/dev/null)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $wheels && export RMSNORM_SITE_DIRS=/tmp/site
  ls cuda_impl/_C*.so || python3 setup.py build_ext --inplace > $OUT/build.log 2>&1
  step decode bench
  python3 -m harness.bench --require-gpu --budget-s 100 --ops rms_norm --impls triton,cuda,native,liger,compile --dtypes bf16 --shapes 1x4096,8x4096,32x4096,128x4096,1x8192,8x8192,32x8192,128x8192 --out $OUT/decode 2>&1 | grep -v "^DEBUG" | tail -30
  step fp32 decode probe
  timeout 40 python3 scripts/decode_probe.py --dtype fp32 --shapes 8x2048,8x4096,8x16384 2>&1
  step grid bench
  python3 -m harness.bench --require-gpu --budget-s 330 --ops rms_norm --impls triton,cuda,native,liger,compile --dtypes fp32,bf16,fp16 --shapes 65536x2048,32776x4095,32768x4096,32760x4097,26214x5120,16384x8192,10922x12288,8192x16384 --out $OUT/grid 2>&1 | grep -v "^DEBUG" | tail -40
  rm -f $OUT/*/*.png $OUT/*/report.md
  step done
fi
