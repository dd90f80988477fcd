"""What the loaders read and what save_quantized writes or removes: a failed save keeps the previous checkpoint,
files fastnf4 did not write are never removed, non-persistent buffers are not loaded, and only regular files inside
the checkpoint folder are read (never blocking on a FIFO). Tiny Llama models on CPU."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from safetensors.torch import load_file, save_file  # noqa: E402

import fastnf4.integrations.transformers as tf  # noqa: E402
from fastnf4.integrations.transformers import load_and_quantize, load_quantized, save_quantized  # noqa: E402
from .test_transformers import _copy, _edit, checkpoint, logits, tiny_llama  # noqa: E402,F401

IDS = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(5))
INDEX = "model.safetensors.index.json"


def files(d):
    """{name: bytes} of every entry in ``d`` (hidden ones too: leftover temporary files show)."""
    return {n: open(os.path.join(d, n), "rb").read() for n in os.listdir(d)}


def quantized(tmp_path, seed):
    """A tiny Llama as load_and_quantize gives it (its rotary buffers as a load builds them, in float32)."""
    d = tmp_path / f"bf16-{seed}"
    if not d.exists():
        tiny_llama(seed).save_pretrained(d)
    return load_and_quantize(str(d), device="cpu")


def test_save_keeps_files_it_did_not_write(tmp_path):
    """Another tool's files, even named model*.safetensors, survive a save (they used to be deleted)."""
    out = tmp_path / "out"
    out.mkdir()
    save_file({"x": torch.ones(3)}, str(out / "model-extra.safetensors"))
    save_file({"y": torch.ones(2)}, str(out / "consolidated.safetensors"))
    (out / "notes.txt").write_text("keep me")
    before = files(out)
    q = quantized(tmp_path, 0)
    for shard_bytes in (None, 20_000, None):
        save_quantized(q, str(out), max_shard_bytes=shard_bytes)
        now = files(out)
        assert {n: now.get(n) for n in before} == before
        assert torch.equal(logits(load_quantized(str(out), device="cpu"), IDS), logits(q, IDS))


@pytest.mark.parametrize("shard_bytes", [None, 20_000])
def test_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch, shard_bytes):
    """An exception half-way through writing the tensors leaves every file as it was (no temporary file left) and
    the previous checkpoint loading as before; into an empty folder, it leaves the folder empty."""
    out = str(tmp_path / "out")
    old = quantized(tmp_path, 0)
    save_quantized(old, out, max_shard_bytes=shard_bytes)
    before = files(out)
    calls = []
    real = tf.save_file

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(tf, "save_file", failing)
    new = quantized(tmp_path, 1)
    with pytest.raises(RuntimeError, match="disk full"):
        save_quantized(new, out, max_shard_bytes=20_000)
    assert files(out) == before
    assert torch.equal(logits(load_quantized(out, device="cpu"), IDS), logits(old, IDS))
    calls.clear()
    empty = str(tmp_path / "empty")
    with pytest.raises(RuntimeError, match="disk full"):
        save_quantized(new, empty, max_shard_bytes=20_000)
    assert os.listdir(empty) == []


