#!/usr/bin/env bash
# Download the optional peers (Liger-Kernel, QuACK and its CuTe DSL, FlashInfer) for the
# device machine (Python 3.12, x86-64, no registry there), into folders git ignores:
#   .whl/  liger-kernel                      (carry it with every bench call)
#   .qk1/, .qk3/, .qk4/  QuACK's CUDA 13 library wheel (92 MB as a zip) repacked as an
#          xz'd tar of its files (61 MB; h200.sh unpacks it into the site folder), in parts
#          of PART_BYTES: the first carried with .qk2, .fi and .whl in a call of its own
#          (with other work, or a `h200.sh stage` call), the others together with the bench
#          call to the still warm machine. LIBS_WHEEL: that wheel already here, used instead
#          of downloading it
#   .qk2/  QuACK's other wheels
#   .fi/   FlashInfer's norms: flashinfer-python's wheel (101 MB) cut by
#          scripts/trim_flashinfer.py to flashinfer.norm and what it reads, one .tar.xz
#          (3 MB; stage it like a part: it imports only beside QuACK's DSL whole, .qk1-.qk4,
#          whichever path it takes). FI_WHEEL:
#          a flashinfer_python-*.whl already here, used instead of downloading it
# One device call carries at most 64 MiB with the working tree (21 MB of tracked files,
# the committed records, sweeps and probes xz'd, and growing), hence the parts (26, 26 and
# 9 MB: the first beside the tree, .qk2, .fi and .whl, 60 MB; the other two beside the
# tree, 56 MB); h200.sh joins them.
set -euo pipefail
cd "$(dirname "$0")/.."
PART_BYTES=${PART_BYTES:-26000000}
FI_VERSION=0.7.4
mkdir -p .git/info .whl .qk2
for d in /.whl/ /.qk1/ /.qk2/ /.qk3/ /.qk4/ /.qk5/ /.qk6/ /.qk7/ /.qk8/ /.qk9/ /.fi/; do
  grep -qxF "$d" .git/info/exclude || echo "$d" >>.git/info/exclude
done
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
fi_wheel=${FI_WHEEL:-}
if [[ -z "$fi_wheel" ]]; then
  get "$tmp" "flashinfer-python==$FI_VERSION"
  fi_wheel="$tmp/flashinfer_python-$FI_VERSION-py3-none-any.whl"
fi
rm -rf .fi && python3 scripts/trim_flashinfer.py "$fi_wheel" --out .fi
libs_wheel=${LIBS_WHEEL:-}
if [[ -z "$libs_wheel" ]]; then
  get "$tmp" nvidia-cutlass-dsl-libs-cu13==4.8.1
  libs_wheel=$(ls "$tmp"/nvidia_cutlass_dsl_libs_cu13-*.whl)
fi
# the wheel's files, modes kept, as an xz'd tar: its IR library deflates to 73 MB, xz's
# strongest preset takes it to 50 and the whole to 61 (minutes here)
big="$tmp/$(basename "$libs_wheel" .whl).tar.xz"
python3 - "$libs_wheel" "$big" <<'PY'
import sys
import tarfile
import zipfile

with zipfile.ZipFile(sys.argv[1]) as whl, tarfile.open(sys.argv[2], "w:xz", preset=9) as tar:
    for info in whl.infolist():
        if info.is_dir():
            continue
        member = tarfile.TarInfo(info.filename)
        member.size = info.file_size
        member.mode = (info.external_attr >> 16) & 0o777 or 0o644
        with whl.open(info) as data:
            tar.addfile(member, data)
PY
split -b "$PART_BYTES" "$big" "$tmp/$(basename "$big").part-"
# the parts into .qk1, .qk3, .qk4, ... (.qk2 holds the other wheels)
dirs=(.qk1 .qk3 .qk4 .qk5 .qk6 .qk7 .qk8 .qk9)
rm -rf "${dirs[@]}"  # an earlier split's parts would join with these into a broken file
i=0
for part in "$tmp"/*.part-*; do
  if ((i == ${#dirs[@]})); then
    echo "fetch_peer_wheels: the library wheel outgrew ${#dirs[@]} parts; raise PART_BYTES" >&2
    exit 1
  fi
  mkdir -p "${dirs[$i]}" && mv "$part" "${dirs[$i]}/"
  i=$((i + 1))
done
rm -rf "$tmp"
du -sh .whl .qk* .fi
