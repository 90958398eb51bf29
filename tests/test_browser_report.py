"""report.html in a real browser (the `browser` tier, `make test-browser`): Debian's chromium + chromium-driver,
headless, driven by Selenium (`SE_OFFLINE=true`: no driver or browser download), every host name resolved to
nowhere and the performance log checked, so the page must work from file:// with no request leaving it.

The study (tests/report_html_rows.py) goes through the real `analyze` writer; what the page shows is compared
with the rows' own texts and counts, and a row's `<script>` / `<img onerror>` must render as text and run nothing."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from report_html_rows import BENCHES, PAYLOAD, XSS_ID, rows_of, write_study

pytestmark = pytest.mark.browser

CHROMEDRIVER = "/usr/bin/chromedriver"
# Each test's screenshots are in its tmp_path (pytest keeps the last three runs' dirs); DTSFT_BROWSER_SHOTS=DIR
# also copies them into DIR.
SHOTS = Path(os.environ["DTSFT_BROWSER_SHOTS"]) if os.environ.get("DTSFT_BROWSER_SHOTS") else None


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from launch.analyze import run_analysis

    root = tmp_path_factory.mktemp("html_study")
    write_study(root / "runs")
    res = run_analysis({"runs_root": str(root / "runs"), "out": str(root / "reports"), "benches": BENCHES,
                        "evaluate": False, "wandb": False})
    return root, res


@pytest.fixture(scope="module")
def chromium_config(tmp_path_factory) -> Path:
    """Chromium's $XDG_CONFIG_HOME: its crash-report store goes there, not into the developer's ~/.config/chromium
    (chromedriver gives it a temp profile, but the crash reports follow the default profile's dir)."""
    return tmp_path_factory.mktemp("chromium-config")


@pytest.fixture(scope="module")
def driver(chromium_config):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    if not Path(CHROMEDRIVER).exists():
        pytest.skip(f"{CHROMEDRIVER} missing: apt-get install chromium chromium-driver (make test-browser does)")
    os.environ["SE_OFFLINE"] = "true"
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
                '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1', "--disable-background-networking", "--no-first-run"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    d = webdriver.Chrome(service=Service(CHROMEDRIVER, env={**os.environ, "XDG_CONFIG_HOME": str(chromium_config)}),
                         options=opts)
    yield d
    d.quit()


def requests_made(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def assert_nothing_left(driver) -> None:
    """Every request the page made was for a file next to it (the page, its shards) or inline data (the figures)."""
    urls = requests_made(driver)
    assert any(u.endswith(".js") and "/report_data/" in u for u in urls), urls  # the log does record the shard loads
    assert all(u.startswith(("file://", "data:")) for u in urls), [u for u in urls if not u.startswith(("file://", "data:"))]


def shot(driver, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    driver.save_screenshot(str(path))
    if SHOTS is not None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, SHOTS / path.name)
    return path


def wait(driver, cond, timeout=10):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: cond(d))


def select(driver, element_id: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", element_id)).select_by_value(value)


def test_chromium_keeps_its_files_out_of_the_developers_config(driver, chromium_config):
    """Chromium started (its crash-report store is made at start) and wrote under the test's config dir."""
    assert driver.execute_script("return navigator.userAgent").find("Chrome") >= 0
    assert (chromium_config / "chromium").is_dir(), sorted(map(str, chromium_config.rglob("*")))


def test_browse_an_item_and_its_transcript(study, driver, tmp_path):
    root, res = study
    driver.get(res.html.resolve().as_uri())
    wait(driver, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "1")
    by = "id"
    assert "Missing points (0)" in driver.find_element(by, "report").text
    assert len(driver.find_elements("css selector", "figure img")) == len(res.figures) >= 3
    driver.find_element(by, "tab-browse").click()
    select(driver, "browse-bench", "nq")
    select(driver, "browse-run", "r2e/seed0")
    select(driver, "browse-step", "20")
    rows = rows_of(root / "runs" / "r2e" / "seed0" / "eval" / "step-000020", "nq")
    status = driver.find_element(by, "browse-status")
    wait(driver, lambda d: status.get_attribute("data-n") == str(len(rows)) and "step 20" in status.text)
    assert f"{sum(r['metrics']['em'] for r in rows):.0f} right by em" in status.text
    listed = driver.find_elements("css selector", "#item-list tbody tr")
    assert [tr.get_attribute("data-id") for tr in listed] == [r["id"] for r in rows]
    # the payload row: its question shows as text in the list, and opening it runs nothing
    xss = next(r for r in rows if r["id"] == XSS_ID)
    tr = driver.find_element("css selector", f'#item-list tr[data-id="{XSS_ID}"]')
    assert PAYLOAD in tr.text
    tr.click()
    box = driver.find_element(by, "transcript")
    wait(driver, lambda d: XSS_ID in box.text)
    assert driver.execute_script("return typeof window.__pwned") == "undefined"
    assert driver.find_elements("css selector", "#transcript img, #transcript script, #item-list img") == []
    assert box.find_element("css selector", ".final-answer").text == xss["prediction"]
    assert box.find_element("css selector", ".golds").text == " | ".join(xss["golden_answers"])
    msgs = box.find_elements("css selector", ".msg")
    assert len(msgs) == len(xss["messages"])
    assert PAYLOAD in msgs[-1].find_element("css selector", ".content").text
    assert "search" in msgs[2].find_element("css selector", ".call").text and "book 3 author" in msgs[2].text
    assert PAYLOAD in msgs[3].text  # the tool response
    reasoning = msgs[-1].find_element("css selector", "details")
    assert reasoning.get_attribute("open") is None  # folded
    shot(driver, tmp_path, "browser_transcript_xss_row")
    # BabyAI: the game's steps, actions and the goal
    select(driver, "browse-bench", "babyai")
    wait(driver, lambda d: "babyai" in status.text and status.get_attribute("data-n") == "8")
    driver.find_element("css selector", '#item-list tr[data-id="babyai-1"]').click()
    wait(driver, lambda d: "babyai-1" in box.text)
    game = rows_of(root / "runs" / "r2e" / "seed0" / "eval" / "step-000020", "babyai")[1]
    assert box.find_element("css selector", ".final-answer").text == " ".join(game["actions"])
    assert "goal: go to the red ball (1)" in box.text and "Current Observation: step 1" in box.text
    assert driver.execute_script("return typeof window.__pwned") == "undefined"
    assert_nothing_left(driver)


def test_the_report_served_over_http_loads_its_shards(study, driver, tmp_path):
    """Issue 62, item 12: served by a loopback http server (python -m http.server's handler), the page loads its
    report_data/*.js from its own origin (its policy blocked them when it allowed only file:)."""
    import functools
    import http.server
    import threading

    root, res = study
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(res.html.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        driver.get(f"{base}/report.html")
        wait(driver, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "1")
        driver.find_element("id", "tab-browse").click()
        select(driver, "browse-bench", "nq")
        select(driver, "browse-run", "r2e/seed0")
        select(driver, "browse-step", "20")
        rows = rows_of(root / "runs" / "r2e" / "seed0" / "eval" / "step-000020", "nq")
        status = driver.find_element("id", "browse-status")
        wait(driver, lambda d: status.get_attribute("data-n") == str(len(rows)) and "step 20" in status.text)
        urls = requests_made(driver)
        assert any(u.startswith(f"{base}/report_data/") and u.endswith(".js") for u in urls), urls
        assert all(u.startswith((base, "data:")) for u in urls), urls
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("bench", ["nq", "search_plan_ood"])
def test_paired_view_counts_and_first_difference(study, driver, tmp_path, bench):
    root, res = study
    driver.get(res.html.resolve().as_uri())
    wait(driver, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "1")
    driver.find_element("id", "tab-paired").click()
    select(driver, "pair-bench", bench)
    select(driver, "pair-a-run", "r2e/seed0")
    select(driver, "pair-a-step", "20")
    select(driver, "pair-b-run", "anchor")
    metric = "em" if bench == "nq" else "reward_outcome"
    a = {r["id"]: r["metrics"][metric] for r in rows_of(root / "runs" / "r2e" / "seed0" / "eval" / "step-000020", bench)}
    b = {r["id"]: r["metrics"][metric] for r in rows_of(root / "runs" / "_anchor" / "eval" / "step-000000", bench)}
    a_only = [i for i in a if a[i] == 1 and b[i] == 0]
    b_only = [i for i in a if a[i] == 0 and b[i] == 1]
    assert a_only and b_only  # the study is built so that both filters show something
    summary = driver.find_element("id", "pair-summary")
    wait(driver, lambda d: summary.get_attribute("data-n") == str(len(a)) and "anchor" in summary.text)
    assert summary.get_attribute("data-a-only") == str(len(a_only))
    assert summary.get_attribute("data-b-only") == str(len(b_only))
    delta = sum(a[i] - b[i] for i in a) / len(a)  # the paired Δ over the rows' own scores
    assert float(summary.get_attribute("data-delta")) == pytest.approx(delta)
    assert f"{delta:+.3f}" in summary.text
    for value, ids in (("a_only", a_only), ("b_only", b_only)):
        select(driver, "pair-filter", value)
        shown = driver.find_elements("css selector", "#pair-list tbody tr")
        assert [tr.get_attribute("data-id") for tr in shown] == ids
    select(driver, "pair-filter", "a_only")
    driver.find_element("css selector", f'#pair-list tr[data-id="{a_only[0]}"]').click()
    note = driver.find_element("id", "pair-diff")
    wait(driver, lambda d: note.get_attribute("data-turn") not in (None, ""))
    # QA: the first turns (the same search) agree, the answers differ; search_plan_ood: the finish call (turn 2)
    assert note.get_attribute("data-turn") == "2"
    marked = driver.find_elements("css selector", "#pair-view .msg.first-diff")
    assert len(marked) == 2 and all(m.get_attribute("data-turn") == "2" for m in marked)
    assert a_only[0] in driver.find_element("id", "pair-a").text and "anchor" in driver.find_element("id", "pair-b").text
    assert driver.execute_script("return typeof window.__pwned") == "undefined"
    shot(driver, tmp_path, f"browser_paired_{bench}")
    assert_nothing_left(driver)


# Holds back the <script> of shard arguments[0] (report.js appends one per shard it loads) until window.__release();
# window.__loaded lists the shards that have run since.
HOLD = """const head = document.head, append = head.appendChild.bind(head), src = "/" + arguments[0] + ".js";
    window.__held = [];
    head.appendChild = (node) => (node.src || "").endsWith(src) ? (window.__held.push(node), node) : append(node);
    window.__release = () => { window.__held.splice(0).forEach(append); head.appendChild = append; };
    const shard = window.dtsftShard;
    window.__loaded = [];
    window.dtsftShard = (k, data) => { shard(k, data); window.__loaded.push(k); };"""


def key_of(driver, bench: str, run: str, step: int) -> str:
    return driver.execute_script('return JSON.parse(document.getElementById("dtsft-index").textContent).entries'
                                 '.find((e) => e.bench === arguments[0] && e.run === arguments[1] && e.step === arguments[2]).key',
                                 bench, run, step)


def test_a_shard_that_fails_after_a_newer_choice_leaves_that_choice_shown(study, driver, tmp_path):
    """The paired view and the browser: step 10's list shard is missing (a copy of the report without it) and its
    <script> held back until step 20 has been chosen and shown; when it then fails, the old error no longer writes
    over step 20's view (before: "Error: could not load …/e<K>.js" replaced the 20's summary and status). Chosen
    while current, the failure is still shown."""
    root, res = study
    report = shutil.copytree(res.html.parent, tmp_path / "report")
    driver.get((report / res.html.name).resolve().as_uri())
    wait(driver, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "1")
    key = key_of(driver, "nq", "r2e/seed0", 10)
    (report / "report_data" / f"{key}.js").unlink()
    n = str(len(rows_of(root / "runs" / "r2e" / "seed0" / "eval" / "step-000020", "nq")))
    gone = f'return document.getElementById("shard-{key}") === null'
    for tab, bench, run, step, out in (("tab-paired", "pair-bench", "pair-a-run", "pair-a-step", "pair-summary"),
                                       ("tab-browse", "browse-bench", "browse-run", "browse-step", "browse-status")):
        driver.find_element("id", tab).click()
        select(driver, bench, "nq")
        select(driver, run, "r2e/seed0")
        select(driver, step, "20")
        view = driver.find_element("id", out)
        wait(driver, lambda d: view.get_attribute("data-n") == n and "step 20" in view.text)
        driver.execute_script(HOLD, key)
        select(driver, step, "10")   # its shard's <script> is held: still loading
        assert driver.execute_script("return window.__held.length") == 1 and "loading" in view.text
        select(driver, step, "20")   # the newer choice, from shards already loaded
        wait(driver, lambda d: "step 20" in view.text and "loading" not in view.text)
        shown = view.text
        driver.execute_script("window.__release()")   # now step 10's load fails
        wait(driver, lambda d: d.execute_script(gone))   # its onerror ran (and the rejection's handlers with it)
        assert view.text == shown and "could not load" not in view.text
        select(driver, step, "10")   # chosen again, and current: its failure is what the view says
        wait(driver, lambda d: "could not load" in view.text and f"{key}.js" in view.text)


def test_a_transcript_that_arrives_after_a_newer_item_is_not_shown_and_a_failed_one_says_so(study, driver, tmp_path):
    """The browser and the paired view: item X's transcript shard is held back while another item Z (of another run)
    is opened and shown; X's, arriving then, no longer replaces Z's (before: X's transcript, or X's pair, over the
    newer one with Z's row selected). A transcript shard that fails says so where the transcript goes (before:
    nothing, the previous item's transcript left beside the newly selected row)."""
    root, res = study
    report = shutil.copytree(res.html.parent, tmp_path / "report")
    driver.get((report / res.html.name).resolve().as_uri())
    wait(driver, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "1")
    missing = [key_of(driver, "babyai", "anchor", 0) + "_t0", key_of(driver, "babyai", "r2e/seed0", 10) + "_t0"]
    for k in missing:
        (report / "report_data" / f"{k}.js").unlink()
    ids = [r["id"] for r in rows_of(root / "runs" / "r2e" / "seed0" / "eval" / "step-000020", "nq")]

    def row(table: str, item: str):
        return driver.find_element("css selector", f'#{table} tr[data-id="{item}"]')

    # the browser: X = r2e/seed0 step 20's first item, held; Z = search/seed0's second item
    box, status = driver.find_element("id", "transcript"), driver.find_element("id", "browse-status")
    driver.find_element("id", "tab-browse").click()
    for sel, value in (("browse-bench", "nq"), ("browse-run", "r2e/seed0"), ("browse-step", "20")):
        select(driver, sel, value)
    wait(driver, lambda d: "r2e/seed0 · step 20" in status.text and "loading" not in status.text)
    held = key_of(driver, "nq", "r2e/seed0", 20) + "_t0"
    driver.execute_script(HOLD, held)
    row("item-list", ids[0]).click()
    assert driver.execute_script("return window.__held.length") == 1
    select(driver, "browse-run", "search/seed0")
    wait(driver, lambda d: "search/seed0" in status.text and "loading" not in status.text)
    row("item-list", ids[1]).click()
    wait(driver, lambda d: f"{ids[1]} (search/seed0" in box.text)
    shown = box.text
    driver.execute_script("window.__release()")
    wait(driver, lambda d: held in d.execute_script("return window.__loaded"))
    assert box.text == shown
    # a transcript that cannot load: its error, not the previous item's transcript
    select(driver, "browse-bench", "babyai")
    select(driver, "browse-run", "anchor")
    wait(driver, lambda d: "anchor · step 0 · babyai" in status.text and "loading" not in status.text)
    row("item-list", "babyai-1").click()
    wait(driver, lambda d: "could not load" in box.text and f"{missing[0]}.js" in box.text)

    # the paired view on search_plan_ood: X = (r2e/seed0 20, anchor), the anchor's transcripts held; then Y of
    # (search/seed0 10, r2e/seed0 10)
    summary, note = driver.find_element("id", "pair-summary"), driver.find_element("id", "pair-diff")
    driver.find_element("id", "tab-paired").click()
    for sel, value in (("pair-bench", "search_plan_ood"), ("pair-a-run", "r2e/seed0"), ("pair-a-step", "20"),
                       ("pair-b-run", "anchor")):
        select(driver, sel, value)
    wait(driver, lambda d: "A: r2e/seed0 · step 20" in summary.text and "B: anchor" in summary.text)
    held = key_of(driver, "search_plan_ood", "anchor", 0) + "_t0"
    driver.execute_script(HOLD, held)
    item = driver.find_elements("css selector", "#pair-list tbody tr")[0].get_attribute("data-id")
    row("pair-list", item).click()
    assert driver.execute_script("return window.__held.length") == 1
    select(driver, "pair-a-run", "search/seed0")
    select(driver, "pair-b-run", "r2e/seed0")
    wait(driver, lambda d: "A: search/seed0 · step 10" in summary.text and "B: r2e/seed0 · step 10" in summary.text)
    row("pair-list", item).click()
    pane_a = driver.find_element("id", "pair-a")
    wait(driver, lambda d: "search/seed0 · step 10" in pane_a.text)
    shown = (pane_a.text, driver.find_element("id", "pair-b").text, note.text)
    driver.execute_script("window.__release()")
    wait(driver, lambda d: held in d.execute_script("return window.__loaded"))
    assert (pane_a.text, driver.find_element("id", "pair-b").text, note.text) == shown
    # babyai: r2e/seed0 step 10's transcripts cannot load
    select(driver, "pair-bench", "babyai")
    wait(driver, lambda d: "babyai" in summary.text and "B: r2e/seed0 · step 10" in summary.text)
    row("pair-list", "babyai-1").click()
    wait(driver, lambda d: "could not load" in note.text and f"{missing[1]}.js" in note.text)
    assert pane_a.text == "" and note.get_attribute("data-turn") == ""


# ---- the demo's own report.html: `python -m demo` with a smaller config (docs/stages/analyze.md): the same
# driver, phases and analysis as `make demo` (arms r2e and search, the tiny base, synthqa + search_plan_ood, the
# anchor), with two seeds, 2 training steps (checkpoints 1 and 2) and 4 items per bench and checkpoint
DEMO_ARGS = ["arms=[r2e,search]", "seeds=[0,1]", "steps=2", "save_steps=[1]", "n=8", "bench_n=8", "eval_n=4",
             "max_turns=2", "max_new_tokens=24"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`python -m demo` with DEMO_ARGS, as a user runs it; its last line names the page to open."""
    import subprocess
    import sys

    from conftest import ROOT

    root = tmp_path_factory.mktemp("demo")
    env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="disabled", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "demo", *DEMO_ARGS, f"runs_root={root / 'runs'}", f"out={root / 'reports'}"],
                          cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    page = root / "reports" / "report.html"
    assert last == f"[demo] open in a browser: {page.resolve()}" and page.is_file()
    return root, page


def eval_rows(root: Path, run: str, step: int, bench: str = "synthqa") -> list[dict]:
    from common import layout

    d = root / "runs" / ("_anchor" if run == "anchor" else run) / "eval" / layout.step_name(step)
    return rows_of(d, bench)


def test_the_demos_report_browse_pair_and_filter(demo, driver, tmp_path):
    """The demo's page: an item's transcript as its row holds it; the paired view's counts and filter equal the
    rows' own; for a two-seed arm at its final steps the paired ΔEM equals the report's `paired_em` cell."""
    root, page = demo
    driver.get(page.resolve().as_uri())
    wait(driver, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "1")
    driver.find_element("id", "tab-browse").click()
    select(driver, "browse-bench", "synthqa")
    select(driver, "browse-run", "r2e/seed1")
    select(driver, "browse-step", "2")
    rows = eval_rows(root, "r2e/seed1", 2)
    status = driver.find_element("id", "browse-status")
    wait(driver, lambda d: status.get_attribute("data-n") == str(len(rows)) == "4" and "r2e/seed1 · step 2" in status.text)
    assert f"{sum(r['metrics']['em'] for r in rows):.0f} right by em" in status.text
    assert [tr.get_attribute("data-id") for tr in driver.find_elements("css selector", "#item-list tbody tr")] == [r["id"] for r in rows]
    row = rows[2]
    driver.find_element("css selector", f'#item-list tr[data-id="{row["id"]}"]').click()
    box = driver.find_element("id", "transcript")
    wait(driver, lambda d: row["id"] in box.text)
    assert box.find_element("css selector", ".final-answer").text == (row["prediction"] or "(none)")
    assert box.find_element("css selector", ".golds").text == " | ".join(row["golden_answers"])
    assert len(box.find_elements("css selector", ".msg")) == len(row["messages"])
    assert box.find_element("css selector", ".question").text == row["question"]
    shot(driver, tmp_path, "demo_transcript")

    driver.find_element("id", "tab-paired").click()
    select(driver, "pair-bench", "synthqa")
    select(driver, "pair-a-run", "search/seed0")
    select(driver, "pair-a-step", "2")
    select(driver, "pair-b-run", "anchor")
    a = {r["id"]: r["metrics"]["em"] for r in eval_rows(root, "search/seed0", 2)}
    b = {r["id"]: r["metrics"]["em"] for r in eval_rows(root, "anchor", 0)}
    summary = driver.find_element("id", "pair-summary")
    wait(driver, lambda d: summary.get_attribute("data-n") == str(len(a)) and "search/seed0 · step 2" in summary.text)
    a_only = [i for i in a if a[i] > b[i]]
    b_only = [i for i in a if a[i] < b[i]]
    assert (summary.get_attribute("data-a-only"), summary.get_attribute("data-b-only")) == (str(len(a_only)), str(len(b_only)))
    assert float(summary.get_attribute("data-delta")) == pytest.approx(sum(a[i] - b[i] for i in a) / len(a))
    for value, ids in (("a_only", a_only), ("b_only", b_only), ("all", list(a))):
        select(driver, "pair-filter", value)
        assert [tr.get_attribute("data-id") for tr in driver.find_elements("css selector", "#pair-list tbody tr")] == ids
    first = driver.find_element("css selector", "#pair-list tbody tr")
    first.click()
    note = driver.find_element("id", "pair-diff")
    wait(driver, lambda d: note.get_attribute("data-turn") not in (None, ""))
    assert first.get_attribute("data-id") in driver.find_element("id", "pair-a").text
    shot(driver, tmp_path, "demo_paired_search_seed0")

    # the two-seed arm at its final steps: per item the seeds' EM averaged, as the report's paired table
    select(driver, "pair-a-run", "r2e/seed-mean")
    select(driver, "pair-a-step", "final")
    seeds = [{r["id"]: r["metrics"]["em"] for r in eval_rows(root, f"r2e/seed{s}", 2)} for s in (0, 1)]
    ids = [i for i in seeds[0] if i in seeds[1] and i in b]
    wait(driver, lambda d: "r2e/seed-mean · step final (2, 2)" in summary.text)
    delta = sum((seeds[0][i] + seeds[1][i]) / 2 - b[i] for i in ids) / len(ids)
    assert summary.get_attribute("data-n") == str(len(ids))
    assert float(summary.get_attribute("data-delta")) == pytest.approx(delta)
    md = (root / "reports" / "tables" / "paired_em.md").read_text()
    cell = next(line for line in md.splitlines() if line.startswith("| r2e "))
    assert f"{delta:+.3f} [" in cell and f"n={len(ids)}" in cell   # the report's own number
    assert f"= {delta:+.3f}" in summary.text
    shot(driver, tmp_path, "demo_paired_r2e_seed_mean")
    assert driver.execute_script("return typeof window.__pwned") == "undefined"
    assert_nothing_left(driver)


@pytest.fixture(scope="module")
def two_seed_study(tmp_path_factory):
    """The generated study plus a second `search` seed whose items differ from the first's."""
    from report_html_rows import write_eval_dir
    from test_analysis_helpers import make_run

    from launch.analyze import run_analysis

    root = tmp_path_factory.mktemp("html_two_seeds")
    write_study(root / "runs")
    run = make_run(root / "runs", "search", 1, [10])
    write_eval_dir(run / "eval" / "step-000010", "search1", 10)   # another arm name: another right/wrong pattern
    res = run_analysis({"runs_root": str(root / "runs"), "out": str(root / "reports"), "benches": BENCHES,
                        "evaluate": False, "wandb": False})
    return root, res


def test_paired_seed_mean_equals_the_reports_paired_delta(two_seed_study, driver, tmp_path):
    """A two-seed arm paired with the anchor at its final steps: per item the seeds' EM averaged (0, 0.5 or 1),
    the items higher in A / in B and their margins; Δ = the report's paired_em cell, not one seed's Δ."""
    root, res = two_seed_study
    driver.get(res.html.resolve().as_uri())
    wait(driver, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "1")
    driver.find_element("id", "tab-paired").click()
    select(driver, "pair-bench", "nq")
    runs = [o.get_attribute("value") for o in driver.find_elements("css selector", "#pair-a-run option")]
    assert runs == ["anchor", "r2e/seed0", "search/seed0", "search/seed1", "search/seed-mean"]   # one seed: no mean
    select(driver, "pair-a-run", "search/seed-mean")
    assert [o.get_attribute("value") for o in driver.find_elements("css selector", "#pair-a-step option")] == ["10", "final"]
    select(driver, "pair-a-step", "final")
    select(driver, "pair-b-run", "anchor")
    summary = driver.find_element("id", "pair-summary")
    wait(driver, lambda d: "search/seed-mean · step final (10, 10)" in summary.text and "anchor" in summary.text)
    ev = root / "runs" / "search"
    seeds = [{r["id"]: r["metrics"]["em"] for r in rows_of(ev / f"seed{s}" / "eval" / "step-000010", "nq")} for s in (0, 1)]
    b = {r["id"]: r["metrics"]["em"] for r in rows_of(root / "runs" / "_anchor" / "eval" / "step-000000", "nq")}
    a = {i: (seeds[0][i] + seeds[1][i]) / 2 for i in seeds[0]}
    assert sorted(set(a.values())) == [0.0, 0.5, 1.0]   # the seeds disagree on some items
    higher_a = [i for i in a if a[i] > b[i]]
    higher_b = [i for i in a if a[i] < b[i]]
    delta = sum(a[i] - b[i] for i in a) / len(a)
    assert summary.get_attribute("data-n") == str(len(a))
    assert (summary.get_attribute("data-a-only"), summary.get_attribute("data-b-only")) == (str(len(higher_a)), str(len(higher_b)))
    assert float(summary.get_attribute("data-a-gain")) - float(summary.get_attribute("data-b-gain")) == pytest.approx(delta * len(a))
    assert float(summary.get_attribute("data-delta")) == pytest.approx(delta)
    table = res.tables["paired_em"]
    col = next(k for k, c in enumerate(table.columns) if c.bench == "nq")
    cell = dict(table.rows)["search"][col]
    assert cell.startswith(f"{delta:+.3f} [") and f" n={len(a)}×" in cell   # the report's own paired ΔEM
    one_seed = sum(seeds[0][i] - b[i] for i in a) / len(a)
    assert one_seed != pytest.approx(delta)   # what the per-seed view showed before: not the report's number
    assert f"= {delta:+.3f}" in summary.text
    select(driver, "pair-filter", "a_only")
    assert [tr.get_attribute("data-id") for tr in driver.find_elements("css selector", "#pair-list tbody tr")] == higher_a
    driver.find_element("css selector", f'#pair-list tr[data-id="{higher_a[0]}"]').click()
    wait(driver, lambda d: higher_a[0] in d.find_element("id", "pair-a").text)
    assert "search/seed0" in driver.find_element("id", "pair-a").text   # the first seed's transcript
    shot(driver, tmp_path, "browser_paired_seed_mean")
    assert_nothing_left(driver)
