"""``--generation compiled`` (marlhf_cli/generation/compiled.py): the static-cache sampler draws
what the eager token loop draws, reads the weights an optimizer just wrote, keeps its
buckets across calls, and falls back to the eager loop, saying why, where it cannot serve.

On a CPU the compiled sampler runs every line but the CUDA-graph capture; tests/test_gpu.py
checks the capture itself (graphs recorded and replayed, the same draws on CUDA)."""

from __future__ import annotations

import pytest
import torch

from marlhf_cli.train.forward import policy_forward
from marlhf_cli.generation import compiled as compiled_sampling, static_cache
from marlhf_cli.generation import SamplingParams, cache_argument, response_mask, sample

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EOS, PAD = 63, 0


def _llama(seed: int = 0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, **overrides)  # fmt: skip
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def llama():
    return _llama()


# left padding in two rows, one row with no padding
PROMPT = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12], [0, 7, 7, 7, 7]])
MASK = (torch.arange(5)[None, :] >= torch.tensor([[2], [0], [1]])).long()


def _both(model, params, *, seed=1, prompt=PROMPT, mask=MASK, eos=EOS, **kwargs):
    """(eager result, compiled result), each (ids, log-probs, the global generator's state after)."""
    out = {}
    for mode in ("eager", "compiled"):
        torch.manual_seed(seed)
        ids, logp = sample(model, prompt, mask, SamplingParams(**params, generation=mode), eos_token_id=eos,
                           pad_token_id=PAD, with_logprobs=True, **kwargs)  # fmt: skip
        out[mode] = (ids, logp, torch.get_rng_state())
    return out["eager"], out["compiled"]


def _agree(eager, compiled) -> float:
    (ids_e, logp_e, _), (ids_c, logp_c, _) = eager, compiled  # the random state: compared where it matters
    assert ids_e.shape == ids_c.shape  # the same length: the compiled loop ends where the eager one does
    same = ids_e == ids_c
    assert torch.allclose(logp_e[same], logp_c[same], atol=1e-5, rtol=0)
    return float(same.float().mean())


