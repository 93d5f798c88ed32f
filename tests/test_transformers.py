"""Hugging Face models on ``attn_implementation="neuralops_sdpa"`` and ``"neuralops_eager"``.

Tiny randomly initialised Llama, Mistral (sliding window) and Qwen2 (one full, one sliding
layer) causal LMs on a padded batch: the logits and every parameter's gradient equal those
of the stock ``"sdpa"``/``"eager"``, eagerly and under ``torch.compile``, and our op does
the expansion where the stock code calls ``repeat_kv``.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch

transformers = pytest.importorskip(
    "transformers",
    minversion="5.17",
    reason="the transformers integration needs transformers>=5.17 (pip install '.[test]')",
)

from benchmarks import e2e_transformers  # noqa: E402
from neuralops_gqa.integrations import transformers as neuralops_transformers  # noqa: E402

LAYERS = 2
PAIRS = [("sdpa", "neuralops_sdpa"), ("eager", "neuralops_eager")]
PAIR_IDS = ["sdpa", "eager"]

# Backward tolerance. The forward is the same arithmetic on the same bits (the expansion is
# an exact copy into the layout repeat_kv produces), so logits must be equal. Gradients
# differ where autograd's sum over repeat_kv's broadcast dim and our float32 group sum add
# in another order, and (on CUDA) where SDPA's backward accumulates in a nondeterministic
# order: float32 rounding of sums of at most `hidden` (64) terms, 64 * 2**-23 < 1e-5 of
# the largest magnitude involved.
GRAD_RTOL = 1e-5
# torch.compile fuses and reorders the stock float32 arithmetic around the attention
# (RMSNorm, rotary, softmax), so compiled logits differ from eager ones by the same kind of
# rounding (about 1e-7 here).
COMPILED_RTOL = 1e-5


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    neuralops_transformers.register()


# No downloads: small enough that the Triton interpreter runs a step in about a second.
_TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
)


def _config(family: str) -> transformers.PretrainedConfig:
    """A tiny Llama-family model (``_TINY``)."""
    if family == "llama":
        return transformers.LlamaConfig(**_TINY)
    if family == "mistral":  # a window shorter than the sequence: the mask is not just causal
        return transformers.MistralConfig(**_TINY, sliding_window=4)
    if family == "qwen2":  # layer 0 full attention, layer 1 a sliding window
        return transformers.Qwen2Config(
            **_TINY, use_sliding_window=True, sliding_window=4, max_window_layers=1
        )
    raise ValueError(family)


def _model_pair(family: str, stock: str, ours: str, device: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    build = transformers.AutoModelForCausalLM.from_config
    ref = build(_config(family), attn_implementation=stock).to(device)
    model = build(_config(family), attn_implementation=ours).to(device)
    model.load_state_dict(ref.state_dict())
    assert model.config._attn_implementation == ours
    return ref, model


def _padded_batch(device: str, seq: int = 10, right: bool = True) -> dict[str, torch.Tensor]:
    """Three rows: left-padded by 3, right-padded by 3 (or left-padded by 1), unpadded."""
    ids = torch.randint(1, 128, (3, seq), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, seq, dtype=torch.long)
    mask[0, :3] = 0
    if right:
        mask[1, -3:] = 0
    else:
        mask[1, :1] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def _step(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], run: Callable[..., Any] | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits and every parameter's gradient of one training step of ``run`` (the model itself
    unless given, e.g. its compiled form)."""
    out = (model if run is None else run)(**batch)
    out.loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is not None for g in grads.values())
    return out.logits.detach(), grads


def _assert_grads_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for name, grad in expected.items():
        atol = GRAD_RTOL * float(grad.abs().max())
        torch.testing.assert_close(actual[name], grad, rtol=GRAD_RTOL, atol=atol, msg=name)


