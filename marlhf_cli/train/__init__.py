"""Training stages: ``sft`` (supervised fine-tuning) and ``rm`` (reward model), with PPO to come.

Each stage module has ``run(config) -> dict`` (the final metrics). They share the DeepSpeed
engine (:mod:`marlhf_cli.engine`), resume checkpoints (:mod:`marlhf_cli.checkpoints`), the
loop (:mod:`.loop`), token encoding (:mod:`.encode`) and progress/metrics (:mod:`.monitor`).
Importing this package is cheap: torch and DeepSpeed load when a stage runs.
"""