def test_resave_removes_only_its_own_stale_files(tmp_path):
    """A save removes the shards (and index) that its previous save listed and does not rewrite; a file of a shard's
    name that fastnf4 did not write stays. Another writer's model.safetensors (transformers reads it before an index)
    stops a sharded save, and another writer's index (fastnf4 reads it before model.safetensors) a single-file save,
    before anything is written."""
    out = tmp_path / "out"
    q0, q1 = quantized(tmp_path, 0), quantized(tmp_path, 1)
    save_quantized(q0, str(out), max_shard_bytes=20_000)
    old_shards = set(json.load(open(out / INDEX))["weight_map"].values())
    assert len(old_shards) > 2
    save_file({"x": torch.ones(3)}, str(out / "model-00001-of-00099.safetensors"))  # not listed: another tool's
    save_quantized(q1, str(out))
    left = set(os.listdir(out))
    assert not old_shards & left and INDEX not in left
    assert {"model.safetensors", "config.json", "model-00001-of-00099.safetensors"} <= left
    assert torch.equal(logits(load_quantized(str(out), device="cpu"), IDS), logits(q1, IDS))
    save_quantized(q0, str(out), max_shard_bytes=20_000)
    assert "model.safetensors" not in os.listdir(out)  # its own single file, stale beside the shards
    assert torch.equal(logits(load_quantized(str(out), device="cpu"), IDS), logits(q0, IDS))

    foreign = tmp_path / "foreign"
    tiny_llama(2).save_pretrained(foreign)  # transformers' model.safetensors
    before = files(foreign)
    with pytest.raises(ValueError, match="model.safetensors was not written by fastnf4"):
        save_quantized(q0, str(foreign), max_shard_bytes=20_000)
    assert files(foreign) == before

    sharded = tmp_path / "sharded"
    tiny_llama(2).save_pretrained(sharded, max_shard_size="60KB")
    assert INDEX in os.listdir(sharded) and len(os.listdir(sharded)) > 3
    before = files(sharded)
    with pytest.raises(ValueError, match=INDEX):
        save_quantized(q1, str(sharded))
    assert files(sharded) == before


def test_non_persistent_buffers_in_a_checkpoint_are_not_loaded(checkpoint, tmp_path):
    """A rotary ``inv_freq`` (a non-persistent buffer) planted in a checkpoint is skipped with a warning, as
    transformers skips it; it used to be loaded and changed the logits."""
    _, path = checkpoint
    nf4 = str(tmp_path / "nf4")
    save_quantized(load_and_quantize(path, device="cpu"), nf4)
    want = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).model.rotary_emb.inv_freq
    ref = logits(load_quantized(nf4, device="cpu"), IDS)

    def plant(sd):
        sd["model.rotary_emb.inv_freq"] = want * 3
        sd["model.rotary_emb.original_inv_freq"] = want * 3

    for src, load in ((path, load_and_quantize), (nf4, load_quantized)):
        d = _copy(src, tmp_path / f"planted-{load.__name__}")
        _edit(d, plant)
        if load is load_and_quantize:  # the independent expectation: transformers leaves the buffer as built
            theirs = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
            assert torch.equal(theirs.model.rotary_emb.inv_freq, want)
        with pytest.warns(UserWarning, match="rotary_emb.inv_freq"):
            m = load(d, device="cpu")
        assert torch.equal(m.model.rotary_emb.inv_freq, want)
        assert torch.equal(logits(m, IDS), ref)


@pytest.fixture
def sharded(checkpoint, tmp_path):
    """A fastnf4 checkpoint in shards with an index, and a valid copy of one of its shards outside its folder."""
    d = str(tmp_path / "sharded")
    save_quantized(load_and_quantize(checkpoint[1], device="cpu"), d, max_shard_bytes=20_000)
    name = sorted(set(json.load(open(os.path.join(d, INDEX)))["weight_map"].values()))[0]
    outside = str(tmp_path / "outside.safetensors")
    shutil.copy(os.path.join(d, name), outside)
    return d, name, outside


def _retarget(d, name, entry):
    """Point the index's entries for shard ``name`` at ``entry``."""
    f = os.path.join(d, INDEX)
    index = json.load(open(f))
    index["weight_map"] = {k: (entry if v == name else v) for k, v in index["weight_map"].items()}
    json.dump(index, open(f, "w"))


