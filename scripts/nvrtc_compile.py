#!/usr/bin/env python3
"""Compile the CUDA sources `cuda_source` recorded with NVRTC, as
`cubecl-cuda` does on a device, and report each kernel's resources.

Usage: nvrtc_compile.py SOURCE_DIR NVRTC_ROOT [--json OUT]

SOURCE_DIR holds `ARCH/GROUP/NN-ENTRY.cu` (ARCH is NVRTC's architecture,
`sm_80` or `sm_90a`), as the kernels' `cuda_source` test writes it.
NVRTC_ROOT is the `nvidia/` folder of NVIDIA's pip wheels
(cuda_nvrtc, cuda_runtime, cuda_nvcc, cuda_cccl), as
`scripts/cuda_compile_check.sh` unpacks them. SOURCE_DIR's
`manifest.jsonl`, if there, adds each file's cube and shared memory.

Each distinct source is compiled once per architecture to a cubin (ptxas
runs, so register allocation and spills are those of the device code)
with `cubecl-cuda`'s options plus `--ptxas-options=-v`. Prints one line
per kernel; the JSON holds, per file, the architecture, group, entry,
registers, spill stores and loads (bytes), stack frame (bytes), seconds,
the manifest's `cube_dim` and `shared_bytes`, and NVRTC's error log if it
failed. Exits 1 if any source fails to
compile, 2 on bad arguments.
"""

import ctypes
import hashlib
import json
import re
import sys
import time
from pathlib import Path

RESOURCES = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
}


def load_nvrtc(root):
    lib = root / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
    if not lib.exists():
        sys.exit(f"nvrtc_compile.py: {lib} not found (run scripts/cuda_compile_check.sh)")
    nvrtc = ctypes.CDLL(str(lib))
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    return nvrtc


def options(root, arch):
    includes = [root / name / "include" for name in ("cuda_runtime", "cuda_nvcc", "cuda_cccl")]
    flags = [f"--gpu-architecture={arch}", "-lineinfo", "--ptxas-options=-v"]
    flags += [f"--include-path={path}" for path in includes]
    return [flag.encode() for flag in flags]


def compile_source(nvrtc, source, flags):
    """Returns (ok, log): whether NVRTC compiled `source`, and its log."""
    program = ctypes.c_void_p()
    rc = nvrtc.nvrtcCreateProgram(ctypes.byref(program), source, b"kernel.cu", 0, None, None)
    if rc != 0:
        return False, nvrtc.nvrtcGetErrorString(rc).decode()
    array = (ctypes.c_char_p * len(flags))(*flags)
    rc = nvrtc.nvrtcCompileProgram(program, len(flags), array)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
    return rc == 0, log.value.decode(errors="replace")


def resources(log):
    found = {}
    for key, pattern in RESOURCES.items():
        match = pattern.search(log)
        found[key] = int(match.group(1)) if match else None
    return found


def main(argv):
    if len(argv) not in (3, 5) or (len(argv) == 5 and argv[3] != "--json"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    sources, root = Path(argv[1]), Path(argv[2])
    files = sorted(sources.glob("*/*/*.cu"))
    if not files:
        print(f"nvrtc_compile.py: no ARCH/GROUP/*.cu under {sources}", file=sys.stderr)
        return 2
    nvrtc = load_nvrtc(root)
    manifest = {}
    if (sources / "manifest.jsonl").exists():
        for line in (sources / "manifest.jsonl").read_text().splitlines():
            entry = json.loads(line)
            manifest[(entry.pop("arch"), entry.pop("group"), entry.pop("file"))] = entry
    done, rows, failures = {}, [], 0
    for path in files:
        arch, group = path.parent.parent.name, path.parent.name
        text = path.read_bytes()
        key = (arch, hashlib.sha256(text).hexdigest())
        if key not in done:
            start = time.monotonic()
            ok, log = compile_source(nvrtc, text, options(root, arch))
            done[key] = (ok, log, round(time.monotonic() - start, 2))
        ok, log, seconds = done[key]
        row = {"arch": arch, "group": group, "file": path.name, "ok": ok, "seconds": seconds}
        row.update(resources(log) if ok else {"error": log.strip()})
        row.update(manifest.get((arch, group, path.name), {}))
        rows.append(row)
        if ok:
            print(
                f"{arch} {group}/{path.name}: {row['registers']} registers, "
                f"spills {row['spill_stores']}/{row['spill_loads']} B, {seconds} s"
            )
        else:
            failures += 1
            print(f"{arch} {group}/{path.name}: FAILED\n{log.strip()}")
    print(f"{len(rows)} sources ({len(done)} distinct), {failures} failed")
    if len(argv) == 5:
        Path(argv[4]).write_text(json.dumps({"kernels": rows}, indent=1) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
