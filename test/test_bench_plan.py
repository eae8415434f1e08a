"""``wamdiff-bench plan``: the contenders through ``Planner.plan`` (and the host loop) on the same weights, their
ratios, page faults and stage times; a baseline checkout timed beside this one in worker processes; the fixture."""

import json

import pytest

from wamdiff_ros.bench import plan as plan_bench
from wamdiff_ros.bench.plan import THIS_TREE, main


def test_plan_benchmark_prints_the_contenders_and_their_ratios(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["--model", "wamdiff-tiny", "--runs", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| AR (next-token)" in text and "| block B=32, runner" in text and "| block B=32, host loop" in text
    assert "block vs AR, p50 per plan:" in text and "block through the runner vs the host loop" in text
    assert "faults/plan" in text and "logits for its last position only" in text
    result = json.loads(out.read_text())
    assert result["contenders"] == ["ar", "block", "host"] and result["vocab"] == 540
    assert result["ar"]["block_size"] == 1 and result["block"]["block_size"] == result["host"]["block_size"] == 32
    assert result["ar"]["forward_calls_per_token"] > result["block"]["forward_calls_per_token"]
    assert result["block"]["forward_calls_per_token"] == result["host"]["forward_calls_per_token"]
    assert result["block"]["texts"] == result["host"]["texts"]  # the runner answers what the host loop answers
    assert result["ratio_p50"] == result["ar"]["p50_ms"] / result["block"]["p50_ms"] > 0
    assert result["host_vs_block_p50"] == result["host"]["p50_ms"] / result["block"]["p50_ms"]
    assert result["block"]["decode_path"] == "attention sdpa, cuda_graph off (cpu), grammar in the step"
    assert result["grammar"] == "in the step" and result["host"]["decode_path"].startswith("decode_blocks_host")
    for name in result["contenders"]:
        r = result[name]
        assert r["minor_faults_per_plan"] >= 0 and r["decode_ms_per_forward"] > 0
        assert r["prefill_ms_p50"] > 0 and r["vision_ms_p50"] > 0 and r["preprocess_ms_p50"] > 0


def test_a_baseline_checkout_runs_in_worker_processes_beside_this_one(tmp_path, capsys):
    """This checkout as its own baseline: two workers, each importing the package from the tree it was given,
    interleaved; both answer the same text."""
    out = tmp_path / "plan.json"
    assert main(["--model", "wamdiff-tiny", "--runs", "1", "--contenders", "block", "--threads", "1",
                 "--baseline-worktree", str(THIS_TREE), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "[baseline" in text and "vs the baseline:" in text and "same text: yes" in text
    result = json.loads(out.read_text())
    assert result["contenders"] == ["block"] and "ar" not in result and result["torch_threads"] == 1
    assert result["baseline"]["tree"] == str(THIS_TREE) and result["vs_baseline"]["block"]["same_text"]


def test_the_fixture_is_written_once_and_named_exclusively(tmp_path, monkeypatch):
    monkeypatch.setattr(plan_bench, "FIXTURE_ROOT", tmp_path / "fixtures")
    writes = []
    monkeypatch.setattr("wamdiff_ros.bench.fixture.write_fixture",
                        lambda folder, layout, size: (writes.append((layout, size)), folder.mkdir(parents=True),
                                                      (folder / "config.json").write_text("{}")))
    first = plan_bench.fixture_folder("wam_diff2-small", plan_bench.FIXTURE_ROOT)
    assert plan_bench.fixture_folder("wam_diff2-small", plan_bench.FIXTURE_ROOT) == first
    assert writes == [("wam_diff2", "small")] and first == (tmp_path / "fixtures" / "wam_diff2-small").resolve()
    with pytest.raises(ValueError, match="not one of"):
        plan_bench.fixture_folder("nope")
    with pytest.raises(SystemExit):
        main(["--model", "wamdiff-tiny", "--fixture", "wam_diff2-small"])
