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
with `cubecl-cuda`'s options plus `--ptxas-options=-v`. A kernel on the
matrix units (`mma` in its source) is disassembled with NVRTC_ROOT's
`cu13/bin/nvdisasm`, and its main loop is the loop (a backward branch
and the instructions it jumps back over, both sides of every branch
inside counted) with the most `HMMA` instructions: a static count of
what one pass over a key or query tile issues.

Prints one line per kernel; the JSON holds, per file, the architecture,
group, entry, registers, spill stores and loads (bytes), stack frame
(bytes), seconds, the main loop's instructions and `HMMA`s
(`loop_instructions`, `loop_mma`; null without matrix units), the
manifest's `cube_dim` and `shared_bytes`, and NVRTC's error log if it
failed. Exits 1 if any source fails to compile or a kernel on the matrix
units has no loop of `HMMA`s, 2 on bad arguments.
"""

import ctypes
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESOURCES = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
}

# The instruction the register and fragment kernels' products compile to.
MMA_SOURCE = ("mma.sync.aligned", "wmma::mma_sync")
SASS_INSTRUCTION = re.compile(r"/\*[0-9a-f]+\*/\s+(.*?)\s*;")
SASS_LABEL = re.compile(r"^\.(L_x_\d+):")
SASS_BRANCH = re.compile(r"\bBRA\b.*`\(\.(L_x_\d+)\)")


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
    """Returns (ok, log, cubin): whether NVRTC compiled `source`, its log
    and the device code (None if it failed)."""
    program = ctypes.c_void_p()
    rc = nvrtc.nvrtcCreateProgram(ctypes.byref(program), source, b"kernel.cu", 0, None, None)
    if rc != 0:
        return False, nvrtc.nvrtcGetErrorString(rc).decode(), None
    array = (ctypes.c_char_p * len(flags))(*flags)
    rc = nvrtc.nvrtcCompileProgram(program, len(flags), array)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    cubin = None
    if rc == 0:
        nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(size))
        buffer = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetCUBIN(program, buffer)
        cubin = buffer.raw
    nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
    return rc == 0, log.value.decode(errors="replace"), cubin


def disassemble(nvdisasm, cubin):
    """nvdisasm's listing of `cubin`."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        done = subprocess.run(
            [str(nvdisasm), "-c", file.name], capture_output=True, text=True, check=True
        )
    return done.stdout


def main_loop(sass):
    """(instructions, HMMAs) of the loop of `sass` with the most HMMAs, or
    None if no loop has one."""
    instructions, labels = [], {}
    for line in sass.splitlines():
        label = SASS_LABEL.match(line.strip())
        if label:
            labels[label.group(1)] = len(instructions)
            continue
        found = SASS_INSTRUCTION.search(line)
        if found:
            instructions.append(found.group(1))
    best = None
    for end, text in enumerate(instructions):
        branch = SASS_BRANCH.search(text)
        start = labels.get(branch.group(1)) if branch else None
        if start is None or start > end:
            continue
        body = instructions[start : end + 1]
        mma = sum(1 for t in body if opcode(t) == "HMMA")
        if mma and (best is None or mma > best[1]):
            best = (len(body), mma)
    return best


def opcode(instruction):
    """The opcode of one SASS instruction, without its predicate and
    modifiers (`@!P0 LDG.E.128 ...` is `LDG`)."""
    words = instruction.split()
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


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
    nvdisasm = root / "cu13" / "bin" / "nvdisasm"
    if not nvdisasm.exists():
        print(f"nvrtc_compile.py: {nvdisasm} not found (run scripts/cuda_compile_check.sh)",
              file=sys.stderr)
        return 2
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
            ok, log, cubin = compile_source(nvrtc, text, options(root, arch))
            seconds = round(time.monotonic() - start, 2)
            on_units = any(marker.encode() in text for marker in MMA_SOURCE)
            loop = main_loop(disassemble(nvdisasm, cubin)) if ok and on_units else None
            done[key] = (ok, log, seconds, on_units, loop)
        ok, log, seconds, on_units, loop = done[key]
        row = {"arch": arch, "group": group, "file": path.name, "ok": ok, "seconds": seconds}
        row.update(resources(log) if ok else {"error": log.strip()})
        row["loop_instructions"], row["loop_mma"] = loop or (None, None)
        row.update(manifest.get((arch, group, path.name), {}))
        rows.append(row)
        if not ok:
            failures += 1
            print(f"{arch} {group}/{path.name}: FAILED\n{log.strip()}")
            continue
        line = (
            f"{arch} {group}/{path.name}: {row['registers']} registers, "
            f"spills {row['spill_stores']}/{row['spill_loads']} B, {seconds} s"
        )
        if on_units and loop is None:
            failures += 1
            line += ", FAILED: on the matrix units but no loop of HMMA instructions"
        elif loop:
            line += f", main loop {loop[0]} instructions for {loop[1]} HMMA"
        print(line)
    print(f"{len(rows)} sources ({len(done)} distinct), {failures} failed")
    if len(argv) == 5:
        Path(argv[4]).write_text(json.dumps({"kernels": rows}, indent=1) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
