"""The paper's evaluations: best-of-N reward scores (``marlhf bon``) and pairwise judging
(``marlhf judge``, an LLM through the ``openai`` client or the reward model).

Modules, smallest first, so each can be used without the CLI:

* :mod:`.estimator` -- the unbiased expected maximum of N draws from M samples;
* :mod:`.stats` -- win/tie/loss rates with Wilson intervals, sign test, position bias,
  length-controlled win rate, judge agreement;
* :mod:`.judge_parse` -- turning a judge's reply into A, B or E (or "unparsed", never a guess);
* :mod:`.prompts` -- the judge templates and the task detection;
* :mod:`.pairs` -- reading two sample files, matching them by prompt, order assignment;
* :mod:`.client` -- the OpenAI-compatible client: concurrency, retries, per-pair disk cache;
* :mod:`.rm_judge` -- the reward model as a judge;
* :mod:`.judge`, :mod:`.bon` -- the two commands; :mod:`.plots`, :mod:`.tables` their output.
"""
