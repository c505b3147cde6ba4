"""Reading models and latents, and writing decoded videos and images, for the command line.

Models: a local diffusers folder (a VAE folder, or a pipeline folder with a `vae/` subfolder), a
Hub id, or one of the named real configs with random weights (NAMED_CONFIGS). Latents:
`.safetensors` (one named tensor), `.pt`/`.pth` (a tensor, or a dict holding one) or `.npy`, in the
(B, C, T, H, W) layout diffusers' video VAEs decode, or (B, C, H, W) for image VAEs. Outputs: an
H.264 `.mp4`, a folder of PNG frames, a single `.png`, or the raw tensor as `.safetensors` (key
`sample`) / `.pt`. Every output is written to a temporary name next to its destination and renamed
into place, so a failed run leaves nothing behind.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

LATENT_SUFFIXES = (".safetensors", ".pt", ".pth", ".npy")
OUTPUT_KINDS = ("mp4", "png", "frames", "safetensors", "pt")
SAFETENSORS_OUTPUT_KEY = "sample"


class InputError(ValueError):
    """A problem with what the user asked for (a file, a key, a shape); the message says what to do."""


# --- models ----------------------------------------------------------------------------------------


def __getattr__(name: str):
    # NAMED_CONFIGS: the families' real configs, name -> (diffusers class, constructor arguments), built
    # with random weights; read when first asked for (it imports every family)
    if name == "NAMED_CONFIGS":
        import vaeshard

        return vaeshard.named_configs()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class ModelSource:
    """Where a worker gets its VAE: a local diffusers folder, or a named config with random weights."""

    class_name: str
    config: dict  # the model's config (config.json, or the constructor arguments of a named config)
    path: str | None = None  # local folder holding config.json and the weights
    named: str | None = None  # one of NAMED_CONFIGS

    @property
    def description(self) -> str:
        if self.named is not None:
            return f"{self.named} config ({self.class_name}), random weights (torch.manual_seed(0))"
        return f"{self.path} ({self.class_name})"

    def latent_ndim(self) -> int:
        """5 for a video VAE's (B, C, T, H, W) latents, 4 for an image VAE's (B, C, H, W)."""
        import vaeshard

        return vaeshard.supported_classes()[self.class_name].latent_ndim

    def shape_facts(self):
        """The family's shapes for this config (`vaeshard.shape_facts`), without building the model."""
        import vaeshard

        return vaeshard.shape_facts(self.class_name, self.config)

    def pixels(self) -> tuple:
        """The decoded samples' pixel convention (scale, offset) for `quantize`: the family's."""
        facts = self.shape_facts()
        return facts.pixel_scale, facts.pixel_offset

    def z_dim(self) -> int:
        """Channels of a latent (C)."""
        return self.shape_facts().latent_channels

    def sample_channels(self) -> int:
        """Channels of a decoded sample, after unpatchify (3 for RGB)."""
        return self.shape_facts().sample_channels

    def spatial_ratio(self) -> int:
        """Sample pixels per latent pixel along each axis."""
        return self.shape_facts().spatial_factor

    def frames_out(self, latent_frames: int) -> int:
        """Frames a latent of `latent_frames` frames decodes to (the family's temporal factor); an image
        is one frame."""
        return self.shape_facts().frames_out(latent_frames)

    def load(self, dtype=None, device=None):
        """The VAE in eval mode (random weights seeded with 0 for a named config)."""
        import diffusers
        import torch

        cls = getattr(diffusers, self.class_name)
        if self.named is not None:
            torch.manual_seed(0)
            vae = cls(**self.config)
            if dtype is not None:
                import vaeshard

                vae = vaeshard.cast_as_loaded(vae, dtype)
        else:
            # without accelerate, diffusers falls back to a full load with a warning; a class that keeps
            # modules in fp32 (MiniMax-H3's) it loads only through accelerate
            low_memory = importlib.util.find_spec("accelerate") is not None
            if not low_memory and getattr(cls, "_keep_in_fp32_modules", None):
                raise InputError(
                    f"diffusers loads {self.class_name} from a folder only with accelerate installed (it keeps "
                    "some of its modules in fp32): pip install accelerate"
                )
            vae = cls.from_pretrained(self.path, local_files_only=True, torch_dtype=dtype, low_cpu_mem_usage=low_memory)
        if device is not None:
            vae = vae.to(device)
        return vae.eval()


