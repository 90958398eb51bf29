"""Where huggingface_hub keeps its files and whether it can answer now, asked of every stage that loads a model or a
tokenizer by a user-given name (data-prep's tokenizer, the trainers' model, evaluate's checkpoint and encoder).

huggingface_hub retries a download up to 5 times per file with backoff when the hub cannot be reached (~25 s a file,
~80 s for a model); `local_only` asks it once instead, so an uncached Hub id while the hub cannot answer is one line
at once, and a cached copy loads from the cache (`local_files_only`), as huggingface_hub would fall back to it. The
answer is the process's for that repo: a stage's later checks of it ask nothing (`hub_unreachable`), and so is the
commit its loads read (`hub_revision`: the one its answer named, else the cached copy's), so an evaluation's identity
names the commit that is loaded even when the Hub's main moves meanwhile.
"""
from __future__ import annotations

import os
from pathlib import Path

from common.cli import ConfigError

TRUE = ("1", "ON", "YES", "TRUE")   # what huggingface_hub and datasets read as a true environment variable


def offline_var() -> str | None:
    """The variable that puts huggingface_hub offline (HF_HUB_OFFLINE, else TRANSFORMERS_OFFLINE), or None."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    if not value or value.upper() not in TRUE:
        return None
    return "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"


# A check's answer per (endpoint, repo type, repo id, revision), for this process: why the hub cannot send the repo
# (None: it answered) and the commit its answer named (None: unknown). A trainer's start checks model.tokenizer and
# model.path 3-4 times, often one repo, and a Hub that accepts connections and never answers made each wait for the
# request's timeout (~10 s). The failure is remembered too, so its next check is the same line at once.
_ANSWERS: dict[tuple[str, str, str, str], tuple[str | None, str | None]] = {}


def _key(repo_id: str, revision: str | None = None, repo_type: str = "model") -> tuple[str, str, str, str]:
    from huggingface_hub import constants

    return constants.ENDPOINT, repo_type, repo_id, revision or constants.DEFAULT_REVISION


def hub_unreachable(repo_id: str, filename: str = "tokenizer_config.json", *, revision: str | None = None,
                    repo_type: str = "model") -> str | None:
    """Why the hub cannot send `repo_id`'s files now, or None: offline (the variable set), or one HEAD request for
    `filename`, without huggingface_hub's retries and backoff (its downloads make up to 5 more per file when no cached
    copy is there), failed at the network. An answer from the hub (not found, gated) is None: the download says it.
    The request is made once per process for one repo at one revision and endpoint, whichever file a check names
    (`_ANSWERS`, with the commit the answer names: a missing file's too); being offline is read anew at each check."""
    if var := offline_var():
        return f"{var}={os.environ[var]}"
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError

    key = _key(repo_id, revision, repo_type)
    if key in _ANSWERS:
        return _ANSWERS[key][0]
    try:   # (the timeout as huggingface_hub's downloads read it: HF_HUB_ETAG_TIMEOUT)
        answer = (None, get_hf_file_metadata(hf_hub_url(repo_id, filename, repo_type=repo_type, revision=revision),
                                             timeout=constants.HF_HUB_ETAG_TIMEOUT, retry_on_errors=False).commit_hash)
    except HfHubHTTPError as exc:
        answer = (None, exc.response.headers.get(constants.HUGGINGFACE_HEADER_X_REPO_COMMIT) if exc.response is not None else None)
    except Exception as exc:   # httpx's connect, network and timeout errors; OfflineModeIsEnabled
        answer = (f"the Hugging Face Hub is unreachable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})", None)
    _ANSWERS[key] = answer
    return answer[0]


def hub_revision(name: str, filename: str = "config.json") -> str | None:
    """The commit this process loads Hub repo `name` at (`revision=` of every load, and what an identity names): the
    one the hub named when this process first asked (`hub_unreachable`, or `hold`'s), else, while the hub cannot answer,
    the commit of the local hub cache's copy that holds `filename`. None: a local path, no repo id, or no commit known."""
    if not _repo_id(name):
        return None
    why = hub_unreachable(name, filename)
    known = _ANSWERS.get(_key(name), (None, None))[1]   # (a held one is kept offline too)
    if known or why is None:
        return known
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, filename)
    return Path(cached).parent.name if isinstance(cached, str) else None


_ASK = object()   # hold's `unreachable` when no other process's answer is given: this process asks


def hold(name: str, commit: str | None, unreachable: str | None | object = _ASK) -> None:
    """Load Hub repo `name` at `commit` in this process (an identity another process took: a data_parallel shard's
    parent's, a launch's plan, a resumed run's start), whatever the hub's main is now; nothing for an unknown commit.
    Whether the hub answers stays this process's own answer, else `unreachable` (another process's: None, it answered),
    else one request now, of that commit (`hub_unreachable`), never assumed: where it cannot answer, the loads read the
    cached copy at once, not huggingface_hub's retries of each file."""
    if commit:
        key = _key(name)
        if key not in _ANSWERS and unreachable is _ASK:   # (offline: read anew at each check, nothing to keep)
            unreachable = None if offline_var() else hub_unreachable(name, revision=commit)
        _ANSWERS[key] = (_ANSWERS[key][0] if key in _ANSWERS else unreachable, commit)


def _repo_id(name: str) -> bool:
    """Whether `name` is a Hub repo id, not a local path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return not Path(name).expanduser().exists()


def hf_home() -> str:
    return os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))


def hub_cache() -> Path:
    """huggingface_hub's file cache (HF_HUB_CACHE, else $HF_HOME/hub)."""
    home = os.path.expandvars(os.path.expanduser(hf_home()))
    where = os.environ.get("HF_HUB_CACHE", os.environ.get("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub")))
    return Path(os.path.expandvars(os.path.expanduser(where)))


def local_only(name: str, key: str, error: type[Exception] = ConfigError, filename: str = "config.json") -> bool:
    """`local_files_only` for loading `name` (a local path or a Hub repo id): False for a path, or while the hub
    answers; True while it cannot (`hub_unreachable`: offline, or one request failed) and the local hub cache holds
    `filename` of it; otherwise one line now, an `error` naming `key`. A name no repo can have is the loader's to refuse."""
    if not _repo_id(name):
        return False
    unreachable = hub_unreachable(name, filename)
    if unreachable:
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, filename), str):
            raise error(f"{key}={name}: not in the local Hugging Face cache ({hub_cache()}) and {unreachable}")
    return bool(unreachable)


def tokenizer_source(name: str, key: str, error: type[ConfigError] = ConfigError) -> tuple[str, bool]:
    """(what to load, `local_files_only`) for a user-given tokenizer name: common.tiny.checked_tokenizer's answer
    (a model's name, a malformed id: refused offline), then `local_only` for its tokenizer_config.json."""
    from common.tiny import checked_tokenizer

    where = checked_tokenizer(name, key, error)
    return where, local_only(where, key, error, "tokenizer_config.json")


def source(name: str, key: str, error: type[Exception] = ConfigError, filename: str = "config.json") -> dict:
    """from_pretrained's `local_files_only` (`local_only`'s answer: its one line first) and `revision` (`hub_revision`'s
    commit; main for a local path) for `name`."""
    offline = local_only(name, key, error, filename)
    return {"local_files_only": offline, "revision": hub_revision(name, filename) or "main"}
