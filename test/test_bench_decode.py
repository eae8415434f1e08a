"""wamdiff-bench decode end to end on the tiny random model: every contender, the constraint's cost and the lean
layer loop against the transformers modules, measured in the same rounds."""

import json

from wamdiff_ros.bench import decode


def test_decode_bench_reports_every_contender_and_the_layer_loop(tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert decode.main(["--new-tokens", "128", "--runs", "5", "--threads", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["new_tokens"] == 128 and result["runs"] == 5
    assert result["ar"]["forward_calls_per_token"] > 0.9
    assert result["block"]["32"]["forward_calls_per_token"] == 16 / 128  # 4 static steps a block
    layers = result["layers"]
    assert layers["lean_tokens_per_s"] == result["block"]["32"]["tokens_per_s"]
    assert layers["modules_tokens_per_s"] > 0 and layers["speedup"] > 0
    assert layers["unstacked_tokens_per_s"] > 0 and layers["stacking_speedup"] > 0
    c = result["constraint"]
    assert c["constrained_tokens_per_s"] > 0 and c["cost"] < 1
    text = capsys.readouterr().out
    assert "vocabulary constraint (B=32 static)" in text
    assert "engine layer loop (B=32 static): transformers modules" in text and "paired speed-up" in text
    assert "of which stacked projections (B=32 static)" in text
