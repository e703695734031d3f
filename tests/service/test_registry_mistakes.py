"""Mistakes in the registry file: a misspelt table or key is refused naming it, at start
(``tsi run``: one line, exit status 2) and on a reload (logged; the running registry
stays); every reload that loads logs what it changes."""

import logging

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.service.instances.registry import LiveRegistry, Registry, RegistryError
from flows.service.runtime.process import Service

SHOP = '[experiments.shop]\narms = ["a", "b"]\n'
HOME = '[experiments.home]\narms = ["x", "y"]\n'

MISTAKES = [
    (  # the typo of the issue: without the check, 'home' silently leaves the registry
        SHOP + HOME.replace("[experiments.", "[experiment."),
        "unknown table [experiment] (did you mean [experiments]?)",
    ),
    (HOME.replace("[experiments.", "[Experiments."), "unknown table [Experiments] (did you mean"),
    (SHOP + "[settings]\nx = 1\n", "unknown table [settings]: "),
    ("seed = 4\n" + SHOP, "unknown key seed (an experiment's setting)"),
    (SHOP + "feedback_tll = 60\n", "experiment 'shop': unknown setting feedback_tll (did you mean"),
    (SHOP + "colour = 1\nArms = 2\n", "'shop': unknown settings Arms (did you mean arms?), colour"),
    (SHOP + "[experiments.shop.extra]\nx = 1\n", "experiment 'shop': unknown setting extra"),
]


@pytest.mark.parametrize(("text", "message"), MISTAKES)
def test_an_unknown_table_or_key_is_refused_naming_it(text, message):
    with pytest.raises(RegistryError) as refused:
        Registry.from_toml(text)
    assert message in str(refused.value)


def test_a_misspelt_table_is_named_even_when_it_is_the_only_one():
    with pytest.raises(RegistryError, match=r"unknown table \[experiment\] \(did you mean"):
        Registry.from_toml(HOME.replace("[experiments.", "[experiment."))


def test_an_odd_unknown_name_is_shown_quoted_on_one_line():
    with pytest.raises(RegistryError) as refused:
        Registry.from_toml(SHOP + '["bad\\nname"]\nx = 1\n')
    assert 'unknown table ["bad\\nname"]' in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.fixture
def root_handlers():
    """Take back the log handler ``tsi run`` adds: its stream is gone once it returns."""
    root = logging.getLogger()
    before = list(root.handlers)
    yield
    root.handlers[:] = before


@pytest.mark.parametrize(("text", "message"), MISTAKES[:1] + MISTAKES[4:5])
def test_tsi_run_refuses_an_unknown_table_or_key_in_one_line(
    tmp_path, root_handlers, text, message
):
    path = tmp_path / "registry.toml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["run", "--registry", str(path), "--no-recovery"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tsi run: ") and message in lines[0], lines


def served(tmp_path, text):
    """A service reading the registry file ``text`` (it never connects)."""
    path = tmp_path / "registry.toml"
    path.write_text(text)
    return Service(LiveRegistry(Registry.load(path), path), brokers=[]), path


def reloaded(service, caplog):
    """Send the service a SIGHUP's reload; the line it logged."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tsi"):
        service.reload_registry()
    [record] = caplog.records
    return record.getMessage()


@pytest.mark.parametrize(("text", "message"), MISTAKES)
def test_a_reload_with_an_unknown_table_or_key_is_logged_and_the_old_registry_stays(
    tmp_path, caplog, text, message
):
    service, path = served(tmp_path, SHOP + HOME)
    before = service.registry.current
    path.write_text(text)
    line = reloaded(service, caplog)
    assert line.startswith("registry reload refused, the running registry stays: ")
    assert message in line and "\n" not in line
    assert not service.registry.apply() and service.registry.current is before
    assert set(service.registry.current.experiments) == {"shop", "home"}


def test_every_reload_logs_what_it_changes(tmp_path, caplog):
    service, path = served(tmp_path, SHOP + HOME)
    path.write_text(SHOP.replace('"b"]', '"b", "c"]') + '[experiments.new]\narms = ["z"]\n')
    assert reloaded(service, caplog).endswith(": added 'new'; removed 'home'; edited 'shop'")
    assert service.registry.apply()
    assert reloaded(service, caplog).endswith(": no change")
    path.write_text(SHOP + "seed = 3\n" + '[experiments.new]\narms = ["z"]\n')
    assert reloaded(service, caplog).endswith(": edited 'shop'")


def test_a_reload_not_yet_applied_is_compared_with_the_registry_in_force(tmp_path, caplog):
    service, path = served(tmp_path, SHOP)
    path.write_text(SHOP + HOME)
    assert reloaded(service, caplog).endswith(": added 'home'")
    path.write_text(SHOP + HOME + '[experiments.new]\narms = ["z"]\n')
    assert reloaded(service, caplog).endswith(": added 'home', 'new'")
    assert service.registry.apply()
    assert set(service.registry.current.experiments) == {"shop", "home", "new"}
