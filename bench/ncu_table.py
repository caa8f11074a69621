# ncu_table.py — the tables of bench/session.sh's ncu mode, from Nsight Compute's text pages: per kernel (name and
# launch shape) the launches, median duration, the busiest pipe as ncu names it, DRAM and memory throughput (% of
# peak: the busiest memory unit) and the SM clock it read, from the details page; and, given the source page
# (--page source --csv --print-source sass), the warp-stall samples by reason and the instructions that hold the most.
# Usage: python3 ncu_table.py DETAILS.txt [SOURCE.csv]
import csv, re, statistics, sys

ALL = "Warp Stall Sampling (All Samples)"  # the source page's column of every sample an instruction holds


def details(path):
    txt = open(path, errors="replace").read()
    # a launch's block starts with its name line: "  name (grid)x(block), Context …"
    blocks = re.split(r"\n  (?=\S.*\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\))", txt)[1:]
    rows = {}
    for b in blocks:
        head = b.split("\n")[0]
        shape = re.search(r"\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", head).group(0)
        name = head.split(shape)[0].strip()
        if name.endswith(")"): # the parameter list goes: its "(" is where the parentheses balance
            depth = 0
            for i in range(len(name) - 1, -1, -1):
                depth += {")": 1, "(": -1}.get(name[i], 0)
                if depth == 0:
                    name = name[:i].strip()
                    break
        dur = re.search(r"Duration\s+(\S+)\s+([\d.,]+)", b)
        us = float(dur.group(2).replace(",", "")) * {"ns": 1e-3, "us": 1, "ms": 1e3}.get(dur.group(1), 1) if dur else 0
        pipe = re.search(r"(\w+) is the highest-utilized pipeline \(([\d.]+)%\)", b)
        ghz = re.search(r"SM Frequency\s+\S+\s+([\d.]+)", b)
        pct = lambda what: (m.group(1) + "%") if (m := re.search(what + r"\s+%\s+([\d.]+)", b)) else "-"
        rows.setdefault((name[:90], shape), []).append((us, f"{pipe.group(1)} {pipe.group(2)}%" if pipe else "-",
                                                        pct("DRAM Throughput"), pct("Memory Throughput"),
                                                        ghz.group(1) if ghz else "-"))
    print("| kernel | launch | n | median µs | busiest pipe | DRAM | memory | SM GHz |")
    print("|---|---|---:|---:|---|---:|---:|---:|")
    for (name, shape), v in rows.items():
        med = statistics.median(x[0] for x in v)
        mid = min(v, key=lambda x: abs(x[0] - med))
        print(f"| {name} | {shape} | {len(v)} | {med:,.1f} | {' | '.join(mid[1:])} |")


def source(path):
    rows = list(csv.reader(open(path, errors="replace")))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    h, data = rows[head], rows[head + 1:]
    col = {n: i for i, n in enumerate(h)}
    reasons = [n for n in h if n.startswith("stall_") and "(Not" not in n]
    num = lambda r, n: int(r[col[n]] or 0) if r[col[n]].isdigit() else 0
    total = sum(num(r, ALL) for r in data) or 1
    by = {n: sum(num(r, n) for r in data) for n in reasons}
    print(f"\nwarp-stall samples: {total}")
    for n, v in sorted(by.items(), key=lambda x: -x[1])[:8]:
        print(f"  {n[6:]:18s} {100 * v / total:5.1f}%")
    print("instructions holding the most samples (samples, executions, main reason, SASS):")
    for r in sorted(data, key=lambda r: -num(r, ALL))[:12]:
        main = max(reasons, key=lambda n: num(r, n))
        print(f"  {num(r, ALL):6d} {r[col['Instructions Executed']]:>9s} "
              f"{main[6:]:14s} {r[col['Source']].strip()[:80]}")


details(sys.argv[1])
if len(sys.argv) > 2:
    source(sys.argv[2])
