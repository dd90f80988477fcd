"""``fastnf4 bench matmul --shapes NxK ...``: the option's parsing and the rows it turns into (CPU)."""
from __future__ import annotations

import pytest

from fastnf4.bench.harness import parse_shapes, selected_shapes
from helpers import bench_opts


def test_shapes_become_custom_rows_in_order():
    assert parse_shapes(["320x5120", "4096X4000", "7x3"]) == [
        ("custom", "320x5120", 320, 5120), ("custom", "4096x4000", 4096, 4000), ("custom", "7x3", 7, 3)]


@pytest.mark.parametrize("spec", ["320", "320x", "x5120", "320x5120x2", "0x64", "64x0", "-3x64", "3.5x64", "axb", ""])
def test_malformed_shapes_are_a_value_error_naming_them(spec):
    with pytest.raises(ValueError, match="--shapes") as e:
        parse_shapes([spec])
    assert repr(spec) in str(e.value)


def test_the_command_line_hands_the_shapes_to_the_bench(monkeypatch, tmp_path):
    opts = bench_opts(monkeypatch, tmp_path, "matmul", "--shapes", "320x5120", "4096x4000", "--m", "1", "16")
    assert opts.shapes == ["320x5120", "4096x4000"] and opts.m == [1, 16]
    assert bench_opts(monkeypatch, tmp_path, "matmul").shapes is None
    # without --shapes the models' own shapes (the default bench) are unchanged
    assert all(s[0] != "custom" for s in selected_shapes(None))