CASES = {
    "plain": dict(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=40),
    "temperature 0.7, top-k 5": dict(temperature=0.7, top_k=5, top_p=1.0, max_new_tokens=40),
    "temperature 1.3, top-p 0.8": dict(temperature=1.3, top_k=0, top_p=0.8, max_new_tokens=40),
    "top-k 10 and top-p 0.9": dict(temperature=0.9, top_k=10, top_p=0.9, max_new_tokens=40),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("repeats", [1, 3])
def test_compiled_draws_the_eager_tokens(llama, case, repeats):
    """Same seed, fp32: the same tokens (>= 99% of positions; here every one), log-probs to
    1e-5, the same length, and the global generator left where the eager loop leaves it."""
    eager, compiled = _both(llama, CASES[case], repeats=repeats, eos=(EOS, 62))
    assert _agree(eager, compiled) >= 0.99
    assert torch.equal(eager[2], compiled[2])


def test_eos_mid_batch_ends_the_output_where_the_eager_loop_does(llama):
    """Rows end at different steps (eight stop ids of 64: EOS comes early and often); the
    output stops at the last row's end, also between two of the host's every-8-tokens checks."""
    stop_ids = tuple(range(56, 64))
    lengths = set()
    for seed in range(8):
        eager, compiled = _both(llama, CASES["plain"], seed=seed, eos=stop_ids)
        assert _agree(eager, compiled) >= 0.99
        lengths.add(eager[0].shape[1])
        ends = response_mask(eager[0], stop_ids)[0].sum(dim=1)
        assert (compiled[0][:, -1:] != PAD).any() or len(set(ends.tolist())) > 1
    assert any(n % compiled_sampling.CHECK_EVERY and n < 40 for n in lengths), lengths


def test_per_row_uniforms_and_budgets_as_mc_gives_them(llama):
    """mc's continuations: random numbers given per row (the global generator untouched) and a
    budget per row; with repeats, as sample_continuations calls it."""
    uniforms = torch.rand((6, 12), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    budgets = torch.tensor([3, 12, 7, 1, 12, 5])
    prompt, mask = PROMPT[:2], MASK[:2]
    torch.manual_seed(1)  # as _both seeds
    state = torch.get_rng_state()
    eager, compiled = _both(llama, dict(CASES["plain"], max_new_tokens=12), prompt=prompt, mask=mask, uniforms=uniforms,
                            budgets=budgets, repeats=3)  # fmt: skip
    assert _agree(eager, compiled) == 1.0
    assert torch.equal(compiled[2], state) and torch.equal(eager[2], state)  # given numbers: the generator is not touched
    for row, budget in enumerate(budgets.tolist()):
        assert (compiled[0][row, budget:] == PAD).all()


def test_the_compiled_log_probs_are_a_full_forwards(llama):
    params = SamplingParams(0.7, 5, 0.9, 20, generation="compiled")
    torch.manual_seed(2)
    ids, logp = sample(llama, PROMPT, MASK, params, eos_token_id=EOS, pad_token_id=PAD, with_logprobs=True)
    real, _ = response_mask(ids, EOS)
    with torch.no_grad():
        full, _ = policy_forward(llama, torch.cat([PROMPT, ids], 1), torch.cat([MASK, real], 1), PROMPT.shape[1], 0.7)
    assert torch.allclose(logp[real.bool()], full[real.bool()], atol=2e-5, rtol=0)


def tiny_of(model_type: str):
    """A tiny random model of ``model_type`` (a static_cache.SUPPORTED_MODEL_TYPES entry)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, head_dim=8, pad_token_id=PAD, bos_token_id=1,
                 eos_token_id=EOS)  # fmt: skip
    if model_type == "gpt2":
        sizes = dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=256, bos_token_id=1, eos_token_id=EOS)
    if model_type == "gpt_neox":  # GPT-NeoX has no grouped-query attention: a stray head count would go unread
        del sizes["num_key_value_heads"]
    config = AutoConfig.for_model(model_type, **sizes)
    if static_cache.unsupported(config, 64) is not None:  # a default window shorter than the test's cache
        config.sliding_window = None
    assert static_cache.unsupported(config, 64) is None
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("model_type", static_cache.SUPPORTED_MODEL_TYPES)
def test_every_architecture_the_static_cache_accepts_draws_the_eager_tokens(model_type):
    """The list of architectures is the list checked here: a tiny random model of each."""
    model = tiny_of(model_type)
    eager, compiled = _both(model, dict(CASES["plain"], max_new_tokens=24), repeats=2)
    assert _agree(eager, compiled) >= 0.99
    sampler = compiled_sampling.sampler_for(model)
    # it ran compiled, not through the fallback: one bucket made, every token after the
    # prefill's drawn by the static-cache step (on a GPU: by replaying it, tests/test_gpu.py)
    assert sampler.unfit is None and compiled_sampling.captures(model) == 1 and sampler.steps == eager[0].shape[1] - 1
    assert static_cache.host_read(model, _meta_shape()) is None  # its step reads nothing back to the host


def test_the_step_reads_nothing_back_to_the_host():
    """A CUDA graph cannot record a step that reads a value back (.item(), a Python branch on a
    tensor): on the meta device, which holds no values, any such read raises. The whole step,
    the model's forward with top-k and top-p included, runs there."""
    with torch.device("meta"):
        model = _llama()
    shape = compiled_sampling.Shape(rows=4, length=64, top_k=5, nucleus=True, stops=(EOS, 62), pad=PAD,
                                    dtype=torch.float32, device=torch.device("meta"))  # fmt: skip
    bucket = compiled_sampling.Bucket(model, shape, cache_argument(model))
    with torch.no_grad():
        bucket.decode(model)
    with pytest.raises(RuntimeError, match="meta"):  # the control: a read-back does raise there
        bool(bucket.finished.all())


def _sampled_logprobs(model, seed=3):
    params = SamplingParams(1.0, 0, 1.0, 16, generation="compiled")
    torch.manual_seed(seed)
    ids, logp = sample(model, PROMPT, MASK, params, eos_token_id=EOS, pad_token_id=PAD, with_logprobs=True)
    real, _ = response_mask(ids, EOS)
    with torch.no_grad():
        full, _ = policy_forward(model, torch.cat([PROMPT, ids], 1), torch.cat([MASK, real], 1), PROMPT.shape[1], 1.0)
    return logp[real.bool()], full[real.bool()]


def test_after_an_optimizer_step_the_sampler_reads_the_new_weights(llama):
    """The classic defect of a recorded step is replaying stale weights: after one AdamW step,
    the same bucket's log-probs are a fresh forward's with the new weights."""
    before, _ = _sampled_logprobs(llama)
    optimizer = torch.optim.AdamW(llama.parameters(), lr=0.05)
    ids = torch.cat([PROMPT, PROMPT], 1)
    llama.train()
    llama(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    llama.eval()
    sampled, fresh = _sampled_logprobs(llama)
    assert torch.allclose(sampled, fresh, atol=2e-5, rtol=0)
    assert compiled_sampling.captures(llama) == 1  # the same bucket, updated in place
    assert not torch.allclose(before[: len(sampled)], sampled[: len(before)], atol=1e-3)  # the weights did move


def test_a_replaced_parameter_makes_the_buckets_afresh(llama):
    """``param.data = ...`` moves a weight to new memory, which a recording would never see:
    the addresses are checked before every call, and a change makes every bucket again."""
    _sampled_logprobs(llama)
    assert compiled_sampling.captures(llama) == 1
    with torch.no_grad():
        llama.model.layers[0].mlp.up_proj.weight.data = llama.model.layers[0].mlp.up_proj.weight.data * 3.0
    sampled, fresh = _sampled_logprobs(llama)
    assert torch.allclose(sampled, fresh, atol=2e-5, rtol=0)
    assert compiled_sampling.captures(llama) == 2


def test_lora_adapters_are_sampled_through_and_read_live():
    """peft's adapter path runs inside the step (not merged): the draws are the eager ones, and
    an optimizer step on the adapters alone is seen by the next call."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_llama(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    eager, compiled = _both(model, CASES["temperature 0.7, top-k 5"])
    assert _agree(eager, compiled) >= 0.99
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    ids = torch.cat([PROMPT, PROMPT], 1)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    sampled, fresh = _sampled_logprobs(model)
    assert torch.allclose(sampled, fresh, atol=2e-5, rtol=0)


def test_buckets_serve_smaller_calls_and_the_count_stays_flat(llama):
    """Rows round up to a power of two and lengths to the run's longest prompt + response, and a
    bucket serves any call it covers: after the largest call, no new bucket is made."""
    def call(rows, width, new_tokens):
        prompt = torch.randint(1, 60, (rows, width), generator=torch.Generator().manual_seed(rows * width))
        params = SamplingParams(1.0, 0, 1.0, new_tokens, generation="compiled", cache_length=64 + 32)
        return sample(llama, prompt, torch.ones_like(prompt), params, eos_token_id=EOS, pad_token_id=PAD)

    call(8, 64, 32)
    assert compiled_sampling.captures(llama) == 1
    for rows, width, new_tokens in [(8, 40, 32), (5, 64, 16), (1, 10, 32), (3, 30, 2)]:
        assert call(rows, width, new_tokens).shape[0] == rows
    assert compiled_sampling.captures(llama) == 1
    (only,) = compiled_sampling.sampler_for(llama).buckets
    assert (only.rows, only.length) == (8, 128)  # 96 rounded up to 64s


def test_a_bucket_that_does_not_fit_samples_eagerly_and_says_so_once(llama, monkeypatch):
    said = []
    monkeypatch.setattr(compiled_sampling, "free_bytes", lambda device: 1000)
    monkeypatch.setattr("marlhf_cli.console.say", said.append)
    eager, compiled = _both(llama, CASES["plain"])
    eager2, compiled2 = _both(llama, CASES["plain"], seed=2)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager2[0], compiled2[0])
    assert compiled_sampling.captures(llama) == 0
    assert len(said) == 1 and said[0].startswith("generation: the static cache for 4 rows x 64 tokens needs ~")
    assert "is free: eager decoding for this shape" in said[0]


def test_a_model_the_static_cache_does_not_cover_samples_eagerly(monkeypatch):
    """Not on the list (here: a sliding window shorter than the sequence), or found at run time
    to do what its config did not say (a head count, positions read from the cache)."""
    said = []
    monkeypatch.setattr("marlhf_cli.console.say", said.append)
    windowed = _llama()
    windowed.config.sliding_window, windowed.config.layer_types = 16, ["sliding_attention"] * 2
    eager, compiled = _both(windowed, CASES["plain"])
    assert torch.equal(eager[0], compiled[0]) and compiled_sampling.captures(windowed) == 0
    assert said == ["generation: eager, not compiled: sliding-window attention over 16 tokens, shorter than the 64 to sample"]

    model = _llama()
    original = model.model.forward

    def reads_positions(*args, **kwargs):  # a model that asks its cache where it is (Falcon does)
        cache = kwargs.get("cache") or kwargs.get("past_key_values")
        if cache is not None:
            cache.get_seq_length()
        return original(*args, **kwargs)

    monkeypatch.setattr(model.model, "forward", reads_positions)
    eager, compiled = _both(model, CASES["plain"])
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[2], compiled[2])  # the random state restored
    assert said[-1] == ("generation: eager, not compiled: the model reads positions from its cache; "
                        "the static cache is used with explicit position ids")  # fmt: skip


class _Recording:
    """A stand-in for a CUDA graph on a CPU: a replay runs the step, and fails at ``fails_at``."""

    def __init__(self, bucket, net, fails_at):
        self.bucket, self.net, self.fails_at, self.calls = bucket, net, fails_at, 0

    def replay(self):
        self.calls += 1
        if self.calls == self.fails_at:
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")
        self.bucket.decode(self.net)


@pytest.mark.parametrize("fails", ["record", "replay"])
def test_a_failed_recording_or_replay_samples_eagerly_for_the_rest_of_the_run(llama, monkeypatch, fails):
    """An error while recording the step or replaying it (a kernel CUDA cannot capture, a
    device error) never ends the run: that call and every later one sample eagerly, from the
    random state the call began with (so the draws are the eager loop's), and one line says why."""
    said = []
    monkeypatch.setattr("marlhf_cli.console.say", said.append)
    monkeypatch.setattr(compiled_sampling, "records", lambda device: True)  # as on CUDA
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)

    def record(bucket, net, pool):
        if fails == "record":
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        bucket.graph = _Recording(bucket, net, fails_at=5)

    monkeypatch.setattr(static_cache.Bucket, "record", record)
    for seed in (1, 2):
        eager, compiled = _both(llama, CASES["temperature 0.7, top-k 5"], seed=seed)
        assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[2], compiled[2])
    sampler = compiled_sampling.sampler_for(llama)
    assert not sampler.buckets and compiled_sampling.captures(llama) == (0 if fails == "record" else 1)
    error = "operation not permitted when stream is capturing" if fails == "record" else "an illegal memory access was encountered"
    assert said == [f"generation: eager, not compiled: the static-cache step failed (RuntimeError: CUDA error: {error}); "
                    "eager for the rest of the run"]  # fmt: skip
    if fails == "replay":
        assert compiled_sampling.replays(llama) == 4  # four tokens replayed before the fifth failed


def _cache_traffic(model, bucket) -> int:
    """Bytes one decoding step moves in tensors shaped like the cache (a dimension of its
    length and one of its head size), counting what each op reads and writes, an expanded
    tensor by its distinct elements; views move nothing, and the new column's in-place write
    is left out (the same for every attention)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    length, dim = bucket.shape.length, bucket.cache.keys[0].shape[-1]

    def size(t) -> int:
        if not isinstance(t, torch.Tensor) or length not in t.shape or dim not in t.shape:
            return 0
        distinct = 1
        for n, stride in zip(t.shape, t.stride()):
            distinct *= n if stride else 1
        return distinct * t.element_size()

    class Count(TorchDispatchMode):
        moved = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view and not func._schema.name.endswith("_"):
                flat = torch.utils._pytree.tree_leaves((args, kwargs, out))
                Count.moved += sum(size(t) for t in flat)
            return out

    with torch.no_grad(), Count():
        bucket.decode(model)
    return Count.moved


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_grouped_query_attention_reads_the_cache_once(monkeypatch, attention):
    """Two query heads per key-value head: the decoding step's attention reads the cache once
    per layer (generation/attention.py), where repeat_kv would read it, write a copy per
    query head and read the copies: (kv + 2 x query heads) / kv times the bytes, 5x here (4
    heads over 2), 7x for SmolLM2-135M (9 over 3): static_cache.attention_bytes_per_token,
    exactly what the grouped step moves, and at most what the model's own eager attention moves
    (its matmuls copy the transposed keys once more)."""
    model = _llama(attn_implementation=attention)
    shape = static_cache.Shape(rows=4, length=64, top_k=0, nucleus=False, stops=(EOS,), pad=PAD, dtype=torch.float32,
                               device=torch.device("cpu"))  # fmt: skip
    bucket = static_cache.Bucket(model, shape, cache_argument(model))
    grouped = static_cache.attention_bytes_per_token(model.config, 4, 64, torch.float32, grouped=True)
    copied = static_cache.attention_bytes_per_token(model.config, 4, 64, torch.float32, grouped=False)
    assert _cache_traffic(model, bucket) == grouped == 2 * 2 * 4 * 2 * 64 * 8 * 4  # layers x K,V x rows x kv heads x L x D x 4 bytes
    if attention == "eager":  # the model's own eager attention copies the cache per query head
        import contextlib

        monkeypatch.setattr(static_cache, "decoding", lambda config: contextlib.nullcontext())
        assert _cache_traffic(model, bucket) >= copied
    assert copied == 5 * grouped


def _ops(function) -> int:
    """The aten ops ``function()`` dispatches, views left out (they launch no kernel)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += not func.is_view
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Count():
        function()
    return Count.ops


def test_the_decoding_step_holds_its_kernel_count():
    """One decoding step at SmolLM2-135M's shape (30 layers, sdpa, bf16, 8 rows x 256 columns,
    top-k and top-p), counted on the meta device: what a recording replays. The sampling part is
    37 ops; the model's forward is the rest (on the meta device sdpa runs its decomposed form,
    8 ops a layer where CUDA launches one kernel). A change that adds ops fails here: the
    count is held, and lowered when a change cuts some."""
    from transformers import LlamaForCausalLM

    from marlhf_cli.models import SMOLLM2_COMMON, SMOLLM2_SHAPES, load_tokenizer, tiny_config

    config = tiny_config(load_tokenizer("tiny"), **SMOLLM2_COMMON, **SMOLLM2_SHAPES["smollm2-135m"])
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    shape = static_cache.Shape(rows=8, length=256, top_k=50, nucleus=True, stops=(2,), pad=2, dtype=torch.bfloat16,
                               device=torch.device("meta"))  # fmt: skip
    bucket = static_cache.Bucket(model, shape, cache_argument(model))
    logits = torch.empty(8, config.vocab_size, device="meta")
    assert _ops(lambda: bucket.choose(logits)) <= 37
    assert _ops(lambda: bucket.decode(model)) <= 1832  # 1,836 before the step kept its mask up to date itself


def _meta_shape():
    return static_cache.Shape(rows=4, length=64, top_k=5, nucleus=True, stops=(EOS,), pad=PAD, dtype=torch.bfloat16,
                              device=torch.device("meta"))  # fmt: skip


@pytest.mark.parametrize("case", ["dynamic rope", "mixtral eager experts"])
def test_a_step_that_reads_a_value_back_is_found_by_running_it_and_sampled_eagerly(monkeypatch, case):
    """Before its first recording, the step runs once on the meta device for the model's own
    config: a host read there (dynamic RoPE's .item(), eager experts' nonzero) means eager
    sampling, said once, instead of a capture that fails or records a stale value."""
    from transformers import AutoConfig, AutoModelForCausalLM

    said = []
    monkeypatch.setattr("marlhf_cli.console.say", said.append)
    monkeypatch.setattr(compiled_sampling, "records", lambda device: True)  # as on CUDA
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(static_cache.Bucket, "record", lambda bucket, net, pool: pytest.fail("recorded a step that reads the host"))
    if case == "dynamic rope":
        model = _llama(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
        read = "RuntimeError: Tensor.item() cannot be called on meta tensors"
    else:
        config = AutoConfig.for_model("mixtral", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, eos_token_id=EOS)  # fmt: skip
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, experts_implementation="eager").eval()
        read = "NotImplementedError: The register_meta function for torch.nonzero()"
    eager, compiled = _both(model, CASES["plain"])
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[2], compiled[2])
    _both(model, CASES["plain"], seed=2)
    assert compiled_sampling.captures(model) == 0 and len(said) == 1
    assert said[0].startswith(f"generation: eager, not compiled: its decoding step reads a value back to the host ({read}")
    assert said[0].endswith("which a CUDA graph cannot record")


def test_the_caches_make_room_for_the_update_unless_measured_to_fit(llama, monkeypatch):
    """On CUDA (mocked: a 100 GB device): the buckets are freed before the first update; then
    kept through an update while its measured peak plus what they hold stays under 90% of the
    device, and freed again when a peak with them held goes past it. A CPU keeps them."""
    said, peaks = [], iter([50e9, 70e9, 95e9])
    monkeypatch.setattr("marlhf_cli.console.say", said.append)
    monkeypatch.setattr(compiled_sampling, "measures", lambda device: True)
    monkeypatch.setattr(compiled_sampling, "total_bytes", lambda device: 100e9)
    monkeypatch.setattr(compiled_sampling, "peak_bytes", lambda device: next(peaks))
    monkeypatch.setattr(compiled_sampling, "bucket_bytes", lambda *args: int(30e9))
    monkeypatch.setattr(compiled_sampling, "free_bytes", lambda device: 1 << 62)
    sampler = compiled_sampling.sampler_for(llama)
    kept = []
    for step in range(3):
        _sampled_logprobs(llama)
        assert len(sampler.buckets) == 1
        compiled_sampling.before_training(llama)
        kept.append(bool(sampler.buckets))
        compiled_sampling.after_training(llama, "cpu")
    # 1st: nothing measured yet; 2nd: 50 + 30 <= 90; 3rd: the peak with them held was 70 <= 90
    assert kept == [False, True, True] and compiled_sampling.captures(llama) == 2
    _sampled_logprobs(llama)
    compiled_sampling.before_training(llama)  # the last update peaked at 95 with them held
    assert not sampler.buckets and compiled_sampling.captures(llama) == 2
    assert said == ["generation: the static caches (27.94 GiB) are freed before each update and made again at the next "
                    "rollout, until an update is measured to leave room for them"]  # fmt: skip
    assert compiled_sampling.keeps(10, None, False, 100) is False and compiled_sampling.keeps(10, 80, False, 100) is True

    monkeypatch.setattr(compiled_sampling, "measures", lambda device: device.type == "cuda")
    cpu = _llama(seed=4)
    _sampled_logprobs(cpu)
    compiled_sampling.before_training(cpu)
    assert compiled_sampling.sampler_for(cpu).buckets  # a CPU keeps its buckets


def test_auto_is_compiled_on_cuda_and_eager_on_a_cpu(monkeypatch):
    assert compiled_sampling.resolve("eager") == ("eager", None)
    assert compiled_sampling.resolve("compiled") == ("compiled", None)
    mode, why = compiled_sampling.resolve("auto")
    assert mode == ("compiled" if torch.cuda.is_available() else "eager") and why
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert compiled_sampling.resolve("auto") == ("compiled", "CUDA (NVIDIA H100 80GB HBM3): one recorded step per token")


def test_the_start_up_line_states_the_cache(llama):
    line = compiled_sampling.start_line("compiled", None, llama.config, rows=24, length=600, dtype=torch.bfloat16, device="cpu")
    # 2 layers x (keys, values) x 32 rows x 2 heads x 640 columns x 8 dims x 2 bytes = 2.5 MiB
    assert line == ("generation: compiled, on a CPU: the static-cache steps without CUDA graphs; "
                    "static KV cache 2.5 MiB for 32 rows x 640 tokens")  # fmt: skip
    assert compiled_sampling.start_line("eager", None, llama.config, rows=8, length=64, dtype=torch.float32, device="cpu") is None
    auto = compiled_sampling.start_line("eager", "a CPU", llama.config, rows=8, length=64, dtype=torch.float32, device="cpu")
    assert auto == "generation: eager (--generation auto: a CPU)"
    assert static_cache.cache_bytes(llama.config, 32, 640, torch.bfloat16) == 2 * 2 * 32 * 2 * 640 * 8 * 2


# ---------------------------------------------------------------------------------------
# the stages: --generation compiled through ppo (rollouts, mc's continuations, evaluation,
# LoRA), bon and passk, on the tiny model


def _ppo_rows(tmp_path, generation: str, **flags) -> list[dict]:
    from marlhf_cli import config as config_module
    from marlhf_cli.artifacts import read_jsonl
    from marlhf_cli.train import ppo

    base = dict(policy="tiny", reward_model="tiny", dataset="tldr", rollout_batch_size=2, mini_batch_size=4,
                max_new_tokens=8, max_prompt_length=48, max_steps=2, eval_every=1, eval_prompts=2, save_every=0,
                actor_lr=1e-3, seed=5, run_dir=str(tmp_path / generation), generation=generation, name="run")  # fmt: skip
    ppo.run(config_module.resolve("ppo", flags={**base, **flags}))
    volatile = ("time", "tokens_per_second", "generation_captures", "generation_replays")
    return [{k: v for k, v in row.items() if k not in volatile and not k.endswith("_time")}
            for row in read_jsonl(tmp_path / generation / "metrics" / "ppo-run.jsonl")]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    dict(advantage="mc", samples_per_prompt=2, mc_rollouts=2, termination="fixed", n=3),
    dict(lora_rank=4, termination="fixed", n=5, critic_lr=1e-3, mini_batch_size=2),
    dict(advantage="tree", termination="fixed", n=3),
], ids=["mc", "lora", "tree"])  # fmt: skip
def test_a_ppo_run_samples_the_same_compiled_as_eager(tmp_path, capfd, flags):
    """Rollouts, mc's continuations (per-row numbers, budgets, repeats), tree rollouts, held-out
    evaluation and LoRA adapters: the compiled run's every logged figure is the eager run's, to float rounding,
    and the run made its buckets in its first step and no more after."""
    eager = _ppo_rows(tmp_path, "eager", **flags)
    compiled = _ppo_rows(tmp_path, "compiled", **flags)
    assert [(r["split"], r["step"]) for r in compiled] == [(r["split"], r["step"]) for r in eager]
    for a, b in zip(compiled, eager):
        numbers = {k for k, v in b.items() if isinstance(v, float)}
        assert {k: a[k] for k in numbers} == pytest.approx({k: b[k] for k in numbers}, rel=1e-3, abs=1e-4), (a["split"], a["step"])
    from marlhf_cli.artifacts import read_jsonl

    captures = [r["generation_captures"] for r in read_jsonl(tmp_path / "compiled" / "metrics" / "ppo-run.jsonl") if r["split"] == "train"]
    assert captures[0] >= 1 and len(set(captures)) == 1, captures
    assert "generation: compiled, on a CPU: the static-cache steps without CUDA graphs; static KV cache" in capfd.readouterr().err


