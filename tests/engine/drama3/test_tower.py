"""The tower and the backbone input embedding against a step-by-step re-derivation.

The reference below is written from reference/drama3.md §2.3-2.7 alone: one row at a time,
one head at a time, with the weights read from the tiny checkpoint's safetensors under
their original key names (no loader, no module of ours). It keeps each layer's keys and
values in a dict by position, so a later row at the same position replaces them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

PROMPT_ROWS = 12


class ReferenceTower:
    def __init__(self, checkpoint: Path) -> None:
        raw = json.loads((checkpoint / "config.json").read_text())
        self.c = raw["audio_decoder_config"]
        self.start, self.end = raw["semantic_start_token_id"], raw["semantic_end_token_id"]
        index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
        self.w: dict[str, torch.Tensor] = {}
        for shard in sorted(set(index["weight_map"].values())):
            with safe_open(checkpoint / shard, framework="pt") as reader:
                self.w.update({k: reader.get_tensor(k).float() for k in reader.keys() if "experts" not in k})
        shared = [f"audio_decoder_mtp_shared.layers.{i}." for i in range(self.c["n_layer"])]
        residual = [f"audio_decoder_mtp.layers.{j}." for j in range(self.c["num_codebooks"] - 1)]
        self.layers = [(p, "semantic_embedding") for p in shared] + [(p, "codebook_embedding") for p in residual]
        self.kv: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in self.layers]

    def norm(self, x: torch.Tensor, key: str) -> torch.Tensor:
        return x / torch.sqrt(x.pow(2).mean() + self.c["norm_eps"]) * (1 + self.w[key])

    def rope(self, x: torch.Tensor, position: int) -> torch.Tensor:
        """Interleaved: pairs (2i, 2i+1) of the first rotary dims turn by position * base^(-2i/rot)."""
        rotary = int(self.c["head_dim"] * self.c["rotary_percent"])
        angle = position * self.c["rope_base"] ** (-torch.arange(0, rotary, 2, dtype=torch.float64) / rotary)
        cos, sin = angle.cos().float(), angle.sin().float()
        a, b = x[0:rotary:2], x[1:rotary:2]
        out = x.clone()
        out[0:rotary:2], out[1:rotary:2] = a * cos - b * sin, b * cos + a * sin
        return out

    def codebook(self, k: int, code: int) -> torch.Tensor:
        return self.w["audio_decoder.codebook_embeddings.weight"][k * self.c["vocab_size"] + code]

    def semantic(self, token: int) -> bool:
        return self.start <= token <= self.end

    def embed_backbone(self, row: list[int]) -> torch.Tensor:
        e = self.w["model.language_model.embed_tokens.weight"][row[0]]
        if not self.semantic(row[0]):
            return e
        kb = self.c["vq_backbone_codebooks"]
        return (e + sum(self.codebook(k, row[1 + k]) for k in range(1, 1 + kb))) / math.sqrt(1 + kb)

    def shared_input(self, row: list[int]) -> torch.Tensor:
        if not self.semantic(row[0]):
            return torch.zeros(self.c["dim"])
        return sum(self.codebook(k, row[1 + k]) for k in range(1 + self.c["vq_backbone_codebooks"], 10))

    def layer(self, n: int, h: torch.Tensor, code: int, semantic: bool, position: int, extra=None) -> torch.Tensor:
        prefix, embedding = self.layers[n]
        w = lambda name: self.w[prefix + name]
        H, Hkv, Dh = self.c["n_head"], self.c["n_local_heads"], self.c["head_dim"]
        e = w(embedding + ".weight")[code] if semantic else torch.zeros(self.c["dim"])
        if extra is not None:
            e = e + extra
        x = w("eh_proj.weight") @ torch.cat((self.norm(e, prefix + "enorm.weight"),
                                             self.norm(h, prefix + "hnorm.weight")))
        a = self.norm(x, prefix + "transformer_layer.attention_norm.weight")
        qkv = w("transformer_layer.attention.wqkv.weight") @ a  # [all Q | all gates | K | V]
        q, gate = qkv[:H * Dh].view(H, Dh), qkv[H * Dh:2 * H * Dh]
        k, v = qkv[2 * H * Dh:2 * H * Dh + Hkv * Dh].view(Hkv, Dh), qkv[2 * H * Dh + Hkv * Dh:].view(Hkv, Dh)
        q = torch.stack([self.rope(self.norm(q[i], prefix + "transformer_layer.attention.q_norm.weight"), position)
                         for i in range(H)])
        k = torch.stack([self.rope(self.norm(k[i], prefix + "transformer_layer.attention.k_norm.weight"), position)
                         for i in range(Hkv)])
        self.kv[n][position] = (k, v)
        visible = sorted(p for p in self.kv[n] if p <= position)
        heads = []
        for i in range(H):
            group = i // (H // Hkv)
            keys = torch.stack([self.kv[n][p][0][group] for p in visible])
            values = torch.stack([self.kv[n][p][1][group] for p in visible])
            heads.append(torch.softmax(keys @ q[i] / math.sqrt(Dh), 0) @ values)
        x = x + w("transformer_layer.attention.wo.weight") @ (torch.cat(heads) * torch.sigmoid(gate))
        f = self.norm(x, prefix + "transformer_layer.ffn_norm.weight")
        up = (F.silu(w("transformer_layer.feed_forward.w1.weight") @ f)
              * (w("transformer_layer.feed_forward.w3.weight") @ f))
        x = x + w("transformer_layer.feed_forward.w2.weight") @ up
        return self.norm(x, prefix + "final_layernorm.weight")

    def frame(self, h: torch.Tensor, row: list[int], main: int, codes: list[int], position: int):
        """One frame at `position` from input row `row`, new main token `main` and codes c0..c9
        (forced); returns each codebook head's logits."""
        semantic = self.semantic(main)
        shared = self.c["n_layer"]
        for n in range(shared):
            h = self.layer(n, h, codes[0], semantic, position, self.shared_input(row) if n == 0 else None)
        logits = []
        for j in range(self.c["num_codebooks"] - 1):
            h = self.layer(shared + j, h, codes[j], semantic, position)
            logits.append(self.w[f"audio_decoder_mtp.heads.{j}.weight"] @ h)
        return logits