def _names(calls: list[tuple[str, torch.Size]]) -> list[str]:
    return [name for name, _ in calls]


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize(("stock", "ours"), PAIRS, ids=PAIR_IDS)
def test_padded_training_step_matches_stock(
    backend: str, device: str, family: str, stock: str, ours: str, op_calls: list[tuple[str, torch.Size]]
) -> None:
    ref, model = _model_pair(family, stock, ours, device)
    batch = _padded_batch(device)
    logits_ref, grads_ref = _step(ref, batch)
    assert op_calls == []
    logits, grads = _step(model, batch)
    # A padded batch has a mask, so stock sdpa calls repeat_kv too: one expansion per layer
    # forward, one group sum per layer backward.
    assert sorted(_names(op_calls)) == ["gqa_expand"] * LAYERS + ["gqa_reduce"] * LAYERS
    torch.testing.assert_close(logits, logits_ref, rtol=0, atol=0)
    _assert_grads_close(grads, grads_ref)


@pytest.mark.slow
# Turning the compiler's caches off turns its profile-guided recompilation off too, which
# PyTorch announces once per process: the point here, nothing to act on.
@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled by torch.compiler.config:UserWarning")
@pytest.mark.parametrize(("stock", "ours"), PAIRS, ids=PAIR_IDS)
def test_compiled_training_step_matches_stock(
    backend: str, device: str, stock: str, ours: str, op_calls: list[tuple[str, torch.Size]]
) -> None:
    """``fullgraph=True``: the whole model is one graph with our op in it. On CPU the graph
    runs through ``aot_eager`` (dynamo, fake tensors, AOT autograd: every step that sees our
    op), as Inductor's C++ builds would take most of a minute on a small CPU; on CUDA
    through Inductor."""
    ref, model = _model_pair("llama", stock, ours, device)
    batch = _padded_batch(device)
    logits_ref, grads_ref = _step(ref, batch)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    # Without the compiler's caches: a graph an earlier run compiled would be served from
    # them, untraced, and this test checks what tracing sees.
    with torch.compiler.config.patch(force_disable_caches=True):
        logits, grads = _step(model, batch, compiled)
    # Traced into the graph, then taken apart for the backend: no real call at run time.
    assert {"traced gqa_expand", "traced gqa_reduce"} <= set(_names(op_calls))
    assert not [call for call in _names(op_calls) if not call.startswith("traced ")], op_calls
    torch.testing.assert_close(
        logits, logits_ref, rtol=COMPILED_RTOL, atol=COMPILED_RTOL * float(logits_ref.abs().max())
    )
    _assert_grads_close(grads, grads_ref)


def test_unpadded_sdpa_keeps_enable_gqa(device: str, op_calls: list[tuple[str, torch.Size]]) -> None:
    """Without a mask stock sdpa expands nothing (SDPA's ``enable_gqa``), and neither do we."""
    ref, model = _model_pair("llama", "sdpa", "neuralops_sdpa", device)
    batch = _padded_batch(device)
    del batch["attention_mask"]
    with torch.no_grad():
        logits_ref, logits = ref(**batch).logits, model(**batch).logits
    assert op_calls == []
    torch.testing.assert_close(logits, logits_ref, rtol=0, atol=0)


@pytest.mark.parametrize(("stock", "ours"), PAIRS, ids=PAIR_IDS)
def test_generate_matches_stock(backend: str, device: str, stock: str, ours: str) -> None:
    """Greedy decoding through the KV cache, left-padded: prefill and single-token steps."""
    ref, model = _model_pair("llama", stock, ours, device)
    batch = _padded_batch(device, seq=6, right=False)
    del batch["labels"]
    kwargs = dict(max_new_tokens=3, do_sample=False, output_logits=True, return_dict_in_generate=True)
    out_ref, out = ref.generate(**batch, **kwargs), model.generate(**batch, **kwargs)
    assert torch.equal(out.sequences, out_ref.sequences)
    for step, (actual, expected) in enumerate(zip(out.logits, out_ref.logits)):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=f"step {step}")


def test_set_attn_implementation_switches(device: str, op_calls: list[tuple[str, torch.Size]]) -> None:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config("llama")).to(device)
    batch = _padded_batch(device)
    with torch.no_grad():
        for name in ("neuralops_eager", "eager", "neuralops_sdpa"):
            model.set_attn_implementation(name)
            assert model.config._attn_implementation == name
            model(**batch)
    assert _names(op_calls) == ["gqa_expand"] * (2 * LAYERS)


