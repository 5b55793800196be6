"""MkDocs hook: the figures the benchmarks and studies write (benchmarks/**/*.png and
studies/**/*.png) are part of the site at the same paths, so a results page shows a figure
where its script makes it, without a copy under docs/ to keep in step. A page under
docs/results/ links one as ``../benchmarks/<path>.png`` or ``../studies/<path>.png``."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File


def on_files(files, config):
    root = Path(config["config_file_path"]).parent
    for figure in sorted(path for folder in ("benchmarks", "studies") for path in (root / folder).rglob("*.png")):
        files.append(File(figure.relative_to(root).as_posix(), str(root), config["site_dir"], config["use_directory_urls"]))
    return files
