#!/usr/bin/env bash
# Download the optional peers (Liger-Kernel, QuACK and its CuTe DSL) as wheels for the
# device machine (Python 3.12, x86-64, no registry there), into folders git ignores:
#   .whl/  liger-kernel                      (carry it with every bench call)
#   .qk1/, .qk3/, .qk4/  QuACK's CUDA 13 library wheel (92 MB) in three 31 MB parts, each
#          carried alone, in a `h200.sh stage` call of its own, to a warm machine
#   .qk2/  QuACK's other wheels (carry with .whl for `bench`)
# One device call carries at most 64 MiB with the working tree (22 MB), hence the split;
# h200.sh joins the parts.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info .whl .qk1 .qk2 .qk3 .qk4
for d in /.whl/ /.qk1/ /.qk2/ /.qk3/ /.qk4/; do grep -qxF "$d" .git/info/exclude || echo "$d" >>.git/info/exclude; done
get() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$1" "$2"
}
get .whl liger-kernel==0.8.5
tmp=$(mktemp -d)
for pkg in quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5; do
  get .qk2 "$pkg"
done
get "$tmp" nvidia-cutlass-dsl-libs-cu13==4.8.1
big=$(ls "$tmp"/nvidia_cutlass_dsl_libs_cu13-*.whl)
split -b 31000000 "$big" "$tmp/$(basename "$big").part-"
mv "$tmp"/*.part-aa .qk1/
mv "$tmp"/*.part-ab .qk3/
mv "$tmp"/*.part-ac .qk4/
if ls "$tmp"/*.part-* >/dev/null 2>&1; then
  echo "fetch_peer_wheels: the library wheel outgrew three parts; add a .qk folder" >&2
  exit 1
fi
rm -rf "$tmp"
du -sh .whl .qk1 .qk2 .qk3 .qk4
