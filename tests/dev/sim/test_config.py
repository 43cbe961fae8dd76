from __future__ import annotations

import argparse

import pytest

from extproc.dev.sim.server import SimConfig, add_arguments


def parse(*argv: str) -> SimConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return SimConfig.from_args(parser.parse_args(argv))


def test_flags_map_onto_config_fields() -> None:
    cfg = parse(
        "--port", "8101", "--model", "qwen3-8b", "--served-alias", "a", "--served-alias", "b",
        "--num-gpu-blocks", "64", "--fail-every", "5", "--time-scale", "0",
    )  # fmt: skip
    assert cfg.served_names == ("qwen3-8b", "a", "b")
    assert (cfg.num_gpu_blocks, cfg.fail_every, cfg.time_scale) == (64, 5, 0.0)
    assert cfg.instance_id == "sim-8101"
    assert parse().served_aliases == ()


def test_invalid_settings_are_rejected() -> None:
    with pytest.raises(ValueError):
        SimConfig(instance_id="has space")
    with pytest.raises(ValueError):
        SimConfig(max_num_seqs=0)
    with pytest.raises(ValueError):
        SimConfig(time_scale=-1)
