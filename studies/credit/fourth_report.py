"""The fourth edition's report: the gates, the rates, the curves, the speedups and their
verdicts, the judge, the cost, the deviations and the README's sentences, from the records.

Everything printed is a function of the committed records and the protocol, so
``--report-only`` prints it again, byte for byte but the machine and wall-time lines.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from . import fourth_stats as S

ARM_NAMES = {"ppo-lam0.95": "token PPO (lambda 0.95)", "fixed5": "MA-PPO (fixed 5)", "ppo-lam1.0": "token PPO (lambda 1.0)"}


def summary_line(settings: dict) -> str:
    p = settings["ppo"]
    return (f"protocol {settings['digest']} (edition 4, mode {settings['mode']}): {settings['model']} {settings['dtype']}, "
            f"TL;DR prompts <= {settings['data']['prompt_tokens']} tokens, responses <= {settings['data']['response_tokens']}; "
            f"arms {', '.join(settings['arms'])}; {p['warmup_steps']} critic warm-up + {p['steps'] - p['warmup_steps']} actor "
            f"steps of {p['stage']['rollout_batch_size']} responses; seeds {settings['reported']['seeds']}")  # fmt: skip


def name(arm: str) -> str:
    return ARM_NAMES.get(arm, arm)


def _f(value, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


@dataclass
class Report:
    settings: dict
    data: dict | None = None
    models: dict | None = None
    gate1: dict | None = None
    critic: dict | None = None
    tuning: dict | None = None
    reported: list[dict] = field(default_factory=list)
    judge: list[dict] | None = None
    wall: float | None = None
    stop: str | None = None
    gate_two_failed: bool = False

    def stopped(self, why: str) -> None:
        self.stop = why

    def note_gate_two(self) -> None:
        self.gate_two_failed = True

    # -----------------------------------------------------------------------------------
    def print(self, figure=None) -> int:
        lines = self.lines()
        for line in lines:
            print(line)
        if figure is not None and self.complete:
            self.plot(figure)
            print(f"# figure: {figure}")
        return 0

    @property
    def complete(self) -> bool:
        return self.stop is None and bool(self.reported)

    def lines(self) -> list[str]:
        out: list[str] = []
        if self.data:
            d = self.data
            out += ["", "## data", f"- source: {d['source']}; {d['comparison_pairs']} comparisons of {d['comparison_posts']} posts: "
                    f"{d['rm_train_pairs']} training pairs ({d['rm_train_posts']} posts), {d['rm_test_pairs']} test pairs "
                    f"({d['rm_test_posts']} posts, trained on by no stage)",
                    f"- {d['reference_posts']} reference posts, {d['reference_posts_left_out']} left out (a test post): "
                    f"{d['ppo_posts']} PPO posts, {d['sft_demonstrations']} SFT demonstrations; "
                    f"{d['rows_whose_post_was_cut']} rows had their post cut to fit"]  # fmt: skip
        if self.models:
            m = self.models
            out += ["", "## models", f"- SFT: held-out loss {_f(m['sft'].get('eval_loss'))}, weights {m['sft']['digest']}"]
            for lr, rm in m["rm"].items():
                mark = " <- picked" if float(lr) == m["picked_rm_lr"] else ""
                out.append(f"- reward model at lr {lr}: held-out accuracy {_f(rm.get('eval_accuracy'))} on "
                           f"{rm.get('eval_pairs', 'n/a')} pairs of its training file's posts, weights {rm['digest']}{mark}")  # fmt: skip
        if self.gate1:
            out += ["", "## gate 1: the reward model on the test pairs", *self.gate_one_lines()]
        if self.critic:
            c = self.critic
            out += ["", "## the critic's rate and gate 2 (pooled explained variance over the warm-up)"]
            out += [f"- critic lr {lr:g}: {_f(fit)}" + (" <- picked" if lr == c["picked"] else "") for lr, fit in c["fits"].items()]
            verdict = "passed" if c["passed"] else "FAILED: the edition makes no claim about what a fitted critic buys"
            out.append(f"- gate 2 (>= {self.settings['critic']['gate']:g}): {verdict}")
        if self.tuning:
            t = self.tuning
            out += ["", "## the actor's rate (the baseline's mean final held-out score over the tuning seeds)"]
            out += [f"- actor lr {lr:g}: {_f(v)}" + (" <- picked" if lr == t["picked"] else "") for lr, v in t["finals"].items()]
        if self.reported and not self.stop:
            out += ["", *self.curve_lines(), "", *self.speedup_lines()]
        if self.judge:
            out += ["", *self.judge_lines()]
        if self.reported or self.tuning:
            out += ["", *self.cost_lines()]
        out += ["", f"## deviations from protocol {self.settings['digest']}: " + (str(len(self.deviations())) if self.deviations() else "none")]
        out += [f"- {line}" for line in self.deviations()]
        out += ["", "## the README's statement (the protocol's decision rule)" + (" - PARTIAL" if self.partial else ""), *self.sentences()]
        return out

    @property
    def partial(self) -> bool:
        return self.stop is not None and not self.stop.startswith("gate")

    # -----------------------------------------------------------------------------------
    def gate_one_lines(self) -> list[str]:
        g = self.gate1
        low, high = g["accuracy_interval"]
        strata = "; ".join(f"{k}: {_f(acc)} on {n}" for k, (n, acc) in g["strata"].items())
        return [
            f"- {g['pairs']} pairs: accuracy {_f(g['accuracy'])} [{_f(low)}, {_f(high)}] (bar {g['bar']:g}); the length "
            f"baseline (the longer summary) {_f(g['length_accuracy'])}",
            f"- against length on the same pairs: the reward model alone right on {g['rm_only']}, length alone on "
            f"{g['length_only']}; exact one-sided McNemar p = {g['p_value']:.3g} (alpha {g['alpha']:g})",
            f"- length-controlled accuracy {_f(g['length_controlled'])} (mean of the strata; {strata})",
            f"- gate 1: {'passed' if g['passed'] else 'FAILED'}",
        ]  # fmt: skip

    def by_arm(self) -> dict[str, list[dict]]:
        return {arm: sorted((r for r in self.reported if r["arm"] == arm), key=lambda r: r["seed"]) for arm in self.settings["arms"]}

    def curve_lines(self) -> list[str]:
        from .fourth import eval_curves, pooled_fit

        warmup = self.settings["ppo"]["warmup_steps"]
        arms = self.by_arm()
        steps, _ = eval_curves(self.settings, next(iter(arms.values())))
        out = ["## held-out reward-model score by actor step (mean over seeds +- sd)",
               "| arm | " + " | ".join(str(s) for s in steps) + " | final KL (k3) | critic EV at the warm-up's end | critic EV, last 10 steps |",
               "|---|" + "---|" * (len(steps) + 3)]  # fmt: skip
        for arm, records in arms.items():
            _, scores = eval_curves(self.settings, records)
            cells = [f"{m:.3f} +- {s:.3f}" for m, s in zip(scores.mean(0), scores.std(0, ddof=1) if len(records) > 1 else 0 * scores[0])]
            kl = statistics.fmean(r["train"][-1]["kl_k3"] for r in records)
            at_warmup = statistics.fmean(pooled_fit(r, warmup) for r in records)
            last = statistics.fmean(pooled_fit(r, r["train"][-1]["step"]) for r in records)
            out.append(f"| {name(arm)} | " + " | ".join(cells) + f" | {kl:.3f} | {_f(at_warmup)} | {_f(last)} |")
        return out

    def speedups(self) -> list[S.Speedup]:
        from .fourth import eval_curves

        d = self.settings["decision"]
        arms = self.by_arm()
        results = []
        for c in d["comparisons"]:
            steps, a = eval_curves(self.settings, arms[c["a"]])
            _, b = eval_curves(self.settings, arms[c["b"]])
            label = f"{name(c['a'])} vs {name(c['b'])}"
            results.append(S.bootstrap_speedup(label, steps, a, b, resamples=self.settings.get("decision_resamples", d["bootstrap_resamples"]),
                                               confidence=d["confidence"]))  # fmt: skip
        return S.decide(results, alpha=d["alpha"], replicated=d["replicated"], contradicted=d["contradicted"])

    def speedup_lines(self) -> list[str]:
        out = ["## speedups (the final step / the first step at which A's mean reaches B's final mean; bootstrap over seeds)"]
        for r in self.speedups():
            out.append(f"- {r.name}: {_f(r.point, 2)} [{_f(r.interval[0], 2)}, {_f(r.interval[1], 2)}], one-sided p {r.p_value:.3g}, "
                       f"Holm-adjusted {r.adjusted:.3g}: {r.verdict}")  # fmt: skip
        return out

    def judge_lines(self) -> list[str]:
        from marlhf_cli.evaluate.stats import sign_test, wilson

        j = self.settings["decision"]["judge"]
        win, tie, loss = (sum(s[k] for s in self.judge) for k in ("win", "tie", "loss"))
        n = win + tie + loss
        rate = (win + tie / 2) / n if n else math.nan
        low, high = wilson(win, win + loss) or (math.nan, math.nan)
        p = sign_test(win, loss)
        return ["## the reward model as judge, final samples (marlhf judge --rm, seed by seed)",
                f"- {name(j['a'])} against {name(j['b'])}: {win} wins, {tie} ties, {loss} losses over {n} prompts; win rate "
                f"{_f(rate)} (ties half; wins among decided {_f(low)}-{_f(high)}, 95% Wilson), sign test p {_f(p)}"]  # fmt: skip

    def cost_lines(self) -> list[str]:
        hours = {}
        for phase, records in (("actor rate", (self.tuning or {}).get("records", [])), ("reported", self.reported)):
            hours[phase] = sum(r["seconds"] for r in records) / 3600
        estimate = self.settings.get("cost_estimate_worker_hours", {})
        return ["## cost (worker-hours; the protocol's estimate in brackets)"] + [
            f"- {phase}: {h:.1f}" + (f" [{estimate[phase]:g}]" if phase in estimate else "") for phase, h in hours.items()
        ]

    def deviations(self) -> list[str]:
        found = []
        digest = self.settings["digest"]
        records = self.reported + list((self.tuning or {}).get("records", []))
        other = sorted({r["protocol"] for r in records if r["protocol"] != digest})
        if other:
            found.append(f"{sum(r['protocol'] != digest for r in records)} runs made under another protocol hash ({', '.join(other)})")
        for key in ("sft", "rm"):
            digests = sorted({r["model"][key] for r in records})
            if len(digests) > 1:
                found.append(f"the runs used {len(digests)} different {key.upper()} weights ({', '.join(digests)})")
        for label, part, grid in (("critic", self.critic, self.settings["critic"]["lrs"]), ("actor", self.tuning, self.settings["tuning"]["lrs"])):
            if part and len(grid) > 1 and part["picked"] in (min(grid), max(grid)):
                found.append(f"the {label}'s rate {part['picked']:g} is on the grid's edge (the protocol does not extend it)")
        return found

    def sentences(self) -> list[str]:
        g = self.gate1
        if self.stop == "gate 1":
            return [f"The fourth edition stopped at gate 1: on {g['pairs']} held-out TL;DR comparisons the SmolLM2-135M reward "
                    f"model was right on {g['accuracy']:.3f} of pairs (bar {g['bar']:g}) against the length baseline's "
                    f"{g['length_accuracy']:.3f} (exact McNemar p = {g['p_value']:.2g}); no PPO run was made, so the edition "
                    "says nothing about macro actions on real text."]  # fmt: skip
        if not self.complete:
            return [f"(no statement yet: {self.stop or 'the reported runs are not done'})"]
        out = []
        for r in self.speedups():
            a, b = r.name.split(" vs ")
            interval = f"{r.point:.2f}x (95% CI [{r.interval[0]:.2f}, {r.interval[1]:.2f}], Holm-adjusted p = {r.adjusted:.2g})"
            if r.verdict == "replicated":
                text = f"{a} reached {b}'s final held-out score {interval} sooner: the paper's direction, replicated at 135M."
            elif r.verdict == "contradicted":
                text = f"{a} against {b}: speedup {interval}, under the 1.3 the rule reads as a contradiction of the paper at 135M."
            else:
                width = r.interval[1] - r.interval[0]
                text = f"{a} against {b}: speedup {interval}, inconclusive (an interval {width:.2f} wide)."
            out.append(f"TL;DR at 135M, {len(self.settings['reported']['seeds'])} seeds per arm: " + text)
        if self.critic and not self.critic["passed"]:
            out.append(f"Gate 2 failed (the critic's pooled explained variance over its warm-up was {self.critic['fits'][self.critic['picked']]:.2f}, "
                       f"under {self.settings['critic']['gate']:g}): these runs say nothing about what a critic that fits buys.")  # fmt: skip
        return out

    # -----------------------------------------------------------------------------------
    def plot(self, path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from marlhf_cli.artifacts import write_figure

        from .fourth import eval_curves

        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
        for arm, records in self.by_arm().items():
            steps, scores = eval_curves(self.settings, records)
            mean = scores.mean(0)
            ax.plot(steps, mean, "o-", markersize=3, label=f"{name(arm)} ({len(records)} seeds)")
            if len(records) > 1:
                sd = scores.std(0, ddof=1)
                ax.fill_between(steps, mean - sd, mean + sd, alpha=0.15)
        ax.set_xlabel("actor step (after the critic's warm-up)")
        ax.set_ylabel(f"held-out reward-model score ({self.settings['ppo']['stage']['eval_prompts']} prompts)")
        ax.set_title("Fourth edition: TL;DR, SmolLM2-135M (mean +- sd over seeds)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        write_figure(path, fig)
