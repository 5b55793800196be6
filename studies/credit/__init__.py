"""The credit-assignment study: does MA-PPO learn sooner than token PPO, and what do its
segment values and Monte-Carlo estimates buy? ``python -m studies.credit --edition N`` runs
or reports any edition (docs/credit-studies.md says what each found).

Each edition is a folder of its protocol and its records: ``first/`` (issue #22, not
pre-registered: its settings as a file), ``second/`` (issue #28) and ``third/`` (issue #35),
each with ``protocol.yaml`` (and, from the second on, ``PROTOCOL.md``, committed before its
runs). The code is shared:

* ``__main__.py`` the runner (every edition); ``first.py`` the first edition's course and report;
* ``protocol.py`` reads the second and third editions' files; ``tasks.py`` the tasks' rewards;
* ``runs.py`` trains and saves one run, and the resumable pool that runs many;
* ``tuning.py`` and ``study.py`` the calibration and tuning rules and the study's course;
* ``survival.py``, ``power.py`` and ``analysis.py`` the statistics; ``report.py`` and
  ``plots.py`` the output; ``estimate.py`` the second edition's cost projection;
* ``gpu_scale.py`` the first edition's runs at SmolLM2-135M's shape (the GPU suite's pilot).
"""
