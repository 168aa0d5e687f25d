"""The `omnigate` dispatcher: each command reaches its own module's parser with the right arguments."""

from __future__ import annotations

import importlib
from pathlib import Path

import orjson
import pytest

from omnigate.cli import COMMANDS, HARNESS, PRODUCT, main


def test_every_command_names_a_module_with_a_main() -> None:
    assert set(PRODUCT) == {"serve", "policy", "tenants", "alerts", "top"}
    assert set(HARNESS) == {"demo", "sim", "loadtest"}
    for name, command in COMMANDS.items():
        assert callable(importlib.import_module(command.module).main), name
    assert all(c.module.startswith("gateway.") for c in PRODUCT.values())
    assert not any(c.module.startswith("gateway.") for c in HARNESS.values())


def test_a_named_command_keeps_its_name_and_others_get_only_their_arguments(tmp_path: Path) -> None:
    out = tmp_path / "schema.json"
    assert main(["policy", "schema", "-o", str(out)]) == 0
    assert orjson.loads(out.read_text())["title"] == "omnigate policy"


@pytest.mark.parametrize(("command", "prog"), [("alerts", "omnigate alerts"), ("demo", "omnigate demo")])
def test_help_is_the_commands_own(command: str, prog: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {prog} ")


def test_no_or_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["serv"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'serv'" in err and "serve" in err
