"""vaeshard's cache folder (vaeshard/kernels/cache.py): where it is, its per-GPU-and-versions subfolders and
their manifests, stale and corrupt ones ignored with a warning, and Triton pointed at it only while
vaeshard's own kernels launch for the first time."""

from __future__ import annotations

import json
import logging

import pytest

from vaeshard.kernels import cache, triton_support

KEY = {"gpu": "NVIDIA H200", "capability": "9.0", "torch": "2.11.0", "triton": "3.6.0", "vaeshard": "0.2.0"}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setattr(cache, "_ready", {})
    return tmp_path / "cache"


def test_the_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.root() == tmp_path / "xdg" / "vaeshard"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.root().parts[-2:] == (".cache", "vaeshard")
    monkeypatch.setenv(cache.ENV, str(tmp_path / "mine"))
    assert cache.root() == tmp_path / "mine"
    monkeypatch.setenv(cache.ENV, "off")
    assert cache.root() is None
    monkeypatch.setattr(cache, "_ready", {})
    assert cache.folder("triton", KEY) is None


def test_one_subfolder_per_gpu_and_versions_with_its_manifest(home):
    place = cache.folder("triton", KEY)
    assert place.is_dir() and place.name == "triton"
    assert place.parent.name.startswith("nvidia-h200-sm90-")
    assert json.loads((place.parent / cache.MANIFEST).read_text()) == KEY
    newer = {**KEY, "triton": "3.7.0"}
    other = cache.folder("triton", newer)
    assert other.parent != place.parent and place.is_dir()  # both kept: each process finds its own
    import importlib.metadata

    try:
        installed = importlib.metadata.version("vaeshard")
    except importlib.metadata.PackageNotFoundError:
        installed = "source"
    assert cache.key()["vaeshard"] == installed


@pytest.mark.parametrize(
    "manifest,why",
    [
        ('{"gpu": "NVIDIA H100"}', "other versions or another GPU"),
        ("{not json", "cannot be read"),
    ],
)
def test_a_stale_or_corrupt_subfolder_is_ignored_with_a_warning_and_rebuilt(home, caplog, manifest, why):
    place = cache.folder("triton", KEY)
    (place / "kernel.cubin").write_bytes(b"old")
    (place.parent / cache.MANIFEST).write_text(manifest)
    cache._ready.clear()  # a later process
    with caplog.at_level(logging.WARNING, logger="vaeshard"):
        again = cache.folder("triton", KEY)
    assert again == place and not (place / "kernel.cubin").exists()
    assert json.loads((place.parent / cache.MANIFEST).read_text()) == KEY
    assert any("ignored and rebuilt" in r.message and why in r.message for r in caplog.records), caplog.text
    caplog.clear()
    cache._ready.clear()
    with caplog.at_level(logging.WARNING, logger="vaeshard"):
        cache.folder("triton", KEY)  # now current: no warning
    assert not caplog.records


def test_triton_points_at_the_folder_only_inside_and_not_over_the_users_choice(home, monkeypatch):
    from triton import knobs

    before = knobs.cache.dir
    with cache.triton_kernels() as place:
        assert place is not None and knobs.cache.dir == str(place)
    assert knobs.cache.dir == before
    monkeypatch.setenv("TRITON_CACHE_DIR", str(home / "users"))
    with cache.triton_kernels() as place:
        assert place is None and knobs.cache.dir == str(home / "users")


class _Kernel:
    """Stands in for a Triton JIT function: records the cache folder each launch sees; the first
    `failures` launches raise as Triton does on an unreadable cache entry."""

    def __init__(self, failures: int):
        self.failures, self.seen = failures, []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            from triton import knobs

            self.seen.append(knobs.cache.dir)
            if self.failures:
                self.failures -= 1
                raise ValueError("Expecting value: line 1 column 1 (char 0)")
            return "compiled"

        return run


def test_a_first_launch_compiles_into_the_folder_and_survives_a_corrupt_entry(home, caplog, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kernel = _Kernel(failures=0)
    assert triton_support._first_launch(kernel, (1,), (), {}) == "compiled"
    place = cache.folder("triton")
    assert kernel.seen == [str(place)]
    (place / "entry.json").write_text("{")
    broken = _Kernel(failures=1)
    with caplog.at_level(logging.WARNING, logger="vaeshard"):
        assert triton_support._first_launch(broken, (1,), (), {}) == "compiled"
    assert len(broken.seen) == 2 and not (place / "entry.json").exists()
    assert "Triton could not read a kernel" in caplog.text
    always = _Kernel(failures=2)  # not the cache's fault: the second failure is raised
    with pytest.raises(ValueError, match="Expecting value"):
        triton_support._first_launch(always, (1,), (), {})
