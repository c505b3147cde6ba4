"""Stream decoded video chunks to an output while the decode goes on.

Each chunk (B, C, t, H, W) in [-1, 1] is quantised to uint8 on its device on the current stream
(`io.quantize`). A CUDA chunk is then copied, on a side stream that waits for the current one through an
event, non_blocking into one of `depth` reusable pinned host buffers, and an event is recorded after the
copy; one worker thread waits for that event and encodes (PyAV for MP4, PIL for PNG) while the GPU goes on
with the next chunk. `write` blocks while `depth` chunks are pending, so host memory stays bounded.
Tensors (.safetensors, .pt) need the whole video: their chunks are kept on the host and saved at close.
Everything goes to a temporary file or folder next to `path` and is renamed into place at close, or
by whoever `finish()` hands it to (a decode on several ranks: the process that started them, once they
all succeeded); a `tag` in its name lets that process remove it if the writer's rank was killed
(`remove_temporary`). Or, with `into`, to a binary stream as it is encoded (the service's responses: a
fragmented MP4, a zip of PNG frames, or safetensors).
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from .io import OUTPUT_KINDS, SAFETENSORS_OUTPUT_KEY, InputError, check_video, quantize

MP4_CODEC = "libx264"
MP4_PIX_FMT = "yuv420p"
MP4_OPTIONS = {"crf": "17"}
# x264's presets, fastest first; the default keeps up with a one-GPU Wan 720p decode (BENCHMARKS.md,
# "Streamed decode and the first request"), where "medium" took several times the decode
MP4_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")
MP4_PRESET = "veryfast"
IMAGE_KINDS = ("mp4", "png", "frames", "zip")  # encoded from uint8 frames by the worker
STREAM_KINDS = ("mp4", "zip", "safetensors")  # what a writer can send `into` a stream
# an MP4 readable while it is written: an empty moov first, then one fragment per keyframe
MP4_FRAGMENTED = {"movflags": "frag_keyframe+empty_moov+default_base_moof"}
_POLL_S = 0.05  # how often a blocked producer or an idle worker looks for an error or a stop
_DONE, _STOP = object(), object()  # what the producer can put to the worker, besides a chunk


def frame_name(b: int, t: int, batch: int) -> str:
    """The PNG name of frame `t` of batch item `b`: `00000.png`, or `b00_00000.png` in a batch."""
    return f"{t:05d}.png" if batch == 1 else f"b{b:02d}_{t:05d}.png"


def _write_png(frame_hwc, path: str) -> None:
    from PIL import Image

    Image.fromarray(frame_hwc).save(path, format="PNG")


class ChunkWriter:
    """Writes a video given as chunks (B, C, t, H, W) in frame order to `path` as `kind` (one of
    io.OUTPUT_KINDS). `close()` finishes and returns the paths written; `abort()` leaves nothing. As a
    context manager it closes on a clean exit and aborts on an exception. A tensor output keeps the
    chunks it is given (on the host); they must not be changed in place before close. `finish()` is a
    close that leaves the output in its temporary place, for the `Finished` it returns to commit.

    tag: a word in the temporary output's name, `.NAME.TAG.XXXXXXXX.tmp`, for `remove_temporary`.

    into: a binary stream (an object with `write`) that receives the output as it is encoded instead of
    a file (`path` then only names it in messages; close returns no paths); kind one of STREAM_KINDS.

    pixels: the samples' pixel convention for image and video kinds, (scale, offset) with `sample *
    scale + offset` the pixel in [0, 1] (`ShapeFacts.pixel_scale`, `pixel_offset`; io.quantize)."""

    def __init__(
        self,
        path: str | os.PathLike,
        kind: str,
        fps: int = 16,
        *,
        depth: int = 2,
        preset: str = MP4_PRESET,
        into=None,
        tag: str = "",
        pixels: tuple = ((0.5,), (0.5,)),
    ) -> None:
        kinds = OUTPUT_KINDS if into is None else STREAM_KINDS
        if kind not in kinds:
            raise ValueError(f"unknown output kind {kind!r}: expected one of {', '.join(kinds)}")
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.path, self.kind, self.fps, self._into = Path(path), kind, fps, into is not None
        if preset not in MP4_PRESETS:
            raise ValueError(f"unknown x264 preset {preset!r}: expected one of {', '.join(MP4_PRESETS)}")
        self._sink = _SINKS[kind](self.path, fps, preset, tag) if into is None else _INTO[kind](into, fps, preset)
        self._worker = _Worker(self._sink, depth, pixels) if kind in IMAGE_KINDS else None
        self._finalizer = weakref.finalize(self, _abandon, self._sink, self._worker)
        self._shape: tuple[int, int, int, int] | None = None  # (B, C, H, W) of the first chunk
        self._frames = 0
        self._paths: list[str] | None = None
        self._finished: Finished | None = None
        self._aborted = False

    def write(self, chunk) -> None:
        """Queue the next frames (B, C, t, H, W); blocks only while `depth` chunks wait to be encoded.
        Raises a worker's error, or InputError for a video this kind cannot hold, after aborting."""
        self._check_open()
        try:
            if self._worker is not None:
                self._worker.raise_error()
            self._check(chunk)
            start, self._frames = self._frames, self._frames + chunk.shape[2]
            if chunk.shape[2] == 0:
                return
            if self._worker is None:
                self._sink.add(chunk.detach().cpu(), start)
            else:
                self._worker.put(chunk, start)
        except BaseException:
            self.abort()
            raise

    def close(self) -> list[str]:
        """Wait for the encoding, move the output into place; returns the paths written."""
        if self._paths is not None:
            return self._paths
        self._check_open()
        try:
            self._complete()
            self._paths = self._sink.commit()
        except BaseException:
            self.abort()
            raise
        self._finalizer.detach()
        return self._paths

    def finish(self) -> Finished:
        """Wait for the encoding and complete the temporary output, but leave it there: the returned
        `Finished` moves it into place (`commit`) or removes it (`discard`). The writer is then done."""
        self._check_open()
        if self._into:
            raise ValueError("a writer into a stream has no temporary output to hand over: close it instead")
        try:
            self._complete()
            self._finished = self._sink.finished()
        except BaseException:
            self.abort()
            raise
        self._finalizer.detach()
        return self._finished

    def abort(self) -> None:
        """Stop the worker and remove every temporary file; a no-op after a successful close or finish."""
        if self._paths is not None or self._finished is not None or self._aborted:
            return
        self._aborted = True
        if self._worker is not None:
            self._worker.stop()
        self._sink.discard()
        self._finalizer.detach()

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif self._finished is None:
            self.close()

    def _complete(self) -> None:
        if self._frames == 0:
            raise ValueError(f"nothing was written to {str(self.path)!r}: write at least one frame")
        if self._worker is not None:
            self._worker.finish()
        else:
            self._sink.finish()

    def _check_open(self) -> None:
        if self._aborted:
            raise ValueError(f"the writer of {str(self.path)!r} was aborted")
        if self._paths is not None or self._finished is not None:
            raise ValueError(f"the writer of {str(self.path)!r} is closed")

    def _check(self, chunk) -> None:
        if chunk.dim() != 5:
            raise ValueError(f"a chunk is (B, C, t, H, W); got shape {tuple(chunk.shape)}")
        b, c, t, h, w = (int(s) for s in chunk.shape)
        if self._shape is None:
            self._shape = (b, c, h, w)
        elif (b, c, h, w) != self._shape:
            expected = "({}, {}, t, {}, {})".format(*self._shape)
            raise ValueError(f"a chunk of shape {tuple(chunk.shape)} follows chunks of shape {expected}")
        check_video("frames" if self.kind == "zip" else self.kind, b, self._frames + t, c, (h, w))


@dataclass(frozen=True)
class Finished:
    """A writer's complete output, still in its temporary file or folder `tmp` next to `path`; picklable,
    so that a rank can hand it to the process that started it."""

    path: str
    tmp: str
    frames: tuple[str, ...] | None = None  # a folder of PNG frames: their names, in order

    def commit(self) -> list[str]:
        """Move the output into place (a folder's frames into `path` when it is an existing folder);
        returns the paths written."""
        path = Path(self.path)
        if self.frames is None:
            os.chmod(self.tmp, 0o666 & ~umask())  # mkstemp makes the file private; give it the usual mode
            os.replace(self.tmp, path)
            return [str(path)]
        for name in self.frames:
            os.chmod(os.path.join(self.tmp, name), 0o666 & ~umask())
        if path.is_dir():
            for name in self.frames:
                os.replace(os.path.join(self.tmp, name), path / name)
            os.rmdir(self.tmp)
        else:
            os.chmod(self.tmp, 0o777 & ~umask())
            os.replace(self.tmp, path)
        return [str(path / name) for name in self.frames]

    def discard(self) -> None:
        if self.frames is None:
            _remove(self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def remove_temporary(path: str | os.PathLike, tag: str) -> None:
    """Remove the temporary output of every writer of `path` made with `tag` (files and folders): what a
    writer on a rank that was killed left. Only a tagged writer's, so that no other run's is touched."""
    if not tag:
        raise ValueError("remove_temporary needs the tag the writer was given")
    path = Path(path)
    folder, prefix = path.resolve().parent, _temporary_prefix(path, tag)
    try:
        with os.scandir(folder) as entries:
            found = [e.path for e in entries if e.name.startswith(prefix) and e.name.endswith(".tmp")]
    except FileNotFoundError:
        return
    for name in found:
        if os.path.isdir(name) and not os.path.islink(name):
            shutil.rmtree(name, ignore_errors=True)
        else:
            _remove(name)


def _temporary_prefix(path: Path, tag: str) -> str:
    return f".{path.name}.{tag}." if tag else f".{path.name}."


def write_stream(vae, z, writer: ChunkWriter | None, **decode_kwargs) -> tuple[int, tuple[int, ...] | None]:
    """Decode `z` with a parallelized `vae` through `vaeshard.stream_decode` into `writer` (None on a rank
    that receives no chunks), each chunk written as it comes (an image decode as one frame). Returns
    (frames written, the (B, C, H, W) of a chunk or None). An error on either side ends both: the stream
    on every rank, the output left as nothing."""
    import vaeshard

    frames, shape = 0, None
    with vaeshard.stream_decode(vae, z, **decode_kwargs) as chunks:
        for chunk in chunks:
            if writer is None:
                continue
            chunk = chunk if chunk.dim() == 5 else chunk.unsqueeze(2)
            writer.write(chunk)
            frames += chunk.shape[2]
            shape = (chunk.shape[0], chunk.shape[1], chunk.shape[3], chunk.shape[4])
    return frames, shape


class _Slot:
    """One of `depth` pending chunks: its reusable pinned buffer, and while copying, the GPU tensor and event."""

    def __init__(self, pixels: tuple) -> None:
        self.pixels = pixels  # (scale, offset): io.quantize
        self.buffer = None  # pinned uint8, grown to the largest chunk seen
        self.source = None  # the quantised GPU chunk, alive until its copy is done
        self.copied = None  # CUDA event recorded after the copy

    def stage(self, chunk):
        """The chunk quantised, on the host (for a CUDA chunk: a copy started into the pinned buffer)."""
        import torch

        frames = quantize(chunk, self.pixels)
        if not frames.is_cuda:
            return frames
        n = frames.numel()
        if self.buffer is None or self.buffer.numel() < n:
            self.buffer = None
            self.buffer = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        host = self.buffer[:n].view(frames.shape)
        with torch.cuda.device(frames.device):
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream())
            side = _copy_stream(frames.device)
            side.wait_event(ready)
            with torch.cuda.stream(side):
                host.copy_(frames, non_blocking=True)
                frames.record_stream(side)
                self.copied = torch.cuda.Event(blocking=True)
                self.copied.record(side)
        self.source = frames
        return host

    def wait(self) -> None:
        if self.copied is not None:
            self.copied.synchronize()
        self.source = self.copied = None


_copy_streams: dict = {}


def _copy_stream(device):
    """One side stream per device for the device-to-host copies."""
    import torch

    if device not in _copy_streams:
        _copy_streams[device] = torch.cuda.Stream(device=device)
    return _copy_streams[device]


class _Worker:
    """The encoding thread: takes (slot, frames, start) in order, waits for each copy, hands the frames to
    the sink, then gives the slot back. It holds no reference to the ChunkWriter."""

    def __init__(self, sink: _Sink, depth: int, pixels: tuple) -> None:
        self.sink = sink
        self.free: queue.Queue[_Slot] = queue.Queue()
        for _ in range(depth):
            self.free.put(_Slot(pixels))
        self.pending: queue.Queue = queue.Queue()  # at most `depth` items: one per slot, then _DONE or _STOP
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="vaeshard-writer", daemon=True)
        self.thread.start()

    def put(self, chunk, start: int) -> None:
        while True:  # wait for a free slot, unless the worker failed
            self.raise_error()
            try:
                slot = self.free.get(timeout=_POLL_S)
                break
            except queue.Empty:
                continue
        try:
            frames = slot.stage(chunk)
        except BaseException:
            self.free.put(slot)
            raise
        self.pending.put((slot, frames, start))

    def finish(self) -> None:
        self.pending.put(_DONE)
        self.thread.join()
        self.raise_error()

    def stop(self) -> None:
        self.stopping.set()
        self.pending.put(_STOP)  # wakes an idle worker at once
        if threading.current_thread() is not self.thread:
            self.thread.join()

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        done = False
        try:
            while not self.stopping.is_set():
                try:
                    item = self.pending.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                if item is _STOP:
                    return
                if item is _DONE:
                    self.sink.finish()
                    done = True
                    return
                slot, frames, start = item
                slot.wait()
                self.sink.add(frames.numpy(), start)
                self.free.put(slot)
        except BaseException as exc:
            self.error = exc
        finally:
            if not done:
                _quietly(self.sink.discard)


def _abandon(sink: _Sink, worker: _Worker | None) -> None:
    """A writer collected without close or abort: drop its output (the worker drops it on its own thread)."""
    if worker is not None:
        worker.stopping.set()
        worker.pending.put(_STOP)
    else:
        _quietly(sink.discard)


def _quietly(fn) -> None:
    try:
        fn()
    except Exception:
        pass


# --- sinks: the temporary output of each kind ------------------------------------------------------


class _Sink:
    """A temporary file next to `path`: frames or chunks are added, then it is finished and renamed into place."""

    def __init__(self, path: Path, fps: int, preset: str = MP4_PRESET, tag: str = "") -> None:
        self.path, self.fps, self.preset = path, fps, preset
        prefix = _temporary_prefix(path, tag)
        fd, self.tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=str(path.resolve().parent))
        os.close(fd)

    def add(self, data, start: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        pass

    def finished(self) -> Finished:
        return Finished(str(self.path), self.tmp)

    def commit(self) -> list[str]:
        return self.finished().commit()

    def discard(self) -> None:
        self.finished().discard()


class _Mp4(_Sink):
    """H.264 in an MP4, encoded frame by frame."""

    def __init__(self, path: Path, fps: int, preset: str = MP4_PRESET, tag: str = "") -> None:
        super().__init__(path, fps, preset, tag)
        self.container = self.stream = None

    def add(self, frames, start: int) -> None:
        import av

        if self.container is None:
            _, _, height, width, _ = frames.shape
            self.container = self._open()
            self.stream = self.container.add_stream(MP4_CODEC, rate=self.fps)
            self.stream.width, self.stream.height, self.stream.pix_fmt = width, height, MP4_PIX_FMT
            self.stream.options = {**MP4_OPTIONS, "preset": self.preset}
        for frame in frames[0]:
            for packet in self.stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                self.container.mux(packet)

    def _open(self):
        import av

        return av.open(self.tmp, mode="w", format="mp4")

    def finish(self) -> None:
        for packet in self.stream.encode():
            self.container.mux(packet)
        self._close()

    def discard(self) -> None:
        _quietly(self._close)
        super().discard()

    def _close(self) -> None:
        container, self.container = self.container, None
        if container is not None:
            container.close()


class _Png(_Sink):
    """A single PNG (its one frame is checked by ChunkWriter)."""

    def add(self, frames, start: int) -> None:
        _write_png(frames[0, 0], self.tmp)


class _Frames(_Sink):
    """PNG frames (`frame_name`) in a temporary folder, which becomes `path`, or whose frames are moved
    into `path` when it is an existing folder."""

    def __init__(self, path: Path, fps: int, preset: str = MP4_PRESET, tag: str = "") -> None:
        self.path, self.fps, self.preset = path, fps, preset
        prefix = _temporary_prefix(path, tag)
        self.tmp = tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=str(path.resolve().parent))
        self.written: list[tuple[int, int, str]] = []

    def add(self, frames, start: int) -> None:
        batch, count = frames.shape[:2]
        for t in range(count):
            for b in range(batch):
                name = frame_name(b, start + t, batch)
                _write_png(frames[b, t], os.path.join(self.tmp, name))
                self.written.append((b, start + t, name))

    def finished(self) -> Finished:
        return Finished(str(self.path), self.tmp, tuple(name for _, _, name in sorted(self.written)))


class _Tensor(_Sink):
    """The raw chunks, concatenated along T and saved at finish with torch.save."""

    def __init__(self, path: Path, fps: int, preset: str = MP4_PRESET, tag: str = "") -> None:
        super().__init__(path, fps, preset, tag)
        self.chunks: list = []

    def add(self, chunk, start: int) -> None:
        self.chunks.append(chunk)

    def finish(self) -> None:
        import torch

        video = torch.cat(self.chunks, dim=2) if len(self.chunks) > 1 else self.chunks[0]
        self.chunks = []
        self.save(video)

    def save(self, video) -> None:
        import torch

        torch.save(video, self.tmp)


class _Safetensors(_Tensor):
    """The raw chunks, concatenated and saved as safetensors under io.SAFETENSORS_OUTPUT_KEY."""

    def save(self, video) -> None:
        from safetensors.torch import save_file

        save_file({SAFETENSORS_OUTPUT_KEY: video.contiguous()}, self.tmp)


_SINKS: dict[str, type[_Sink]] = {
    "mp4": _Mp4,
    "png": _Png,
    "frames": _Frames,
    "safetensors": _Safetensors,
    "pt": _Tensor,
}


# --- into a stream ---------------------------------------------------------------------------------


class _Mp4Into(_Mp4):
    """A fragmented MP4 into a stream: a player can start on the first fragment."""

    def __init__(self, into, fps: int, preset: str = MP4_PRESET) -> None:
        self.into, self.fps, self.preset = into, fps, preset
        self.container = self.stream = None

    def _open(self):
        import av

        return av.open(self.into, mode="w", format="mp4", options=MP4_FRAGMENTED)

    def commit(self) -> list[str]:
        return []

    def discard(self) -> None:
        _quietly(self._close)


class _ZipInto(_Sink):
    """PNG frames (`frame_name`), stored uncompressed (PNG is compressed) in a zip written as it goes."""

    def __init__(self, into, fps: int, preset: str = MP4_PRESET) -> None:
        import zipfile

        self.zip = zipfile.ZipFile(into, mode="w", compression=zipfile.ZIP_STORED)

    def add(self, frames, start: int) -> None:
        from io import BytesIO

        from PIL import Image

        batch, count = frames.shape[:2]
        for t in range(count):
            for b in range(batch):
                data = BytesIO()
                Image.fromarray(frames[b, t]).save(data, format="PNG")
                self.zip.writestr(frame_name(b, start + t, batch), data.getvalue())

    def finish(self) -> None:
        self.zip.close()

    def commit(self) -> list[str]:
        return []

    def discard(self) -> None:
        pass  # a stream cannot be taken back: its reader sees it end short of a zip's directory


class _SafetensorsInto(_Tensor):
    """The whole tensor as safetensors (key io.SAFETENSORS_OUTPUT_KEY), sent at finish."""

    def __init__(self, into, fps: int, preset: str = MP4_PRESET) -> None:
        self.into, self.chunks = into, []

    def save(self, video) -> None:
        from safetensors.torch import save

        self.into.write(save({SAFETENSORS_OUTPUT_KEY: video.contiguous()}))

    def commit(self) -> list[str]:
        return []

    def discard(self) -> None:
        self.chunks = []


_INTO: dict[str, type[_Sink]] = {"mp4": _Mp4Into, "zip": _ZipInto, "safetensors": _SafetensorsInto}


def write_output(video_bcthw, path: str | os.PathLike, kind: str, fps: int = 16) -> list[str]:
    """Write the decoded video in one chunk of a `ChunkWriter`; returns the paths written. Nothing is left at
    `path` on failure."""
    with ChunkWriter(path, kind, fps) as writer:
        writer.write(video_bcthw)
        return writer.close()


def umask() -> int:
    """The process's file-creation mask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


__all__ = [
    "ChunkWriter",
    "Finished",
    "InputError",
    "MP4_CODEC",
    "MP4_OPTIONS",
    "MP4_PIX_FMT",
    "MP4_PRESET",
    "MP4_PRESETS",
    "STREAM_KINDS",
    "frame_name",
    "remove_temporary",
    "umask",
    "write_output",
    "write_stream",
]
