"""End to end through diffusers' pipelines: each newer VAE class decoded by its own pipeline, on 2 gloo ranks.

Each pipeline is tiny and built offline (a small transformer with random weights, the scheduler, the tiny VAE
of tests/models.py, no text encoder or tokenizer: the prompt is given as `prompt_embeds`). Every rank runs it
with the same seed; `output_type="latent"` gives every rank the same latents (checked). Rank 0 runs the
pipeline with its plain VAE and `output_type="pt"`: diffusers' own decode, the reference. Then the VAE is
parallelized and the same pipeline call decodes through vaeshard, so what is tested is the pipeline's own call
into `vae.decode`, with whatever it passes (LTX's decode timestep and noise, Qwen-Image 2.1's one-frame 5-D
latents, FLUX.2's batch-norm-denormalized latents, CogVideoX's frames-first latents, Mochi's latents
denormalized with latents_mean / latents_std). spatial shard: within CPU_FP32 (RMS-norm families) or
CPU_FP32_GROUPNORM (FLUX.2, HunyuanVideo, CogVideoX, Mochi) of it; tile, where the pipeline's VAE has tiling
enabled: bit-identical. HunyuanVideo's latents are 2 frames: above 4 latent frames diffusers' default decode is
tiled in time and vaeshard's spatial modes compare with its untiled decode instead; at 2 they are one and the
same, so the reference here is diffusers' default decode itself.

All classes run in one launch on the shared 2-rank pool (starting ranks is the expensive part); each class's
outcome is its own test.
"""

from __future__ import annotations

import logging
import traceback
import types

import pytest
import torch

# diffusers' pipeline classes are placeholders without transformers (a test extra): fail, never skip
import transformers  # noqa: F401

import vaeshard

from .dist_harness import run_ranks
from .parity import CPU_FP32, CPU_FP32_GROUPNORM, assert_close, assert_identical, reference_from_rank0

SEED = 11  # the pipelines' generator
RNG_SEED = 3  # the global RNG (LTX's decoder noise)


def _embeds(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(5))


class _NoProcessor:
    """Stands in for QwenImage21Pipeline's Qwen3VLProcessor: its __init__ only counts the system prompt's tokens
    and looks up the image-pad token, for encoding a prompt itself, which `prompt_embeds` skips."""

    tokenizer = types.SimpleNamespace(encode=lambda text: [0])

    def apply_chat_template(self, *args, **kwargs):
        return [[0]]


def _flux2():
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Pipeline, Flux2Transformer2DModel

    from .models import BUILDERS

    vae = BUILDERS["flux2"]()  # 2x, 8 latent channels: the transformer sees 2x2 patches of them
    torch.manual_seed(0)
    transformer = Flux2Transformer2DModel(
        in_channels=32,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=16,
        timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4),
    )
    pipe = Flux2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        transformer=transformer.eval(),
    )
    # latents of 12 x 14 rows
    return pipe, dict(prompt_embeds=_embeds(1, 4, 16), height=24, width=28), "images"


def _qwenimage21():
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline, QwenImage21Transformer2DModel

    from .models import BUILDERS

    vae = BUILDERS["qwenimage21"]()
    torch.manual_seed(0)
    transformer = QwenImage21Transformer2DModel(
        in_channels=4,
        out_channels=4,
        num_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        context_in_dim=16,
        axes_dims_rope=(4, 6, 6),
    )
    pipe = QwenImage21Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=None,
        processor=_NoProcessor(),
        transformer=transformer.eval(),
    )
    # the pipeline's latent grid is the real VAE's 16x (its own vae_scale_factor): 6 x 8 latent rows, which the
    # tiny 4x VAE decodes to a 24 x 32 RGBA image
    return pipe, dict(prompt_embeds=_embeds(1, 4, 16), height=96, width=128), "images"


def _hunyuanvideo15():
    from diffusers import (
        ClassifierFreeGuidance,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline,
        HunyuanVideo15Transformer3DModel,
    )

    from .models import BUILDERS

    vae = BUILDERS["hunyuanvideo15"]()  # 4x spatial, 2x temporal
    torch.manual_seed(0)
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=9,  # latents, condition latents and their mask
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=16,
        num_layers=1,
        num_refiner_layers=1,
        text_embed_dim=16,
        text_embed_2_dim=8,
        image_embed_dim=8,
        rope_axes_dim=(4, 6, 6),
        task_type="t2v",
    )
    pipe = HunyuanVideo15Pipeline(
        text_encoder=None,
        tokenizer=None,
        transformer=transformer.eval(),
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder_2=None,
        tokenizer_2=None,
        guider=ClassifierFreeGuidance(guidance_scale=1.0),  # one condition: no negative prompt needed
    )
    g = torch.Generator().manual_seed(5)
    call = dict(
        prompt_embeds=torch.randn(1, 4, 16, generator=g),
        prompt_embeds_mask=torch.ones(1, 4, dtype=torch.long),
        prompt_embeds_2=torch.randn(1, 3, 8, generator=g),
        prompt_embeds_mask_2=torch.ones(1, 3, dtype=torch.long),
        height=32,
        width=36,
        num_frames=3,
    )  # latents of 2 frames, 8 x 9 rows (uneven over 2 ranks)
    return pipe, call, "frames"


