"""scripts/bench/pooled.py: each mode against exclusive on the same footing, over many runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import load_script


def pooled() -> Any:
    return load_script("scripts/bench/pooled.py")


def doc(**modes: list[float]) -> dict[str, Any]:
    runs = [{"mode": m.replace("_", "-"), "parts": {"cudnn": {"ms": ms}}}
            for m, xs in modes.items() for ms in xs]  # fmt: skip
    runs.append({"mode": "krex", "parts": {"other": {"ms": 9.0}}})  # another part: ignored
    return {"runs": runs}


def test_exclusive_is_scored_against_the_others_not_against_itself() -> None:
    # Against all four, 1.3 would lie within their spread (30 %); against the other three
    # (spread 0) it does not, and it is 30 % from their median.
    out = pooled().pooled([("r", doc(exclusive=[1.0, 1.0, 1.0, 1.3]))], "cudnn")
    ex = out["modes"]["exclusive"]
    assert ex["n"] == 4
    assert ex["within_spread_share"] == 0.75 and ex["within_one_pct_share"] == 0.75


def test_a_mode_that_reads_slow_in_every_run_shows_it_beside_one_that_does_not() -> None:
    ex = [2.0, 2.01, 1.99, 2.0]
    docs = [
        (f"run{i}", doc(exclusive=ex, krex=[x * 1.02 for x in ex], krex_alone=[2.0, 2.005]))
        for i in range(5)
    ]
    out = pooled().pooled(docs, "cudnn")
    krex, alone = out["modes"]["krex"], out["modes"]["krex-alone"]
    assert krex["n"] == 20 and krex["mean_pct"] == pytest.approx(2.0, abs=0.05)
    assert krex["within_spread_share"] == 0.0 and krex["within_one_pct_share"] == 0.0
    assert alone["within_spread_share"] == 1.0 and abs(alone["mean_pct"]) < 0.2
    pair = out["pairs"]["krex - exclusive"]
    assert (pair["runs"], pair["above"], pair["below"]) == (5, 5, 0)
    assert pair["sign_p"] == pytest.approx(2 / 2**5)
    assert out["pairs"]["krex - krex-alone"]["above"] == 5
    assert "exclusive - krex" not in out["pairs"]  # each pair once, exclusive second
    assert set(out["run_means_pct"]) == {f"run{i}" for i in range(5)}


def test_runs_with_too_few_exclusive_timings_are_left_out() -> None:
    docs = [("short", doc(exclusive=[1.0, 1.1], krex=[5.0])), ("ok", doc(exclusive=[1, 1, 1]))]
    out = pooled().pooled(docs, "cudnn")
    assert list(out["run_means_pct"]) == ["ok"] and "krex" not in out["modes"]
    with pytest.raises(ValueError, match="3 or more exclusive"):
        pooled().pooled(docs[:1], "cudnn")


def test_sign_test() -> None:
    p = pooled()._sign_p
    assert p(13, 0) == pytest.approx(2 / 2**13)
    assert p(1, 1) == 1.0 and p(0, 0) == 1.0
    assert p(6, 1) == pytest.approx(2 * 8 / 128)


def test_cli_writes_the_json_and_a_bad_file_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "out.json"
    good.write_text(json.dumps(doc(exclusive=[1.0, 1.0, 1.01], krex=[1.002])))
    bad.write_text("{not json")
    argv = ["pooled.py", str(good), "--part", "cudnn", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    assert pooled().main() == 0
    assert json.loads(out.read_text())["modes"]["krex"]["n"] == 1
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["pooled.py", str(good), str(bad), "--part", "cudnn"])
    assert pooled().main() == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "b.json" in err
    monkeypatch.setattr(sys, "argv", ["pooled.py", str(good), "--part", "nothing"])
    assert pooled().main() == 1