def test_files_outside_the_folder_are_refused(sharded, checkpoint, tmp_path):
    """Index entries of ``../x``, an absolute path or a symlink out of the folder, and a symlinked
    model.safetensors leading out of it, are refused by name (each named file is a valid shard: it used to be read)."""
    d, name, outside = sharded
    cases = {"../outside.safetensors": None, outside: None, "link.safetensors": outside}
    for i, (entry, link_to) in enumerate(cases.items()):
        c = _copy(d, tmp_path / f"case{i}")
        if link_to:
            os.symlink(link_to, os.path.join(c, entry))
        _retarget(c, name, entry)  # (../outside.safetensors is the copy beside the folder)
        with pytest.raises(ValueError, match=f"{re.escape(entry)}.*outside the checkpoint folder"):
            load_quantized(c, device="cpu")
    c = _copy(checkpoint[1], tmp_path / "single")
    moved = str(tmp_path / "elsewhere.safetensors")
    os.replace(os.path.join(c, "model.safetensors"), moved)
    os.symlink(moved, os.path.join(c, "model.safetensors"))
    with pytest.raises(ValueError, match="model.safetensors.*outside the checkpoint folder"):
        load_and_quantize(c, device="cpu")
    inside = _copy(checkpoint[1], tmp_path / "inside")  # a symlink within the folder is fine
    os.rename(os.path.join(inside, "model.safetensors"), os.path.join(inside, "weights.bin"))
    os.symlink("weights.bin", os.path.join(inside, "model.safetensors"))
    load_and_quantize(inside, device="cpu")


def test_a_hugging_face_cache_snapshot_loads(checkpoint, tmp_path):
    """huggingface_hub's cache: ``<repo>/snapshots/<rev>/<file>`` are symlinks to ``<repo>/blobs/<hash>``. Those load;
    a snapshot file linked anywhere else is still refused."""
    repo = tmp_path / "models--org--tiny"
    snap, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted(os.listdir(checkpoint[1]))):
        os.replace(os.path.join(checkpoint[1], f), blobs / f"blob{i}")
        os.symlink(f"../../blobs/blob{i}", snap / f)
    load_and_quantize(str(snap), device="cpu")
    stray = tmp_path / "stray.safetensors"
    os.replace(os.path.realpath(snap / "model.safetensors"), stray)
    os.unlink(snap / "model.safetensors")
    os.symlink(stray, snap / "model.safetensors")
    with pytest.raises(ValueError, match="model.safetensors.*outside the checkpoint folder"):
        load_and_quantize(str(snap), device="cpu")


_CHILD = """
import json, sys
from fastnf4.integrations.transformers import load_and_quantize, load_quantized
seen = {}
for case, path in json.loads(sys.argv[1]).items():
    load = load_quantized if case.startswith("nf4") else load_and_quantize
    try:
        load(path, device="cpu")
        seen[case] = "loaded"
    except Exception as e:
        seen[case] = f"{type(e).__name__}: {e}"
print(json.dumps(seen))
"""


def test_non_regular_files_are_refused_without_blocking(sharded, checkpoint, tmp_path):
    """A FIFO or a folder in the place of model.safetensors, an indexed shard, the index or config.json is a
    ValueError naming it. Run in a child process with a time limit: opening a FIFO blocks until a writer comes, in
    safetensors' own code, so a regression fails here rather than hanging the suite."""
    d, name, _ = sharded
    cases = {}

    def case(label, src, entry, make, remove=None):
        """A copy of ``src`` without its file ``remove`` (default: ``entry``), with ``make(entry)`` in its place."""
        c = _copy(src, tmp_path / label)
        os.remove(os.path.join(c, remove or entry))
        make(os.path.join(c, entry))
        cases[label] = (c, entry)

    case("bf16-fifo-model", checkpoint[1], "model.safetensors", os.mkfifo)
    case("bf16-fifo-config", checkpoint[1], "config.json", os.mkfifo)
    case("bf16-dir-model", checkpoint[1], "model.safetensors", os.mkdir)
    case("bf16-fifo-glob", checkpoint[1], "other.safetensors", os.mkfifo, remove="model.safetensors")
    case("nf4-fifo-shard", d, name, os.mkfifo)
    case("nf4-dir-shard", d, name, os.mkdir)
    case("nf4-fifo-index", d, INDEX, os.mkfifo)
    try:
        r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps({k: c for k, (c, _) in cases.items()})],
                           capture_output=True, text=True, timeout=240, env={**os.environ},
                           cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    except subprocess.TimeoutExpired:
        pytest.fail("a load blocked (on a FIFO)")
    assert r.returncode == 0, r.stderr[-2000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    for label, (_, entry) in cases.items():
        assert seen[label].startswith("ValueError: ") and entry in seen[label] and "not a regular file" in seen[label], \
            (label, seen[label])
