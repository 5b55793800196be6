"""Training stages: ``sft`` (supervised fine-tuning), ``rm`` (reward model) and the ``ppo``
package (PPO, MA-PPO, RLOO, GRPO; its top module reads like the paper's Algorithm 1).

Each stage has ``run(config) -> dict`` (the final metrics). They share the DeepSpeed
engine (:mod:`marlhf_cli.engine`), resume checkpoints (:mod:`marlhf_cli.checkpoints`), the
loop of sft and rm (:mod:`.loop`), token encoding (:mod:`.encode`) and progress/metrics (:mod:`.monitor`).
Importing this package is cheap: torch and DeepSpeed load when a stage runs.
"""