def _ltx():
    from diffusers import FlowMatchEulerDiscreteScheduler, LTXPipeline, LTXVideoTransformer3DModel

    from .models import BUILDERS

    vae = BUILDERS["ltx"]()  # timestep-conditioned decoder with noise injection
    torch.manual_seed(0)
    transformer = LTXVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        num_layers=1,
        caption_channels=16,
    )
    pipe = LTXPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        transformer=transformer.eval(),
    )
    call = dict(
        prompt_embeds=_embeds(1, 4, 16),
        prompt_attention_mask=torch.ones(1, 4, dtype=torch.long),
        height=160,
        width=224,
        num_frames=9,
        guidance_scale=1.0,
        decode_timestep=0.05,  # the decoder's timestep conditioning and the pipeline's decode noise
        decode_noise_scale=0.025,
    )  # latents of 2 frames, 5 x 7 rows
    return pipe, call, "frames"


def _ltx2():
    from diffusers import (
        AutoencoderKLLTX2Audio,
        FlowMatchEulerDiscreteScheduler,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    from .models import BUILDERS

    vae = BUILDERS["ltx2"]()
    torch.manual_seed(0)
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=4,
        audio_cross_attention_dim=8,
        num_layers=1,
        caption_channels=16,
        rope_double_precision=False,
    )
    connectors = LTX2TextConnectors(  # prompt_embeds: 16 channels x 2 text-encoder layers
        caption_channels=16,
        text_proj_in_factor=2,
        video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=8,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32,
        rope_double_precision=False,
    )
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, ch_mult=(1,), num_res_blocks=1, resolution=32, latent_channels=2, mel_bins=8
    )
    vocoder = LTX2Vocoder(
        in_channels=16,  # the audio VAE's 2 output channels x 8 mel bins
        hidden_channels=8,
        upsample_kernel_sizes=[4],
        upsample_factors=[2],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1]],
        output_sampling_rate=16000,
    )
    pipe = LTX2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        audio_vae=audio_vae.eval(),
        text_encoder=None,
        tokenizer=None,
        connectors=connectors.eval(),
        transformer=transformer.eval(),
        vocoder=vocoder.eval(),
    )
    call = dict(
        prompt_embeds=_embeds(1, 4, 32),
        prompt_attention_mask=torch.ones(1, 4, dtype=torch.long),
        height=160,
        width=224,
        num_frames=9,
        frame_rate=25.0,
        # no guidance of any kind: one transformer pass per step
        guidance_scale=1.0,
        stg_scale=0.0,
        modality_scale=1.0,
        guidance_rescale=0.0,
        audio_guidance_scale=1.0,
        audio_stg_scale=0.0,
        audio_modality_scale=1.0,
        audio_guidance_rescale=0.0,
        spatio_temporal_guidance_blocks=None,
        decode_timestep=0.05,
        decode_noise_scale=0.025,
    )  # latents of 2 frames, 5 x 7 rows
    return pipe, call, "frames"


def _hunyuanvideo():
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline, HunyuanVideoTransformer3DModel

    from .models import BUILDERS

    vae = BUILDERS["hunyuanvideo"]()  # 8x spatial, 4x temporal: the real ratios, which the pipeline reads off it
    torch.manual_seed(0)
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=16,
        num_layers=1,
        num_single_layers=1,
        num_refiner_layers=1,
        text_embed_dim=16,
        pooled_projection_dim=8,
        rope_axes_dim=(4, 6, 6),
    )
    pipe = HunyuanVideoPipeline(
        text_encoder=None,
        tokenizer=None,
        transformer=transformer.eval(),
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder_2=None,
        tokenizer_2=None,
    )
    g = torch.Generator().manual_seed(5)
    call = dict(
        prompt_embeds=torch.randn(1, 4, 16, generator=g),
        pooled_prompt_embeds=torch.randn(1, 8, generator=g),
        prompt_attention_mask=torch.ones(1, 4, dtype=torch.long),
        height=32,
        width=48,
        num_frames=5,
    )  # latents of 2 frames (<= 4: diffusers' default decode is not tiled in time), 4 x 6 rows
    return pipe, call, "frames"


