"""setup.py's reading of TORCH_CUDA_ARCH_LIST and FLASHATTN_HEADDIMS (tools/build_archs.py):
which targets each CUDA source family gets, over the forms torch accepts. CPU only."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))
import build_archs  # noqa: E402

BUCKETS = [32, 64, 96, 128, 192, 256]


def targets(value):
    t = build_archs.family_targets(value)
    return t["sm80"]["sass"], t["sm80"]["ptx"], t["sm90"]["sass"]


@pytest.mark.parametrize("value, sm80, ptx, sm90", [
    (None, ["80", "90"], ["90"], ["90a"]),
    ("", ["80", "90"], ["90"], ["90a"]),
    ("9.0a", ["90"], ["90"], ["90a"]),          # the H200 machine's preset: both families
    ("9.0", ["90"], ["90"], ["90a"]),
    ("8.0;9.0a", ["80", "90"], ["90"], ["90a"]),  # CI's
    ("8.0 9.0", ["80", "90"], ["90"], ["90a"]),
    ("8.0,8.6", ["80", "86"], ["86"], []),
    ("8.6+PTX", ["86"], ["86"], []),
    ("8.0+PTX;8.9", ["80", "89"], ["80", "89"], []),
    ("7.5;8.0", ["80"], ["80"], []),             # below 8.0: nothing of ours
    ("10.0", ["100"], ["100"], []),
    ("10.0a;12.0", ["100", "120"], ["120"], []),
    ("Hopper", ["90"], ["90"], ["90a"]),
    ("Ampere", ["80", "86"], ["86"], []),
    (" 9.0a ; ", ["90"], ["90"], ["90a"]),
])
def test_family_targets(value, sm80, ptx, sm90):
    assert targets(value) == (sm80, ptx, sm90)


@pytest.mark.parametrize("value", ["7.0", "7.5+PTX", "6.1;7.0"])
def test_no_family_left(value):
    assert targets(value) == ([], [], [])
    err = build_archs.no_kernels_error(value)
    assert "TORCH_CUDA_ARCH_LIST" in str(err) and repr(value) in str(err)


@pytest.mark.parametrize("value", ["sm_90", "9", "nine", "9.0b", "90"])
def test_unreadable_entry(value):
    with pytest.raises(build_archs.ArchListError, match="TORCH_CUDA_ARCH_LIST"):
        build_archs.family_targets(value)


def test_native():
    t = build_archs.family_targets("native", native=(90,))
    assert t["sm80"]["sass"] == ["90"] and t["sm90"]["sass"] == ["90a"]
    with pytest.raises(build_archs.ArchListError, match="native"):
        build_archs.family_targets("native", native=())


def test_gencode_flags():
    flags = build_archs.gencode_flags(build_archs.family_targets("9.0a")["sm90"])
    assert flags == ["-gencode=arch=compute_90a,code=sm_90a"]
    flags = build_archs.gencode_flags(build_archs.family_targets("8.0;8.6")["sm80"])
    assert flags == ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_86,code=sm_86",
                     "-gencode=arch=compute_86,code=compute_86"]


@pytest.mark.parametrize("value, built", [
    (None, BUCKETS), ("128", [128]), ("64,128", [64, 128]), ("59", [64]), ("1;256", [32, 256]),
])
def test_head_dim_selection(value, built):
    mask = build_archs.head_dim_selection(value, BUCKETS)
    assert [b for i, b in enumerate(BUCKETS) if mask >> i & 1] == built


@pytest.mark.parametrize("value", ["0", "257", "x", ","])
def test_head_dim_selection_bad(value):
    with pytest.raises(build_archs.ArchListError, match="FLASHATTN_HEADDIMS"):
        build_archs.head_dim_selection(value, BUCKETS)


def test_this_build_reports_its_targets():
    """The installed build's config agrees with what its arch list would give."""
    import flashattn
    cfg = flashattn.BUILD_CONFIG
    assert set(cfg["FLASHATTN_HEADDIMS"]) <= set(BUCKETS) and cfg["FLASHATTN_HEADDIMS"]
    if cfg["FLASHATTN_DISABLE_CUDA"]:
        assert cfg["cuda_archs"] == []
    else:
        assert cfg["cuda_archs"], "a CUDA build with no kernel family should have failed"
        assert ("sm_90a" in cfg["cuda_archs"]) == (not cfg["FLASHATTN_DISABLE_SM90"])


def test_setup_fails_without_a_family():
    """A build that found CUDA but whose arch list leaves no kernel family stops, naming
    TORCH_CUDA_ARCH_LIST (before it writes anything)."""
    import os
    import shutil
    import subprocess

    root = pathlib.Path(__file__).resolve().parent.parent
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if shutil.which("nvcc", path=os.path.join(cuda_home, "bin")) is None:
        pytest.skip("no CUDA toolkit: setup.py builds the CPU backend alone")
    import torch
    if torch.version.cuda is None:
        pytest.skip("torch without CUDA: setup.py builds the CPU backend alone")
    nvcc = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"],
                          capture_output=True, text=True).stdout
    if f"release {torch.version.cuda.split('.')[0]}." not in nvcc:
        pytest.skip("nvcc does not match torch's CUDA: setup.py builds the CPU backend alone")
    config = root / "flashattn" / "_build_config.py"
    before = config.read_bytes() if config.exists() else None
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST="7.5", CUDA_HOME=cuda_home)
    env.pop("FLASHATTN_DISABLE_CUDA", None)
    r = subprocess.run([sys.executable, "setup.py", "--version"], cwd=root, env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "TORCH_CUDA_ARCH_LIST='7.5' leaves no CUDA kernel family" in r.stderr
    assert (config.read_bytes() if config.exists() else None) == before


def test_generated_sources_are_current():
    """The committed generated sources match their generators (setup.py reruns both)."""
    import generate_instantiations
    import generate_wgmma

    assert generate_wgmma.OUT.read_text() == generate_wgmma.text(), \
        "csrc/sm90/wgmma_sm90.h is stale: run python tools/generate_wgmma.py"
    for name, text in generate_instantiations.expected_files().items():
        path = generate_instantiations.OUT / name
        assert path.exists() and path.read_text() == text, f"{name}: run generate_instantiations"
    names = {p.name for p in generate_instantiations.OUT.glob("*.cu")}
    assert names == set(generate_instantiations.expected_files()), "stale instantiations"
    assert generate_instantiations.file_bucket("fwd_sm90_hdim192x128_bf16.cu") == 192
    assert generate_instantiations.file_bucket("bwd_sm80_hdim64_fp16.cu") == 64
