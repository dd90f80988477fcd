"""Summary of an ncu source page (`ncu -i REPORT --page source --csv > SRC.csv`, collected with `--set full`):
stall reasons, shared-memory wavefronts by opcode, and warp instructions and stall samples per address range.
usage: python benchmarks/ncu_summary.py SRC.csv WARPS [CUT ...]
  WARPS: the launch's warps (instructions per warp = executed / WARPS); CUT: SASS line numbers (0-based, in file
  order) where the address ranges split, e.g. prologue / statistics / main loop / epilogue."""
import collections
import csv
import re
import sys


def num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def load(path: str) -> tuple[list[str], list[dict]]:
    with open(path) as f:
        r = csv.reader(f)
        next(r)  # "Kernel Name", name
        head = next(r)
        return head, [dict(zip(head, row)) for row in r if len(row) == len(head)]


def opcode(src: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", src.strip()).split(" ")[0]


def stall_counts(rows: list[dict], stall_keys: list[str]) -> collections.Counter:
    """Stall samples by reason (the key without its "stall_" prefix) over ``rows``."""
    c = collections.Counter()
    for r in rows:
        for k in stall_keys:
            c[k[6:]] += num(r[k])
    return c


def main() -> None:
    path, warps, cuts = sys.argv[1], float(sys.argv[2]), [int(c) for c in sys.argv[3:]]
    head, rows = load(path)
    stall_keys = [k for k in head if k.startswith("stall_") and "Not Issued" not in k]
    samples = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in rows)
    instr = sum(num(r["Instructions Executed"]) for r in rows)
    stalls = stall_counts(rows, stall_keys)
    wf, wf_excess, wf_instr = collections.Counter(), collections.Counter(), collections.Counter()
    for r in rows:
        op = opcode(r["Source"])
        wf[op] += num(r["L1 Wavefronts Shared"])
        wf_excess[op] += num(r["L1 Wavefronts Shared Excessive"])
        wf_instr[op] += num(r["Instructions Executed"])
    total_wf = sum(wf.values())
    print(f"{path}: {samples:.0f} stall samples, {instr / warps:.0f} warp instructions per warp, "
          f"{total_wf:.0f} shared-memory wavefronts")
    st = sum(stalls.values())
    print("  stalls: " + ", ".join(f"{k} {100 * v / st:.1f}%" for k, v in stalls.most_common(9)))
    for op, v in wf.most_common(8):
        if v:
            print(f"  {op:28s} {v:10.0f} wavefronts ({100 * v / total_wf:4.1f}%), excess {wf_excess[op]:9.0f}, "
                  f"{wf_instr[op]:9.0f} instructions")
    bounds = [0, *cuts, len(rows)]
    for a, b in zip(bounds, bounds[1:]):
        part = rows[a:b]
        s = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in part)
        e = sum(num(r["Instructions Executed"]) for r in part)
        top = ", ".join(f"{k} {100 * v / samples:.1f}" for k, v in stall_counts(part, stall_keys).most_common(4))
        print(f"  lines {a}-{b}: {e / warps:7.1f} instructions per warp, {100 * s / samples:5.1f}% of samples ({top})")


if __name__ == "__main__":
    main()
