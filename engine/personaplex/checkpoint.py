"""Reading a PersonaPlex checkpoint in the released layout (`nvidia/personaplex-7b-v1`).

Layout: `config.json` (empty in the release; see config.py), `model.safetensors` (the LM,
keys of reference/personaplex.md §1.9), the Mimi safetensors, the SentencePiece model
`tokenizer_spm_32k_3.model`, and voice bundles in `voices/` (or `voices.tgz`).

Design choices:
- `lm_shapes` / `mimi_shapes` are the tables of stored keys and shapes derived from the
  config. The loader checks a checkpoint against them (a missing or misshapen tensor is a
  `CheckpointError` that names it) and the tiny writer writes exactly them.
- The depformer is stored with `dep_q` (8) weight sets and runs with 16 steps. As
  PersonaPlex's `get_moshi_lm` does: per-step attention weights are tiled (set t = t mod 8),
  and `gating`, `linears`, `depformer_in`, `depformer_emb` sets t >= 8 are copied from t - 8.
  The embedding table `depformer_emb.7` has no source in that scheme, so it must be stored.
- One explicit rename table maps Mimi's nested Moshi names onto ours; the codebooks are
  computed from the EMA sums, only for the codebooks in use.
- Modules are built on the meta device and take the loaded tensors (`assign=True`).
- A directory or a Hugging Face repo id is found by engine/checkpoints.py (the cache
  first, a download of `HUB_PATTERNS` only when allowed); errors are `CheckpointError`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tarfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from engine.checkpoints import cache_dir, write_once
from engine.errors import CheckpointError, ConfigError
from engine.personaplex.config import LMConfig, MimiConfig, PersonaPlexConfig
from engine.personaplex.depformer import Depformer
from engine.personaplex.mimi import Mimi
from engine.personaplex.prompt import TextTokenizer
from engine.personaplex.temporal import Temporal

logger = logging.getLogger(__name__)

HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "voices.tgz", "voices/*"]  # not the web UI (dist.tgz)
CODEBOOK_EPSILON = 1e-5  # Moshi's EuclideanCodebook: embedding_sum / cluster_usage.clamp(min=eps)
MIMI_RENAMES = (
    ("downsample.conv.conv.conv.", "downsample.conv."),
    ("upsample.convtr.convtr.convtr.", "upsample.convtr."),
    (".conv.conv.", ".conv."),
    (".convtr.convtr.", ".convtr."),
    ("_transformer.transformer.", "_transformer."),
)


def read_config(root: Path) -> PersonaPlexConfig:
    path = root / "config.json"
    try:
        text = path.read_text() if path.exists() else ""
        raw = json.loads(text) if text.strip() else {}
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    mimi_raw = None
    mimi_name = raw.pop("mimi_config_name", None)
    if mimi_name is not None:
        mimi_path = root / str(mimi_name)
        try:
            mimi_raw = json.loads(mimi_path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise CheckpointError(f"cannot read the Mimi config {mimi_path}: {error}") from None
    try:
        return PersonaPlexConfig.from_dicts(raw, mimi_raw)
    except ConfigError as error:
        raise CheckpointError(f"{path}: {error}") from None


def lm_shapes(cfg: LMConfig) -> dict[str, tuple[int, ...]]:
    """The LM tensors as stored: `dep_q` depformer sets."""
    d, dd, S = cfg.dim, cfg.depformer_dim, cfg.dep_q
    shapes: dict[str, tuple[int, ...]] = {"text_emb.weight": (cfg.text_card + 1, d)}
    shapes |= {f"emb.{k}.weight": (cfg.card + 1, d) for k in range(cfg.n_q)}
    for i in range(cfg.num_layers):
        p = f"transformer.layers.{i}."
        shapes |= {p + "self_attn.in_proj_weight": (3 * d, d), p + "self_attn.out_proj.weight": (d, d),
                   p + "gating.linear_in.weight": (2 * cfg.ffn_hidden, d),
                   p + "gating.linear_out.weight": (d, cfg.ffn_hidden),
                   p + "norm1.alpha": (1, 1, d), p + "norm2.alpha": (1, 1, d)}
    shapes |= {"out_norm.alpha": (1, 1, d), "text_linear.weight": (cfg.text_card, d),
               "depformer_text_emb.weight": (cfg.text_card + 1, dd)}
    for t in range(S):
        shapes |= {f"depformer_in.{t}.weight": (dd, d), f"linears.{t}.weight": (cfg.card, dd)}
    shapes |= {f"depformer_emb.{t}.weight": (cfg.card + 1, dd) for t in range(min(S, cfg.depformer_steps - 1))}
    for i in range(cfg.depformer_num_layers):
        p = f"depformer.layers.{i}."
        shapes |= {p + "self_attn.in_proj_weight": (S * 3 * dd, dd), p + "self_attn.out_proj.weight": (S * dd, dd),
                   p + "norm1.alpha": (1, 1, dd), p + "norm2.alpha": (1, 1, dd)}
        for t in range(S):
            shapes |= {p + f"gating.{t}.linear_in.weight": (2 * cfg.depformer_ffn_hidden, dd),
                       p + f"gating.{t}.linear_out.weight": (dd, cfg.depformer_ffn_hidden)}
    return shapes


def _seanet_shapes(cfg: MimiConfig, prefix: str, decoder: bool) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}

    def conv(i: int | str, cin: int, cout: int, kernel: int) -> None:
        shapes[f"{prefix}.model.{i}.conv.conv.weight"] = (cout, cin, kernel)
        shapes[f"{prefix}.model.{i}.conv.conv.bias"] = (cout,)

    def resblocks(i: int, dim: int) -> int:
        for _ in range(cfg.n_residual_layers):
            conv(f"{i}.block.1", dim, dim // cfg.compress, cfg.residual_kernel_size)
            conv(f"{i}.block.3", dim // cfg.compress, dim, 1)
            i += 1
        return i

    nf = cfg.n_filters
    if not decoder:
        conv(0, 1, nf, cfg.kernel_size)
        i, mult = 1, 1
        for ratio in reversed(cfg.ratios):
            i = resblocks(i, mult * nf)
            conv(i + 1, mult * nf, 2 * mult * nf, 2 * ratio)
            i, mult = i + 2, mult * 2
        conv(i + 1, mult * nf, cfg.dimension, cfg.last_kernel_size)
        return shapes
    mult = 2 ** len(cfg.ratios)
    conv(0, cfg.dimension, mult * nf, cfg.kernel_size)
    i = 1
    for ratio in cfg.ratios:
        shapes[f"{prefix}.model.{i + 1}.convtr.convtr.weight"] = (mult * nf, mult * nf // 2, 2 * ratio)
        shapes[f"{prefix}.model.{i + 1}.convtr.convtr.bias"] = (mult * nf // 2,)
        i = resblocks(i + 2, mult * nf // 2)
        mult //= 2
    conv(i + 1, nf, 1, cfg.last_kernel_size)
    return shapes


def mimi_shapes(cfg: MimiConfig) -> dict[str, tuple[int, ...]]:
    """The Mimi tensors as stored (all `total_codebooks` codebooks)."""
    D, stride = cfg.dimension, cfg.downsample
    shapes = _seanet_shapes(cfg, "encoder", False) | _seanet_shapes(cfg, "decoder", True)
    for part in ("encoder_transformer", "decoder_transformer"):
        for i in range(cfg.num_layers):
            p, d = f"{part}.transformer.layers.{i}.", cfg.d_model
            shapes |= {p + "self_attn.in_proj_weight": (3 * d, d), p + "self_attn.out_proj.weight": (d, d),
                       p + "norm1.weight": (d,), p + "norm1.bias": (d,), p + "norm2.weight": (d,),
                       p + "norm2.bias": (d,), p + "linear1.weight": (cfg.dim_feedforward, d),
                       p + "linear2.weight": (d, cfg.dim_feedforward), p + "layer_scale_1.scale": (d,),
                       p + "layer_scale_2.scale": (d,)}
    shapes["downsample.conv.conv.conv.weight"] = (D, D, 2 * stride)
    shapes["upsample.convtr.convtr.convtr.weight"] = (D, 1, 2 * stride)
    for half, count in (("rvq_first", 1), ("rvq_rest", cfg.total_codebooks - 1)):
        p = f"quantizer.{half}."
        shapes |= {p + "input_proj.weight": (cfg.codebook_dim, D, 1),
                   p + "output_proj.weight": (D, cfg.codebook_dim, 1)}
        for i in range(count):
            q = f"{p}vq.layers.{i}._codebook."
            shapes |= {q + "_initialized": (1,), q + "cluster_usage": (cfg.bins,),
                       q + "embedding_sum": (cfg.bins, cfg.codebook_dim)}
    return shapes


def _read(path: Path, shapes: dict[str, tuple[int, ...]], device: str | torch.device) -> dict[str, torch.Tensor]:
    if not path.exists():
        raise CheckpointError(f"missing checkpoint file {path}")
    try:
        state = load_file(str(path), device=str(device))
    except Exception as error:  # noqa: BLE001 - safetensors raises its own types for a bad file
        raise CheckpointError(f"cannot read {path}: {error}") from None
    missing = [k for k in shapes if k not in state]
    if missing:
        raise CheckpointError(f"{path.name} lacks {len(missing)} tensors the config needs, e.g. {missing[:3]}")
    wrong = [f"{k} {tuple(state[k].shape)} (expected {shapes[k]})"
             for k in shapes if tuple(state[k].shape) != shapes[k]]
    if wrong:
        raise CheckpointError(f"{path.name} has tensors of the wrong shape for its config: {wrong[:3]}")
    extra = sorted(set(state) - set(shapes))
    if extra:
        logger.warning("%s: ignoring %d tensors the model does not use, e.g. %s", path.name, len(extra), extra[:3])
    return {k: state[k] for k in shapes}


def expand_depformer(state: dict[str, torch.Tensor], cfg: LMConfig) -> dict[str, torch.Tensor]:
    """The stored `dep_q` depformer sets -> `depformer_steps` sets, as PersonaPlex's loader does."""
    S, steps, out = cfg.dep_q, cfg.depformer_steps, dict(state)
    for i in range(cfg.depformer_num_layers):
        p = f"depformer.layers.{i}.self_attn."
        for name in ("in_proj_weight", "out_proj.weight"):
            w = state[p + name]
            w = w.view(S, -1, w.shape[-1])  # [S, rows per step, D]
            out[p + name] = w[[t % S for t in range(steps)]].reshape(-1, w.shape[-1])
    for t in range(S, steps):
        for i in range(cfg.depformer_num_layers):
            for name in ("linear_in", "linear_out"):
                out[f"depformer.layers.{i}.gating.{t}.{name}.weight"] = state[
                    f"depformer.layers.{i}.gating.{t - S}.{name}.weight"]
        out[f"depformer_in.{t}.weight"] = state[f"depformer_in.{t - S}.weight"]
        out[f"linears.{t}.weight"] = state[f"linears.{t - S}.weight"]
    for t in range(S, steps - 1):
        out[f"depformer_emb.{t}.weight"] = state[f"depformer_emb.{t - S}.weight"]
    return out


