#!/usr/bin/env bash
# one-off device call (not committed)
set -uo pipefail
export RMSNORM_GIT_SHA=e17e33814a0ce8fd690b012852626da616b318bf
export CUDA_HOME=/usr/local/cuda PYTHONPATH=$PWD PYTHONUNBUFFERED=1
L=$OUT/run.log
exec > >(tee -a "$L") 2>&1
step() { echo; echo "=== $* ($(date +%T))"; }
step build sweep
RMSNORM_SWEEP_CONFIGS=1 python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
step tests
python3 -m pytest -q -p no:cacheprovider -x tests/test_op.py -k "bypass or fast_path or graph or plan_cache" 2>&1 | tail -15
python3 -m pytest -q -p no:cacheprovider tests/test_configs.py -k "var32 or cuda_config_table or sweep_only or kernel_info" 2>&1 | tail -8
step decode probe
python3 scripts/decode_probe.py --cuda 512x4x1/128x4x32/256x2x32/512x1x32/256x4x32/512x2x32/128x8x32 2>&1
step sweep fp32
python3 -m harness.sweep --kernels triton,cuda --dtypes fp32 --shapes 32768x4096,16384x8192,10922x12288,65536x2048,26214x5120,8192x16384,4096x32768 --where triton:kernel=chunked,block_n=1024 --where triton:kernel=chunked,block_n=2048 --where cuda:variant=32 --budget-s 240 --out $OUT/sweep-fp32.jsonl 2>&1 | grep -v "^DEBUG"
step sweep bf16
python3 -m harness.sweep --kernels triton,cuda --dtypes bf16 --shapes 10922x12288,4096x32768,16384x8192,32768x4096,8192x16384 --where triton:kernel=chunked,block_n=1024 --where triton:kernel=chunked,block_n=2048 --where cuda:variant=32 --budget-s 150 --out $OUT/sweep-bf16.jsonl 2>&1 | grep -v "^DEBUG"
step ncu fp32 32768x4096
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__block_size,launch__grid_size,smsp__inst_executed.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_sectors_srcunit_tex_op_read.sum
timeout 200 ncu --clock-control none --profile-from-start off --metrics "$metrics" python3 scripts/ncu_one.py --impls triton,cuda,compile --dtype fp32 --shape 32768x4096 --cuda-configs 512x1x1x32/512x2x1x32 2>&1 | grep -v "^==PROF==" | grep -v "^DEBUG"
step done
