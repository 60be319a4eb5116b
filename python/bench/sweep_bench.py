#!/usr/bin/env python3
"""A 747-point sweep from Python (offsim.sweep) against the CLI (offsim sweep), same jobs.

    PYTHONPATH=build/ci/python python3 python/bench/sweep_bench.py build/ci/scenarios/offsim \\
        [--jobs N] [--repeats R]

Prints the median wall time of each over R runs (alternating, so machine load hits both) and
checks that both produced the same rows.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import offsim

HERE = os.path.dirname(os.path.abspath(__file__))
SWEEP = os.path.join(HERE, "sweep-747.yaml")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cli")
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    cli_s, py_s, df_s = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cli.csv")
        for _ in range(a.repeats):
            t = time.perf_counter()
            subprocess.run([a.cli, "sweep", SWEEP, "--out", out, "--overwrite", "--quiet",
                            "--jobs", str(a.jobs)], check=True)
            cli_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            rows = offsim.sweep(SWEEP, jobs=a.jobs, as_frame=False)
            py_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            frame = offsim.sweep(SWEEP, jobs=a.jobs)
            df_s.append(time.perf_counter() - t)
        with open(out) as f:
            cli_rows = sum(1 for _ in f) - 1
    assert cli_rows == len(rows) == len(frame) == 747, (cli_rows, len(rows), len(frame))
    cli_m, py_m = statistics.median(cli_s), statistics.median(py_s)
    print(f"747 points, jobs={a.jobs or os.cpu_count()}, {a.repeats} runs each")
    print(f"  offsim sweep (CLI):   median {cli_m:.3f} s  {[round(x, 3) for x in cli_s]}")
    print(f"  offsim.sweep (Python, list of dicts): median {py_m:.3f} s  "
          f"{[round(x, 3) for x in py_s]}")
    df_m = statistics.median(df_s)
    print(f"  offsim.sweep (Python, DataFrame):     median {df_m:.3f} s  "
          f"{[round(x, 3) for x in df_s]}")
    print(f"  Python / CLI: {py_m / cli_m:.3f} (dicts), {df_m / cli_m:.3f} (DataFrame)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
