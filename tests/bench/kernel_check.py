"""Compiles one of our CUDA kernel bodies for the H200 (sm_90) on a machine
without a GPU, with NVRTC, and prints ptxas's report (registers, spills,
shared memory) or the compile errors: a kernel's text checked before a
device call is spent on it.

The body is read from the Rust sources as the engine builds it (each
`--source FILE:CONST` is a `const CONST: &str = r#"..."#;`, concatenated
in order) and wrapped as MLX's `mlx_fast_cuda_kernel` wraps it: a
`__global__` function taking each input as `const T* NAME` (with
`NAME_shape` / `NAME_strides` where the body reads them), each output as
`T* NAME`, and the template values as `constexpr` constants. MLX's own
device header is not used (it lives inside libmlx), nor cooperative
groups; `inf` and `INFINITY` are defined, and shapes and strides are plain
pointers here.

NVRTC and CUDA's headers come from the `nvidia-cuda-nvrtc-cu12` and
`nvidia-cuda-runtime-cu12` wheels, fetched by pip into
~/.cache/mlx-engine/nvrtc on first use.

Usage (the codes decode kernel at the Qwen3-8B shape):
  python3 tests/bench/kernel_check.py \\
    --source plugin-api/kv-quant/src/codes_attention.rs:SOURCE \\
    --source plugin-api/model-kit/src/decode_attention.rs:BLOCK_MERGE \\
    --input q:__nv_bfloat16 --input k:uint16_t --input v:uint16_t --input mask:bool \\
    --output part:float --output ml:float \\
    -t BITS=4 -t GROUP=64 -t D=128 -t R=4 -t HKV=8 -t VALUES=0 -t HAS_MASK=true
and model-kit's masked decode kernel, whose key access is spliced in:
  python3 tests/bench/kernel_check.py \
    --source plugin-api/model-kit/src/decode_attention.rs:SOURCE \
    --source plugin-api/model-kit/src/decode_attention.rs:SOFTMAX_TAIL \
    --source plugin-api/model-kit/src/decode_attention.rs:BLOCK_MERGE \
    --splice KEYS=plugin-api/model-kit/src/decode_attention.rs:DENSE \
    --input q:__nv_bfloat16 --input k:__nv_bfloat16 --input v:__nv_bfloat16 --input mask:bool \
    --output part:float --output ml:float -t D=128 -t R=4 -t HKV=8 -t SCALE_BITS=1040187392
"""
import argparse
import ctypes
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path.home() / ".cache/mlx-engine/nvrtc"
WHEELS = ["nvidia-cuda-nvrtc-cu12==12.9.86", "nvidia-cuda-runtime-cu12==12.9.79"]


def toolkit():
    """libnvrtc and the CUDA include folder, fetched once."""
    lib = CACHE / "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
    inc = CACHE / "nvidia/cuda_runtime/include"
    if not (lib.exists() and inc.exists()):
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(CACHE), *WHEELS],
                       check=True)
        for wheel in CACHE.glob("*.whl"):
            zipfile.ZipFile(wheel).extractall(CACHE)
    return lib, inc


def constant(spec):
    """The text of `const NAME: &str = r#"..."#;` in FILE, for FILE:NAME."""
    file, name = spec.rsplit(":", 1)
    found = re.search(rf'const {name}: &str = r#"(.*?)"#;', (ROOT / file).read_text(), re.S)
    if not found:
        sys.exit(f"{file}: no `const {name}: &str = r#\"...\"#;`")
    return found.group(1)


def body(sources, splices):
    text = "".join(constant(spec) for spec in sources)
    for word, spec in splices:
        text = text.replace(word, constant(spec))
    return text


def wrap(source, inputs, outputs, template):
    params = []
    for name, ctype in inputs:
        params.append(f"const {ctype}* {name}")
        for suffix, t in (("shape", "int32_t"), ("strides", "int64_t")):
            if f"{name}_{suffix}" in source:
                params.append(f"const {t}* {name}_{suffix}")
        if f"{name}_ndim" in source:
            params.append(f"const int {name}_ndim")
    params += [f"{ctype}* {name}" for name, ctype in outputs]
    constants = "".join(
        f"  constexpr bool {k} = {v};\n" if v in ("true", "false") else f"  constexpr int {k} = {v};\n"
        for k, v in template)
    return ("#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n"
            "typedef unsigned int uint32_t; typedef unsigned short uint16_t; typedef unsigned char uint8_t;\n"
            "typedef int int32_t; typedef long long int64_t;\n"
            "#define inf __int_as_float(0x7f800000)\n#define INFINITY inf\n"
            f"__global__ void checked_kernel({', '.join(params)}) {{\n{constants}{source}\n}}\n")


def compile_ptx(lib_path, include, text, arch):
    lib = ctypes.CDLL(str(lib_path))
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), b"kernel.cu", 0, None, None) != 0:
        sys.exit("nvrtcCreateProgram failed")
    opts = [f"-arch={arch}".encode(), f"-I{include}".encode(), b"-std=c++17", b"-Xptxas=-v", b"-default-device"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    return rc, log.value.decode(errors="replace")


def pairs(values, sep):
    out = []
    for v in values:
        if sep not in v:
            sys.exit(f"`{v}`: expected NAME{sep}VALUE")
        out.append(tuple(v.split(sep, 1)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", action="append", required=True, help="FILE:CONST, in the order they concatenate")
    ap.add_argument("--splice", action="append", default=[],
                    help="WORD=FILE:CONST: WORD in the body replaced by that text, as the engine splices it")
    ap.add_argument("--input", action="append", default=[], help="NAME:C_TYPE, in the kernel's order")
    ap.add_argument("--output", action="append", default=[], help="NAME:C_TYPE")
    ap.add_argument("-t", "--template", action="append", default=[], help="NAME=VALUE (an int, or true/false)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--print-source", action="store_true")
    a = ap.parse_args()
    text = wrap(body(a.source, pairs(a.splice, "=")), pairs(a.input, ":"), pairs(a.output, ":"), pairs(a.template, "="))
    if a.print_source:
        print(text)
    lib, inc = toolkit()
    rc, log = compile_ptx(lib, inc, text, a.arch)
    print(log.strip() or "(no output)")
    sys.exit(0 if rc == 0 else 1)


if __name__ == "__main__":
    main()
