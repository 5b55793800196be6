"""The compiled sampler's first minute on a GPU: every check that a CPU cannot make, each one
PASS or FAIL on its own line, all of them run whatever fails (issue 44).

    python benchmarks/gpu/first_contact.py [--device cuda|cpu] [--json FILE] [--quick]

GPU time comes in short windows on a bare machine, so this runs first (``suite.sh first``,
under 90 s on an H100/H200) and reports every remaining failure at once:

1. **sampling ops**: the sampling part of the step alone (temperature, top-k, top-p, the
   inverse-CDF draw, the done mask) recorded as a CUDA graph and replayed: the same tokens as
   running it;
2. **exact in fp32**: the compiled sampler against the eager one from the same uniforms
   (SmolLM2's GQA shape, random init): the same tokens, log-probs to 1e-4;
3. **stale weights**: after an in-place update (``mul_``) and after a replaced ``.data``, the
   compiled sampler's log-probs are a fresh forward's;
4. **bf16 gap**: the compiled sampler's bf16 log-probs against a full bf16 forward (the
   rollout recomputes old log-probs with a forward; the gap is reported, with a bound);
5. **ms per token**: eager against compiled decoding at SmolLM2-135M's shape, batches 8 and
   64, with the replays counted (a compiled run that replayed nothing FAILs).

``--device cpu`` is the dry run: the same checks on the CPU (the recording checks run the
step instead of replaying it and say so), at a tiny shape with ``--quick``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

RESULTS: list[dict] = []


def check(name: str):
    """Run the decorated check at once; record and print PASS (its detail) or FAIL (the error)."""

    def run(function):
        began = time.perf_counter()
        try:
            detail = function()
            status = "PASS"
        except Exception as error:  # noqa: BLE001 - every check runs, whatever the others did
            status, detail = "FAIL", f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            traceback.print_exc(file=sys.stderr)
        seconds = time.perf_counter() - began
        RESULTS.append({"check": name, "status": status, "detail": detail, "seconds": round(seconds, 2)})
        print(f"{status} {name} ({seconds:.1f} s): {detail}", flush=True)
        return function

    return run


def model(shape: str, dtype, device, seed: int = 0):
    from marlhf_cli.models import load_causal_lm

    torch.manual_seed(seed)
    net = load_causal_lm(shape, dtype=None).to(device=device, dtype=dtype).eval()
    return net


def sample(net, prompts, params, generation, uniforms=None):
    from marlhf_cli.generation import SamplingParams, sample as draw

    settings = SamplingParams(**params, generation=generation)
    ids, mask = prompts
    return draw(net, ids, mask, settings, eos_token_id=2, pad_token_id=2, with_logprobs=True, uniforms=uniforms)


def full_logprobs(net, prompts, ids, temperature):
    from marlhf_cli.train.forward import policy_forward
    from marlhf_cli.generation import response_mask

    prompt, mask = prompts
    real, _ = response_mask(ids, 2)
    with torch.no_grad():
        full, _ = policy_forward(net, torch.cat([prompt, ids], 1), torch.cat([mask, real], 1), prompt.shape[1], temperature)
    return full, real.bool()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="the tiny model and short runs (the CPU dry run)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("FAIL device: torch sees no GPU")
        return 1
    from marlhf_cli.generation import compiled as compiled_sampling
    from marlhf_cli.generation import draw, filter_logits

    shape = "tiny" if args.quick else "random:smollm2-135m"
    new_tokens = 16 if args.quick else 64
    plain = dict(temperature=0.8, top_k=50, top_p=0.95, max_new_tokens=new_tokens)
    generator = torch.Generator().manual_seed(0)

    def prompts(rows: int, width: int = 32):
        ids = torch.randint(3, 30000, (rows, width), generator=generator).to(device)
        mask = torch.ones_like(ids)
        mask[: rows // 2, : width // 4] = 0  # left padding in half the rows
        return ids, mask

    @check("sampling ops")
    def _():
        logits = torch.randn(8, 49152, generator=generator).to(device)
        finished = torch.zeros(8, dtype=torch.bool, device=device)
        uniforms = torch.rand(8, dtype=torch.float64, generator=generator).to(device)
        temperature = torch.full((1,), 0.8, device=device)
        top_p = torch.full((1,), 0.9, device=device)
        out = torch.zeros(8, dtype=torch.long, device=device)

        def step():
            filtered = filter_logits(logits / temperature, 50, top_p, nucleus=True)
            out.copy_(torch.where(finished, 2, draw(torch.softmax(filtered, -1), uniforms)))

        step()
        ran = out.clone()
        if not compiled_sampling.records(device):
            return f"ran the step: {ran.tolist()[:4]} (no CUDA graph on a {device.type})"
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            step()
        out.zero_()
        graph.replay()
        assert torch.equal(out, ran), f"replayed {out.tolist()} against {ran.tolist()}"
        return "recorded and replayed: the same tokens"

    fp32 = model(shape, torch.float32, device)

    @check("exact in fp32")
    def _():
        batch = prompts(8)
        uniforms = torch.rand(8, new_tokens, dtype=torch.float64, generator=generator).to(device)
        (ids_e, lp_e), (ids_c, lp_c) = (sample(fp32, batch, plain, g, uniforms) for g in ("eager", "compiled"))
        assert ids_e.shape == ids_c.shape, f"lengths {ids_e.shape} and {ids_c.shape}"
        same = ids_e == ids_c
        gap = float((lp_e[same] - lp_c[same]).abs().max())
        assert bool(same.all()), f"{int((~same).sum())} of {same.numel()} tokens differ"
        assert gap < 1e-4, f"log-prob gap {gap:.2e}"
        return f"{same.numel()} tokens the same, log-prob gap {gap:.1e}, {compiled_sampling.replays(fp32)} replays"

    @check("stale weights")
    def _():
        batch = prompts(4)
        gaps = []
        for how in ("in place", "replaced"):
            weight = fp32.model.layers[0].mlp.up_proj.weight
            with torch.no_grad():
                if how == "in place":
                    weight.mul_(1.5)
                else:
                    weight.data = weight.data * 1.5
            ids, logp = sample(fp32, batch, dict(plain, max_new_tokens=8), "compiled")
            full, real = full_logprobs(fp32, batch, ids, plain["temperature"])
            gaps.append(float((logp[real] - full[real]).abs().max()))
            assert gaps[-1] < 1e-3, f"{how}: the sampler's log-probs are {gaps[-1]:.2e} from a fresh forward's"
        return f"fresh forward's log-probs after an in-place update (gap {gaps[0]:.1e}) and a replaced .data ({gaps[1]:.1e})"

    @check("bf16 gap")
    def _():
        bf16 = model(shape, torch.bfloat16, device)
        batch = prompts(8)
        ids, logp = sample(bf16, batch, plain, "compiled")
        full, real = full_logprobs(bf16, batch, ids, plain["temperature"])
        gap = (logp[real] - full[real]).abs()
        assert float(gap.max()) < 0.05, f"max gap {float(gap.max()):.3g}"
        return f"mean {float(gap.mean()):.1e}, max {float(gap.max()):.1e} over {int(real.sum())} tokens (the H200's first run: 4e-5, 0.0028)"

    for rows in (8, 64):

        @check(f"ms per token, batch {rows}")
        def _(rows=rows):
            bf16 = model(shape, torch.bfloat16, device, seed=1)
            batch = prompts(rows)
            times = {}
            for generation in ("eager", "compiled", "compiled"):  # the second compiled call replays a made bucket
                if device.type == "cuda":
                    torch.cuda.synchronize()
                began = time.perf_counter()
                ids, _ = sample(bf16, batch, dict(plain, top_p=1.0), generation)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times[generation] = (time.perf_counter() - began) * 1000 / ids.shape[1]
            replays = compiled_sampling.replays(bf16)
            if compiled_sampling.records(device):
                assert replays > 0, "the compiled sampler replayed nothing (it fell back to eager)"
            return f"eager {times['eager']:.2f} ms, compiled {times['compiled']:.2f} ms ({times['eager'] / times['compiled']:.1f}x), {replays} replays"

    failed = [r["check"] for r in RESULTS if r["status"] == "FAIL"]
    print(f"# first contact on {device.type}: {len(RESULTS) - len(failed)} of {len(RESULTS)} passed"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"device": device.type, "checks": RESULTS}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
