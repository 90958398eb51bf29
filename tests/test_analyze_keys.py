"""analyze's command line: a key typed without its section is named with it ("did you mean" across
sections, dotted names included), an eval.KEY that is no evaluate key is refused at once, and what the
demo prints as its analyze step is a command analyze accepts, with the values the demo runs."""
from __future__ import annotations

import shlex

import pytest

from common.cli import ConfigError


def test_a_key_given_without_its_section_is_named_with_it(capsys):
    from launch.analyze import main, parse_argv

    with pytest.raises(ConfigError, match=r"unknown key 'max_new_tokens'\. Did you mean: eval\.max_new_tokens\?"):
        parse_argv(["runs_root=runs", "max_new_tokens=32"])
    with pytest.raises(ConfigError, match=r"eval\.max_new_tokenz: unknown evaluate key 'max_new_tokenz'\. Did you mean: eval\.max_new_tokens, eval\.babyai"):
        parse_argv(["eval.max_new_tokenz=32"])
    assert parse_argv(["eval.max_new_tokens=32", "eval.sets.nq=nq:hub"]).eval.max_new_tokens == 32
    assert main(["runs_root=runs", "index_dir=x"]) == 2
    assert "Did you mean: eval.index_dir?" in capsys.readouterr().err
    for arg, line in (("launcher=[]", "launcher=[]: expected a non-empty string"),
                      ("benches=[]", "benches=[]: expected null or a list of bench names"),   # [] is not null
                      ("anchor_dir=/dev/null", "anchor_dir='/dev/null': expected null or a directory"),
                      ("benches=[nq,nq@open]", "benches: nq and nq@open name the same bench (nq); give it once")):   # also with evaluate=false
        assert main(["runs_root=runs", "evaluate=false", arg]) == 2
        assert line in capsys.readouterr().err


def test_the_demo_prints_an_analyze_command_analyze_accepts(capsys):
    from omegaconf import OmegaConf

    from demo.run import DEFAULTS, analyze_config, main as demo_main
    from launch import analyze

    assert demo_main(["dry_run=true"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("4. analyze "))
    given = analyze.parse_argv(shlex.split(line.split("4. analyze ", 1)[1]))
    want = OmegaConf.merge(analyze.DEFAULTS, analyze_config(OmegaConf.create(DEFAULTS)))
    assert OmegaConf.to_container(given) == OmegaConf.to_container(want)
