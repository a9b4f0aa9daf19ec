"""The CUDA build's promises, checked on every machine:

- build/tessera links no CUDA library (everything CUDA lives in libtessera-cuda.so, loaded
  at run time), so it starts and serves where no NVIDIA driver or CUDA library exists;
- `tessera devices` reports the CPU and explains a missing or unusable CUDA backend
  instead of failing;
- where nvcc is installed (CI, the GPU machines), the kernels compiled for every target
  architecture, the backend library loads, and no kernel spills registers (the
  `nvcc -Xptxas -v` report the build keeps, build/cuda/ptxas.log).
"""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import BIN, BUILD, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import importlib  # noqa: E402

ptxas_report = importlib.import_module("ptxas-report")

# Whether this build compiled the CUDA side: the Makefile says (TESSERA_CUDA=1/0, from
# CUDA=auto|0|1); by hand, whether nvcc is installed.
_flag = os.environ.get("TESSERA_CUDA")
CUDA_BUILT = _flag == "1" if _flag in ("0", "1") else shutil.which(os.environ.get("NVCC", "nvcc")) is not None
need_nvcc = pytest.mark.skipif(not CUDA_BUILT, reason="no CUDA build here (nvcc not installed, or CUDA=0)")
CUDA_LIB_WORDS = ("libcuda", "libcudart", "libcublas", "libnccl", "libnvrtc")


def needed_libs(path):
    r = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True)
    return [line.split("[")[1].rstrip("]") for line in r.stdout.splitlines() if "(NEEDED)" in line]


def run_devices(env_extra):
    env = dict(os.environ, **env_extra)
    return subprocess.run([str(BIN), "devices"], capture_output=True, text=True, timeout=60, env=env)


def test_binary_links_no_cuda():
    libs = needed_libs(BIN)
    assert libs, "readelf found no NEEDED entries at all"
    assert not [x for x in libs if x.startswith(CUDA_LIB_WORDS)], libs


def test_devices_without_cuda_backend():
    r = run_devices({"TESSERA_CUDA_LIB": "none"})
    assert r.returncode == 0, r.stderr
    assert "cpu: available" in r.stdout
    assert "cuda: not available" in r.stdout and "disabled" in r.stdout
    r = run_devices({"TESSERA_CUDA_LIB": "/nonexistent/libtessera-cuda.so"})
    assert r.returncode == 0 and "cuda: not available" in r.stdout, r.stdout


def test_devices_with_a_library_that_does_not_load(tmp_path):
    bogus = tmp_path / "libtessera-cuda.so"
    bogus.write_bytes(b"not an ELF file")
    r = run_devices({"TESSERA_CUDA_LIB": str(bogus)})
    assert r.returncode == 0, r.stderr
    assert "cuda: not available" in r.stdout and str(bogus) in r.stdout


@need_nvcc
def test_backend_library_built_and_loads():
    lib = BUILD / "libtessera-cuda.so"
    assert lib.exists(), f"{lib} missing although nvcc is installed (make CUDA=1)"
    r = run_devices({"TESSERA_CUDA_LIB": str(lib)})
    assert r.returncode == 0, r.stderr
    assert f"cuda: library {lib}" in r.stdout, r.stdout
    # with no GPU here this line reports why; on a GPU machine it lists the devices
    assert "cuda: no usable device" in r.stdout or "cuda:0:" in r.stdout, r.stdout


def test_devices_lists_gpus_and_nccl_for_tensor_parallel():
    """Through the emulated backend with 2 devices: both GPUs, then the NCCL that
    --tensor-parallel-size would use (one GPU prints no NCCL line)."""
    emu = BUILD / "libtessera-cuda-emu.so"
    r = run_devices({"TESSERA_CUDA_LIB": str(emu), "TESSERA_EMU_DEVICES": "2"})
    assert r.returncode == 0, r.stderr
    assert "cuda:0:" in r.stdout and "cuda:1:" in r.stdout, r.stdout
    assert "nccl: 2." in r.stdout and "--tensor-parallel-size up to 2" in r.stdout, r.stdout
    r = run_devices({"TESSERA_CUDA_LIB": str(emu), "TESSERA_EMU_DEVICES": "1"})
    assert r.returncode == 0 and "cuda:0:" in r.stdout and "nccl:" not in r.stdout, r.stdout


@need_nvcc
def test_every_kernel_compiled_without_spills():
    log = BUILD / "cuda" / "ptxas.log"
    assert log.exists(), f"{log} missing although nvcc is installed"
    rows = ptxas_report.parse(log.read_text())
    kernels = sorted(p.name for p in (ROOT / "kernels").glob("*.cu"))
    assert kernels, "no kernels/*.cu"
    assert rows, "the ptxas report lists no kernel"
    archs = {r["arch"] for r in rows}
    for want in ("sm_90a", "sm_80", "sm_89"):
        assert want in archs, f"no kernel built for {want}: {sorted(archs)}"
    spills = [(r["kernel"], r["arch"], r["spill_st"], r["spill_ld"]) for r in rows
              if r["spill_st"] or r["spill_ld"]]
    assert not spills, f"kernels that spill registers: {spills}"
    # one report per kernel object: a family whose ptxas output is missing did not build
    for k in kernels:
        rep = BUILD / "cuda" / "obj" / "kernels" / (k[:-3] + ".o.ptxas")
        assert rep.exists(), f"{rep} missing"


def test_kernel_bench_runs_under_emulator():
    """The kernel benchmark builds and runs on the CPU emulator at tiny sizes (its numbers
    mean nothing there and it says so): every family registers rows, and nothing fails."""
    tool = BUILD / "tests" / "tool_kernel_bench_emu"
    assert tool.exists(), f"{tool} not built"
    r = subprocess.run([str(tool)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "EMULATOR: these numbers mean nothing" in r.stdout
    assert "ceilings: device-to-device copy" in r.stdout
    rows = [line.split()[0] for line in r.stdout.splitlines()[3:] if "(of " in line]
    for family in ("attention_decode", "attention_prefill", "qmm_gemv", "qmm_bf16", "embedding",
                   "rmsnorm+residual", "head_rmsnorm", "rope+kv_write", "silu_mul", "sampling", "dense_gemv",
                   "skinny_gemm", "cublas_gemv", "dense_gemv_pdl", "skinny_gemm_pdl", "dense_gemv_silu",
                   "dense_gemv+silu_mul", "skinny_gemm_silu", "skinny_gemm+silu_mul"):
        assert family in rows, f"no bench row for {family}: {sorted(set(rows))}"


def test_kernel_bench_once_under_emulator():
    """--once (the GPU check's profiler runs): one launch per row, said so in the output, and
    --filter keeps only the family asked for."""
    tool = BUILD / "tests" / "tool_kernel_bench_emu"
    assert tool.exists(), f"{tool} not built"
    r = subprocess.run([str(tool), "--once", "--filter", "attention_decode"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "--once: one cold launch per row" in r.stdout
    rows = [line.split()[0] for line in r.stdout.splitlines() if "(of " in line]
    assert rows and set(rows) == {"attention_decode"}, rows
    bad = subprocess.run([str(tool), "--bogus"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--once" in bad.stderr
