"""Build flashattn: two stable-ABI, limited-API extensions, `flashattn._C` and, with CUDA,
`flashattn._C_cuda` (or one: see FLASHATTN_SPLIT_CUDA).

Build flags (environment variables; each but FLASHATTN_FORCE_CUDA is also a C++ macro and a key
of flashattn/_build_config.py's BUILD_CONFIG; FLASHATTN_HEADDIMS's macro is
FLASHATTN_HEADDIM_MASK):
  FLASHATTN_DISABLE_CUDA=1      CPU backend only
  FLASHATTN_FORCE_CUDA=1        compile CUDA sources even if the toolkit looks mismatched
  FLASHATTN_DISABLE_SM80=1      no portable CUDA kernels
  FLASHATTN_DISABLE_SM90=1      no Hopper kernels
  FLASHATTN_DISABLE_BACKWARD=1  no CUDA backward kernels (the CPU backward stays)
  FLASHATTN_DISABLE_FP8=1       no FP8 (float8_e4m3fn) forward on any backend: FP8 calls raise
                                an error naming the flag (issue 14)
  FLASHATTN_DISABLE_DROPOUT=1   no CUDA dropout kernels (the CPU's dropout stays): a CUDA call
                                with dropout_p > 0 raises naming the flag (a shorter build)
  FLASHATTN_DISABLE_BLOCK_SPARSE=1  no CUDA block-sparse kernels (the CPU's stay), likewise
  FLASHATTN_SPLIT_CUDA=0        one extension, `_C`, holding the CUDA kernels too (it then needs
                                a CUDA torch). Default (unset or 1): the CUDA kernels in a
                                second extension, flashattn._C_cuda, which flashattn/__init__.py
                                loads only when torch has CUDA: `_C` (the API and the CPU
                                backend) links torch's CPU libraries alone, so the same wheel
                                imports on a CPU-only torch (csrc/common/cuda_table.h); the
                                CUDA tests passed with it on an H100, 2026-12-06
  FLASHATTN_LINEINFO=1          nvcc -lineinfo (source lines for profilers and sanitizers;
                                off by default: a release wheel does not carry them)
  TORCH_CUDA_ARCH_LIST          the CUDA targets (tools/build_archs.py: "9.0a" or "9.0" builds
                                the Hopper family for sm_90a and the portable one for sm_90)
  FLASHATTN_HEADDIMS            developer switch: build only these head-dim buckets ("128")
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))
import build_archs  # noqa: E402
import generate_instantiations  # noqa: E402
import generate_wgmma  # noqa: E402

FLAGS = ["FLASHATTN_DISABLE_CUDA", "FLASHATTN_DISABLE_SM80", "FLASHATTN_DISABLE_SM90",
         "FLASHATTN_DISABLE_BACKWARD", "FLASHATTN_DISABLE_FP8", "FLASHATTN_DISABLE_DROPOUT",
         "FLASHATTN_DISABLE_BLOCK_SPARSE", "FLASHATTN_LINEINFO", "FLASHATTN_SPLIT_CUDA"]
NVCC_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xcompiler=-fvisibility=hidden"]
TORCH_TARGET_VERSION = "0x020a000000000000"  # the stable ABI of torch 2.10: runs on >= 2.10
# The same version as "major.minor": BUILD_CONFIG's torch_target_version (flashattn/__init__.py
# refuses an older torch before loading the extension) and the wheel's torch requirement.
_TARGET = int(TORCH_TARGET_VERSION, 16)
TORCH_TARGET = f"{_TARGET >> 56}.{_TARGET >> 48 & 0xff}"
# Python's limited API (3.10+): torch's cpp_extension adds -DPy_LIMITED_API=0x030A0000 for
# py_limited_api=True extensions.


DEFAULT_ON = {"FLASHATTN_SPLIT_CUDA"}  # flags that an unset variable turns on


def env_flag(name):
    default = "1" if name in DEFAULT_ON else "0"
    return os.environ.get(name, default).strip().lower() in ("1", "true", "yes", "on")


def nvcc_version(cuda_home):
    try:
        out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def want_cuda():
    """CUDA sources are built when a toolkit matching torch's CUDA major version is found."""
    import torch
    from torch.utils.cpp_extension import CUDA_HOME
    if env_flag("FLASHATTN_DISABLE_CUDA"):
        return False, "disabled by FLASHATTN_DISABLE_CUDA"
    if torch.version.cuda is None:
        return False, "torch has no CUDA"
    if CUDA_HOME is None or nvcc_version(CUDA_HOME) is None:
        if env_flag("FLASHATTN_FORCE_CUDA"):
            raise RuntimeError("FLASHATTN_FORCE_CUDA=1 but no nvcc found (set CUDA_HOME)")
        return False, "no CUDA toolkit found (set CUDA_HOME)"
    found = nvcc_version(CUDA_HOME)
    torch_major = int(torch.version.cuda.split(".")[0])
    if found[0] != torch_major and not env_flag("FLASHATTN_FORCE_CUDA"):
        return False, f"nvcc {found} does not match torch's CUDA {torch.version.cuda}"
    return True, f"nvcc {found[0]}.{found[1]} at {CUDA_HOME}"


