"""FlashInfer's norms alone: the part of a flashinfer-python wheel that ``flashinfer.norm``'s
rmsnorm and fused_add_rmsnorm need on both their paths, as one .tar.xz small enough to ride
in a device call beside the other peers (the whole wheel is 101 MB, 715 MB installed).

    python3 scripts/trim_flashinfer.py WHEEL --out .fi           # .fi/NAME-VERSION+norm.tar.xz
    python3 scripts/trim_flashinfer.py WHEEL --trace SITE [SITE]  # rewrite the manifest

What is kept is data, scripts/flashinfer_norm.txt: paths in the wheel, a path ending in /
keeping that folder whole. ``--trace`` writes it from the wheel, on a machine where
apache-tvm-ffi and nvidia-cutlass-dsl import from the SITE directories (no GPU needed):

- the modules ``import flashinfer.norm`` loads with the CuTe DSL importable (a superset of
  those it loads without: the DSL path's modules and the CUDA path's JIT modules), plus
  every flashinfer module they import at module level in any branch (a try the DSL takes on
  one machine and not on another), plus the lazy imports on the two functions' call paths
  (CALL_PATH);
- the CUDA path's JIT sources, csrc/norm.cu and csrc/flashinfer_norm_binding.cu, and the
  headers they include from data/include and data/csrc, followed through #include (the
  same files nvcc's dependency output lists for an sm_90a build), and FlashInfer's vendored
  CCCL whole (it is put ahead of the toolkit's by -I). Not data/cutlass or data/spdlog:
  on the JIT's include path, never read by these sources.

The build replaces flashinfer/__init__.py by one that imports only the version: the
original imports every subpackage (the attention, GEMM and MoE code, 450 modules, and their
optional dependencies), and ``import flashinfer.norm`` runs it first. Nothing else is
changed. The dist-info is the wheel's with the version marked ``+norm`` (what the bench's
environment records), less RECORD and the console script (the ``flashinfer`` CLI, not
kept). Unpacked into a directory on sys.path (scripts/h200.sh: /tmp/site) it imports as
the package; its other needs are QuACK's wheels (apache-tvm-ffi; nvidia-cutlass-dsl for the
CuTe DSL path) and what the device image has (torch, filelock, jinja2, nvidia-ml-py,
requests, numpy, packaging, cuda-bindings; ninja and nvcc for the CUDA path's JIT).
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

MANIFEST = Path(__file__).with_name("flashinfer_norm.txt")
#: Imported inside the functions the two calls run, not at import: api_logging's
#: statistics module (its decorator, when FLASHINFER_LOGLEVEL asks for them).
CALL_PATH = ("flashinfer.jit.api_log_stats",)
#: The CUDA path's JIT module: flashinfer/jit/norm.py's gen_norm_module.
JIT_SOURCES = ("csrc/norm.cu", "csrc/flashinfer_norm_binding.cu")
#: Searched for a quoted or bracketed #include, in this order after the includer's folder
#: (the JIT's -isystem order for FlashInfer's own folders).
INCLUDE_DIRS = ("include", "csrc")
#: Kept whole: the vendored CCCL, which the JIT puts ahead of the toolkit's.
WHOLE = ("flashinfer/data/cccl/",)
SUFFIX = "+norm"
MINIMAL_INIT = '''"""flashinfer trimmed to flashinfer.norm (the rmsnorm study's
scripts/trim_flashinfer.py): the original __init__ imports every subpackage, not shipped."""

from .version import __git_commit__ as __git_commit__
from .version import __version__ as __version__
'''
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


# ---------------------------------------------------------------------------------------
# --trace: what flashinfer.norm reads
# ---------------------------------------------------------------------------------------


def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for f in (base / "__init__.py", base.with_suffix(".py")):
        if f.is_file():
            return f
    return None


def _imports_at_module_level(root: Path, module: str) -> set[str]:
    """The flashinfer modules ``module`` imports outside its function bodies, in any branch
    (try, if): for ``from X import name``, X and X.name where that is a module."""
    import ast

    path = _module_file(root, module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join(parts + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                found.add(target)
                found.update(f"{target}.{a.name}" for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m.split(".")[0] == "flashinfer" and _module_file(root, m)}


def _static_closure(root: Path, start: set[str]) -> set[str]:
    """start and every module reachable from it by module-level imports (their packages'
    __init__ too; the root package's is the minimal one, which imports nothing)."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        module = todo.pop()
        if module in seen or _module_file(root, module) is None:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(2, len(parts))]
        if module != "flashinfer":
            todo += _imports_at_module_level(root, module)
    return seen


_IMPORT_AND_LIST = """
import json, site, sys
for d in sys.argv[2:]:
    site.addsitedir(d)
sys.path.insert(0, sys.argv[1])
import flashinfer.norm as norm
files = sorted({m.__file__ for n, m in list(sys.modules.items())
                if n.split(".")[0] == "flashinfer" and getattr(m, "__file__", None)})
print(json.dumps({"cuda_path_only": norm._USE_CUDA_NORM, "files": files}))
"""