def _module(**attrs: object) -> types.SimpleNamespace:
    return types.SimpleNamespace(num_key_value_groups=3, head_dim=8, training=False, **attrs)


def _qkv_mask(device: str) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, h, 5, 8, generator=gen).to(device) for h in (6, 2, 2))
    mask = torch.zeros(2, 1, 5, 5).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -1e9).to(device)
    return q, k, v, mask


def _other_config(family: str) -> transformers.PretrainedConfig:
    """Families whose eager attention is not the Llama family's, as tiny as ``_config``'s."""
    common = {**_TINY, "bos_token_id": 1, "eos_token_id": 2}
    if family == "gemma2":  # soft-capped logits, a sliding-window layer
        return transformers.Gemma2Config(**common, head_dim=16, attn_logit_softcapping=5.0, sliding_window=4)
    if family == "gpt_oss":  # attention sinks in the softmax; a mixture of 2 experts
        return transformers.GptOssConfig(
            **common, head_dim=16, num_local_experts=2, num_experts_per_tok=1, sliding_window=4
        )
    if family == "granite_swa":  # sinks applied as a scale of the output: not reproduced
        return transformers.GraniteSWAConfig(**common, sliding_window=4)
    raise ValueError(family)


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss", "granite_swa"])
def test_eager_families_match_stock(
    backend: str,
    device: str,
    family: str,
    op_calls: list[tuple[str, torch.Size]],
) -> None:
    """Logits and attention weights equal stock ``"eager"``'s, bit for bit, with one expansion
    per layer: Gemma 2's soft-capping, GPT-OSS's sinks in the softmax and Granite-SWA's sinks
    as an output scale all run in the layers' own eager attention, on our expanded k and v."""
    torch.manual_seed(0)
    build = transformers.AutoModelForCausalLM.from_config
    ref = build(_other_config(family), attn_implementation="eager").to(device)
    with torch.no_grad():  # sinks start at zero (Granite-SWA) or small: make them matter
        for name, param in ref.named_parameters():
            if name.endswith("sinks"):
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(5)))
    model = build(_other_config(family), attn_implementation="neuralops_eager").to(device)
    model.load_state_dict(ref.state_dict())
    batch = _padded_batch(device)
    del batch["labels"]
    with torch.no_grad():
        expected = ref(**batch, output_attentions=True)
        actual = model(**batch, output_attentions=True)
    assert _names(op_calls) == ["gqa_expand"] * LAYERS
    torch.testing.assert_close(actual.logits, expected.logits, rtol=0, atol=0)
    assert len(actual.attentions) == len(expected.attentions) == LAYERS
    for layer, (a, e) in enumerate(zip(actual.attentions, expected.attentions)):
        torch.testing.assert_close(a, e, rtol=0, atol=0, msg=f"layer {layer}")


def test_eager_refuses_a_layer_without_eager_attention() -> None:
    """A module whose eager attention cannot be found: a clear error, not a guess."""
    q, k, v, mask = _qkv_mask("cpu")
    with pytest.raises(
        NotImplementedError, match=r"cannot find the eager attention of types\.SimpleNamespace"
    ):
        neuralops_transformers.eager_attention_forward(_module(), q, k, v, mask, scaling=0.3)


