"""``fastnf4 bench matmul`` options on CPU (the benchmark itself needs a GPU): ``--layouts`` reaches the benchmark,
and values outside ``fastnf4.LAYOUTS`` are refused by the parser."""
import pytest
import torch

import fastnf4
from fastnf4 import cli
from fastnf4.bench.registry import BENCHMARKS, load_all


def parsed_opts(monkeypatch, tmp_path, *args):
    load_all()
    seen = {}

    def fake(opts):
        seen["opts"] = opts
        return {"rows": [], "table": ""}

    monkeypatch.setitem(BENCHMARKS, "matmul", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    import fastnf4.bench.harness as harness

    monkeypatch.setattr(harness, "environment", lambda: {"gpu": "test gpu", "bitsandbytes": None})
    assert cli.main(["bench", "matmul", "--json", str(tmp_path / "out.json"), *args]) == 0
    return seen["opts"]


def test_layouts_reach_the_benchmark(monkeypatch, tmp_path):
    assert parsed_opts(monkeypatch, tmp_path).layouts is None  # (the benchmark's default: bnb only)
    opts = parsed_opts(monkeypatch, tmp_path, "--layouts", "bnb", "fastnf4", "--m", "1", "16")
    assert opts.layouts == ["bnb", "fastnf4"] and opts.m == [1, 16]
    assert set(opts.layouts) <= set(fastnf4.LAYOUTS)


@pytest.mark.parametrize("args", [["--layouts", "tiled"], ["--layouts"]])
def test_bad_layouts_are_refused(monkeypatch, tmp_path, args):
    with pytest.raises(SystemExit) as exc:
        parsed_opts(monkeypatch, tmp_path, *args)
    assert exc.value.code == 2
