#!/usr/bin/env python3
"""ncu-table.py — one short line per profiled kernel launch from Nsight Compute's raw CSV.

    ncu --import REPORT.ncu-rep --csv --page raw > REPORT.csv
    scripts/ncu-table.py REPORT.csv [--summary N]

Prints, per launch in profile order: the kernel (its name without the parameter list),
grid, registers per thread, duration, DRAM and SM throughput (% of peak), achieved
occupancy, issue-slot use, and the three largest warp stall reasons (warps stalled per
issued instruction: long_scoreboard = waiting on global memory, barrier =
__syncthreads, short_scoreboard / mio_throttle = shared memory, math_pipe_throttle = a
busy pipe such as the tensor cores). A column ncu did not collect prints "-".

--summary N: instead, one line of at most N characters for the first two launches (the
GPU check's results row).

Only the standard library: it runs on the GPU machine's plain python3.
"""
import csv
import re
import sys

STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"

COLUMNS = {  # label: metric
    "dram%": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm%": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "occ%": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "issue%": "smsp__issue_active.avg.pct_of_peak_sustained_active",
}
TIME_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
              "second": 1e6, "s": 1e6}


def number(text):
    """A metric value as a float (ncu may print thousands separators); None if not one."""
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return None


def read_launches(path):
    """The profiled launches of an ncu CSV: a list of {column: value} dicts and a
    {metric: unit} dict. Either layout ncu writes: the raw page (one row per launch,
    metrics as columns, a units row under the header) or the details page (one row per
    metric: "Metric Name", "Metric Unit", "Metric Value"; pivoted here by launch ID)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(line for line in f if not line.startswith("==")) if r]
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "ID" in r), None)
    if head is None:
        raise SystemExit(f"{path}: no 'ID' / 'Kernel Name' header (not ncu --csv output?)")
    names = rows[head]
    units, launches = {}, []
    if "Metric Name" in names:  # details page
        by_id = {}
        for r in rows[head + 1:]:
            rec = dict(zip(names, r))
            launch = by_id.setdefault(rec.get("ID"), {k: v for k, v in rec.items() if not k.startswith("Metric ")})
            launch[rec.get("Metric Name", "")] = rec.get("Metric Value", "")
            units[rec.get("Metric Name", "")] = rec.get("Metric Unit", "")
        return list(by_id.values()), units
    for r in rows[head + 1:]:
        rec = dict(zip(names, r))
        if number(rec.get("ID", "")) is None:  # the units row
            units = rec
            continue
        launches.append(rec)
    return launches, units


def short_name(name):
    """The kernel's name with template arguments kept and the parameter list dropped."""
    name = re.sub(r"^void ", "", name.strip())
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            name = name[:i]
            break
    name = name.replace("(anonymous namespace)::", "").replace("__nv_bfloat16", "bf16").replace("__half", "f16")
    return name


def microseconds(rec, units):
    v = number(rec.get("gpu__time_duration.sum", ""))
    if v is None:
        return None
    return v * TIME_UNITS.get(units.get("gpu__time_duration.sum", "nsecond").strip(), 1e-3)


def stalls(rec):
    """(reason, warps per issue) of every stall metric present, largest first."""
    out = []
    for k, v in rec.items():
        if k.startswith(STALL_PREFIX) and k.endswith(STALL_SUFFIX):
            x = number(v)
            if x is not None:
                out.append((k[len(STALL_PREFIX):-len(STALL_SUFFIX)], x))
    return sorted(out, key=lambda t: -t[1])


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def line(i, rec, units):
    regs = number(rec.get("launch__registers_per_thread", ""))
    cols = [fmt(number(rec.get(m, "")), ".1f") for m in COLUMNS.values()]
    top = ", ".join(f"{k} {v:.2f}" for k, v in stalls(rec)[:3]) or "-"
    grid = rec.get("Grid Size", "-").replace(" ", "").strip("()")
    return (f"{i:>3} {short_name(rec.get('Kernel Name', '?')):<44.44} {grid:<14.14} {fmt(regs, '.0f'):>4} "
            f"{fmt(microseconds(rec, units), '.1f'):>9} " + " ".join(f"{c:>6}" for c in cols) + f"  {top}")


def summary(launches, units, width):
    parts = []
    for rec in launches[:2]:
        st = stalls(rec)
        parts.append(f"{fmt(microseconds(rec, units), '.0f')}us dram {fmt(number(rec.get(COLUMNS['dram%'], '')), '.0f')}%"
                     f" sm {fmt(number(rec.get(COLUMNS['sm%'], '')), '.0f')}%"
                     + (f" {st[0][0]}" if st else ""))
    return "; ".join(parts)[:width]


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    launches, units = read_launches(argv[1])
    if len(argv) >= 4 and argv[2] == "--summary":
        print(summary(launches, units, int(argv[3])) if launches else "no launch profiled")
        return 0
    print(f"{'#':>3} {'kernel':<44} {'grid':<14} {'regs':>4} {'us':>9} "
          + " ".join(f"{k:>6}" for k in COLUMNS) + "  top stalls (warps per issued instruction)")
    for i, rec in enumerate(launches, 1):
        print(line(i, rec, units))
    return 0 if launches else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
