"""The README's Python example and `offsim import` commands, run as written."""

import os
import re
import shlex
import sys
import subprocess

import pytest


def section(root, title):
    text = (root / "README.md").read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def blocks(text, lang):
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_python_example_runs(root, tmp_path):
    data, plot = blocks(section(root, "Python"), "python")
    scope = {}
    exec(compile(data, "README.md (python example)", "exec"), scope)
    assert len(scope["df"]) == 30 and len(scope["fits"]) > 0
    try:
        import matplotlib
    except ImportError:
        pytest.skip("matplotlib is not installed: the plotting block was not run")
    matplotlib.use("Agg")
    os.chdir(tmp_path)
    exec(compile(plot, "README.md (plot)", "exec"), scope)
    assert (tmp_path / "sweep.png").stat().st_size > 10_000


def test_build_tree_command_runs(root, cli):
    sh = blocks(section(root, "Python"), "sh")[0].splitlines()
    line = [l for l in sh if l.startswith("PYTHONPATH=")][0]
    code = shlex.split(line)[-1]
    out = subprocess.run([sys.executable, "-c", code], check=True,
                         capture_output=True, text=True).stdout
    assert float(out) > 0


def test_import_commands_run(root, cli, tmp_path):
    lines = [l for l in blocks(section(root, "Importing framework configs"), "sh")[0].splitlines()
             if l.startswith("offsim ")]
    assert len(lines) == 8
    for line in lines:
        args = [a if not a.endswith(".yaml") or "/" in a else str(tmp_path / a)
                for a in shlex.split(line)[1:]]
        r = subprocess.run([cli, *args], capture_output=True, text=True)
        assert r.returncode == 0, f"{line}\n{r.stderr}"
        if args[0] == "run":
            assert "completed" in r.stdout, f"{line}\n{r.stdout}"
    # Every scenario the imports wrote runs.
    for written in sorted(tmp_path.glob("*.yaml")):
        r = subprocess.run([cli, "run", str(written)], capture_output=True, text=True)
        assert r.returncode == 0, f"{written.name}\n{r.stderr}"
    effective = subprocess.run([cli, "run", str(tmp_path / "maxtext.yaml"), "--print-effective"],
                               check=True, capture_output=True, text=True).stdout
    assert "fsdp: true" in effective


def test_sweep_bench_command_runs(root, cli):
    sh = [l for b in blocks(section(root, "Python"), "sh") for l in b.splitlines()]
    line = [l for l in sh if "sweep_bench.py" in l][0]
    args = shlex.split(line)[2:]  # after PYTHONPATH=... python3
    args = [cli if a.endswith("scenarios/offsim") else a for a in args]
    r = subprocess.run([sys.executable, *args, "--repeats", "1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "747 points" in r.stdout and "Python / CLI" in r.stdout
