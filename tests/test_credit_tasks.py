"""The credit-assignment study's tasks and the first edition's statistics (studies/credit/tasks.py
and first.py) against hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from studies.credit.tasks import CLASSES, task_scores, token_classes

EOS = 2


def _classes() -> torch.Tensor:
    """Token id i has class i % 10 (ids 0..99), so examples can be written by class."""
    return torch.arange(100) % CLASSES


def test_token_classes_are_ten_equal_deciles_of_the_projection():
    embedding = torch.randn(1000, 8, generator=torch.Generator().manual_seed(1))
    classes = token_classes(embedding)
    assert torch.equal(torch.bincount(classes, minlength=CLASSES), torch.full((CLASSES,), 100))
    direction = torch.randn(8, generator=torch.Generator().manual_seed(0))
    projection = embedding @ direction
    # every token of a higher class projects further along the direction
    for low in range(CLASSES - 1):
        assert projection[classes == low].max() < projection[classes == low + 1].min()


def test_target_counts_class_nine_among_real_tokens_without_eos():
    ids = torch.tensor([[9, 19, 3, EOS, 0], [4, 5, 6, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    scores = task_scores("target", ids, mask, _classes(), EOS)
    assert torch.allclose(scores, torch.tensor([2 / 3, 0.0]))


def test_pairs_score_aligned_units_whose_second_class_follows_the_first():
    # units (3, 4) yes, (9, 10) yes (9 -> 0 wraps), (5, 5) no; the odd last token is no unit
    ids = torch.tensor([[3, 4, 9, 10, 5, 5, 7]])
    mask = torch.ones_like(ids)
    assert torch.allclose(task_scores("pairs", ids, mask, _classes(), EOS), torch.tensor([2 / 3]))
    # shifted by one token the same classes make no unit: alignment matters
    shifted = torch.tensor([[1, 3, 4, 9, 10, 5]])
    assert float(task_scores("pairs", shifted, torch.ones_like(shifted), _classes(), EOS)[0]) == 0.0
    # a unit cut by the end of the response (padding) does not count
    cut = torch.tensor([[3, 4, 8, 0]])
    assert float(task_scores("pairs", cut, torch.tensor([[1, 1, 1, 0]]), _classes(), EOS)[0]) == 1.0


def test_prefix_reads_only_the_first_four_tokens():
    ids = torch.tensor([[9, 1, 19, 2, 9, 9, 9, 9], [9, 9, 9, 9, 0, 0, 0, 0], [29, EOS, 0, 0, 0, 0, 0, 0]])
    mask = torch.tensor([[1] * 8, [1] * 8, [1, 1, 0, 0, 0, 0, 0, 0]])
    scores = task_scores("prefix", ids, mask, _classes(), EOS)
    # row 0: ids 9 and 19 of the first four (2 is EOS and does not count): 2 / 3
    assert torch.allclose(scores, torch.tensor([2 / 3, 1.0, 1.0]))


def test_units_score_aligned_five_token_units_wholly_in_the_upper_six_classes():
    # class = id % 10: units (4 5 6 7 9) yes, (3 9 9 9 9) no (one token in class 3), the
    # last two tokens make no unit
    ids = torch.tensor([[4, 5, 6, 7, 9, 3, 9, 9, 9, 9, 9, 9]])
    assert torch.allclose(task_scores("units", ids, torch.ones_like(ids), _classes(), EOS), torch.tensor([0.5]))
    # shifted by one token the same classes fall into other units: alignment matters
    shifted = torch.tensor([[0, 4, 5, 6, 7, 9, 3, 9, 9, 9, 9]])
    assert float(task_scores("units", shifted, torch.ones_like(shifted), _classes(), EOS)[0]) == 0.0
    # a unit cut by EOS or padding is no unit; a response without a whole unit scores 0
    cut = torch.tensor([[4, 5, 6, 7, 8, 9, 9, EOS, 0, 0], [9, 9, 9, 0, 0, 0, 0, 0, 0, 0]])
    mask = torch.tensor([[1] * 8 + [0, 0], [1, 1, 1] + [0] * 7])
    assert torch.allclose(task_scores("units", cut, mask, _classes(), EOS), torch.tensor([1.0, 0.0]))


def test_units_reference_on_random_responses():
    """Against a per-response loop over units, on random ids, lengths and EOS."""
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 100, (64, 23), generator=generator)
    lengths = torch.randint(0, 24, (64,), generator=generator)
    mask = (torch.arange(23)[None] < lengths[:, None]).long()
    scores = task_scores("units", ids, mask, _classes(), EOS)
    for row in range(64):
        real = [int(t) for t, m in zip(ids[row], mask[row]) if m]
        units = [ids[row, i : i + 5].tolist() for i in range(0, 23 - 4, 5)]
        kept = [u for i, u in enumerate(units) if 5 * i + 5 <= len(real) and EOS not in u]
        hits = sum(all(t % 10 >= 4 for t in u) for u in kept)
        assert float(scores[row]) == pytest.approx(hits / max(len(kept), 1))


def test_unknown_task_is_an_error():
    with pytest.raises(ValueError, match="unknown task"):
        task_scores("nonsense", torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2), _classes(), EOS)


def test_steps_to_threshold_uses_the_trailing_mean():
    from studies.credit.first import steps_to, trailing_mean

    curve = [0.1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]
    assert trailing_mean(curve)[4] == pytest.approx(0.74)
    assert steps_to(curve, 0.8) == 6  # trailing 5-step mean 0.9 first reaches 0.8 at step 6
    assert steps_to(curve, 0.95) is None


def test_learning_rate_and_best_configuration_are_chosen_on_tuning_scores():
    from studies.credit.first import Summary, best_of, choose

    tuned = {("t", "a", 0.1): 0.2, ("t", "a", 0.2): 0.5, ("t", "b", 0.1): 0.4, ("t", "b", 0.2): 0.3}
    lr_of, score_of = choose(tuned, ["t"], ["a", "b"], (0.1, 0.2))
    assert lr_of == {"t": {"a": 0.2, "b": 0.1}} and score_of == {"t": {"a": 0.5, "b": 0.4}}

    def summary(name, tuning):
        return Summary(name, 0.1, tuning, 1, 1, [5.0], (5.0, 5.0), [0.9], (0.9, 0.9), 1.0, 1.0, [[0.9]])

    # the reported seeds' steps do not enter the choice, only the tuning score
    summaries = {"a": summary("a", 0.5), "b": summary("b", 0.4)}
    assert best_of(summaries, ("a", "b")).config == "a"


def test_settled_line_reports_runs_that_still_move():
    from studies.credit.first import Summary, settled_line

    def summary(curves):
        return Summary("ppo", 0.1, 0.5, len(curves), 0, [20.0], (20.0, 20.0), [0.5], (0.5, 0.5), 1.0, 1.0, curves)

    flat = [0.1] * 5 + [1.0] * 25  # learned by step 6, then flat
    rising = [i / 30 for i in range(30)]  # still climbing at the end
    assert "settled" in settled_line("t", summary([flat, [0.0] * 30]))
    line = settled_line("t", summary([flat, rising]))
    assert "still moving" in line and "0.300" in line  # 9 rises of 1/30 between the last 10 trailing means
