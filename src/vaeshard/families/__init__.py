"""The one registry of supported classes: diffusers VAE class name -> the vaeshard family module that
supports it (imported lazily). The library, the command line, the tests and docs/families.md all read
it, and through it each family's facts: its real configs, tiny test configs and shapes."""

from __future__ import annotations

import importlib
from typing import NamedTuple

from .base import Family, ShapeFacts


class Support(NamedTuple):
    """What vaeshard supports for one diffusers class (`vaeshard.supported_classes()`)."""

    family: str
    latent_ndim: int  # 5: (B, C, T, H, W) video latents; 4: (B, C, H, W) image latents
    tile_decode: bool
    tile_encode: bool
    spatial_decode: bool
    spatial_encode: bool


# class name -> (module, family attribute); in this order the command line lists the named configs
# (its choices are frozen: tests/test_cli) and docs/families.md the classes
_REGISTRY: dict[str, tuple[str, str]] = {
    "AutoencoderKLWan": ("vaeshard.families.wan", "FAMILY"),
    "AutoencoderKLQwenImage": ("vaeshard.families.qwenimage", "FAMILY"),
    "AutoencoderKL": ("vaeshard.families.autoencoder_kl", "FAMILY"),
    "AutoencoderKLFlux2": ("vaeshard.families.autoencoder_kl", "FAMILY"),
    "AutoencoderKLHunyuanVideo15": ("vaeshard.families.hunyuanvideo15", "FAMILY"),
    "AutoencoderKLQwenImage21": ("vaeshard.families.qwenimage21", "FAMILY"),
    "AutoencoderKLLTXVideo": ("vaeshard.families.ltx", "LTX_FAMILY"),
    "AutoencoderKLLTX2Video": ("vaeshard.families.ltx", "LTX2_FAMILY"),
    "AutoencoderKLHunyuanVideo": ("vaeshard.families.hunyuanvideo", "FAMILY"),
    "AutoencoderKLCogVideoX": ("vaeshard.families.cogvideox", "FAMILY"),
    "AutoencoderKLMochi": ("vaeshard.families.mochi", "FAMILY"),
    "AutoencoderKLMiniMaxH3": ("vaeshard.families.minimax_h3", "FAMILY"),
    "AutoencoderDC": ("vaeshard.families.dcae", "FAMILY"),
    "Kandinsky6SRVAE": ("vaeshard.families.kandinsky6_sr", "FAMILY"),
    "LTX2VideoDiffusionDecoderModel": ("vaeshard.families.ltx2_diffusion_decoder", "FAMILY"),
}


def supported_classes() -> dict[str, Support]:
    """Every diffusers VAE class vaeshard supports, with what it supports for each."""
    out = {}
    for name, (module_name, attr) in _REGISTRY.items():
        f = getattr(importlib.import_module(module_name), attr)
        out[name] = Support(f.name, f.latent_ndim, f.tile_decode, f.tile_encode, f.spatial_decode, f.spatial_encode)
    return out


def family_for(vae) -> Family:
    """The family of `vae`, or ValueError naming the class and the supported ones."""
    name = type(vae).__name__
    entry = _REGISTRY.get(name)
    if entry is None:
        raise ValueError(
            f"vaeshard does not support {name}: supported VAE classes are {', '.join(_REGISTRY)}. "
            "Use the VAE's own decode, or add a family (docs/adding-a-family.md)."
        )
    module_name, attr = entry
    return getattr(importlib.import_module(module_name), attr)


def all_families() -> list[Family]:
    return [getattr(importlib.import_module(m), a) for m, a in _REGISTRY.values()]


def _families_once() -> list[Family]:
    """Each family once, in the registry's order (a family may serve several classes)."""
    out: list[Family] = []
    for family in all_families():
        if all(family is not seen for seen in out):
            out.append(family)
    return out


def cast_as_loaded(vae, dtype):
    """`vae` in `dtype` as diffusers' `from_pretrained(..., torch_dtype=dtype)` loads it: a class that
    keeps modules in fp32 (`_keep_in_fp32_modules`: MiniMax-H3's norms, scales and encoder) keeps the
    parameters of those modules in fp32 and its buffers as built, every other parameter in `dtype`;
    any other class is cast whole (`vae.to(dtype)`). The named configs' random-weight models are
    built in fp32 and cast with this, so they run in the dtypes a loaded checkpoint runs in."""
    import torch

    keep = getattr(vae, "_keep_in_fp32_modules", None) or ()
    if dtype == torch.float32 or not keep:
        from diffusers.utils import logging as diffusers_logging

        # diffusers warns on any dtype cast of a model that was not loaded with torch_dtype
        previous = diffusers_logging.get_verbosity()
        diffusers_logging.set_verbosity_error()
        try:
            return vae.to(dtype=dtype)
        finally:
            diffusers_logging.set_verbosity(previous)
    for name, p in vae.named_parameters():
        if p.is_floating_point():
            p.data = p.data.to(torch.float32 if any(k in name.split(".") for k in keep) else dtype)
    return vae


def named_configs() -> dict[str, tuple[str, dict]]:
    """The real configs of every family: name -> (diffusers class name, constructor arguments), the
    VAE those arguments build being the real model's (with random weights until loaded)."""
    return {name: (cls, dict(kwargs)) for f in _families_once() for name, (cls, kwargs) in f.configs.items()}


def tiny_configs() -> dict[str, tuple[str, dict]]:
    """The tiny configs the tests build, name -> (diffusers class name, constructor arguments)."""
    out = {}
    for family in _families_once():
        for name, (cls, kwargs) in family.test_configs.items():
            if name in out:
                raise ValueError(f"two families declare the test config {name!r}")
            out[name] = (cls, dict(kwargs))
    return out


def full_config(class_name: str, config: dict) -> dict:
    """`config` (constructor arguments, or a config.json's values) over the class's defaults."""
    import inspect

    import diffusers

    params = inspect.signature(getattr(diffusers, class_name).__init__).parameters
    defaults = {k: v.default for k, v in params.items() if k != "self" and v.default is not inspect.Parameter.empty}
    return {**defaults, **{k: v for k, v in config.items() if k in params}}


def shape_facts(class_name: str, config: dict) -> ShapeFacts:
    """The latent and sample shapes of a supported class built with `config` (constructor arguments or
    config.json's values; the class's defaults fill the rest), from the config alone: no model is built."""
    entry = _REGISTRY.get(class_name)
    if entry is None:
        raise ValueError(f"vaeshard does not support {class_name}: supported VAE classes are {', '.join(_REGISTRY)}")
    family = getattr(importlib.import_module(entry[0]), entry[1])
    return family.shape_facts(class_name, full_config(class_name, config))


def support_table() -> str:
    """The markdown table of what each registered class supports, as docs/families.md shows it.

    Generated from the registry and the families' declarations, so the document cannot drift from
    the code (tests/test_families/test_families.py checks that the document contains exactly this table).
    """

    def mark(yes: bool) -> str:
        return "yes" if yes else "no"

    lines = [
        "| diffusers class | family | latent | tile decode | tile encode | spatial decode | spatial encode "
        "| streamed decode |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, (module_name, attr) in _REGISTRY.items():
        family = getattr(importlib.import_module(module_name), attr)
        lines.append(
            f"| `{name}` | {family.name} | {family.layout} | {mark(family.tile_decode)} | {mark(family.tile_encode)} "
            f"| {mark(family.spatial_decode)} | {mark(family.spatial_encode)} "
            f"| {'per step' if family.streams_steps else 'once'} |"
        )
    return "\n".join(lines) + "\n"