def named_model(name: str) -> ModelSource:
    import vaeshard

    configs = vaeshard.named_configs()
    if name not in configs:
        raise InputError(f"unknown config {name!r}: choose one of {', '.join(configs)}")
    class_name, kwargs = configs[name]
    import diffusers

    # the full config, so z_dim and channels are known without building the model
    defaults = {k: v.default for k, v in _init_parameters(getattr(diffusers, class_name)).items()}
    return ModelSource(class_name=class_name, config={**defaults, **kwargs}, named=name)


def _init_parameters(cls) -> dict:
    import inspect

    return {k: v for k, v in inspect.signature(cls.__init__).parameters.items() if k != "self"}


def resolve_model(model: str, subfolder: str | None = None, offline: bool = False) -> ModelSource:
    """A local folder or a Hub id -> a ModelSource with a local path, or InputError saying what to do.

    A Hub id is fetched here, once, so that every worker loads the same local files.
    """
    p = Path(model).expanduser()
    if p.exists():
        if not p.is_dir():
            raise InputError(
                f"model {model!r} is a file: pass a diffusers folder (with config.json, or with a vae/ subfolder)"
            )
        return _local_model(p, subfolder)
    if _looks_like_path(model):
        raise InputError(
            f"model folder {model!r} does not exist: pass an existing diffusers folder or a Hub id (owner/name)"
        )
    return _hub_model(model, subfolder, offline)


def _looks_like_path(model: str) -> bool:
    return (
        model.startswith((".", "/", "~", "\\"))
        or model.count("/") > 1
        or os.sep in model.replace("/", "")
        or model.endswith("/")
        or model.strip() != model
        or model == ""
    )


def _local_model(root: Path, subfolder: str | None) -> ModelSource:
    if subfolder is None:
        subfolder = "vae" if (root / "vae").is_dir() else None
    folder = root / subfolder if subfolder else root
    config_file = folder / "config.json"
    if not config_file.is_file():
        where = f"{str(root)!r} (subfolder {subfolder!r})" if subfolder else repr(str(root))
        raise InputError(
            f"no config.json in {where}: pass a diffusers VAE folder, a pipeline folder with a vae/ subfolder, "
            "or --subfolder NAME"
        )
    if not any(folder.glob("diffusion_pytorch_model*.safetensors")) and not any(
        folder.glob("diffusion_pytorch_model*.bin")
    ):
        raise InputError(
            f"{str(folder)!r} has a config.json but no weights (diffusion_pytorch_model*.safetensors or .bin): "
            "save the VAE with save_pretrained, or pass a complete model folder"
        )
    return _source_from_config(folder, config_file, str(root))


def _source_from_config(folder: Path, config_file: Path, shown: str) -> ModelSource:
    import json

    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {str(config_file)!r} ({exc}): check the model folder") from exc
    import vaeshard

    class_name = config.get("_class_name")
    supported = vaeshard.supported_classes()
    if class_name not in supported:
        raise InputError(
            f"model {shown!r} is {with_article(class_name or 'model without _class_name')}: vaeshard decodes "
            f"{', '.join(supported)}; pass the VAE of a pipeline that uses one of them"
        )
    return ModelSource(class_name=class_name, config=config, path=str(folder))


