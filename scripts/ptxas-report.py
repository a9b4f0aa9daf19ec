#!/usr/bin/env python3
"""Summarises the `nvcc -Xptxas -v` report the build keeps (build/cuda/ptxas.log): one line
per kernel and GPU architecture with registers, stack frame, spill stores/loads and shared
memory. Exit status 1 when any kernel spills (the build's rule: no spill in a kernel the
decode path uses, and today every kernel is held to it).

    scripts/ptxas-report.py [build/cuda/ptxas.log]
"""
import re
import shutil
import subprocess
import sys

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse(text):
    """[{kernel, arch, regs, stack, spill_st, spill_ld, smem}] in log order."""
    out, cur = [], None
    for line in text.splitlines():
        m = ENTRY.search(line)
        if m:
            cur = {"kernel": m.group(1), "arch": m.group(2), "regs": 0, "stack": 0, "spill_st": 0,
                   "spill_ld": 0, "smem": 0}
            out.append(cur)
            continue
        if cur is None:
            continue
        m = PROPS.search(line)
        if m:
            cur["stack"], cur["spill_st"], cur["spill_ld"] = map(int, m.groups())
            continue
        m = USED.search(line)
        if m:
            cur["regs"] = int(m.group(1))
            cur["smem"] = int(m.group(2) or 0)
    return out


def demangle(names):
    if not shutil.which("c++filt"):
        return names
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return r.stdout.splitlines() if r.returncode == 0 else names


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "build/cuda/ptxas.log"
    rows = parse(open(path).read())
    names = demangle([r["kernel"] for r in rows])
    bad = 0
    print(f"{'arch':8} {'regs':>4} {'stack':>5} {'spill st/ld':>11} {'smem':>6}  kernel")
    for r, n in zip(rows, names):
        spill = r["spill_st"] + r["spill_ld"]
        bad += spill > 0
        print(f"{r['arch']:8} {r['regs']:4} {r['stack']:5} {r['spill_st']:5}/{r['spill_ld']:<5} {r['smem']:6}  "
              f"{n[:110]}{'   <-- SPILLS' if spill else ''}")
    print(f"{len(rows)} kernel builds, {bad} with spills")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