@pytest.mark.parametrize("masked", [True, False], ids=["mask", "causal"])
def test_sdpa_arguments_match_stock(
    device: str, masked: bool, op_calls: list[tuple[str, torch.Size]]
) -> None:
    """Dropout (same seed, same draws), scaling, is_causal, with and without a mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v, mask = _qkv_mask(device)
    mask = mask.bool().logical_not() if masked else None  # sdpa's masks are boolean
    for kwargs in ({"dropout": 0.5}, {"scaling": 0.2, "is_causal": False}, {"is_causal": True}):
        module = _module(is_causal=True)
        torch.manual_seed(4)
        expected, _ = sdpa_attention_forward(module, q, k, v, mask, **kwargs)
        torch.manual_seed(4)
        actual, weights = neuralops_transformers.sdpa_attention_forward(module, q, k, v, mask, **kwargs)
        assert weights is None
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=str(kwargs))
    assert _names(op_calls) == (["gqa_expand"] * 3 if masked else [])


def test_register_adds_mask_functions() -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    neuralops_transformers.register()  # again: idempotent
    interface = transformers.AttentionInterface()
    assert interface["neuralops_sdpa"] is neuralops_transformers.sdpa_attention_forward
    assert interface["neuralops_eager"] is neuralops_transformers.eager_attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["neuralops_sdpa"] is ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    assert ALL_MASK_ATTENTION_FUNCTIONS["neuralops_eager"] is ALL_MASK_ATTENTION_FUNCTIONS["eager"]


def test_neuralops_gqa_import_does_not_import_transformers() -> None:
    code = (
        "import sys, neuralops_gqa, neuralops_gqa.integrations; "
        "assert 'transformers' not in sys.modules, 'transformers was imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_benchmark_runs_on_cpu(tmp_path: pytest.TempPathFactory) -> None:
    out = tmp_path / "bench.json"
    e2e_transformers.main(["--device", "cpu", "--warmup", "1", "--repeats", "2", "--out", str(out)])
    report = json.loads(out.read_text())
    names = [r["implementation"] for r in report["results"]]
    assert names == ["sdpa", "neuralops_sdpa", "eager", "neuralops_eager"]
    assert all(len(r["step_ms"]) == 2 and r["median_ms"] > 0 for r in report["results"])
    # The same weights and batch: the stock and our losses agree.
    losses = {r["implementation"]: r["loss"] for r in report["results"]}
    assert losses["neuralops_sdpa"] == pytest.approx(losses["sdpa"], rel=1e-6)
    assert losses["neuralops_eager"] == pytest.approx(losses["eager"], rel=1e-6)
    assert set(report["speedup"]) == {"neuralops_sdpa vs sdpa", "neuralops_eager vs eager"}


class _KeyStrides(torch.overrides.TorchFunctionMode):
    """Records, for each attention product, whether its key reached it as a broadcast view
    over the heads (head stride 0): the second operand of ``torch.matmul`` (eager attention)
    and the key of ``scaled_dot_product_attention``."""

    def __init__(self) -> None:
        super().__init__()
        self.broadcast: list[bool] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func in (torch.matmul, torch.nn.functional.scaled_dot_product_attention):
            key = args[1] if len(args) > 1 else (kwargs or {})["key"]
            if key.dim() == 4 and key.shape[1] > 1:
                self.broadcast.append(key.stride(1) == 0)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("stock", "ours", "rows"),
                         [("sdpa", "neuralops_sdpa", 3), ("eager", "neuralops_eager", 3),
                          ("eager", "neuralops_eager", 1)],
                         ids=["sdpa", "eager", "eager-batch-1"])  # fmt: skip
def test_one_kv_head_takes_the_consumers_route(
    backend: str, device: str, stock: str, ours: str, rows: int,
    op_calls: list[tuple[str, torch.Size]],
) -> None:  # fmt: skip
    """One KV head: stock repeat_kv makes a broadcast view (head stride 0), and the attention
    reads it as it is (SDPA in place; eager matmul, whatever the batch, as its own kernels
    take it). Our implementations copy nothing there and hand the attention the same view,
    so the forward is stock's computation: equal bits on any machine (``matmul`` of the view
    and of a contiguous copy can differ in the last bits on some CPUs)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**_TINY, "num_key_value_heads": 1})
    build = transformers.AutoModelForCausalLM.from_config
    ref = build(config, attn_implementation=stock).to(device)
    model = build(copy.deepcopy(config), attn_implementation=ours).to(device)
    model.load_state_dict(ref.state_dict())
    batch = {k: v[:rows] for k, v in _padded_batch(device).items()}
    logits_ref, grads_ref = _step(ref, batch)
    with _KeyStrides() as keys:
        logits, grads = _step(model, batch)
    assert op_calls == []
    # Every layer's attention got the broadcast view (eager: q @ k^T, then weights @ v).
    assert keys.broadcast == [True] * (LAYERS * (1 if stock == "sdpa" else 2)), keys.broadcast
    torch.testing.assert_close(logits, logits_ref, rtol=0, atol=0)
    # The same computation as stock's, backward included; GRAD_RTOL covers CUDA's
    # nondeterministic SDPA backward.
    _assert_grads_close(grads, grads_ref)


