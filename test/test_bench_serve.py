"""``wamdiff-bench serve``: the wamdiff-serve round trip against the in-process plan, one run (behaviour, not time)."""

from wamdiff_ros.bench import serve
from wamdiff_ros.bench.__main__ import main


def test_serve_benchmark_times_every_contender_on_the_same_requests(tmp_path, capsys):
    out = tmp_path / "serve.json"
    assert main(["serve", "--model", "tiny-random", "--rounds", "2", "--warmup", "0", "--threads", "1",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for row in ("Planner.plan (in process)", "wamdiff-serve, raw RGB", "wamdiff-serve, PNG",
                "wamdiff-serve, control only"):
        assert f"| {row} |" in text
    import json

    result = json.loads(out.read_text())
    assert result["rounds"] == 2 and result["transport"] == "tcp" and result["image"] == [128, 256, 3]
    ms = result["ms"]
    assert all(0 < ms[k]["p50"] <= ms[k]["p90"] for k in ("direct", "rgb8", "png", "control"))
    for encoding in ("rgb8", "png"):  # the protocol's share is part of the round trip, and the ratio is its own
        assert 0 < result["protocol_ms_p50"][encoding] < ms[encoding]["p90"]
        assert result["round_trip_over_direct"][encoding] > 0


def test_serve_benchmark_over_a_unix_socket(tmp_path):
    result = serve.run("tiny-random", rounds=1, warmup=0, unix=str(tmp_path / "s.sock"), threads=1)
    assert result["transport"] == "unix" and result["ms"]["control"]["p50"] > 0
