"""The dashboard's one stylesheet and one script (allowed by hash in the CSP: keep them constants)."""

CSS = """
:root { --ink: #1d2430; --muted: #5f6b7a; --line: #dfe3ea; --bg: #f6f7f9; --card: #fff; --accent: #2f6fdb;
  --spent: #d9822b; --base: #9aa5b1; --client: #8e9aaf; --fwd: #2f6fdb; --cached: #2bb673;
  --warn: #e0b400; --prune: #e07b00; --refuse: #d64545; --pass: #2bb673; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
  background: var(--bg); }
header { display: flex; align-items: center; gap: 24px; padding: 10px 24px; background: #1d2430;
  color: #fff; }
header .brand { font-weight: 700; letter-spacing: .02em; }
header nav a { color: #c9d3e0; text-decoration: none; margin-right: 16px; }
header nav a.on, header nav a:hover { color: #fff; border-bottom: 2px solid var(--accent); }
header .logout { margin-left: auto; }
main { padding: 16px 24px 48px; max-width: 1500px; }
h1 { font-size: 20px; margin: 8px 0 16px; }
h2 { font-size: 16px; margin: 28px 0 10px; }
a { color: var(--accent); }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 10px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; }
.card .label { color: var(--muted); font-size: 12px; }
.card .value { font-size: 20px; font-weight: 600; font-variant-numeric: tabular-nums; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; background: var(--card); border: 1px solid var(--line); }
th, td { padding: 5px 8px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: #eef1f5; font-weight: 600; font-size: 12px; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.empty td { color: var(--muted); text-align: center; }
tbody tr:hover { background: #f3f6fb; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 14px; }
.chart { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 8px 12px; }
.chart h3 { font-size: 13px; margin: 2px 0 4px; }
.legend { font-size: 12px; color: var(--muted); }
.legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin: 0 4px 0 10px; }
svg { display: block; width: 100%; height: auto; }
svg text { font: 10px system-ui, sans-serif; fill: var(--muted); }
svg .grid { stroke: var(--line); }
.spent { fill: var(--spent); background: var(--spent); }
.baseline { fill: var(--base); background: var(--base); }
.client { fill: var(--client); background: var(--client); }
.forwarded { fill: var(--fwd); background: var(--fwd); }
.cached { fill: var(--cached); background: var(--cached); }
.g-pass { fill: var(--pass); } .g-warn { fill: var(--warn); } .g-prune { fill: var(--prune); }
.g-refuse { fill: var(--refuse); } .g-command, .g-other { fill: var(--base); }
.event { fill: #6b4fbb; } svg text.event-n { fill: #fff; font-size: 9px; }
.filters { display: flex; flex-wrap: wrap; gap: 8px; align-items: end; margin: 0 0 12px; }
.filters label { font-size: 12px; color: var(--muted); display: flex; flex-direction: column; }
input, select, button { font: inherit; padding: 4px 8px; border: 1px solid var(--line); border-radius: 6px; }
button { background: var(--accent); color: #fff; border-color: var(--accent); cursor: pointer; }
.badge { display: inline-block; font-size: 11px; padding: 1px 6px; border-radius: 9px; background: #e8ecf2;
  color: var(--ink); margin-right: 4px; white-space: nowrap; }
.badge.kept { background: #e8ecf2; } .badge.evicted { background: #fde2e2; color: #9b1c1c; }
.badge.summary, .badge.replaced { background: #dbeafe; color: #1e40af; }
.badge.masked { background: #fef3c7; color: #92400e; }
.badge.injected { background: #dcfce7; color: #166534; }
.badge.internal { background: #ede9fe; color: #5b21b6; } .badge.rewritten { background: #f1f5f9; }
.badge.g-warn { background: #fef9c3; } .badge.g-prune { background: #ffedd5; }
.badge.g-refuse { background: #fde2e2; } .badge.g-pass { background: #dcfce7; }
.compare { display: grid; grid-template-columns: 1fr 1fr; gap: 14px; }
@media (max-width: 1000px) { .compare { grid-template-columns: 1fr; } }
.msg { background: var(--card); border: 1px solid var(--line); border-left: 4px solid var(--line);
  border-radius: 6px; padding: 6px 10px; margin: 0 0 8px; }
.msg.evicted { border-left-color: var(--refuse); opacity: .75; }
.msg.replaced { border-left-color: var(--fwd); }
.msg.summary { border-left-color: var(--fwd); } .msg.masked { border-left-color: var(--prune); }
.msg.injected { border-left-color: var(--pass); } .msg.internal { border-left-color: #6b4fbb; }
.msg .meta { font-size: 12px; color: var(--muted); margin-bottom: 4px; }
details.evicted-run { border-left: 4px solid var(--refuse); background: #fff5f5; border-radius: 6px;
  padding: 6px 10px; margin: 0 0 8px; }
details.evicted-run[open] summary { margin-bottom: 6px; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; font: 12px/1.4 ui-monospace, Menlo, Consolas,
  monospace; background: #f8fafc; border: 1px solid var(--line); border-radius: 6px; padding: 8px; }
.msg pre { max-height: 320px; overflow: auto; }
dl.pairs { display: grid; grid-template-columns: max-content 1fr; gap: 3px 14px; margin: 0 0 14px; }
details summary { cursor: pointer; color: var(--muted); font-size: 12px; }
dl.pairs dt { color: var(--muted); } dl.pairs dd { margin: 0; font-variant-numeric: tabular-nums; }
.boxes { display: grid; grid-template-columns: repeat(auto-fit, minmax(260px, 1fr)); gap: 14px;
  margin-bottom: 14px; }
.box { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; }
.box h3 { font-size: 13px; margin: 0 0 6px; }
.muted, .note { color: var(--muted); font-size: 12px; }
.problem { background: #fde2e2; border: 1px solid #f5b5b5; padding: 10px; border-radius: 6px; }
.hit { background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: 8px 10px;
  margin-bottom: 8px; }
.login { max-width: 380px; background: var(--card); border: 1px solid var(--line); border-radius: 8px;
  padding: 16px; display: flex; flex-direction: column; gap: 10px; }
"""

# Live filtering of a table by the text box that names it (data-filter="<table id>"); the server-side
# filter (the same box submitted) works without it.
SCRIPT = """
document.querySelectorAll('input[data-filter]').forEach(function (box) {
  var table = document.getElementById(box.dataset.filter);
  if (!table) { return; }
  var rows = table.querySelectorAll('tbody tr');
  box.addEventListener('input', function () {
    var q = box.value.trim().toLowerCase();
    rows.forEach(function (row) { row.hidden = q !== '' && row.textContent.toLowerCase().indexOf(q) < 0; });
  });
});
"""