def _tiny_from(config: Any, *names: str) -> list[torch.nn.Module]:
    """One model per attention name, all with the first one's weights."""
    torch.manual_seed(0)
    models = [transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=n).eval()
              for n in names]  # fmt: skip
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    return models


def test_gemma4_kv_shared_layers_refuse_queries_cut_without_a_mask() -> None:
    """Gemma 4 cuts its KV-shared layers' queries to the kept logits under any attention name
    but the literal "sdpa", with no mask: SDPA would align several with the first keys and
    give other logits than stock's. "neuralops_sdpa" refuses those calls by name; its full
    forward, a padded batch (a mask), one kept query and a generate with a dynamic cache
    (what stock cuts too) stay stock's bits, and "neuralops_eager" (always a mask) is
    stock's with the cut queries too."""
    if not hasattr(transformers, "Gemma4TextConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no Gemma 4")
    config = transformers.Gemma4TextConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, head_dim=8, global_head_dim=8, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"] * 2, num_kv_shared_layers=2,
        vocab_size_per_layer_input=100, hidden_size_per_layer_input=8, max_position_embeddings=64,
    )  # fmt: skip
    stock, ours, eager, our_eager = _tiny_from(config, "sdpa", "neuralops_sdpa", "eager", "neuralops_eager")
    ids = torch.randint(1, 100, (2, 10), generator=torch.Generator().manual_seed(1))
    padded = torch.ones_like(ids)
    padded[0, :2] = 0
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).logits, stock(input_ids=ids).logits)
        with pytest.raises(
            NotImplementedError, match=r"KV-shared layer .* 3 queries for 10 keys and no mask"
        ):
            ours(input_ids=ids, logits_to_keep=3)
        cut = {"attention_mask": padded, "logits_to_keep": 3}
        assert torch.equal(ours(input_ids=ids, **cut).logits, stock(input_ids=ids, **cut).logits)
        assert torch.equal(
            our_eager(input_ids=ids, logits_to_keep=3).logits, eager(input_ids=ids, logits_to_keep=3).logits
        )
        # One kept query, as stock cuts it too with a dynamic cache: no refusal, stock's bits.
        assert torch.equal(
            ours(input_ids=ids, logits_to_keep=1).logits, stock(input_ids=ids, logits_to_keep=1).logits
        )
    settings = {
        "max_new_tokens": 3,
        "do_sample": False,
        "output_logits": True,
        "return_dict_in_generate": True,
    }
    got, want = (
        m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **settings) for m in (ours, stock)
    )
    assert torch.equal(got.sequences, want.sequences)
    assert all(torch.equal(a, b) for a, b in zip(got.logits, want.logits))


@pytest.mark.parametrize("ours", ["neuralops_sdpa", "neuralops_eager"])
def test_sparse_attention_indices_are_refused(ours: str) -> None:
    """DeepSeek-V3.2-style indexers: the model masks the keys its indexer left out only under
    the literal "sdpa" and "eager", and otherwise passes the indices on, which the stock
    attention functions ignore (dense attention, other logits). Both names refuse them."""
    if not hasattr(transformers, "DeepseekV32Config"):
        pytest.skip(f"transformers {transformers.__version__} has no DeepSeek-V3.2")
    config = transformers.DeepseekV32Config(
        vocab_size=100, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, head_dim=8, n_routed_experts=2, num_experts_per_tok=1, n_group=1,
        topk_group=1, first_k_dense_replace=2, index_topk=3, index_head_dim=16, index_n_heads=2,
        max_position_embeddings=64,
    )  # fmt: skip
    (model,) = _tiny_from(config, ours)
    with torch.no_grad(), pytest.raises(NotImplementedError, match="sparse-attention indices"):
        model(input_ids=torch.randint(1, 100, (2, 10), generator=torch.Generator().manual_seed(1)))
