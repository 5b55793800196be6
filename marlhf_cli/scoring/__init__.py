"""What a response scores: the reward interface every stage and evaluation shares.

:mod:`.heads` reads a reward model's score (and a critic's values) where a sequence really
ends; :mod:`.rewards` is the one-number-per-response interface (:class:`~.rewards.RewardFn`
over a :class:`~.rewards.ScoringBatch`) with the reward model's normalised score, weighted
sums and a synthetic reward for tests. ``ppo`` optimises these, ``bon`` and ``judge --rm``
evaluate with them, ``rm`` trains the heads: this package sits below all of them and imports
none (tests/test_layout.py), as the sampler does (:mod:`marlhf_cli.generation`).
"""
