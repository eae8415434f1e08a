"""``wamdiff-bench plan``: both contenders through ``Planner.plan`` on the same weights, and their ratio."""

import json

from wamdiff_ros.bench.plan import main


def test_plan_benchmark_prints_both_contenders_and_their_ratio(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["--model", "wamdiff-tiny", "--runs", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| AR (next-token)" in text and "| block B=32" in text and "block vs AR, p50 per plan:" in text
    result = json.loads(out.read_text())
    assert result["ar"]["block_size"] == 1 and result["block"]["block_size"] == 32
    assert result["ar"]["forward_calls_per_token"] > result["block"]["forward_calls_per_token"]
    assert result["ratio_p50"] == result["ar"]["p50_ms"] / result["block"]["p50_ms"] > 0
    assert result["block"]["decode_path"] == "attention sdpa, cuda_graph off (cpu), grammar in the step"
