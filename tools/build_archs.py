"""TORCH_CUDA_ARCH_LIST -> the CUDA targets of each source family, and FLASHATTN_HEADDIMS -> the
head-dim buckets built. Imported by setup.py; tested by tests/test_build_archs.py (no torch,
no CUDA toolkit needed).

Families:
  sm80 (csrc/sm80, portable): machine code for every listed arch >= 8.0 (a/f suffixes
       dropped: "9.0a" also means plain sm_90 for this family), plus PTX of the newest one
       and of every "+PTX" entry, so newer GPUs JIT-compile it.
  sm90 (csrc/sm90, Hopper only): sm_90a machine code, when the list names 9.0 or 9.0a.
Unset: sm80 -> sm_80, sm_90 + compute_90 PTX; sm90 -> sm_90a.
"""
import re

# torch.utils.cpp_extension's names (same expansion order: combined names first).
NAMED_ARCHS = [
    ("Kepler+Tesla", "3.7"), ("Kepler", "3.5+PTX"), ("Maxwell+Tegra", "5.3"),
    ("Maxwell", "5.0;5.2+PTX"), ("Pascal", "6.0;6.1+PTX"), ("Volta+Tegra", "7.2"),
    ("Volta", "7.0+PTX"), ("Turing", "7.5+PTX"), ("Ampere+Tegra", "8.7"),
    ("Ampere", "8.0;8.6+PTX"), ("Ada", "8.9+PTX"), ("Hopper", "9.0+PTX"),
    ("Blackwell+Tegra", "11.0"), ("Blackwell", "10.0;10.3;12.0;12.1+PTX"), ("Rubin", "10.7+PTX"),
]
DEFAULT = {"sm80": {"sass": ["80", "90"], "ptx": ["90"]}, "sm90": {"sass": ["90a"], "ptx": []}}
_ENTRY = re.compile(r"^(\d+)\.(\d)([af]?)(\+PTX)?$", re.IGNORECASE)


class ArchListError(ValueError):
    pass


def parse_arch_list(value, native=()):
    """Entries of a TORCH_CUDA_ARCH_LIST value as (cc, suffix, ptx) with cc = 10*major + minor;
    None when unset. `native` lists the visible GPUs' capabilities (for "native")."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text == "native":
        if not native:
            raise ArchListError("TORCH_CUDA_ARCH_LIST='native' needs a visible GPU; none found")
        text = ";".join(f"{c // 10}.{c % 10}" for c in sorted(set(native)))
    for name, archs in NAMED_ARCHS:
        text = text.replace(name, archs)
    entries = []
    for item in re.split(r"[;\s,]+", text):
        if not item:
            continue
        m = _ENTRY.match(item)
        if not m:
            raise ArchListError(
                f"TORCH_CUDA_ARCH_LIST={value!r}: cannot read the entry {item!r} "
                "(expected forms like 8.0, 8.6+PTX, 9.0a, or a name such as Hopper)")
        entries.append((int(m.group(1)) * 10 + int(m.group(2)), m.group(3).lower(),
                        bool(m.group(4))))
    return entries


def family_targets(value, native=()):
    """{"sm80": {"sass": [...], "ptx": [...]}, "sm90": {...}} for a TORCH_CUDA_ARCH_LIST value
    (arch names as nvcc spells them after sm_ / compute_); an empty family is not built."""
    entries = parse_arch_list(value, native)
    if entries is None:
        return {family: {k: list(v) for k, v in t.items()} for family, t in DEFAULT.items()}
    portable = sorted({cc for cc, _, _ in entries if cc >= 80})
    ptx = sorted({cc for cc, _, p in entries if p and cc >= 80} | set(portable[-1:]))
    hopper = any(cc == 90 for cc, _, _ in entries)
    return {"sm80": {"sass": [str(a) for a in portable], "ptx": [str(a) for a in ptx]},
            "sm90": {"sass": ["90a"] if hopper else [], "ptx": []}}


def gencode_flags(target):
    """nvcc -gencode flags of one family's targets."""
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in target["sass"]]
    flags += [f"-gencode=arch=compute_{a},code=compute_{a}" for a in target["ptx"]]
    return flags


def no_kernels_error(value):
    return ArchListError(
        f"flashattn: TORCH_CUDA_ARCH_LIST={value!r} leaves no CUDA kernel family to build "
        "(the portable kernels need an arch >= 8.0, the Hopper ones 9.0 or 9.0a); set it to "
        "include one, e.g. '8.0;9.0a', or build the CPU backend alone with "
        "FLASHATTN_DISABLE_CUDA=1")


def head_dim_selection(value, buckets):
    """FLASHATTN_HEADDIMS ("128" or "64,128"): the buckets to build, as a bitmask over
    `buckets` (a head dim selects the smallest bucket that holds it). Unset: all."""
    if value is None or not value.strip():
        return (1 << len(buckets)) - 1
    mask = 0
    for item in re.split(r"[;\s,]+", value.strip()):
        if not item:
            continue
        if not item.isdigit() or not 1 <= int(item) <= buckets[-1]:
            raise ArchListError(f"FLASHATTN_HEADDIMS={value!r}: {item!r} is not a head dim "
                                f"in 1..{buckets[-1]}")
        mask |= 1 << next(i for i, b in enumerate(buckets) if b >= int(item))
    if not mask:
        raise ArchListError(f"FLASHATTN_HEADDIMS={value!r} names no head dim")
    return mask