def cuda_targets():
    """Per source family, the targets TORCH_CUDA_ARCH_LIST asks for (tools/build_archs.py)."""
    native = ()
    value = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if value and value.strip() == "native":
        import torch
        native = tuple(10 * a + b for a, b in (torch.cuda.get_device_capability(i)
                                               for i in range(torch.cuda.device_count())))
    return value, build_archs.family_targets(value, native)


def write_build_config(config):
    lines = ['"""Generated by setup.py at build time; do not edit."""', "BUILD_CONFIG = {"]
    for key, value in config.items():
        lines.append(f"    {key!r}: {value!r},")
    lines.append("}")
    (ROOT / "flashattn" / "_build_config.py").write_text("\n".join(lines) + "\n")


def write_targets_header(target):
    """csrc/sm80/build_targets.h: the sm80 family's targets, so that the API layer can tell
    native machine code from PTX run by JIT (a header: nvcc splits a -D value at commas)."""
    path = ROOT / "csrc" / "sm80" / "build_targets.h"
    text = ("// Generated by setup.py at build time; do not edit.\n#pragma once\n"
            f"#define FLASHATTN_SM80_SASS {', '.join(target['sass']) or '0'}\n"
            f"#define FLASHATTN_SM80_PTX {', '.join(target['ptx']) or '0'}\n")
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def shared_libstdcxx():
    """The libstdc++.so that torch runs with, linked in by path: a compiler that links libstdc++
    statically (seen: a g++ wrapper on the H200 machine) would otherwise give the extension its
    own C++ runtime, and an error thrown across into torch then crashes the process."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libstdc++.so" in line}
    except OSError:
        return []
    return sorted(paths)[:1]


def make_extensions():
    import torch
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    cuda, why = want_cuda()
    config = {flag: env_flag(flag) for flag in FLAGS}
    config["FLASHATTN_DISABLE_CUDA"] = not cuda
    if not cuda:
        config["FLASHATTN_DISABLE_SM80"] = True
        config["FLASHATTN_DISABLE_SM90"] = True
        config["FLASHATTN_DISABLE_BACKWARD"] = True
        config["FLASHATTN_LINEINFO"] = False
        config["FLASHATTN_SPLIT_CUDA"] = False
    generate_instantiations.main()
    generate_wgmma.main()
    buckets = [d for d, _ in generate_instantiations.head_dims()]
    hdim_mask = build_archs.head_dim_selection(os.environ.get("FLASHATTN_HEADDIMS"), buckets)
    built_hdims = [b for i, b in enumerate(buckets) if hdim_mask >> i & 1]
    arch_value, targets = cuda_targets() if cuda else (None, {})

    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "api").glob("*.cpp"))
    sources += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "cpu").glob("*.cpp"))
    cuda_archs, nvcc_flags, separate = [], [], []
    sm80_target = {"sass": [], "ptx": []}
    for family in ("sm80", "sm90"):
        key = f"FLASHATTN_DISABLE_{family.upper()}"
        cu = list((ROOT / "csrc" / family).glob("*.cu"))
        cu += [p for p in (ROOT / "csrc" / "instantiations").glob(f"*_{family}_*.cu")
               if generate_instantiations.file_bucket(p.name) in built_hdims]
        if config["FLASHATTN_DISABLE_BACKWARD"]:
            cu = [p for p in cu if "bwd" not in p.name]
        if config["FLASHATTN_DISABLE_FP8"]:  # FP8 sources carry "e4m3" in their names
            cu = [p for p in cu if "e4m3" not in p.name]
        target = targets.get(family, {"sass": [], "ptx": []})
        flags = build_archs.gencode_flags(target)
        if config[key] or not cu or not flags:
            config[key] = True  # off, or narrowed away by TORCH_CUDA_ARCH_LIST
            continue
        cuda_archs += [f"sm_{a}" for a in target["sass"]]
        cu = sorted(str(p.relative_to(ROOT)) for p in cu)
        if family == "sm80":  # compiled by torch's ninja build with the extension's flags
            sources += cu
            nvcc_flags = flags
            sm80_target = target
        else:                 # its own arch flags: compiled first, linked in as objects
            separate.append((family, cu, flags))
    if cuda and config["FLASHATTN_DISABLE_SM80"] and config["FLASHATTN_DISABLE_SM90"] and not (
            env_flag("FLASHATTN_DISABLE_SM80") and env_flag("FLASHATTN_DISABLE_SM90")):
        raise build_archs.no_kernels_error(arch_value)
    config["cuda_archs"] = cuda_archs
    config["FLASHATTN_HEADDIMS"] = built_hdims
    config["torch_version"] = torch.__version__
    config["torch_target_version"] = TORCH_TARGET
    config["cuda_version"] = torch.version.cuda if cuda else None
    write_build_config(config)
    n_sm90 = sum(len(cu) for _, cu, _ in separate)
    print(f"flashattn: CUDA {'on' if cuda else 'off'} ({why}); TORCH_CUDA_ARCH_LIST="
          f"{arch_value!r}; archs {cuda_archs}; head dims {built_hdims}; "
          f"{len(sources) + n_sm90} sources ({n_sm90} sm90)", flush=True)

    defines = [f"-D{flag}" for flag in FLAGS if config[flag]]
    defines.append(f"-DFLASHATTN_HEADDIM_MASK={hdim_mask}")
    write_targets_header(sm80_target)
    cxx = ["-O3", "-std=c++17", "-fvisibility=hidden",
           f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}"] + defines
    common = dict(py_limited_api=True, include_dirs=[str(ROOT / "csrc")],
                  extra_link_args=shared_libstdcxx())
    if not cuda:
        return [CppExtension("flashattn._C", sources, extra_compile_args={"cxx": cxx}, **common)]
    nvcc = NVCC_FLAGS + (["-lineinfo"] if config["FLASHATTN_LINEINFO"] else []) + defines
    if config["FLASHATTN_SPLIT_CUDA"]:
        # _C: the API and CPU sources, no CUDA library; _C_cuda: the kernel families and the
        # table that hands them to _C (csrc/cuda_table/).
        host = [s for s in sources if not s.endswith(".cu")]
        kernels = [s for s in sources if s.endswith(".cu")] + ["csrc/cuda_table/cuda_table.cpp"]
        exts = [CppExtension("flashattn._C", host, extra_compile_args={"cxx": cxx}, **common),
                CUDAExtension("flashattn._C_cuda", kernels,
                              extra_compile_args={"cxx": cxx, "nvcc": nvcc + nvcc_flags},
                              **common)]
    else:
        exts = [CUDAExtension("flashattn._C", sources,
                              extra_compile_args={"cxx": cxx, "nvcc": nvcc + nvcc_flags},
                              **common)]
    exts[-1].flashattn_separate = [(family, cu, nvcc + flags) for family, cu, flags in separate]
    return exts


def check_cxx_runtime(path):
    """Fails the build if the extension carries its own static C++ runtime (see
    shared_libstdcxx): better an error now than a crash at the first bad-input error."""
    if not sys.platform.startswith("linux") or shutil.which("readelf") is None:
        return
    dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    if "libstdc++" not in dynamic:
        raise RuntimeError(
            f"flashattn: {path} does not load libstdc++.so (the compiler, CXX="
            f"{os.environ.get('CXX', 'default')}, linked the C++ runtime statically); C++ "
            "errors raised into torch would crash. Build with a g++ that links it dynamically, "
            "e.g. CXX=/usr/bin/g++.")


def build_ext_cls():
    from concurrent.futures import ThreadPoolExecutor

    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension

    class BuildExt(BuildExtension.with_options(use_ninja=True)):
        """torch's ninja build, plus source families that need their own arch flags (Hopper's
        sm_90a): compiled here with nvcc, in parallel, and linked in as extra objects."""

        def build_extensions(self):
            for ext in self.extensions:
                for family, sources, flags in getattr(ext, "flashattn_separate", []):
                    ext.extra_objects += self.compile_family(family, sources, flags)
            super().build_extensions()
            for ext in self.extensions:
                check_cxx_runtime(self.get_ext_fullpath(ext.name))

        def compile_family(self, family, sources, flags):
            out_dir = Path(self.build_temp).resolve() / family
            out_dir.mkdir(parents=True, exist_ok=True)
            headers = [p.stat().st_mtime for p in (ROOT / "csrc").rglob("*.h*")]
            newest_header = max(headers, default=0)
            nvcc = os.path.join(CUDA_HOME, "bin", "nvcc")
            # Objects compiled with other flags (e.g. FLASHATTN_LINEINFO toggled) are stale.
            stamp = out_dir / "flags.txt"
            same_flags = stamp.exists() and stamp.read_text() == "\n".join(flags)
            stamp.unlink(missing_ok=True)

            def compile_one(src):
                obj = out_dir / (Path(src).stem + ".o")
                src_path = ROOT / src
                if same_flags and obj.exists() and obj.stat().st_mtime > max(
                        src_path.stat().st_mtime, newest_header):
                    return str(obj)
                cmd = [nvcc, *flags, "-Xcompiler=-fPIC", f"-I{ROOT / 'csrc'}", "-c",
                       str(src_path), "-o", str(obj)]
                print(f"flashattn: [{family}] nvcc {src}", flush=True)
                subprocess.run(cmd, check=True)
                return str(obj)

            jobs = int(os.environ.get("MAX_JOBS", os.cpu_count() or 1))
            with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                objects = list(pool.map(compile_one, sources))
            stamp.write_text("\n".join(flags))
            return objects

    return BuildExt


setup(
    name="flashattn",
    version="0.1.0",
    description="Exact FlashAttention for PyTorch: fused tiled kernels, CPU backend, "
                "flash-attn 2.x compatible API",
    packages=find_packages(include=["flashattn", "flashattn.*"]),
    ext_modules=make_extensions(),
    cmdclass={"build_ext": build_ext_cls()},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
    python_requires=">=3.10",
    install_requires=[f"torch>={TORCH_TARGET}"],
)
