// report.html's trajectory browser and paired view. Data comes from report_data/*.js shards
// (window.dtsftShard(key, data)), loaded on demand with <script src> (file:// forbids fetch).
// Every string from a row reaches the page through textContent or a text node, never innerHTML.
(function () {
  "use strict";
  const INDEX = JSON.parse(document.getElementById("dtsft-index").textContent);
  const ENTRIES = INDEX.entries;
  const MAX_SHARDS = 48;  // shards kept in memory (least recently used dropped)
  const shards = new Map();
  const waiting = new Map();
  const $ = (id) => document.getElementById(id);

  window.dtsftShard = function (key, data) {
    shards.set(key, data);
    const w = waiting.get(key) || [];
    waiting.delete(key);
    w.forEach((f) => f.resolve(data));
    while (shards.size > MAX_SHARDS) {
      const old = shards.keys().next().value;
      shards.delete(old);
      const s = $("shard-" + old);
      if (s) s.remove();
    }
  };

  function load(key) {
    if (shards.has(key)) {
      const d = shards.get(key);
      shards.delete(key);
      shards.set(key, d);
      return Promise.resolve(d);
    }
    return new Promise((resolve, reject) => {
      if (waiting.has(key)) { waiting.get(key).push({ resolve, reject }); return; }
      waiting.set(key, [{ resolve, reject }]);
      const old = $("shard-" + key);
      if (old) old.remove();
      const s = document.createElement("script");
      s.id = "shard-" + key;
      s.src = INDEX.data + "/" + key + ".js";
      s.onerror = () => {
        const w = waiting.get(key) || [];
        waiting.delete(key);
        s.remove();
        w.forEach((f) => f.reject(new Error("could not load " + s.src)));
      };
      document.head.appendChild(s);
    });
  }

  function el(tag, props, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const c of kids) if (c !== null && c !== undefined) e.append(c);
    return e;
  }

  // v to 3 decimals as Python's format(v, ".3f") writes it (the report's tables): an exact tie, which for a double
  // is v = odd/16, rounds half to even; toFixed rounds it up
  function fixed3(v) {
    const j = v * 16;
    if (Number.isInteger(j) && j % 2 !== 0) {
      const m = Math.floor(Math.abs(v) * 1000);
      return (v < 0 ? "-" : "") + ((m % 2 === 0 ? m : m + 1) / 1000).toFixed(3);
    }
    return v.toFixed(3);
  }

  function fmt(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(3);
    return String(v);
  }

  // ---- tabs
  function show(tab) {
    for (const s of document.querySelectorAll("section.tab")) s.hidden = s.id !== tab;
    for (const b of document.querySelectorAll("nav button")) b.classList.toggle("active", b.dataset.tab === tab);
  }
  for (const b of document.querySelectorAll("nav button")) b.addEventListener("click", () => show(b.dataset.tab));

  // ---- the index
  // A seed-mean run ("<arm>/seed-mean", paired view only) stands for every seed of an arm with two or more
  // (INDEX.means, from analysis.html.seed_means): at step "final" each seed's final checkpoint as the report's
  // paired table takes it (one per seed for the whole row, not each bench's own last step), or the table's
  // reason for its gap; per item the seeds' scores averaged, over the ids every seed has (what
  // analysis.aggregate.paired_vs_anchor pairs).
  const MEAN = "/seed-mean";
  const meanOf = (bench, arm) => (INDEX.means[bench] || {})[arm];
  function runsOf(bench, withMeans) {
    const out = [], means = [];
    for (const e of ENTRIES) {
      if (e.bench !== bench) continue;
      if (!out.includes(e.run)) out.push(e.run);
      if (withMeans && e.run !== "anchor" && meanOf(bench, e.arm) && !means.includes(e.arm + MEAN)) means.push(e.arm + MEAN);
    }
    return out.concat(means);
  }
  function stepsOf(bench, run) {
    if (run.endsWith(MEAN)) {
      const arm = run.slice(0, -MEAN.length), seeds = meanOf(bench, arm).seeds;
      const shared = [...new Set(ENTRIES.filter((e) => e.bench === bench && e.arm === arm).map((e) => e.step))]
        .filter((s) => seeds.every((sd) => ENTRIES.some((e) => e.bench === bench && e.arm === arm && e.seed === sd && e.step === s)));
      return [...shared.sort((a, b) => a - b), "final"];
    }
    return ENTRIES.filter((e) => e.bench === bench && e.run === run).map((e) => e.step).sort((a, b) => a - b);
  }
  function entryOf(bench, run, step) {
    if (run.endsWith(MEAN)) {
      const arm = run.slice(0, -MEAN.length), m = meanOf(bench, arm);
      if (!m) return null;
      if (step === "final" && m.why) return { key: null, arm, bench, run, step, why: m.why };
      const parts = step === "final" ? m.keys.map((k) => ENTRIES.find((e) => e.key === k))
        : m.seeds.map((sd) => ENTRIES.find((e) => e.bench === bench && e.arm === arm && e.seed === sd && e.step === Number(step)));
      if (!parts.length || parts.some((x) => !x)) return null;
      return { key: null, arm, bench, run, step: step === "final" ? "final (" + parts.map((x) => x.step).join(", ") + ")" : Number(step), parts };
    }
    return ENTRIES.find((e) => e.bench === bench && e.run === run && e.step === Number(step)) || null;
  }
  function mean(xs) { return xs.some((x) => x === null || x === undefined) ? null : xs.reduce((a, b) => a + Number(b), 0) / xs.length; }
  async function loadEntry(e) {
    if (!e.parts) return load(e.key);
    const lists = await Promise.all(e.parts.map((x) => load(x.key)));
    const maps = lists.map((l) => new Map(l.map((x) => [x.id, x])));
    return lists[0].filter((x) => maps.every((m) => m.has(x.id))).map((x) => {
      const each = maps.map((m) => m.get(x.id)), m = {};
      for (const k of Object.keys(x.m)) m[k] = typeof x.m[k] === "number" ? mean(each.map((y) => y.m[k])) : x.m[k];
      return { ...x, m, ok: mean(each.map((y) => y.ok)), seeds: each };
    });
  }
  function fill(select, values, fallback) {
    const keep = select.value;
    select.replaceChildren(...values.map((v) => el("option", { value: String(v), text: String(v) })));
    const want = values.map(String).includes(keep) ? keep : (fallback !== undefined ? String(fallback) : String(values[0] ?? ""));
    select.value = want;
  }
  function title(e) { return e.run + " · step " + e.step + " · " + e.bench; }

  // ---- one transcript
  function renderTranscript(box, t, e, markTurn) {
    box.replaceChildren();
    box.append(el("h3", { class: "t-title", text: t.id + " (" + title(e) + ")" }));
    if (t.question) box.append(el("p", { class: "kv" }, el("b", { text: "question: " }), el("span", { class: "question", text: t.question })));
    let turn = 0;
    for (const m of t.messages) {
      const div = el("div", { class: "msg " + m.role });
      let label = m.role + (m.name ? " (" + m.name + ")" : "");
      if (m.role === "assistant") {
        turn += 1;
        label += " turn " + turn;
        div.dataset.turn = String(turn);
        if (turn === markTurn) { div.classList.add("first-diff"); label += ": the first difference"; }
      }
      div.append(el("div", { class: "role", text: label }));
      if (m.reasoning) {
        div.append(el("details", { class: "reasoning" }, el("summary", { text: "reasoning (" + m.reasoning.length + " characters)" }),
          el("pre", { text: m.reasoning })));
      }
      if (m.content) div.append(el("div", { class: "content", text: m.content }));
      for (const c of m.calls || []) div.append(el("div", { class: "call" }, el("b", { text: "call " + c.name + ": " }), el("code", { text: c.args })));
      box.append(div);
    }
    box.append(el("p", { class: "kv" }, el("b", { text: "final answer: " }), el("span", { class: "final-answer", text: t.answer || "(none)" })));
    box.append(el("p", { class: "kv" }, el("b", { text: "gold: " }), el("span", { class: "golds", text: t.golds.join(" | ") || "(none)" })));
    box.append(el("p", { class: "kv" }, el("b", { text: "scores: " }),
      el("span", { class: "scores", text: Object.entries(t.metrics).map(([k, v]) => k + "=" + fmt(v)).join(", ") })));
    box.append(el("p", { class: "kv" }, el("span", { class: "info", text: Object.entries(t.info).map(([k, v]) => k + "=" + fmt(v)).join(", ") })));
  }

  async function transcriptOf(e, item) {
    if (e.parts) return transcriptOf(e.parts[0], item.seeds[0]);   // a seed mean: its first seed's transcript
    const chunk = await load(e.key + "_t" + item.c);
    return chunk.find((x) => x.id === item.id);
  }

  // ---- the trajectory browser
  const bb = $("browse-bench"), br = $("browse-run"), bs = $("browse-step");
  let browseToken = 0, openToken = 0;   // openToken: the item last opened (its transcript alone is drawn)
  function browseControls(level) {
    if (level <= 0) fill(bb, INDEX.benches);
    if (level <= 1) fill(br, runsOf(bb.value));
    if (level <= 2) { const st = stepsOf(bb.value, br.value); fill(bs, st, st[st.length - 1]); }
    loadList();
  }
  async function loadList() {
    const table = $("item-list"), status = $("browse-status");
    table.tHead.replaceChildren();
    table.tBodies[0].replaceChildren();
    const e = entryOf(bb.value, br.value, bs.value);
    if (!e) { status.textContent = "No trajectories."; return; }
    const token = ++browseToken;
    status.textContent = "loading " + title(e) + " …";
    let items;
    try { items = await load(e.key); } catch (err) { if (token === browseToken) status.textContent = String(err); return; }
    if (token !== browseToken) return;
    const scores = INDEX.scores[e.bench] || [];
    table.tHead.append(el("tr", {}, ...["id", "question", ...scores, "turns", "tool calls", "extraction", "stop"].map((h) => el("th", { text: h }))));
    const rows = items.map((item) => {
      const tr = el("tr", { "data-id": item.id },
        el("td", { class: "item-id", text: item.id }), el("td", { text: item.q }),
        ...scores.map((s) => el("td", { class: "score-" + s, text: fmt(item.m[s]) })),
        el("td", { text: fmt(item.turns) }), el("td", { text: fmt(item.calls) }), el("td", { text: fmt(item.rule) }),
        el("td", { text: fmt(item.stop) }));
      tr.addEventListener("click", async () => {
        for (const r of table.tBodies[0].rows) r.classList.remove("selected");
        tr.classList.add("selected");
        const box = $("transcript"), token = ++openToken;
        let t;
        try { t = await transcriptOf(e, item); } catch (err) { if (token === openToken) box.textContent = String(err); return; }
        if (token === openToken) renderTranscript(box, t, e, 0);
      });
      return tr;
    });
    table.tBodies[0].append(...rows);
    const right = items.filter((x) => x.ok === 1).length;
    status.textContent = items.length + " items (" + title(e) + "); " + right + " right by " + INDEX.correct[e.bench];
    status.dataset.n = String(items.length);
  }
  bb.addEventListener("change", () => browseControls(1));
  br.addEventListener("change", () => browseControls(2));
  bs.addEventListener("change", () => browseControls(3));

  // ---- the paired view
  const pb = $("pair-bench"), par = $("pair-a-run"), pas = $("pair-a-step"), pbr = $("pair-b-run"), pbs = $("pair-b-step"), pf = $("pair-filter");
  let pairToken = 0, pairOpened = 0, pairs = [], pairEntries = null;
  function pairControls(level) {
    if (level <= 0) fill(pb, INDEX.benches);
    const runs = runsOf(pb.value, true);
    const trained = runs.filter((r) => r !== "anchor" && !r.endsWith(MEAN));
    if (level <= 1) fill(par, runs, trained.length ? trained[trained.length - 1] : runs[0]);
    if (level <= 1) fill(pbr, runs, runs.includes("anchor") ? "anchor" : runs[0]);
    if (level <= 2) { const st = stepsOf(pb.value, par.value); fill(pas, st, st[st.length - 1]); }   // a seed mean: "final"
    if (level <= 2) { const st = stepsOf(pb.value, pbr.value); fill(pbs, st, st[0]); }
    loadPairs();
  }
  async function loadPairs() {
    const summary = $("pair-summary");
    const ea = entryOf(pb.value, par.value, pas.value), eb = entryOf(pb.value, pbr.value, pbs.value);
    pairs = [];
    pairEntries = null;
    const token = ++pairToken;   // a load still in flight for an earlier choice no longer writes
    const gap = [ea, eb].find((e) => e && e.why);   // the paired table's gap: its reason, no numbers
    if (gap || !ea || !eb) {
      for (const k of Object.keys(summary.dataset)) delete summary.dataset[k];
      summary.textContent = gap ? "No paired items: " + gap.run + " at its final checkpoints: " + gap.why + " (as the paired table)"
        : "Choose two checkpoints with trajectories.";
      renderPairs();
      return;
    }
    summary.textContent = "loading …";
    let A, B;
    try { [A, B] = await Promise.all([loadEntry(ea), loadEntry(eb)]); } catch (err) { if (token === pairToken) summary.textContent = String(err); return; }
    if (token !== pairToken) return;
    const byId = new Map(B.map((x) => [x.id, x]));
    pairs = A.filter((x) => byId.has(x.id) && x.ok !== null && byId.get(x.id).ok !== null).map((x) => ({ a: x, b: byId.get(x.id) }));
    pairEntries = [ea, eb];
    const n = pairs.length;
    // per item "right" is 0/1, or for a seed mean the fraction of seeds right: A-only / B-only are the items
    // higher in A / in B, and their summed margins give the paired Δ (for 0/1 the margins are the counts)
    const aHigher = pairs.filter(FILTERS.a_only), bHigher = pairs.filter(FILTERS.b_only);
    const aGain = aHigher.reduce((s, p) => s + p.a.ok - p.b.ok, 0), bGain = bHigher.reduce((s, p) => s + p.b.ok - p.a.ok, 0);
    const binary = pairs.every((p) => [0, 1].includes(p.a.ok) && [0, 1].includes(p.b.ok));
    const metric = INDEX.correct[ea.bench];
    const delta = n ? (aGain - bGain) / n : null;
    const num = (v) => (Number.isInteger(v) ? String(v) : fixed3(v));
    summary.dataset.n = String(n);
    summary.dataset.aOnly = String(aHigher.length);
    summary.dataset.bOnly = String(bHigher.length);
    summary.dataset.aGain = String(aGain);
    summary.dataset.bGain = String(bGain);
    summary.dataset.delta = delta === null ? "" : String(delta);
    const sides = binary ? "Right (" + metric + ") in A, wrong in B: " + aHigher.length + "; right in B, wrong in A: " + bHigher.length :
      "Higher (" + metric + ", the fraction of seeds right) in A: " + aHigher.length + " items, by " + num(aGain) + " in all; higher in B: " +
      bHigher.length + " items, by " + num(bGain);
    summary.textContent = n + " paired items (A: " + title(ea) + "; B: " + title(eb) + "). " + sides + "; paired Δ" + metric + " = (" +
      num(aGain) + " − " + num(bGain) + ")/" + n + " = " + (delta === null ? "–" : (delta >= 0 ? "+" : "") + fixed3(delta));
    renderPairs();
  }
  const FILTERS = {
    all: () => true,
    a_only: (p) => p.a.ok > p.b.ok,   // 0/1: right in A, wrong in B
    b_only: (p) => p.a.ok < p.b.ok,
    both: (p) => p.a.ok === 1 && p.b.ok === 1,
    neither: (p) => p.a.ok === 0 && p.b.ok === 0,
  };
  function renderPairs() {
    const table = $("pair-list");
    table.tHead.replaceChildren();
    table.tBodies[0].replaceChildren();
    $("pair-a").replaceChildren();
    $("pair-b").replaceChildren();
    $("pair-diff").textContent = "";
    const shown = pairs.filter(FILTERS[pf.value] || FILTERS.all);
    table.dataset.shown = String(shown.length);
    if (!pairEntries) return;
    const metric = INDEX.correct[pairEntries[0].bench];
    table.tHead.append(el("tr", {}, ...["id", "question", "A " + metric, "B " + metric, "A turns", "B turns"].map((h) => el("th", { text: h }))));
    table.tBodies[0].append(...shown.map((p) => {
      const tr = el("tr", { "data-id": p.a.id },
        el("td", { class: "item-id", text: p.a.id }), el("td", { text: p.a.q }),
        el("td", { class: p.a.ok === 1 ? "ok" : p.a.ok === 0 ? "wrong" : "partial", text: fmt(p.a.m[metric]) }),
        el("td", { class: p.b.ok === 1 ? "ok" : p.b.ok === 0 ? "wrong" : "partial", text: fmt(p.b.m[metric]) }),
        el("td", { text: fmt(p.a.turns) }), el("td", { text: fmt(p.b.turns) }));
      tr.addEventListener("click", () => openPair(p, tr));
      return tr;
    }));
  }
  function firstDifference(ta, tb) {
    const a = ta.messages.filter((m) => m.role === "assistant"), b = tb.messages.filter((m) => m.role === "assistant");
    for (let i = 0; i < Math.max(a.length, b.length); i++) {
      if (i >= a.length || i >= b.length) return i + 1;
      if (JSON.stringify([a[i].content, a[i].calls || []]) !== JSON.stringify([b[i].content, b[i].calls || []])) return i + 1;
    }
    return 0;
  }
  async function openPair(p, tr) {
    const [ea, eb] = pairEntries, token = ++pairOpened, choice = pairToken;
    const current = () => token === pairOpened && choice === pairToken;   // no other item or checkpoints chosen since
    for (const r of $("pair-list").tBodies[0].rows) r.classList.remove("selected");
    tr.classList.add("selected");
    const note = $("pair-diff");
    let ta, tb;
    try { [ta, tb] = await Promise.all([transcriptOf(ea, p.a), transcriptOf(eb, p.b)]); } catch (err) {
      if (!current()) return;
      $("pair-a").replaceChildren();
      $("pair-b").replaceChildren();
      note.dataset.turn = "";
      note.textContent = String(err);
      return;
    }
    if (!current()) return;
    const turn = firstDifference(ta, tb);
    note.dataset.turn = String(turn);
    note.textContent = turn ? "The first assistant turn whose text or tool calls differ: turn " + turn + " (marked)." :
      "Every assistant turn is the same under A and B.";
    renderTranscript($("pair-a"), ta, ea.parts ? ea.parts[0] : ea, turn);   // a seed mean: its first seed's run
    renderTranscript($("pair-b"), tb, eb.parts ? eb.parts[0] : eb, turn);
  }
  pb.addEventListener("change", () => pairControls(1));
  par.addEventListener("change", () => pairControls(2));
  pbr.addEventListener("change", () => pairControls(2));
  pas.addEventListener("change", loadPairs);
  pbs.addEventListener("change", loadPairs);
  pf.addEventListener("change", renderPairs);

  browseControls(0);
  pairControls(0);
  document.body.dataset.ready = "1";
})();
