import math

import pytest
from typer.testing import CliRunner

from marlhf_cli import config
from marlhf_cli.errors import UserError


def test_defaults_are_the_papers_ppo_hyperparameters():
    ppo = config.PPOConfig()
    assert (ppo.rollout_batch_size, ppo.actor_lr, ppo.critic_lr) == (256, 1.5e-5, 1.5e-5)
    assert (ppo.clip_range, ppo.lam, ppo.gamma, ppo.kl_coef) == (0.2, 0.95, 1.0, 0.05)
    assert (ppo.temperature, ppo.top_k, ppo.max_prompt_length, ppo.max_new_tokens) == (0.8, 50, 512, 512)
    assert ppo.whiten_advantages is False and ppo.value_function == "equal"


def test_precedence_defaults_then_preset_then_file_then_flags(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("seed: 7\nppo:\n  kl_coef: 0.2\n  max_steps: 3\n")
    resolved = config.resolve(
        "ppo", preset="cpu-tiny", config_file=cfg_file, flags={"max_steps": 5, "termination": None}
    )
    assert resolved.rollout_batch_size == 8  # from the preset
    assert resolved.kl_coef == 0.2  # the file wins over the preset and the default
    assert resolved.seed == 7  # top-level key applies to every stage
    assert resolved.max_steps == 5  # the flag wins over the file
    assert resolved.termination == "fixed"  # a flag left at None means "not given"
    assert resolved.clip_range == 0.2  # untouched default


def test_stage_section_wins_over_top_level(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("seed: 1\nsft:\n  seed: 2\n")
    assert config.resolve("sft", config_file=cfg_file).seed == 2
    assert config.resolve("rm", config_file=cfg_file).seed == 1


def test_inf_and_type_coercion(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("ppo:\n  n: inf\n  actor_lr: 1e-4\n")
    resolved = config.resolve("ppo", config_file=cfg_file)
    assert math.isinf(resolved.n) and resolved.actor_lr == 1e-4
    assert config.to_dict(resolved)["n"] == "inf"


@pytest.mark.parametrize(
    "text, message",
    [
        ("ppo:\n  kl_coeff: 0.1\n", "unknown key 'kl_coeff' in section 'ppo'"),
        ("bogus: 1\n", "unknown config key 'bogus'"),
        ("ppo:\n  max_steps: many\n", "config key 'max_steps'"),
        ("ppo:\n  whiten_advantages: 3\n", "config key 'whiten_advantages'"),
        ("- a\n- b\n", "must be a mapping"),
        ("ppo: [1\n", "not valid YAML"),
    ],
)
def test_bad_config_files_give_one_line_errors(tmp_path, text, message):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(text)
    with pytest.raises(UserError) as err:
        config.resolve("ppo", config_file=cfg_file)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_missing_config_file_and_unknown_preset(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        config.resolve("ppo", config_file=tmp_path / "nope.yaml")
    with pytest.raises(UserError, match="unknown preset 'nope'.*cpu-tiny"):
        config.resolve("ppo", preset="nope")


@pytest.mark.parametrize("preset", sorted(path.stem for path in config.PRESETS_DIR.glob("*.yaml")))
def test_every_preset_resolves_for_every_stage(preset):
    for stage in config.STAGES:
        config.resolve(stage, preset=preset)


def test_version_flag():
    from marlhf_cli import __version__
    from marlhf_cli.cli import app

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"marlhf {__version__}"
