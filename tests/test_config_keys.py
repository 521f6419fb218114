"""Each setting is defined once: a Config field whose Key carries its section and key, type,
bounds, default and meaning. The TOML schema, validate(), `krex config show` and the operator
guide's table are derived from it; these tests keep the guide's table from drifting and pin the
messages the derived checks give."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from krex.core.config import (
    _FIELDS,
    _SCHEMA,
    SETTINGS,
    Config,
    ConfigError,
    from_toml,
    keys_table,
)
from krex.daemon.views import config_toml, effective_config

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- settings: written by scripts/config_table.py from krex/core/config.py -->\n"
END = "<!-- end of settings -->\n"


def test_the_operator_guides_table_is_the_one_the_dataclass_gives() -> None:
    guide = (ROOT / "docs" / "operator-guide.md").read_text()
    assert BEGIN in guide and END in guide
    table = guide.split(BEGIN, 1)[1].split(END, 1)[0]
    assert table == keys_table(), "run: python scripts/config_table.py"


def test_every_field_but_the_source_is_a_setting_with_a_default_in_words() -> None:
    names = [f.name for f in dataclasses.fields(Config)]
    assert [name for name, _ in SETTINGS] == [n for n in names if n != "source"]
    assert len({key.name for _, key in SETTINGS}) == len(SETTINGS)
    defaults = Config()
    for name, key in SETTINGS:
        assert key.what and key.takes, key.name
        assert getattr(defaults, name) is not None or key.default, key.name


def test_the_schema_and_the_fields_come_from_the_keys() -> None:
    for name, key in SETTINGS:
        if key.section != "slices":
            assert _SCHEMA[key.section][key.key] == key.toml
            assert _FIELDS[key.section, key.key] == name
    assert sum(map(len, _SCHEMA.values())) == len(SETTINGS) - 1  # all but [slices]


def test_config_show_prints_every_setting(tmp_path: Path) -> None:
    cfg = from_toml(f'[gpus]\nsim = true\n[daemon]\nsocket = "{tmp_path}/k.sock"\n', "c.toml")
    doc = effective_config(cfg)
    text = config_toml(doc)
    for _, key in SETTINGS:
        if key.key:
            assert key.key in doc[key.section], key.name
            assert f"\n{key.key} = " in text or f"# {key.key}: per GPU" in text, key.name
    assert from_toml(text, "shown") is not None  # what it prints is a configuration


@pytest.mark.parametrize(
    "doc,says",
    [
        ("[gpus]\ncount = 17", "c.toml: gpus.count must be 1..16, got 17"),
        ("[gpus]\nvendor = 'x'", "c.toml: gpus.vendor must be one of auto, nvidia, amd, got 'x'"),
        ("[daemon]\nlog_format = 'x'", "c.toml: daemon.log_format must be text or json, got 'x'"),
        ("[timeouts]\ndrain_s = 0", "c.toml: timeouts.drain_s must be > 0 and finite, at most "
         "1e+09 (seconds), got 0.0"),
        ("[regions]\nsettle_s = 6", "c.toml: regions.settle_s must be 0..5 (seconds), got 6.0"),
        ("[regions]\npace_ms = -1", "c.toml: regions.pace_ms must be 0..1000 (milliseconds, 0: "
         "off), got -1.0"),
        ("[memory]\nroom_gib = -1", "c.toml: memory.room_gib must be >= 0 and finite, at most "
         "1048576 (GiB, 1 PiB), got -1.0"),
        ("[pool]\nmax_uses = 0", "c.toml: pool.max_uses must be at least 1, at most 2147483647, "
         "got 0"),
        ("[pool]\npreload = ['1x']", "c.toml: pool.preload: '1x' is not a module name"),
        ("[metrics]\naddress = 'a b'", "c.toml: metrics.address must be a host name or address, "
         "got 'a b'"),
        ("[daemon]\nsocket = ''", "c.toml: daemon.socket: not a usable path ('.')"),
        ("[freezer]\nbackend = 1", "c.toml: freezer.backend has the wrong type: a string is "
         "expected, got 1 (a number)"),
        ("[memory]\nroom_wait = 1", "c.toml: unknown key memory.room_wait (did you mean "
         "memory.room_wait_s?)"),
    ],
)  # fmt: skip
def test_the_derived_checks_say_what_they_always_said(doc: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        from_toml(doc + "\n", "c.toml")
    assert str(e.value) == says