def _cogvideox():
    from diffusers import CogVideoXDDIMScheduler, CogVideoXPipeline, CogVideoXTransformer3DModel

    from .models import BUILDERS

    vae = BUILDERS["cogvideox"]()
    torch.manual_seed(0)
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        time_embed_dim=8,
        text_embed_dim=16,
        num_layers=1,
        sample_width=8,
        sample_height=6,
        sample_frames=3,
        temporal_compression_ratio=2,
        max_text_seq_length=4,
    )
    pipe = CogVideoXPipeline(
        tokenizer=None,
        text_encoder=None,
        vae=vae,
        transformer=transformer.eval(),
        scheduler=CogVideoXDDIMScheduler(),
    )
    # the pipeline's latent grid is the VAE's own: 2 ** (levels - 1) spatial (4x for the tiny VAE's three
    # levels), its config's temporal_compression_ratio (2x)
    call = dict(prompt_embeds=_embeds(1, 4, 16), height=24, width=32, num_frames=3, guidance_scale=1.0)
    return pipe, call, "frames"  # latents of 2 frames, 6 x 8 rows


def _mochi():
    from diffusers import FlowMatchEulerDiscreteScheduler, MochiPipeline, MochiTransformer3DModel

    from .models import BUILDERS

    # 12 latent channels: the pipeline denormalizes with latents_mean / latents_std viewed as 12 channels
    g = torch.Generator().manual_seed(6)
    vae = BUILDERS["mochi"](
        latent_channels=12,
        latents_mean=tuple((0.1 * torch.randn(12, generator=g)).tolist()),
        latents_std=tuple((1.0 + 0.1 * torch.rand(12, generator=g)).tolist()),
    )
    torch.manual_seed(0)
    transformer = MochiTransformer3DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        num_layers=1,
        pooled_projection_dim=16,
        in_channels=12,
        text_embed_dim=16,
        time_embed_dim=8,
        max_sequence_length=4,
    )
    pipe = MochiPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        transformer=transformer.eval(),
    )
    # the pipeline hard-codes the real VAE's 8x spatial and 6x temporal compression, which the tiny VAE keeps
    call = dict(
        prompt_embeds=_embeds(1, 4, 16),
        prompt_attention_mask=torch.ones(1, 4, dtype=torch.long),
        height=32,
        width=48,
        num_frames=7,
        guidance_scale=1.0,
    )  # latents of 2 frames, 4 x 6 rows
    return pipe, call, "frames"


def _enable_tiling(vae):
    """Tiles a few latent rows wide, so the pipelines' small latents make several."""
    name = type(vae).__name__
    if name == "AutoencoderKLFlux2":
        vae.enable_tiling()
        vae.tile_sample_min_size, vae.tile_latent_min_size, vae.tile_overlap_factor = 16, 8, 0.25
    elif name == "AutoencoderKLHunyuanVideo":  # tests/models.py's tiles: 32 pixels (4 latent rows) every 24
        vae.enable_tiling()
    elif name == "AutoencoderKLCogVideoX":
        # 24 x 20-pixel tiles (6 x 5 latent rows) every 5 x 4 latent rows: diffusers' default overlaps (a sixth, a
        # fifth) with sizes whose latent and sample strides agree (diffusers' tiled decode is the wrong size else)
        vae.enable_tiling(tile_sample_min_height=24, tile_sample_min_width=20)
    elif name == "AutoencoderKLMochi":  # 32-pixel tiles (4 latent rows) every 24
        vae.enable_tiling(
            tile_sample_min_height=32,
            tile_sample_min_width=32,
            tile_sample_stride_height=24,
            tile_sample_stride_width=24,
        )
    else:  # LTX-Video: 96-pixel tiles (3 latent rows) every 64
        size, stride = 96, 64
        vae.enable_tiling(
            tile_sample_min_height=size,
            tile_sample_min_width=size,
            tile_sample_stride_height=stride,
            tile_sample_stride_width=stride,
        )


# class, pipeline builder, spatial mode, tolerance, whether to check tile too
CASES = {
    "AutoencoderKLFlux2": (_flux2, "spatial_shard_height", CPU_FP32_GROUPNORM, True),
    "AutoencoderKLQwenImage21": (_qwenimage21, "spatial_shard_width", CPU_FP32, False),
    "AutoencoderKLHunyuanVideo15": (_hunyuanvideo15, "spatial_shard_width", CPU_FP32, False),
    "AutoencoderKLLTXVideo": (_ltx, "spatial_shard_width", CPU_FP32, True),
    "AutoencoderKLLTX2Video": (_ltx2, "spatial_shard_height", CPU_FP32, False),
    "AutoencoderKLHunyuanVideo": (_hunyuanvideo, "spatial_shard_height", CPU_FP32_GROUPNORM, True),
    "AutoencoderKLCogVideoX": (_cogvideox, "spatial_shard_width", CPU_FP32_GROUPNORM, True),
    "AutoencoderKLMochi": (_mochi, "spatial_shard_width", CPU_FP32_GROUPNORM, True),
}


