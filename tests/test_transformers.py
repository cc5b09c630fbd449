"""numba_flash.transformers: a tiny Llama (GQA) built from a config, every attention layer on
numba_flash, against the same model on transformers' SDPA attention: logits and gradients of a
dense batch, a left-padded batch, a padding-free packed batch, and greedy generation with the
model's cache; a tiny Mistral with a sliding window likewise, and a tiny Gemma-2 (softcap and
sliding windows) and a tiny gpt-oss (sinks) against transformers' eager attention (skipped without torch or transformers: the suite's set-up installs neither
transformers nor the "hf" extra, whose transformers 5.2x brings a top-level package "kernels"
that hides tests/kernels; these tests run where transformers is at hand, as on the GPU image)."""

import copy

import numpy as np
import pytest

from helpers import SIMULATOR

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import numba_flash.transformers as nftr  # noqa: E402  (needs both)

DEVICE = "cpu" if SIMULATOR else "cuda"
DTYPE = torch.float32 if SIMULATOR else torch.bfloat16


def _models(rng, family="Llama", reference="sdpa", **options):
    """The same tiny model twice (Llama, or ``family`` with its config's ``options``): on
    transformers' ``reference`` attention (SDPA), and on numba_flash."""
    sizes = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config = getattr(transformers, f"{family}Config")(**{**sizes, **options})
    model = getattr(transformers, f"{family}ForCausalLM")
    torch.manual_seed(int(rng.integers(2**31)))
    ref = model._from_config(copy.deepcopy(config), attn_implementation=reference)
    ours = model._from_config(copy.deepcopy(config), attn_implementation=nftr.register())
    ours.load_state_dict(ref.state_dict())
    assert ours.config._attn_implementation == "numba_attention"
    assert ref.config._attn_implementation == reference
    return ref.to(DEVICE, DTYPE).eval(), ours.to(DEVICE, DTYPE).eval()


def _close(got, want):
    tol = 2e-4 if DTYPE == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def _same_logits_and_gradients(ref, ours, ids, masks=(None,)):
    """Both models' logits (the rows each mask keeps) and every parameter's gradient of one
    loss agree, for each attention mask in ``masks``."""
    for attention_mask in masks:
        logits = []
        for model in (ref, ours):
            model.zero_grad()
            out = model(ids, attention_mask=attention_mask).logits
            out.float().square().mean().backward()
            logits.append(out)
        keep = slice(None) if attention_mask is None else attention_mask.bool()
        _close(logits[1][keep], logits[0][keep])
        for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
            _close(p.grad, q.grad)


def test_register_refuses_a_name_transformers_takes_for_flash_attn():
    with pytest.raises(ValueError, match="flash"):
        nftr.register("numba_flash")
    assert nftr.register() == "numba_attention"


def test_dense_and_padded_batches_give_sdpa_logits_and_gradients(rng):
    ref, ours = _models(rng)
    ids = torch.from_numpy(rng.integers(0, 61, (2, 7))).to(DEVICE)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding, as generation lays it out
    _same_logits_and_gradients(ref, ours, ids, (None, mask))


def test_a_sliding_window_model_gives_sdpa_logits_gradients_and_generation(rng):
    """A tiny Mistral whose window (3 keys) is shorter than its sequences: every layer passes
    ``sliding_window``, which numba_flash runs as ``window_size``; dense and left-padded."""
    ref, ours = _models(rng, "Mistral", sliding_window=3)
    ids = torch.from_numpy(rng.integers(0, 61, (2, 7))).to(DEVICE)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    _same_logits_and_gradients(ref, ours, ids, (None, mask))
    kwargs = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert np.array_equal(ours.generate(ids[:, :5], **kwargs).cpu().numpy(),
                          ref.generate(ids[:, :5], **kwargs).cpu().numpy())


def test_a_softcapped_model_gives_eager_logits_and_gradients(rng):
    """A tiny Gemma-2: logits capped at 2 (so the cap bites) in every layer, a 3-key sliding
    window in every other, against transformers' eager attention (its SDPA path drops the
    cap)."""
    ref, ours = _models(rng, "Gemma2", reference="eager", num_hidden_layers=2, head_dim=8,
                        sliding_window=3, attn_logit_softcapping=2.0)
    ids = torch.from_numpy(rng.integers(0, 61, (2, 7))).to(DEVICE)
    _same_logits_and_gradients(ref, ours, ids)


def test_a_model_with_sinks_gives_eager_logits_and_gradients(rng):
    """A tiny gpt-oss: a learned sink per query head in every layer (``s_aux``, numba_flash's
    ``learnable_sink``; its gradient too), a 3-key sliding window in every other, dense and
    left-padded, against transformers' eager attention."""
    ref, ours = _models(rng, "GptOss", reference="eager", num_hidden_layers=2, head_dim=8,
                        sliding_window=3, num_local_experts=2, num_experts_per_tok=1,
                        layer_types=["sliding_attention", "full_attention"])
    with torch.no_grad():  # sinks that matter: as large as the scores
        for a, b in zip(ref.model.layers, ours.model.layers):
            a.self_attn.sinks.copy_(2 * torch.randn_like(a.self_attn.sinks))
            b.self_attn.sinks.copy_(a.self_attn.sinks)
    ids = torch.from_numpy(rng.integers(0, 61, (2, 7))).to(DEVICE)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    _same_logits_and_gradients(ref, ours, ids, (None, mask))
    assert ours.model.layers[0].self_attn.sinks.grad.abs().sum() > 0


def test_a_padding_free_packed_batch_equals_its_sequences_run_alone(rng):
    """Batch 1 with position_ids restarting at 0 (transformers' DataCollatorWithFlattening):
    each sequence attends only to itself, as when run alone on SDPA."""
    ref, ours = _models(rng)
    lengths = [3, 5, 2]
    ids = torch.from_numpy(rng.integers(0, 61, (1, sum(lengths)))).to(DEVICE)
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(DEVICE)
    packed = ours(ids, position_ids=positions).logits[0]
    start = 0
    for n in lengths:
        alone = ref(ids[:, start:start + n]).logits[0]
        _close(packed[start:start + n], alone)
        start += n


def test_greedy_generation_with_the_cache_matches_sdpa(rng):
    ref, ours = _models(rng)
    ids = torch.from_numpy(rng.integers(0, 61, (2, 4))).to(DEVICE)
    kwargs = dict(max_new_tokens=2, do_sample=False, pad_token_id=0)
    want = ref.generate(ids, **kwargs)
    got = ours.generate(ids, **kwargs)
    assert np.array_equal(got.cpu().numpy(), want.cpu().numpy())