def prompt(config, generator: torch.Generator) -> torch.Tensor:
    frames = torch.zeros(1, PROMPT_ROWS, 11, dtype=torch.long)
    frames[0, :5, 0] = torch.randint(0, 256, (5,), generator=generator)
    frames[0, 5:, 1] = torch.randint(0, 4096, (PROMPT_ROWS - 5,), generator=generator)
    frames[0, 5:, 2:] = torch.randint(0, 1024, (PROMPT_ROWS - 5, 9), generator=generator)
    frames[0, 5:, 0] = frames[0, 5:, 1] + config.semantic_start_token_id
    return frames


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: Path) -> ReferenceTower:
    return ReferenceTower(tiny_checkpoint)


def test_embed_backbone_matches_reference(tiny_model, reference: ReferenceTower) -> None:
    model, config, _ = tiny_model
    frames = prompt(config, torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ours = model.embed(frames)[0]
    expected = torch.stack([reference.embed_backbone(row) for row in frames[0].tolist()])
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_prefill_and_two_decode_steps_match_reference(tiny_model, reference: ReferenceTower) -> None:
    model, config, _ = tiny_model
    generator = torch.Generator().manual_seed(1)
    frames = prompt(config, generator)
    hidden = torch.randn(1, PROMPT_ROWS + 1, config.text.hidden_size, generator=generator)
    # Step 1 draws a semantic frame at the last prompt row's position; step 2 draws end of speech.
    codes1 = [int(torch.randint(0, 4096, (), generator=generator)),
              *torch.randint(0, 1024, (9,), generator=generator).tolist()]
    frame1 = [config.semantic_start_token_id + codes1[0], *codes1]
    codes2 = [0] * 10
    frame2 = [config.eos_token_id, *codes2]
    slots, positions = torch.tensor([1]), torch.arange(PROMPT_ROWS + 1)[None]
    model.setup_caches(2, 32, "cpu", torch.float32)

    def step(h, row: list[int], frame: list[int], codes: list[int], position: int) -> list[torch.Tensor]:
        tower = model.tower
        main = torch.tensor([frame[0]])
        semantic = tower.is_semantic(main)
        pos = torch.tensor([position])
        x = tower.run_shared(h, torch.tensor([codes[0]]), semantic, torch.tensor([row]), pos, slots)
        logits = []
        for j, (layer, head) in enumerate(zip(tower.residual_layers, tower.heads)):
            x = layer(x, torch.tensor([codes[j]]), semantic, pos, slots)
            logits.append(head(x)[0])
        return logits

    with torch.inference_mode():
        model.tower.prefill(hidden[:, :PROMPT_ROWS - 1], positions[:, :PROMPT_ROWS - 1], frames[:, :-1],
                            frames[:, 1:], slots)
        last = frames[0, -1].tolist()
        ours = step(hidden[:, PROMPT_ROWS - 1], last, frame1, codes1, PROMPT_ROWS - 1)
        ours += step(hidden[:, PROMPT_ROWS], frame1, frame2, codes2, PROMPT_ROWS)

    rows = frames[0].tolist()
    for p in range(PROMPT_ROWS - 1):  # teacher forcing: row p is labelled by row p + 1
        reference.frame(hidden[0, p], rows[p], rows[p + 1][0], rows[p + 1][1:], p)
    expected = reference.frame(hidden[0, PROMPT_ROWS - 1], last, frame1[0], codes1, PROMPT_ROWS - 1)
    expected += reference.frame(hidden[0, PROMPT_ROWS], frame1, frame2[0], codes2, PROMPT_ROWS)
    assert len(ours) == len(expected) == 18
    for mine, theirs in zip(ours, expected):
        assert 0.3 < theirs.std() < 3.0  # sane logits from the random init
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)


def test_one_row_and_sequence_calls_agree(tiny_model) -> None:
    """A residual layer over [B, D] rows equals the same layer over [B, 1, D]."""
    model, config, _ = tiny_model
    model.setup_caches(2, 16, "cpu", torch.float32)
    layer = model.tower.residual_layers[3]
    h = torch.randn(2, config.text.hidden_size)
    codes, semantic = torch.tensor([5, 7]), torch.tensor([True, False])
    pos, slots = torch.tensor([4, 9]), torch.tensor([0, 1])
    with torch.inference_mode():
        rows = layer(h, codes, semantic, pos, slots)
        sequence = layer(h[:, None], codes[:, None], semantic[:, None], pos[:, None], slots)
    torch.testing.assert_close(rows, sequence[:, 0], atol=1e-6, rtol=1e-6)