def _hub_model(repo_id: str, subfolder: str | None, offline: bool) -> ModelSource:
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.utils import logging as hub_logging
    except ImportError as exc:  # pragma: no cover - diffusers depends on huggingface_hub
        raise InputError(f"model {repo_id!r} is not a local folder: pass a local diffusers folder") from exc

    offline = offline or bool(constants.HF_HUB_OFFLINE)
    reachable = not offline and _endpoint_reachable(constants.ENDPOINT)
    previous = hub_logging.get_verbosity()
    hub_logging.set_verbosity_error()  # no retry chatter: one error line is the contract
    try:
        if subfolder is None:
            subfolder = _hub_subfolder(repo_id, local_only=not reachable)
        patterns = [f"{subfolder}/*"] if subfolder else ["*.json", "*.safetensors", "*.bin"]
        root = snapshot_download(repo_id, allow_patterns=patterns, local_files_only=not reachable)
    except InputError:
        raise
    except Exception as exc:
        if not reachable:
            why = "offline mode is on" if offline else f"the Hub ({constants.ENDPOINT}) cannot be reached"
            raise InputError(
                f"model {repo_id!r} is not a local folder and not in the local cache, and {why}: "
                "pass a local diffusers folder, or connect to the network"
            ) from exc
        raise InputError(
            f"cannot fetch model {repo_id!r} ({_first_line(exc)}): check the id, or pass a local folder"
        ) from exc
    finally:
        hub_logging.set_verbosity(previous)
    return _local_model(Path(root), subfolder or "")


def _hub_subfolder(repo_id: str, local_only: bool) -> str:
    """`vae` when the repository is a pipeline with a vae/ folder, else the root."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        hf_hub_download(repo_id, "vae/config.json", local_files_only=local_only)
        return "vae"
    except LocalEntryNotFoundError:  # (a subclass of EntryNotFoundError) not cached
        if not local_only:
            raise
        hf_hub_download(repo_id, "config.json", local_files_only=True)
        return ""
    except EntryNotFoundError:  # the repository has no vae/ folder
        return ""


def _endpoint_reachable(endpoint: str, timeout: float = 5.0) -> bool:
    """One quick TCP connection, so an offline machine gets its error at once rather than after retries."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(endpoint)
    if not url.hostname:
        return False
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


# --- latents ---------------------------------------------------------------------------------------


def load_latents(path: str | os.PathLike, key: str = "latents"):
    """The latent tensor stored in `path` (on CPU, its stored dtype), or InputError."""
    import torch

    p = Path(path)
    if not p.exists():
        raise InputError(f"latents file {str(p)!r} does not exist: pass the path of a .safetensors, .pt or .npy file")
    if p.is_dir():
        raise InputError(f"latents path {str(p)!r} is a folder: pass a .safetensors, .pt or .npy file")
    suffix = p.suffix.lower()
    if suffix == ".safetensors":
        z = _load_safetensors(p, key)
    elif suffix in (".pt", ".pth"):
        z = _load_torch(p, key)
    elif suffix == ".npy":
        z = _load_numpy(p)
    else:
        raise InputError(
            f"latents file {str(p)!r} has an unsupported suffix {suffix or '(none)'!r}: use .safetensors, .pt or .npy"
        )
    if not isinstance(z, torch.Tensor):
        raise InputError(f"{str(p)!r} holds {with_article(type(z).__name__)}, not a tensor")
    if not z.is_floating_point():
        raise InputError(f"latents in {str(p)!r} have dtype {z.dtype}: expected a floating-point tensor")
    return z


def _load_safetensors(p: Path, key: str):
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(p), framework="pt") as f:
            keys = list(f.keys())
            if key not in keys:
                raise InputError(
                    f"{str(p)!r} has no tensor named {key!r} (it has: {', '.join(keys) or 'none'}): pass --key NAME"
                )
            return f.get_tensor(key)
    except (SafetensorError, OSError) as exc:
        raise InputError(f"cannot read {str(p)!r} as safetensors ({exc}): check the file") from exc


def _load_torch(p: Path, key: str):
    import torch

    try:
        obj = torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise InputError(f"cannot read {str(p)!r} with torch.load ({_first_line(exc)}): check the file") from exc
    if isinstance(obj, dict):
        if key not in obj:
            names = ", ".join(str(k) for k in obj) or "none"
            raise InputError(f"{str(p)!r} holds a dict without the key {key!r} (it has: {names}): pass --key NAME")
        obj = obj[key]
    return obj