def _assign(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    own = set(module.state_dict())
    module.load_state_dict({k: v for k, v in state.items() if k in own}, strict=True, assign=True)


def load_lm(root: Path, cfg: PersonaPlexConfig, device: torch.device,
            dtype: torch.dtype) -> tuple[Temporal, Depformer]:
    state = _read(root / cfg.files["moshi_name"], lm_shapes(cfg.lm), device)
    state = {k: v.to(dtype) for k, v in expand_depformer(state, cfg.lm).items()}
    with torch.device("meta"):
        temporal, depformer = Temporal(cfg.lm), Depformer(cfg.lm)
    _assign(temporal, state)
    _assign(depformer, state)
    return temporal.eval(), depformer.eval()


def load_mimi(root: Path, cfg: PersonaPlexConfig, device: torch.device) -> Mimi:
    codebooks = cfg.lm.codebooks
    state = _read(root / cfg.files["mimi_name"], mimi_shapes(cfg.mimi), device)
    ours: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if "._codebook." in key:
            continue
        for old, new in MIMI_RENAMES:
            key = key.replace(old, new)
        ours[key] = value.float()
    for half, count in (("rvq_first", 1), ("rvq_rest", codebooks - 1)):
        p = f"quantizer.{half}.vq.layers."
        ours[f"quantizer.{half}.codebooks"] = torch.stack([
            state[f"{p}{i}._codebook.embedding_sum"].float()
            / state[f"{p}{i}._codebook.cluster_usage"].float().clamp(min=CODEBOOK_EPSILON)[:, None]
            for i in range(count)])
    with torch.device("meta"):
        mimi = Mimi(cfg.mimi, codebooks)
    mimi.load_state_dict(ours, strict=True, assign=True)
    return mimi.eval()


def load_tokenizer(root: Path, cfg: PersonaPlexConfig) -> TextTokenizer:
    import sentencepiece

    path = root / cfg.files["tokenizer_name"]
    if not path.exists():
        raise CheckpointError(f"missing text tokenizer {path}")
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(path))
    if tokenizer.vocab_size() > cfg.lm.text_card:
        raise CheckpointError(f"{path.name} has {tokenizer.vocab_size()} pieces, more than text_card "
                              f"({cfg.lm.text_card})")
    return tokenizer


def voices_dir(root: Path) -> Path | None:
    """`voices/` of the checkpoint, or `voices.tgz` extracted on first use (only plain `.pt`
    members under `voices/` are taken). The archive is extracted into Retake's cache, keyed
    by the archive's path, size and time, never into the checkpoint: a Hugging Face
    snapshot stays as downloaded, and a read-only checkpoint works."""
    folder = root / "voices"
    archive = root / "voices.tgz"
    if folder.is_dir() or not archive.exists():
        return folder if folder.is_dir() else None
    stat = archive.resolve().stat()
    key = hashlib.sha1(f"{archive.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]

    def extract(staging: Path) -> None:
        with tarfile.open(archive, "r:gz") as tar:
            members = [m for m in tar.getmembers()
                       if m.isfile() and m.name.endswith(".pt") and Path(m.name).parts[:1] == ("voices",)
                       and ".." not in Path(m.name).parts]
            tar.extractall(staging, members=members, filter="data")
        (staging / "voices").mkdir(exist_ok=True)

    return write_once(cache_dir() / "personaplex-voices" / key, extract) / "voices"