@pytest.mark.slow
def test_bon_and_passk_sample_the_same_compiled_as_eager(tmp_path, capfd):
    import json

    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    def bon(generation):
        run = tmp_path / f"bon-{generation}"
        result = CliRunner().invoke(app, [
            "bon", "--policy", "tiny", "--reward-model", "tiny", "--dataset", "tldr", "--max-records", "2", "--n", "2",
            "--temperature", "0.7", "--max-new-tokens", "8", "--max-prompt-length", "48", "--batch-size", "4",
            "--run-dir", str(run), "--generation", generation,
        ])  # fmt: skip
        assert result.exit_code == 0, result.output
        return json.loads((run / "bon" / "tiny" / "t0.7.json").read_text())["rows"]

    def passk(generation):
        run = tmp_path / f"passk-{generation}"
        problems = tmp_path / "problems.jsonl"
        problems.write_text("".join(json.dumps({"question": f"Print {i}.", "inputs": [""], "outputs": [f"{i}\n"], "difficulty": "introductory"}) + "\n" for i in range(3)))
        result = CliRunner().invoke(app, [
            "passk", "--model", "tiny", "--data-file", str(problems), "--n", "2", "--k", "1", "--max-new-tokens", "8",
            "--max-prompt-length", "48", "--batch-size", "4", "--run-dir", str(run), "--generation", generation,
            "--reward", f"py:{_length_reward(tmp_path)}:score",
        ])  # fmt: skip
        assert result.exit_code == 0, result.output
        return [row["response"] for row in (json.loads(line) for line in (run / "passk" / "tiny-samples.jsonl").read_text().splitlines())]

    assert bon("compiled") == bon("eager")
    assert passk("compiled") == passk("eager")


