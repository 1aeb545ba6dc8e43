"""Random weights made on the device (`EngineSpec(random_weights=...)`, `retake serve
--random-weights`): a tokenizer laid out at the full preset's ids builds prompts, and an
engine of the tiny preset runs takes and says its weights are demo weights. (The full
preset needs a GPU: scripts/gpu serves it and load-tests it.)"""

from __future__ import annotations

import pytest

from engine import Done, EngineSpec, RequestError, Sampling, load_engine
from engine.drama3.config import Drama3Config, preset
from engine.drama3.prompt import build_prompt
from engine.drama3.tokenizer import semantic_token, tiny_tokenizer, token_ids, tokenizer_for


def test_a_tokenizer_at_the_full_presets_ids_builds_prompts() -> None:
    config = Drama3Config.from_dict(preset("full"))
    tokenizer = tokenizer_for(config.semantic_start_token_id, config.eos_token_id, config.text.vocab_size)
    assert token_ids(tokenizer) == {"semantic_start": 248_192, "eos": 248_046, "vocab": 252_288}
    assert tokenizer.token_to_id(semantic_token(4095)) == 252_287
    text = tokenizer.encode("Places, everyone.").ids
    assert all(i < 256 for i in text) and tokenizer.decode(text) == "Places, everyone."  # bytes, no reserved ids
    prompt = build_prompt("Places, everyone.", None, [], Sampling(), tokenizer, config)
    assert prompt.rows.shape[1] == config.frame_width and int(prompt.rows[:, 0].max()) < config.text.vocab_size


def test_the_tiny_tokenizer_is_its_own_layout() -> None:
    tiny = tiny_tokenizer()
    ids = token_ids(tiny)
    assert tokenizer_for(ids["semantic_start"], ids["eos"], ids["vocab"]).to_str() == tiny.to_str()
    with pytest.raises(ValueError, match="no byte tokenizer"):
        tokenizer_for(100, 50, 4196)


def test_an_engine_of_random_tiny_weights_runs_takes_as_demo_weights() -> None:
    engine = load_engine(EngineSpec(random_weights="tiny", device="cpu", slots=1, threads=1))
    assert engine.demo_weights and engine.weights == "random weights of the tiny preset, made on cpu"
    prompt = engine.prompt("Random, and it says so.", None, [], Sampling(max_new_tokens=12, seed=3))
    events = list(engine.generate(prompt))
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason in ("stop", "length") and done.codes.shape[1] > 0


def test_random_weights_are_refused_where_they_cannot_run() -> None:
    with pytest.raises(RequestError, match="full preset need a CUDA GPU"):
        load_engine(EngineSpec(random_weights="full", device="cpu"))
    with pytest.raises(RequestError, match="presets full, tiny"):
        load_engine(EngineSpec(random_weights="huge", device="cpu"))
    with pytest.raises(RequestError, match="not both"):
        load_engine(EngineSpec(random_weights="tiny", checkpoint="owner/name", device="cpu"))
