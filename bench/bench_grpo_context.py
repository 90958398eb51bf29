"""The GRPO context check's cost over one launch: the longest training prompt, measured once vs at every check.

`launch stage=grpo` checks that the longest rollout prompt and grpo.max_completion_length fit the model's context
(rl.prompts.model_checks) three times: at placement and at the launch's preflight (one process), then in the trainer
at start (another process). Each check rendered and tokenized every training prompt (the baseline, "every check");
now the answer (and the chat template's acceptance) is measured once per inputs and kept in the process and in small
cache files the trainer reads back ("once"). Same tiny base tokenizer, same task=spa config of about `n` generated prompts, a cold cache each run;
prints both times, the prompts rendered, the ratio (baseline: every check) and that both found the same prompt.

    .venv/bin/python bench/bench_grpo_context.py [n=1000]
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one_launch(rp, cfg) -> None:
    """The three checks of one launch: placement and preflight in this process, the trainer's start in a new one."""
    rp.model_checks(cfg)
    rp.model_checks(cfg)
    rp._LONGEST.clear()   # the trainer's process starts with nothing in memory
    rp.model_checks(cfg)


def main(argv=None) -> int:
    args = dict(tok.split("=", 1) for tok in (sys.argv[1:] if argv is None else argv))
    if set(args) - {"n"}:
        raise SystemExit(f"unknown key(s) {sorted(set(args) - {'n'})}; the one key: n")
    from launch.compose import compose_grpo
    from rl import chat, prompts as rp

    rendered, real = [], chat.prompt_lengths

    def spy(tok, prompts, *rest):
        rendered.append(len(prompts))
        return real(tok, prompts, *rest)

    chat.prompt_lengths = spy
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")   # cold: this run's own cache
        k = rp.prompts_per_step(compose_grpo(["task=spa", "model=tiny_base"]).cfg)
        cfg = compose_grpo(["task=spa", "model=tiny_base", f"steps={-(-int(args.get('n', 1000)) // k)}", f"runs_root={tmp}"]).cfg
        rp.model_checks(cfg)   # warm-up (imports, the tokenizer's first load), not timed
        rp._LONGEST.clear()
        keyed, results = rp._inputs_key, {}
        for label, key in (("every check", lambda c, **_: None), ("once", keyed)):   # None: no key, so nothing kept
            rp._inputs_key, rendered[:] = key, []
            for f in (Path(tmp) / "cache" / "dtsft").glob("*/*.json"):   # the longest prompts and accepted templates
                f.unlink()
            t0 = time.perf_counter()
            one_launch(rp, cfg)
            results[label] = time.perf_counter() - t0, list(rendered), rp.longest_prompt(cfg)
            print(f"{label:>12}: {results[label][0]:.2f} s for one launch's 3 checks, prompts rendered {results[label][1]}")
        rp._inputs_key = keyed
    (before, _, found_before), (after, _, found_after) = results["every check"], results["once"]
    print(f"every check / once = {before / after:.2f}x ({int(cfg.train.steps) * k} prompts, model=tiny_base; longest "
          f"{found_after[0]} tokens ({found_after[1]}), {'the same' if found_before == found_after else 'DIFFERENT'} in both)")
    return 0 if found_before == found_after else 1


if __name__ == "__main__":
    sys.exit(main())
