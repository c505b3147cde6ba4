"""ChunkWriter: a video written chunk by chunk equals writer.write_output of the whole; failures leave nothing."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from vaeshard.cli import io, writer
from vaeshard.cli.writer import ChunkWriter


def _video(batch: int = 1, frames: int = 9, height: int = 48, width: int = 64, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(batch, 3, frames, height, width, generator=g) * 2.2 - 1.1).clamp(-1, 1).to(dtype)


def _chunks(video, sizes=(1, 4, 4)):
    assert sum(sizes) == video.shape[2]
    return list(torch.split(video, list(sizes), dim=2))


def _write(path, kind, chunks, **kwargs) -> list[str]:
    with ChunkWriter(path, kind, **kwargs) as w:
        for chunk in chunks:
            w.write(chunk)
        return w.close()


def _read_png(path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def _leftovers(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("."))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_is_the_diffusers_rounding(dtype):
    video = _video(dtype=dtype)
    x = (video.to(torch.float32) / 2 + 0.5).clamp(0, 1)
    expected = (x.permute(0, 2, 3, 4, 1) * 255).round().to(torch.uint8).numpy()
    got = io.quantize(video)
    assert got.dtype == torch.uint8 and got.is_contiguous() and tuple(got.shape) == (1, 9, 48, 64, 3)
    np.testing.assert_array_equal(got.numpy(), expected)
    np.testing.assert_array_equal(io.to_uint8_frames(video), expected)


@pytest.mark.parametrize(("batch", "sizes", "depth"), [(1, (1, 4, 4), 2), (2, (1, 4, 4), 1), (2, (3, 1, 5), 3)])
def test_frames_written_chunk_by_chunk_equal_the_whole(tmp_path, batch, sizes, depth):
    video = _video(batch=batch, dtype=torch.bfloat16)
    out = tmp_path / "frames"
    paths = _write(out, "frames", _chunks(video, sizes), depth=depth)
    names = [f"{t:05d}.png" if batch == 1 else f"b{b:02d}_{t:05d}.png" for b in range(batch) for t in range(9)]
    assert paths == [str(out / name) for name in names]
    expected = io.to_uint8_frames(video)
    for b in range(batch):
        for t in range(9):
            np.testing.assert_array_equal(_read_png(out / writer.frame_name(b, t, batch)), expected[b, t])
    assert sorted(os.listdir(out)) == sorted(names) and _leftovers(tmp_path) == []
    # the same as write_output, which is one write of the whole video
    assert writer.write_output(video, tmp_path / "whole", "frames") == [str(tmp_path / "whole" / n) for n in names]


def test_frames_into_an_existing_folder_are_added(tmp_path):
    out = tmp_path / "frames"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    (out / "00000.png").write_bytes(b"old")
    video = _video()
    paths = _write(out, "frames", _chunks(video))
    assert paths == [str(out / f"{t:05d}.png") for t in range(9)]
    assert (out / "keep.txt").read_text() == "mine"
    np.testing.assert_array_equal(_read_png(out / "00000.png"), io.to_uint8_frames(video)[0, 0])
    assert len(os.listdir(out)) == 10 and _leftovers(tmp_path) == []


@pytest.mark.parametrize("kind, name", [("mp4", "v.mp4"), ("frames", "frames")])
def test_finish_hands_the_complete_output_over_and_only_its_commit_puts_it_in_place(tmp_path, kind, name):
    import pickle

    video = _video()
    w = ChunkWriter(tmp_path / name, kind, tag="t1")
    for chunk in _chunks(video):
        w.write(chunk)
    finished = pickle.loads(pickle.dumps(w.finish()))  # as a rank hands it to the process that started it
    w.abort()  # the writer is done: the output is the Finished's now
    assert not (tmp_path / name).exists() and _leftovers(tmp_path) == [os.path.basename(finished.tmp)]
    assert os.path.basename(finished.tmp).startswith(f".{name}.t1.")
    (tmp_path / "whole").mkdir()
    expected = _write(tmp_path / "whole" / name, kind, _chunks(video))  # closed by the writer itself
    paths = finished.commit()
    assert [os.path.relpath(p, tmp_path) for p in paths] == [os.path.relpath(p, tmp_path / "whole") for p in expected]
    assert _leftovers(tmp_path) == []
    for got, want in zip(paths, expected):
        assert open(got, "rb").read() == open(want, "rb").read()
    writer.remove_temporary(tmp_path / name, "t1")  # nothing of this tag is left: a no-op
    assert (tmp_path / name).exists()


def test_png_holds_one_frame(tmp_path):
    video = _video(frames=1)
    out = tmp_path / "image.png"
    assert _write(out, "png", [video]) == [str(out)]
    np.testing.assert_array_equal(_read_png(out), io.to_uint8_frames(video)[0, 0])
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~writer.umask())
    with pytest.raises(io.InputError, match="decode to 2 frames; a .png holds one"):
        _write(tmp_path / "two.png", "png", _chunks(_video(frames=2), (1, 1)))
    with pytest.raises(io.InputError, match="batch of 2; png holds one video"):
        _write(tmp_path / "batch.png", "png", [_video(batch=2, frames=1)])
    assert sorted(os.listdir(tmp_path)) == ["image.png"]


def test_mp4_has_the_frames_and_size(tmp_path):
    import av

    out = tmp_path / "video.mp4"
    assert _write(out, "mp4", _chunks(_video(dtype=torch.float16), (1, 4, 3, 1)), fps=8) == [str(out)]
    with av.open(str(out)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        assert (stream.codec_context.name, stream.average_rate) == ("h264", 8)
    assert len(frames) == 9 and {(f.width, f.height) for f in frames} == {(64, 48)}
    assert _leftovers(tmp_path) == []


def test_mp4_with_an_odd_frame_size_raises_and_leaves_nothing(tmp_path):
    out = tmp_path / "odd.mp4"
    with pytest.raises(io.InputError, match="H.264 needs an even frame size, got 63x48"):
        _write(out, "mp4", _chunks(_video(width=63)))
    with pytest.raises(io.InputError, match="batch of 2; mp4 holds one video"):
        writer.write_output(_video(batch=2), out, "mp4")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind", ["safetensors", "pt"])
def test_tensors_equal_the_whole(tmp_path, kind):
    from safetensors.torch import load_file

    video = _video(batch=2, dtype=torch.bfloat16)
    out = tmp_path / f"video.{kind}"
    assert _write(out, kind, _chunks(video, (2, 2, 5))) == [str(out)]
    saved = load_file(str(out))[io.SAFETENSORS_OUTPUT_KEY] if kind == "safetensors" else torch.load(str(out))
    assert saved.dtype == torch.bfloat16 and torch.equal(saved, video)
    assert os.listdir(tmp_path) == [out.name]


@pytest.mark.parametrize(("kind", "name"), [("frames", "frames"), ("mp4", "v.mp4"), ("pt", "v.pt")])
def test_an_exception_inside_with_leaves_nothing(tmp_path, kind, name):
    chunks = _chunks(_video())
    with pytest.raises(KeyError, match="stop"):
        with ChunkWriter(tmp_path / name, kind) as w:
            w.write(chunks[0])
            w.write(chunks[1])
            raise KeyError("stop")
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="aborted"):
        w.write(chunks[2])


class DiskFull(OSError):
    pass


def _failing_png(frame_hwc, path):
    raise DiskFull(28, "no space left for this frame")


def test_a_worker_failure_surfaces_from_close(tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "_write_png", _failing_png)
    w = ChunkWriter(tmp_path / "frames", "frames")
    w.write(_video(frames=1))
    with pytest.raises(DiskFull, match="no space left for this frame"):
        w.close()
    assert os.listdir(tmp_path) == []


def test_a_worker_failure_surfaces_from_write_without_hanging(tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "_write_png", _failing_png)
    chunks = _chunks(_video())
    with pytest.raises(DiskFull, match="no space left for this frame"):
        with ChunkWriter(tmp_path / "frames", "frames", depth=1) as w:
            w.write(chunks[0])  # the worker fails on it and keeps its one slot: the next write sees the error
            w.write(chunks[1])
            pytest.fail("the second write returned")
    assert os.listdir(tmp_path) == []


def test_an_encoder_failure_in_mp4_surfaces_with_its_message(tmp_path, monkeypatch):
    add = writer._Mp4.add

    def fail(self, frames, start):
        if start > 0:
            raise RuntimeError(f"encoder broke at frame {start}")
        add(self, frames, start)  # the container is open when the second chunk fails

    monkeypatch.setattr(writer._Mp4, "add", fail)
    with pytest.raises(RuntimeError, match="encoder broke at frame 1"):
        with ChunkWriter(tmp_path / "v.mp4", "mp4") as w:
            for chunk in _chunks(_video()):
                w.write(chunk)
    assert os.listdir(tmp_path) == []


def test_abort_and_mismatched_chunks(tmp_path):
    w = ChunkWriter(tmp_path / "frames", "frames")
    w.write(_video(frames=2))
    w.abort()
    w.abort()
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="follows chunks of shape"):
        _write(tmp_path / "v.pt", "pt", [_video(frames=2), _video(frames=2, width=32)])
    with pytest.raises(ValueError, match="nothing was written"):
        _write(tmp_path / "v.mp4", "mp4", [])
    with pytest.raises(ValueError, match="unknown output kind"):
        ChunkWriter(tmp_path / "v.gif", "gif")
    assert os.listdir(tmp_path) == []
