"""tools/pack_wheel.py OUTDIR: the built package of this tree (flashattn/*.py and the extension,
or a split build's two, an in-place or editable build left in flashattn/) packed as a
cp310-abi3 wheel, without compiling anything. CI's wheel check (.ci/run) installs it with
tools/wheel_check.sh: the same extension binary a user's build makes, installed as a wheel
outside the source tree. The release wheel is tools/build_wheel.sh's (a build from scratch,
then auditwheel's manylinux tag); this one keeps the plain linux_x86_64 tag."""
import re
import sys
from pathlib import Path

from wheel.wheelfile import WheelFile

ROOT = Path(__file__).resolve().parent.parent
TAG = "cp310-abi3-linux_x86_64"


def setup_value(pattern: str) -> str:
    m = re.search(pattern, (ROOT / "setup.py").read_text())
    if not m:
        raise SystemExit(f"pack_wheel: setup.py has no match for {pattern!r}")
    return m.group(1)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tools/pack_wheel.py OUTDIR")
    out = Path(sys.argv[1])
    pkg = ROOT / "flashattn"
    # _C, and _C_cuda of a split build (setup.py's FLASHATTN_SPLIT_CUDA)
    ext = sorted(pkg.glob("_C.*so")) + sorted(pkg.glob("_C_cuda.*so"))
    if len(sorted(pkg.glob("_C.*so"))) != 1 or len(sorted(pkg.glob("_C_cuda.*so"))) > 1:
        raise SystemExit(f"pack_wheel: expected one built extension flashattn/_C*.so (and at "
                         f"most one _C_cuda*.so), found {[p.name for p in ext]} (build in "
                         "place first)")
    version = setup_value(r'version="([^"]+)"')
    target = int(setup_value(r'TORCH_TARGET_VERSION = "(0x[0-9a-f]+)"'), 16)
    torch_min = f"{target >> 56}.{target >> 48 & 0xff}"
    files = sorted(p for p in pkg.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts and
                   (p.suffix == ".py" or p in ext))
    dist_info = f"flashattn-{version}.dist-info"
    metadata = (f"Metadata-Version: 2.1\nName: flashattn\nVersion: {version}\n"
                f"Requires-Python: >=3.10\nRequires-Dist: torch>={torch_min}\n")
    wheel_meta = (f"Wheel-Version: 1.0\nGenerator: flashattn tools/pack_wheel.py\n"
                  f"Root-Is-Purelib: false\nTag: {TAG}\n")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"flashattn-{version}-{TAG}.whl"
    with WheelFile(path, "w") as whl:  # writes RECORD on close
        for f in files:
            whl.write(str(f), f.relative_to(ROOT).as_posix())
        whl.writestr(f"{dist_info}/METADATA", metadata)
        whl.writestr(f"{dist_info}/WHEEL", wheel_meta)
    print(f"pack_wheel: {path} ({len(files)} files, {path.stat().st_size / 2**20:.1f} MiB, "
          f"torch>={torch_min})")


if __name__ == "__main__":
    main()
