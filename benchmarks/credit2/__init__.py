"""The credit-assignment study, second edition (issue #28): ``benchmarks/credit_study2.py`` runs it.

protocol.py reads benchmarks/credit_study/protocol.yaml; runs.py trains and saves one run;
tuning.py and study.py are the calibration and tuning rules and the study's course;
survival.py, power.py and analysis.py the statistics; report.py and plots.py the output.
"""