def _imported(root: Path, sites: list[str]) -> set[str]:
    """The flashinfer modules ``import flashinfer.norm`` loads in a fresh interpreter with
    the SITE directories added; refuses where the CuTe DSL did not import (its path's
    modules would be missing)."""
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_USE_CUDA_NORM"}
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_AND_LIST, str(root), *sites],
        check=True, capture_output=True, text=True, env=env,
    ).stdout  # fmt: skip
    got = json.loads(out.strip().splitlines()[-1])
    if got["cuda_path_only"]:
        sys.exit(
            "trim_flashinfer: flashinfer.norm fell back to its CUDA path here (the CuTe DSL "
            "did not import from the SITE directories): the DSL path's modules are unseen"
        )
    modules = set()
    for f in got["files"]:
        rel = Path(f).relative_to(root).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        modules.add(".".join(parts))
    return modules


def _included(data: Path) -> set[Path]:
    """The JIT sources and every header they reach through #include in FlashInfer's own
    folders (system, CUDA, CCCL and tvm-ffi headers are found elsewhere)."""
    seen: set[Path] = set()
    todo = [data / s for s in JIT_SOURCES]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        for name in _INCLUDE.findall(f.read_text(errors="replace")):
            for d in (f.parent, *(data / i for i in INCLUDE_DIRS)):
                p = Path(os.path.normpath(d / name))
                if p.is_file():
                    todo.append(p)
                    break
    return seen


def trace(wheel: Path, sites: list[str]) -> list[str]:
    """The manifest's paths, from the wheel unpacked into a temporary folder."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(root, [n for n in z.namelist() if n.startswith("flashinfer/")])
        (root / "flashinfer" / "__init__.py").write_text(MINIMAL_INIT)
        modules = _static_closure(root, _imported(root, sites) | set(CALL_PATH))
        files = {_module_file(root, m).relative_to(root).as_posix() for m in modules}
        data = root / "flashinfer" / "data"
        files |= {p.relative_to(root).as_posix() for p in _included(data)}
    files.discard("flashinfer/__init__.py")  # written by the build
    return sorted(files) + list(WHOLE)


def write_manifest(paths: list[str], wheel: Path) -> None:
    head = [
        f"# What scripts/trim_flashinfer.py keeps of {wheel.name}: paths in the wheel, a",
        "# path ending in / keeping that folder whole. Written by its --trace; see its",
        "# docstring for what is traced.",
    ]
    MANIFEST.write_text("\n".join(head + paths) + "\n")


# ---------------------------------------------------------------------------------------
# the build
# ---------------------------------------------------------------------------------------


def read_manifest() -> list[str]:
    lines = MANIFEST.read_text().splitlines()
    return [s for s in (line.strip() for line in lines) if s and not s.startswith("#")]


def build(wheel: Path, out: Path) -> Path:
    """The trimmed package in out, as NAME-VERSION+norm.tar.xz to unpack into a site
    directory: the manifest's files, the minimal __init__, and the dist-info (METADATA, with
    the version marked +norm, WHEEL, top_level.txt, the licenses; no RECORD, which only pip's
    uninstall reads). Refuses a wheel lacking a listed path."""
    keep = read_manifest()
    files, folders = {p for p in keep if not p.endswith("/")}, [p for p in keep if p.endswith("/")]
    name, version = wheel.name.split("-")[:2]
    info, new_info = f"{name}-{version}.dist-info/", f"{name}-{version}{SUFFIX}.dist-info/"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        missing = sorted(files - names) + [f for f in folders if not any(
            n.startswith(f) for n in names)]  # fmt: skip
        if missing:
            sys.exit(f"trim_flashinfer: {wheel.name} lacks {', '.join(missing[:5])}")
        chosen = [n for n in names if n in files or n.startswith(tuple(folders))]
        contents = {n: z.read(n) for n in chosen}
        contents["flashinfer/__init__.py"] = MINIMAL_INIT.encode()
        for n in ("METADATA", "WHEEL"):
            contents[new_info + n] = z.read(info + n)
        for n in names:
            if n.startswith(info + "licenses/") and not n.endswith("/"):
                contents[new_info + n[len(info) :]] = z.read(n)
    meta = contents[new_info + "METADATA"].decode()
    meta = re.sub(r"^Version: .*$", f"Version: {version}{SUFFIX}", meta, count=1, flags=re.M)
    contents[new_info + "METADATA"] = meta.encode()
    contents[new_info + "top_level.txt"] = b"flashinfer\n"
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{name}-{version}{SUFFIX}.tar.xz"
    # one xz stream over the whole tar: the headers and sources share most of their text,
    # which a wheel's per-file deflate cannot use (a third of the size of the same files
    # as a wheel); entries sorted, owner and times zeroed, so the same wheel gives the
    # same bytes
    with lzma.open(target, "wb", preset=9 | lzma.PRESET_EXTREME) as xz:
        with tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for n in sorted(contents):
                entry = tarfile.TarInfo(n)
                entry.size, entry.mode = len(contents[n]), 0o644
                tar.addfile(entry, io.BytesIO(contents[n]))
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 scripts/trim_flashinfer.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("wheel", type=Path, help="flashinfer_python-*.whl")
    p.add_argument("--out", type=Path, default=Path(".fi"), help="folder of the .tar.xz")
    p.add_argument("--trace", nargs="+", metavar="SITE", help="rewrite the manifest instead")
    args = p.parse_args(argv)
    if args.trace:
        paths = trace(args.wheel, args.trace)
        write_manifest(paths, args.wheel)
        print(f"{MANIFEST}: {len(paths)} paths")
        return 0
    target = build(args.wheel, args.out)
    print(f"{target}: {target.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
