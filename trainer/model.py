"""GPT-2 from Hugging Face transformers on its fast path: presets, the tokenizer, FLOPs per token.

The fast path, the same for every preset and for pretrained checkpoints (nanoGPT's choices, on HF's model):
- attention through `scaled_dot_product_attention` (`attn_implementation="sdpa"`: flash attention on GPUs,
  `is_causal` with no mask tensor);
- GELU as one kernel: GPT-2's `gelu_new` is the tanh approximation written out in Python (several kernels);
  `gelu_pytorch_tanh` is the same function in one (`F.gelu(approximate="tanh")`);
- the vocabulary padded to a multiple of 64 (50,257 -> 50,304 rows) so the embedding and output matmuls get
  tensor-core-friendly shapes. The padding rows are zeros, are never looked up (no token id reaches them) and
  are never targets: the loss reads the first `vocab_size` logits only (`gpt2bench.trainer.loss`), so they get
  no gradient and the model computes what the unpadded one computes. Pretrained checkpoints are padded on load.

Dropout is 0 in every preset and in loaded checkpoints (as in nanoGPT's pretraining configs): a benchmark
compares strategies,
and dropout would make each rank draw different masks, so equal-batch runs could not be compared
step by step.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

from gpt2bench.specification.model import PRESETS

from .config import TrainConfig

VOCAB_SIZE = 50257
EOS_TOKEN_ID = 50256
VOCAB_MULTIPLE = 64  # padded rows: 50,304 for GPT-2's 50,257 tokens


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
    """The unpadded GPT2Config of a preset (build_model pads the vocabulary after initialising)."""
    n_layer, n_head, n_embd = PRESETS[config.model.preset]
    gpt2 = GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_layer=config.model.n_layer or n_layer,
        n_head=config.model.n_head or n_head,
        n_embd=config.model.n_embd or n_embd,
        n_positions=config.model.n_positions or max(1024, config.training.seq_len),
        activation_function="gelu_pytorch_tanh",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=EOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
    )
    gpt2._attn_implementation = "sdpa"
    return gpt2


def build_model(config: TrainConfig) -> GPT2LMHeadModel:
    """The model on CPU in fp32, on the fast path, seeded by --seed so every rank builds identical weights.

    Weights are initialised at the real vocabulary size and padded afterwards, so a preset starts from the same
    weights (and draws the same random numbers) whether or not the vocabulary is padded.
    """
    torch.manual_seed(config.training.seed)
    if config.model.pretrained:
        model = _load_pretrained(config.model.pretrained)
    else:
        model = GPT2LMHeadModel(gpt2_config(config))
    if config.training.seq_len > model.config.n_positions:
        raise RuntimeError(
            f"--seq-len {config.training.seq_len} exceeds the model's n_positions {model.config.n_positions}")
    pad_vocabulary(model)
    return model.float().train()


def _load_pretrained(source: str) -> GPT2LMHeadModel:
    try:
        checkpoint = GPT2Config.from_pretrained(source)
        if checkpoint.activation_function == "gelu_new":  # the same function, in one kernel
            checkpoint.activation_function = "gelu_pytorch_tanh"
        checkpoint.resid_pdrop = checkpoint.embd_pdrop = checkpoint.attn_pdrop = 0.0  # as every preset
        return GPT2LMHeadModel.from_pretrained(source, config=checkpoint, attn_implementation="sdpa")
    except OSError as exc:
        raise RuntimeError(f"--pretrained {source!r}: cannot load ({exc})") from exc


def pad_vocabulary(model: GPT2LMHeadModel, multiple: int = VOCAB_MULTIPLE) -> None:
    """Pad the tied token embedding / output layer with zero rows to a multiple of `multiple`, in place.

    `model.config.vocab_size` keeps the real size (what the tokenizer produces, what the loss reads);
    `model.config.padded_vocab_size` is the number of rows.
    """
    old = model.transformer.wte.weight
    vocab, width = old.shape
    padded = -(-vocab // multiple) * multiple
    model.config.padded_vocab_size = padded
    if padded == vocab:
        return
    embedding = torch.nn.Embedding(padded, width, dtype=old.dtype, device=old.device)
    with torch.no_grad():
        embedding.weight[:vocab] = old
        embedding.weight[vocab:] = 0
    model.transformer.wte = embedding
    model.lm_head.weight = embedding.weight  # tied, as GPT-2's output layer is
    model.lm_head.out_features = padded


def vocab_sizes(model: torch.nn.Module) -> tuple[int, int]:
    """(real vocabulary, padded rows) of a model built by build_model."""
    config = model.config
    return config.vocab_size, getattr(config, "padded_vocab_size", config.vocab_size)


def count_params(model: torch.nn.Module) -> int:
    """Distinct parameters (tied wte/lm_head counted once), the vocabulary's padding rows left out."""
    vocab, padded = vocab_sizes(model)
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return total - (padded - vocab) * model.config.n_embd


def flops_per_token(model_config: GPT2Config, seq_len: int, n_params: int) -> float:
    """Training FLOPs per token: 6N + 12·L·d·T (PaLM appendix B, as nanoGPT's estimate_mfu).

    N (`count_params`) excludes the position embeddings (a lookup, not a matmul) and the vocabulary's
    padding rows (work the GPU does but that computes nothing: MFU counts useful FLOPs only); the tied
    token embedding counts once, for the output projection.
    """
    n = n_params - model_config.n_positions * model_config.n_embd
    return 6.0 * n + 12.0 * model_config.n_layer * model_config.n_embd * seq_len