def _load_numpy(p: Path):
    import numpy as np
    import torch

    try:
        array = np.load(str(p), allow_pickle=False)
    except Exception as exc:
        raise InputError(f"cannot read {str(p)!r} with numpy.load ({_first_line(exc)}): check the file") from exc
    return torch.from_numpy(np.ascontiguousarray(array))


def check_latents(z, model: ModelSource, source: str = "latents") -> None:
    """InputError unless `z` is a latent this model decodes: its layout, with C == its latent channels."""
    check_latent_shape(tuple(z.shape), model, source)


def check_latent_shape(shape: tuple[int, ...], model: ModelSource, source: str = "latents") -> None:
    shape = tuple(int(s) for s in shape)
    ndim, z_dim = model.latent_ndim(), model.z_dim()
    layout = "(B, C, T, H, W)" if ndim == 5 else "(B, C, H, W)"
    if len(shape) != ndim:
        raise InputError(
            f"{source} have shape {shape} ({len(shape)}-D): this VAE decodes {ndim}-D latents {layout} "
            f"with C = {z_dim}; add or remove dimensions to match (e.g. a batch or frame dimension of 1)"
        )
    if shape[1] != z_dim:
        raise InputError(
            f"{source} have {shape[1]} channels (shape {shape}), but this VAE expects {z_dim} "
            f"(its latent channels) in layout {layout}: check the model matches the latents"
        )
    if any(s == 0 for s in shape):
        raise InputError(f"{source} are empty (shape {shape})")


def check_denormalize(config: dict, channels: int) -> None:
    """InputError unless the model's config holds what `denormalize` needs."""
    if "latents_mean" in config or "latents_std" in config:
        for name in ("latents_mean", "latents_std"):
            values = config.get(name)
            if not isinstance(values, list) or len(values) != channels:
                raise InputError(
                    f"--denormalize needs {name} with {channels} entries in the model's config; it has {values!r}"
                )
    elif not isinstance(config.get("scaling_factor"), (int, float)):
        raise InputError("--denormalize needs latents_mean/latents_std or scaling_factor in the model's config")


def denormalize(z, config: dict, dtype):
    """Undo the latent normalisation the way the diffusers pipelines do before decode: Wan's and
    Qwen-Image's `z * latents_std + latents_mean`, per channel; Stable Diffusion's and FLUX's
    `z / scaling_factor + shift_factor` (SD, SDXL, FLUX.1, SD3)."""
    import torch

    z = z.to(dtype)
    if config.get("latents_mean") is not None:
        channels = z.shape[1]
        view = (1, channels) + (1,) * (z.dim() - 2)
        mean = torch.tensor(config["latents_mean"]).view(view).to(z.device, z.dtype)
        inv_std = 1.0 / torch.tensor(config["latents_std"]).view(view).to(z.device, z.dtype)
        return z / inv_std + mean
    return z / config["scaling_factor"] + (config.get("shift_factor") or 0.0)


# --- outputs ---------------------------------------------------------------------------------------


def output_kind(path: str | os.PathLike) -> str:
    """What `path` asks to be written: one of OUTPUT_KINDS, or InputError."""
    p = Path(path)
    if p.is_dir():
        return "frames"
    suffix = p.suffix.lower()
    kinds = {".mp4": "mp4", ".png": "png", ".safetensors": "safetensors", ".pt": "pt", ".pth": "pt"}
    if suffix in kinds:
        return kinds[suffix]
    if suffix == "":
        return "frames"
    raise InputError(
        f"cannot write {str(p)!r}: unsupported suffix {suffix!r}; use .mp4, .png, .safetensors, .pt, "
        "or a folder name (no suffix) for PNG frames"
    )


def check_output(path: str | os.PathLike, kind: str, batch: int, frames: int, channels: int) -> None:
    """InputError if the decoded (batch, channels, frames, H, W) video cannot be written as `kind` at `path`."""
    p = Path(path)
    parent = p.resolve().parent
    if not parent.is_dir():
        raise InputError(f"cannot write {str(p)!r}: the folder {str(parent)!r} does not exist; create it first")
    if p.exists() and kind != "frames" and p.is_dir():
        raise InputError(f"cannot write {str(p)!r}: it is a folder")
    check_video(kind, batch, frames, channels)
    if kind == "mp4" and importlib.util.find_spec("av") is None:
        raise InputError("writing .mp4 needs PyAV (pip install av): install it, or write PNG frames or a tensor")