class _Strategies(logging.Handler):
    """The strategy of every request vaeshard runs (its debug line), and any fallback it warns of."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _decoded_by(pipe, call, field):
    """The pipeline's output (`output_type="pt"`), every rank's RNGs seeded alike, and the global RNG after it."""
    torch.manual_seed(RNG_SEED)
    out = getattr(pipe(**call, generator=torch.Generator().manual_seed(SEED), output_type="pt"), field)
    return out, torch.rand(4)


def _captured(compute):
    """(True, compute()) or (False, the traceback of its failure)."""
    try:
        return True, compute()
    except Exception:
        return False, traceback.format_exc()


def _rank0(rank, compute):
    """reference_from_rank0, with rank 0's failure raised on every rank (not left for the others to wait on)."""
    ok, value = reference_from_rank0(rank, lambda: _captured(compute))
    if not ok:
        raise AssertionError(f"diffusers' own pipeline run failed on rank 0:\n{value}")
    return value


def _one_class(rank, world, cls_name):
    import torch.distributed as dist

    build, mode, tol, tile = CASES[cls_name]

    def latents_of_this_rank():
        pipe, call, field = build()
        pipe.set_progress_bar_config(disable=True)
        call = dict(call, num_inference_steps=2)
        assert type(pipe.vae).__name__ == cls_name
        torch.manual_seed(RNG_SEED)
        latents = getattr(pipe(**call, generator=torch.Generator().manual_seed(SEED), output_type="latent"), field)
        return pipe, call, field, latents

    built = _captured(latents_of_this_rank)
    every = [None] * world  # each rank's latents, or its failure: then every rank fails here, and alike
    dist.all_gather_object(every, built if not built[0] else (True, built[1][3]))
    failed = [f"rank {r}:\n{value}" for r, (ok, value) in enumerate(every) if not ok]
    assert not failed, "building or running the pipeline failed:\n" + "\n".join(failed)
    pipe, call, field, latents = built[1]
    assert all(torch.equal(value, latents) for _, value in every), "the ranks' pipelines made different latents"
    assert latents.float().std() > 1e-3

    ref, ref_after = _rank0(rank, lambda: _decoded_by(pipe, call, field))  # diffusers' own decode
    handler = _Strategies()
    log = logging.getLogger("vaeshard")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        vaeshard.parallelize(pipe.vae, mode=mode)
        out, after = _decoded_by(pipe, call, field)
        assert handler.lines and all(f"strategy: {mode} " in line for line in handler.lines), handler.lines
        assert_close(out, ref, tol, f"{cls_name} {mode} through {type(pipe).__name__}")
        assert torch.equal(after, ref_after), "the global RNG is not where diffusers leaves it"
        vaeshard.unparallelize(pipe.vae)
        if not tile:
            return
        _enable_tiling(pipe.vae)
        ref, ref_after = _rank0(rank, lambda: _decoded_by(pipe, call, field))  # diffusers' tiled decode
        vaeshard.parallelize(pipe.vae, mode="tile")
        handler.lines.clear()
        out, after = _decoded_by(pipe, call, field)
        assert handler.lines and all("strategy: tile " in line for line in handler.lines), handler.lines
        assert_identical(out, ref, f"{cls_name} tile through {type(pipe).__name__}")
        assert torch.equal(after, ref_after), "the global RNG is not where diffusers leaves it (tile)"
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _every_class(rank, world):
    """Each class's check in turn; a failed one is reported (its traceback) and the next one still runs. The
    ranks fail alike (the latents and the reference are shared, vaeshard's requests agree across ranks), so
    they stay in step."""
    outcomes = {}
    for cls_name in CASES:
        try:
            _one_class(rank, world, cls_name)
            outcomes[cls_name] = None
        except Exception:
            outcomes[cls_name] = traceback.format_exc()
    return outcomes


@pytest.fixture(scope="module")
def outcomes():
    return run_ranks(_every_class, 2, timeout=200)


@pytest.mark.parametrize("cls_name", list(CASES))
def test_pipeline_decode_through_vaeshard(outcomes, cls_name):
    failures = [f"rank {r}:\n{o[cls_name]}" for r, o in enumerate(outcomes) if o[cls_name] is not None]
    assert not failures, "\n".join(failures)
