"""``fastnf4 bench matmul`` options on CPU (the benchmark itself needs a GPU): ``--layouts`` reaches the benchmark,
and values outside ``fastnf4.LAYOUTS`` are refused by the parser."""
import pytest

import fastnf4
from helpers import bench_opts


def parsed_opts(monkeypatch, tmp_path, *args):
    return bench_opts(monkeypatch, tmp_path, "matmul", *args)


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