def _length_reward(tmp_path):
    path = tmp_path / "length_reward.py"
    path.write_text("def score(prompts, completions, **kwargs):\n    return [float(len(c)) / 100 for c in completions]\n")
    return path


def engine_step_then_sample(device: str, dtype: str, zero_stage: int) -> dict:
    """A DeepSpeed engine around the tiny policy: sample compiled, one optimizer step, sample
    again. Returns the buckets made before and after the step, and the sampled log-probs of
    the second call beside a fresh forward's with the new weights and with the old ones.
    (tests/test_gpu.py runs it on CUDA, where the sampler replays a recorded graph.)"""
    import copy

    from marlhf_cli import config as config_module, engine as eng
    from marlhf_cli.models import load_causal_lm, load_tokenizer
    from marlhf_cli.train.forward import disable_dropout
    from marlhf_cli.generation.texts import tokenize_prompts

    config = config_module.resolve("ppo", flags=dict(dtype=dtype, zero_stage=zero_stage, rollout_batch_size=2, mini_batch_size=2))
    model = load_causal_lm("tiny", dtype=dtype).to(device)
    disable_dropout(model)
    engine = eng.build_engine(model, config, lr=3e-2, batch_size=2, total_steps=4)
    tokenizer = load_tokenizer("tiny", padding_side="left")
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, ["Tell me about cats.", "Rain?"], 16, engine.device)

    def sampled():
        torch.manual_seed(0)
        params = SamplingParams(1.0, 0, 1.0, 12, generation="compiled", cache_length=28)
        ids, logp = sample(engine, prompt_ids, prompt_mask, params, eos_token_id=eos, pad_token_id=pad, with_logprobs=True)
        real, _ = response_mask(ids, eos)
        return ids, logp, real

    sampled()
    made = compiled_sampling.captures(engine)
    old = copy.deepcopy(engine.module).eval()
    sequences = torch.cat([prompt_ids, prompt_ids], 1)
    engine.train()
    loss = engine(input_ids=sequences, attention_mask=torch.cat([prompt_mask, prompt_mask], 1), labels=sequences).loss
    engine.backward(loss)
    engine.step()
    ids, logp, real = sampled()
    full = torch.cat([prompt_ids, ids], 1), torch.cat([prompt_mask, real], 1), prompt_ids.shape[1], 1.0
    with torch.no_grad():
        fresh, _ = policy_forward(engine.module, *full)
        stale, _ = policy_forward(old, *full)
    keep = real.bool()
    return {"made_before": made, "made_after": compiled_sampling.captures(engine), "sampled": logp[keep].float().cpu(),
            "fresh": fresh[keep].float().cpu(), "stale": stale[keep].float().cpu(), "engine": engine}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("dtype, zero_stage", [("fp32", 0), ("bf16", 2)])
def test_deepspeed_updates_the_weights_in_place_so_a_recording_reads_them(dtype, zero_stage):
    """DeepSpeed's engines (fp32, and bf16 with ZeRO 2, whose parameters are views of its flat
    buffers) write a step's weights where they were: the sampler makes no new bucket, and its
    log-probs are the new weights', not the old ones'."""
    got = engine_step_then_sample("cpu", dtype, zero_stage)
    assert got["made_after"] == got["made_before"] == 1
    gap = (got["sampled"] - got["fresh"]).abs()
    moved = (got["stale"] - got["fresh"]).abs().mean()
    tolerance = 2e-5 if dtype == "fp32" else 0.05
    assert float(gap.max()) < (tolerance if dtype == "fp32" else 0.25) and float(gap.mean()) < tolerance
    assert float(moved) > max(20 * float(gap.mean()), 0.05)  # stale weights would have been told apart
