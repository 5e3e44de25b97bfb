"""GPT-2 from Hugging Face transformers: presets, overrides, FLOPs per token, the tokenizer.

Dropout is 0 in every preset (as in nanoGPT's pretraining configs): a benchmark compares strategies,
and dropout would make each rank draw different masks, so equal-batch runs could not be compared
step by step.
"""

from __future__ import annotations

import platform
from functools import lru_cache
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

from gpt2bench.spec import PRESETS
from gpt2bench.trainer.config import TrainConfig

VOCAB_SIZE = 50257
EOS_TOKEN_ID = 50256


def tokenizer_dir() -> Path:
    """The GPT-2 BPE files shipped with the package (works installed or from a checkout)."""
    import gpt2bench

    return Path(gpt2bench.__file__).resolve().parent / "assets" / "gpt2-tokenizer"


@lru_cache(maxsize=1)
def load_tokenizer() -> GPT2TokenizerFast:
    # from_pretrained(dir): GPT2TokenizerFast(vocab_file=...) builds an empty tokenizer in transformers 5.
    tok = GPT2TokenizerFast.from_pretrained(str(tokenizer_dir()))
    tok.model_max_length = 1 << 30  # we cut blocks ourselves; silence the 1024-token warning
    if len(tok) != VOCAB_SIZE:
        raise RuntimeError(f"GPT-2 tokenizer at {tokenizer_dir()} has {len(tok)} tokens, expected {VOCAB_SIZE}")
    return tok


def gpt2_config(config: TrainConfig) -> GPT2Config:
    n_layer, n_head, n_embd = PRESETS[config.model.preset]
    return GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_layer=config.model.n_layer or n_layer,
        n_head=config.model.n_head or n_head,
        n_embd=config.model.n_embd or n_embd,
        n_positions=config.model.n_positions or max(1024, config.training.seq_len),
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=EOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
    )


def build_model(config: TrainConfig) -> GPT2LMHeadModel:
    """The model on CPU in fp32, seeded by --seed so every rank builds identical weights."""
    torch.manual_seed(config.training.seed)
    if config.model.pretrained:
        try:
            model = GPT2LMHeadModel.from_pretrained(config.model.pretrained)
        except OSError as exc:
            raise RuntimeError(f"--pretrained {config.model.pretrained!r}: cannot load ({exc})") from exc
    else:
        model = GPT2LMHeadModel(gpt2_config(config))
    if config.training.seq_len > model.config.n_positions:
        raise RuntimeError(
            f"--seq-len {config.training.seq_len} exceeds the model's n_positions {model.config.n_positions}")
    return model.float().train()


def count_params(model: torch.nn.Module) -> int:
    """Distinct parameters (tied wte/lm_head counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def flops_per_token(model_config: GPT2Config, seq_len: int, n_params: int) -> float:
    """Training FLOPs per token: 6N + 12·L·d·T (PaLM appendix B, as nanoGPT's estimate_mfu).

    N excludes the position embeddings (they are a lookup, not a matmul); the tied token
    embedding counts once, for the output projection.
    """
    n = n_params - model_config.n_positions * model_config.n_embd
    return 6.0 * n + 12.0 * model_config.n_layer * model_config.n_embd * seq_len


def device_name(device: torch.device) -> str:
    """What the figures were measured on: the GPU's name, else the CPU's model name (Linux), else 'cpu'."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def peak_flops_per_device(device: torch.device, precision: str, override: float | None) -> float | None:
    """Dense peak FLOP/s of one device for MFU; None when unknown (CPU, unlisted GPU)."""
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, (half, fp32) in _PEAK_FLOPS.items():
        if key in name:
            return fp32 if precision == "fp32" else half
    return None


# GPU name fragment -> (dense bf16/fp16 tensor-core peak, fp32 non-tensor peak), vendor datasheets.
# fp32 runs use the plain fp32 peak because torch leaves TF32 matmuls off by default.
_PEAK_FLOPS: dict[str, tuple[float, float]] = {
    "H200": (989e12, 67e12),
    "H100 PCIe": (756e12, 51e12),
    "H100": (989e12, 67e12),
    "A100": (312e12, 19.5e12),
    "A10G": (70e12, 31.2e12),
    "A10": (125e12, 31.2e12),
    "L40S": (362e12, 91.6e12),
    "L4": (121e12, 30.3e12),
    "V100": (125e12, 15.7e12),
    "T4": (65e12, 8.1e12),
}