def check_video(kind: str, batch: int, frames: int, channels: int, size: tuple[int, int] | None = None) -> None:
    """InputError if a (batch, channels, frames, H, W) video cannot be written as `kind`; `size` is (H, W)
    when known (H.264 needs it even)."""
    if kind in ("mp4", "png", "frames") and channels != 3:
        raise InputError(
            f"this VAE decodes {channels}-channel samples, which are not RGB images: write .safetensors or .pt"
        )
    if kind in ("mp4", "png") and batch != 1:
        raise InputError(
            f"the latents hold a batch of {batch}; {kind} holds one video: write a folder of frames, "
            ".safetensors or .pt, or pass one batch item"
        )
    if kind == "png" and frames != 1:
        raise InputError(f"the latents decode to {frames} frames; a .png holds one: write .mp4 or a folder of frames")
    if kind == "mp4" and size is not None and (size[0] % 2 or size[1] % 2):
        height, width = size
        raise InputError(f"H.264 needs an even frame size, got {width}x{height}: write PNG frames or a tensor instead")


def quantize(video_bcthw, pixels: tuple = ((0.5,), (0.5,))):
    """Samples (B, C, T, H, W) -> contiguous uint8 (B, T, H, W, C) on the same device, rounded the way
    diffusers' image processor does. `pixels`: (scale, offset), per channel or one value for all, with
    `sample * scale + offset` the pixel in [0, 1] (the VAE's `ShapeFacts.pixel_scale` / `pixel_offset`;
    the default is [-1, 1] samples)."""
    import torch

    scale, offset = (torch.tensor(v, dtype=torch.float32, device=video_bcthw.device) for v in pixels)
    shape = (1, -1, 1, 1, 1)
    x = (video_bcthw.detach().to(torch.float32) * scale.view(shape) + offset.view(shape)).clamp(0, 1)
    return (x.permute(0, 2, 3, 4, 1) * 255).round().to(torch.uint8).contiguous()


def to_uint8_frames(video_bcthw, pixels: tuple = ((0.5,), (0.5,))):
    """Samples -> uint8 numpy (B, T, H, W, C) on the host (`quantize`)."""
    return quantize(video_bcthw, pixels).cpu().numpy()


def with_article(noun: str) -> str:
    """`noun` after "a" or "an" as it is read aloud: an Encoder, an int, a UNet2DConditionModel (an
    initialism is read letter by letter: an SDXL, a UNet, an ndarray), an 8-D."""
    if not noun:
        return "a"
    if noun[:1].isdigit():
        number = noun[: len(noun) - len(noun.lstrip("0123456789"))]
        vowel = number.startswith("8") or (len(number) in (2, 5) and number[:2] in ("11", "18"))
    elif noun[:1].isupper() and noun[1:2] in ("", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ") or noun.startswith("nd"):
        vowel = noun[0].upper() in "AEFHILMNORSX"  # letters whose name starts with a vowel sound
    else:
        vowel = noun[:1].lower() in "aeio" or (noun[:1].lower() == "u" and not noun.lower().startswith(_U_AS_YOU))
    return f"{'an' if vowel else 'a'} {noun}"


_U_AS_YOU = ("uni", "use", "usu", "uti", "ura", "uri", "uro")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


__all__ = [
    "InputError",
    "ModelSource",
    "named_model",
    "resolve_model",
    "LATENT_SUFFIXES",
    "OUTPUT_KINDS",
    "SAFETENSORS_OUTPUT_KEY",
    "check_latent_shape",
    "check_latents",
    "check_output",
    "check_video",
    "denormalize",
    "load_latents",
    "output_kind",
    "quantize",
    "to_uint8_frames",
]
