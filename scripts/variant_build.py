"""Build a variant of the extension for a probe: some sources recompiled with extra defines
(--source, repeatable; a glob such as 'cuda_impl/csrc/forward*.cu' for the forward's
units), linked with the default build's other objects, so a probe of a build switch costs
those files' compile instead of the whole build.

    python3 scripts/variant_build.py --define NAME=VALUE --out build/variants/v1
    CUDA_IMPL_LIBRARY=build/variants/v1/_C.so python3 scripts/bwd_probe.py --impls cuda

Needs the default build (``python setup.py build_ext --inplace``): its build.ninja gives
the compiler and the flags, its objects the rest of the library.
"""

import argparse
import glob
import os
import re
import shlex
import subprocess
import sys

import torch


def ninja_build() -> tuple[dict[str, str], dict[str, str]]:
    """The default build's variables and its objects (source path -> object path)."""
    found = sorted(glob.glob("build/temp*/build.ninja"))
    if not found:
        sys.exit("variant_build: no build/temp*/build.ninja; run setup.py build_ext first")
    text = open(found[-1]).read()
    variables = dict(re.findall(r"^(\w+) = (.*)$", text, re.M))
    objects = {src: obj for obj, src in re.findall(r"^build (\S+): \w*compile (\S+)$", text, re.M)}
    return variables, objects


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "--source",
        action="append",
        help="a source or a glob, repeatable"
        " (default: the backward, cuda_impl/csrc/rms_norm_backward.cu)",
    )
    p.add_argument("--define", action="append", required=True, help="NAME=VALUE, repeatable")
    p.add_argument("--out", required=True, help="folder for the object and _C.so")
    args = p.parse_args()
    variables, objects = ninja_build()
    patterns = args.source or ["cuda_impl/csrc/rms_norm_backward.cu"]
    sources = sorted({os.path.abspath(f) for p in patterns for f in glob.glob(p)})
    missing = [s for s in sources if s not in objects]
    if not sources or missing:
        sys.exit(f"variant_build: --source {patterns} names no source of the default build")
    os.makedirs(args.out, exist_ok=True)
    defines = " ".join(shlex.quote(f"-D{d}") for d in args.define)
    built = []
    for source in sources:
        obj = os.path.join(args.out, os.path.basename(source) + ".o")
        # the flags as ninja has them (quoted for a shell), the defines last
        compile_cmd = (
            f"{variables['nvcc']} {variables['cuda_cflags']} -c {shlex.quote(source)}"
            f" -o {shlex.quote(obj)} {variables['cuda_post_cflags']} {defines}"
        )
        subprocess.run(["bash", "-c", compile_cmd], check=True)
        built.append(obj)
    others = [o for s, o in objects.items() if s not in sources]
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    libs = ["c10", "torch", "torch_cpu", "torch_python", "cudart", "c10_cuda", "torch_cuda"]
    so = os.path.join(args.out, "_C.so")
    subprocess.run(
        [
            variables.get("cxx", "c++"),
            "-shared",
            *built,
            *others,
            f"-L{os.path.join(torch.__path__[0], 'lib')}",
            f"-L{cuda_home}/lib64",
            *[f"-l{lib}" for lib in libs],
            "-o",
            so,
        ],
        check=True,
    )
    print(f"variant {' '.join(args.define)}: {so}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
