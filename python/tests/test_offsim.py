"""The offsim Python module against the CLI: same reports, same sweep rows, typed errors with the
CLI's positions, the GIL released while simulating, framework import."""

import json
import subprocess
import threading

import pytest

import offsim

EX = "scenarios/examples/"
ONE = EX + "zero-offload-1gpu.yaml"
SWEEP = EX + "2b-1xa100-sweep.yaml"


def cli_json(cli, *args):
    out = subprocess.run([cli, *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def test_run_matches_the_cli(cli):
    report = offsim.run(ONE, set={"training.micro_batch": 2})
    expected = cli_json(cli, "run", ONE, "--set", "training.micro_batch=2", "--format", "json")
    expected = expected[0] if isinstance(expected, list) else expected
    if "reports" in expected:
        expected = expected["reports"][0]
    for key in ("step_time_s", "hbm_peak_bytes", "host_peak_bytes", "mfu", "tokens_per_s"):
        assert report[key] == pytest.approx(expected[key], rel=0, abs=0)


def test_sources_path_dict_and_yaml_string_agree(root):
    text = (root / ONE).read_text()
    by_path = offsim.resolve(ONE)
    by_text = offsim.resolve(text)
    by_dict = offsim.resolve(by_path)  # the effective scenario is itself a scenario
    for r in (by_text, by_dict):
        r.pop("name")
    by_path.pop("name")
    assert by_path == by_text == by_dict
    assert offsim.run(text)["step_time_s"] == offsim.run(ONE)["step_time_s"]


def test_overrides_as_dict_list_and_scenario():
    a = offsim.resolve(ONE, set={"training.micro_batch": 4, "parallelism": {"dp": 1}})
    b = offsim.resolve(ONE, set=["training.micro_batch=4", "parallelism={dp: 1}"])
    c = offsim.resolve(offsim.load(ONE).with_set({"training.micro_batch": 4}))
    assert a["training"]["micro_batch"] == b["training"]["micro_batch"] == 4
    assert c["training"]["micro_batch"] == 4


def test_errors_are_typed_and_carry_positions(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: llama3-8b\nhardware: {system: h100-1gpu}\n"
                   "training:\n  global_batch: 8\n  seq_len: 2048\n  micro_batch: two\n")
    with pytest.raises(offsim.InputError) as e:
        offsim.run(str(bad))
    assert (e.value.file, e.value.line, e.value.column) == (str(bad), 6, 16)
    assert e.value.key == "training.micro_batch"
    assert isinstance(e.value, offsim.Error) and isinstance(e.value, ValueError)

    with pytest.raises(offsim.InputError) as e:
        offsim.run(ONE, set="training.micro_batch=two")
    assert e.value.key == "training.micro_batch"
    assert e.value.origin == "--set training.micro_batch=two"

    with pytest.raises(offsim.InputError) as e:
        offsim.run({"model": "llama3-8b", "hardware": {"system": "nope"},
                    "training": {"global_batch": 8, "seq_len": 16}})
    assert e.value.key == "hardware.system" and e.value.file == "<dict>"

    with pytest.raises(offsim.NotFoundError):
        offsim.run("no/such/file.yaml")
    with pytest.raises(offsim.InputError) as e:
        offsim.run(ONE, set={"model": "llama9-1t"})
    assert e.value.key == "model" and e.value.origin == "--set model=llama9-1t"
    with pytest.raises(TypeError):
        offsim.run(42)


@pytest.mark.parametrize("text", ["model: [", "a: 1\na: 2\n", "- 1\n- 2\n", "{x: *y}", "\t:\n",
                                  "model: llama3-8b\nhardware: {system: h100-1gpu}\n"
                                  "training: {global_batch: 8, seq_len: 99999999999999999999}\n"])
def test_malformed_text_raises_never_crashes(text):
    with pytest.raises(offsim.Error):
        offsim.run(text)


def test_sweep_frame_matches_cli_rows(cli, tmp_path):
    df = offsim.sweep(SWEEP, jobs=2)
    out = tmp_path / "sweep.csv"
    subprocess.run([cli, "sweep", SWEEP, "--out", str(out), "--jobs", "2", "--quiet"],
                   check=True, capture_output=True)
    import pandas
    expected = pandas.read_csv(out, keep_default_na=False, na_values=[""])
    assert list(df.columns) == list(expected.columns)
    assert len(df) == 30
    pandas.testing.assert_frame_equal(df, expected)


def test_sweep_without_pandas_gives_dicts():
    rows = offsim.sweep(SWEEP, as_frame=False, jobs=2)
    assert isinstance(rows, list) and len(rows) == 30
    assert rows[0]["index"] == 0 and isinstance(rows[0]["step_time_s"], float)
    assert {"axes.training.micro_batch", "axes.offload", "axes.recompute"} <= set(rows[0])


def test_plan_returns_ranked_fitting_policies():
    rows = offsim.plan(ONE, top=3, as_frame=False, jobs=2)
    assert 1 <= len(rows) <= 3
    assert all(r["fits"] for r in rows)
    times = [r["step_time_s"] for r in rows]
    assert times == sorted(times)
    df = offsim.plan(ONE, top=3, jobs=2)
    assert list(df["policy"]) == [r["policy"] for r in rows]


def test_plan_searches_the_all_to_all_overlap_of_an_moe_model():
    rows = offsim.plan(EX + "qwen3-30b-a3b-8xh100-no-offload.yaml", top=2, as_frame=False,
                       jobs=2, search_a2a_overlap=True,
                       set=["model.layers=2"])
    assert rows and all(r["fits"] for r in rows)
    assert "moe_a2a_overlap" in rows[0]
    assert rows[0]["moe_a2a_overlap"] == ("; EP all-to-all overlap" in rows[0]["policy"])


def test_timeline_for_plotting():
    tl = offsim.timeline(EX + "2b-1xa100-offload.yaml")
    lanes = tl["lanes"]
    assert tl["spans"] and all(0 <= s["lane"] < len(lanes) for s in tl["spans"])
    assert all(s["end_ns"] >= s["start_ns"] for s in tl["spans"])
    hbm = [p for p in tl["pools"] if p["name"].endswith(".hbm")][0]
    assert max(b for _, b in hbm["samples"]) == hbm["peak_bytes"]
    assert tl["report"]["hbm_peak_bytes"] == hbm["peak_bytes"]


def test_threads_give_the_sequential_results():
    from concurrent.futures import ThreadPoolExecutor
    sets = [{"training.micro_batch": mb} for mb in (1, 2, 4, 8)]
    sequential = [offsim.run(ONE, set=s)["step_time_s"] for s in sets]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(lambda s: offsim.run(ONE, set=s)["step_time_s"], sets))
    assert threaded == sequential


def test_simulation_releases_the_gil():
    # While another thread simulates a 40k-op step, this thread keeps running Python. With the
    # GIL held for the whole simulation it could not run at all until the call returned.
    scenario = offsim.load(EX + "llama70b-8xh100-offload.yaml")
    from offsim import _offsim
    done = threading.Event()
    ticks_during = []

    def work():
        _offsim.run(scenario.text, scenario.source, scenario.base_dir, [], True)
        done.set()

    ticks = 0
    t = threading.Thread(target=work)
    t.start()
    while not done.is_set():
        ticks += 1
    ticks_during.append(ticks)
    t.join()
    assert ticks_during[0] > 100_000


def test_import_maxtext_then_run():
    r = offsim.import_config("maxtext", ["scenarios/imports/maxtext-base.yml",
                                         "scenarios/imports/maxtext-llama3-8b.yml"],
                             set={"hardware.system": "dgx-h100"}, gpus=8,
                             overrides=["per_device_batch_size=2"])
    assert r["scenario"]["parallelism"] == {"dp": 8, "fsdp": True, "tp": 1, "pp": 1}
    assert {m["key"] for m in r["mapped"]} >= {"ici_fsdp_parallelism", "per_device_batch_size"}
    assert r["unmapped"] == []
    assert offsim.run(r["scenario"])["fits"]
    with pytest.raises(offsim.InputError) as e:
        offsim.import_config("maxtext", "scenarios/imports/maxtext-base.yml",
                             set={"hardware.system": "dgx-h100"})
    assert e.value.key == "ici_fsdp_parallelism" and e.value.line == 38
    with pytest.raises(offsim.InputError):
        offsim.import_config("caffe", "x.prototxt")


def test_sweep_rows_do_not_depend_on_jobs():
    assert offsim.sweep(SWEEP, jobs=1, as_frame=False) == offsim.sweep(SWEEP, jobs=2,
                                                                       as_frame=False)


def test_oversized_step_is_a_limit_error_before_building():
    # 200000 micro-batches of a 126-layer model over 14 stages: ~864M ops, refused by the
    # plan-size estimate (20M ops) before anything is built.
    with pytest.raises(offsim.LimitError) as e:
        offsim.run({"model": "llama3-405b", "hardware": {"system": "dgx-h100", "nodes": 14},
                    "training": {"global_batch": 200000, "micro_batch": 1, "seq_len": 4096},
                    "parallelism": {"tp": 8, "pp": 14}, "recompute": "full"})
    assert "plan too large" in str(e.value)
    with pytest.raises(offsim.LimitError):
        offsim.run(ONE, max_plan_ops=10)
    assert offsim.run(ONE, max_plan_ops=10_000_000, time_limit=600)["fits"]
