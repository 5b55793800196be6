"""``--report-to tensorboard``: event files under ``tb/<stage>/`` (torch's SummaryWriter)."""

from __future__ import annotations

import json

from torch.utils.tensorboard import SummaryWriter

from . import Tracker


class TensorBoard(Tracker):
    name = "tensorboard"

    def __init__(self, folder, start_step: int, config: dict):
        folder.mkdir(parents=True, exist_ok=True)
        # a resumed run drops what the stopped process wrote after its checkpoint
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=start_step + 1 if start_step else None)
        if not start_step:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```", 0)

    def log(self, step: int, values: dict[str, float], split: str) -> None:
        for key, value in values.items():
            if value == value and abs(value) != float("inf"):  # TensorBoard has no NaN or inf
                self.writer.add_scalar(f"{split}/{key}", value, step)
        self.writer.flush()

    def table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        """A Markdown table in the Text tab (TensorBoard has no table type)."""
        def cell(value) -> str:
            return str(value).replace("|", "\\|").replace("\n", " ")

        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
        self.writer.add_text(name, "\n".join(lines), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def start(*, run, stage, name, group, config, start_step, resume_id, say) -> TensorBoard:
    return TensorBoard(run.path("tb", stage), start_step, config)
