"""The dashboard's pages (Jinja2, autoescaped), its stylesheet and its one script, kept in this module so they ship
with the package without package-data rules and are served by the broker itself (no CDN, no Node build)."""

from __future__ import annotations

from jinja2 import DictLoader, Environment, select_autoescape

CSS = """
:root { --fg:#1b1f24; --muted:#57606a; --bg:#fff; --line:#d0d7de; --accent:#0b5cad; --bad:#a40e26; --ok:#116329; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg);
       margin: 0; }
a { color: var(--accent); }
a:focus, button:focus, input:focus, select:focus { outline: 3px solid #f2a100; outline-offset: 2px; }
.skip { position: absolute; left: -999px; } .skip:focus { left: 8px; top: 8px; background: #fff; padding: 4px; }
header { display: flex; gap: 1.5rem; align-items: center; padding: .6rem 1.2rem; border-bottom: 1px solid var(--line); }
header nav ul { display: flex; gap: 1rem; list-style: none; margin: 0; padding: 0; }
header .who { margin-left: auto; color: var(--muted); }
main { padding: 1rem 1.2rem; max-width: 1280px; }
table { border-collapse: collapse; width: 100%; margin: .5rem 0 1.5rem; }
caption { text-align: left; font-weight: 600; padding: .3rem 0; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #f6f8fa; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.state { font-weight: 600; } .state-failed, .state-cancelled { color: var(--bad); }
.state-running, .state-succeeded { color: var(--ok); }
pre.log { background: #0d1117; color: #e6edf3; padding: .8rem; max-height: 28rem; overflow: auto; font-size: 13px; }
.muted { color: var(--muted); } .bad { color: var(--bad); } .ok { color: var(--ok); }
meter { width: 12rem; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1rem; }
dt { font-weight: 600; } dd { margin: 0; }
form.login { max-width: 28rem; display: grid; gap: .6rem; }
input[type=password], input[type=text] { padding: .4rem; font: inherit; width: 100%; }
button { padding: .4rem .9rem; font: inherit; cursor: pointer; }
svg.chart { width: 100%; max-width: 960px; height: auto; border: 1px solid var(--line); }
"""

# Follows a job's log: reads the NDJSON stream the dashboard serves (same origin, the session cookie) and appends
# each line as it comes; the <pre> is an aria-live region so a screen reader hears new lines too.
LOG_JS = """
(function () {
  const pre = document.getElementById('log');
  if (!pre) return;
  const status = document.getElementById('log-status');
  const decoder = new TextDecoder();
  fetch(pre.dataset.src, {credentials: 'same-origin'}).then(async (resp) => {
    if (!resp.ok) { status.textContent = 'log unavailable (' + resp.status + ')'; return; }
    status.textContent = 'following';
    const reader = resp.body.getReader();
    let buf = '';
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += decoder.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf('\\n')) >= 0) {
        const line = buf.slice(0, i); buf = buf.slice(i + 1);
        if (!line.trim()) continue;
        const l = JSON.parse(line);
        const row = document.createElement('span');
        row.className = 'line line-' + l.stream;
        row.textContent = (l.rank ? '[' + l.rank + '] ' : '') + l.text + '\\n';
        pre.appendChild(row);
        pre.scrollTop = pre.scrollHeight;
      }
    }
    status.textContent = 'ended';
  }).catch(() => { status.textContent = 'disconnected'; });
})();
"""

BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }} · Lockstep</title><link rel="stylesheet" href="{{ prefix }}/static/ui.css"></head>
<body><a class="skip" href="#main">Skip to content</a>
<header><strong>Lockstep</strong>
{% if who %}<nav aria-label="Main"><ul>
<li><a href="{{ prefix }}/">Jobs</a></li><li><a href="{{ prefix }}/tenants">Spend</a></li>
<li><a href="{{ prefix }}/offers">Offers</a></li><li><a href="{{ prefix }}/prices">Prices</a></li>
<li><a href="{{ prefix }}/providers">Providers</a></li></ul></nav>
<span class="who">{{ who.tenant }} ({{ who.role.value }})</span>
<form method="post" action="{{ prefix }}/logout"><button type="submit">Log out</button></form>{% endif %}
</header>
<main id="main" tabindex="-1"><h1>{{ title }}</h1>{% block body %}{% endblock %}</main></body></html>
"""

LOGIN = """{% extends "base.html" %}{% block body %}
{% if error %}<p class="bad" role="alert">{{ error }}</p>{% endif %}
<form class="login" method="post" action="{{ prefix }}/login">
<label for="token">API token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required autofocus
       aria-describedby="token-help">
<small id="token-help" class="muted">A token from <code>lockstep tokens create</code>. It is kept in an HttpOnly
session cookie for this site only.</small>
<button type="submit">Log in</button></form>{% endblock %}
"""

JOBS = """{% extends "base.html" %}{% block body %}
<table><caption>{{ jobs|length }} most recent jobs{% if scope %} of tenant {{ scope }}{% endif %}</caption>
<thead><tr><th scope="col">Job</th><th scope="col">Name</th>{% if not scope %}<th scope="col">Tenant</th>{% endif %}
<th scope="col">State</th><th scope="col">Where</th><th scope="col" class="num">Spend (USD)</th>
<th scope="col">Last event</th><th scope="col">Updated</th></tr></thead><tbody>
{% for j in jobs %}<tr data-job="{{ j.id }}"><td><a href="{{ prefix }}/jobs/{{ j.id }}">{{ j.id }}</a></td>
<td>{{ j.spec.name }}</td>{% if not scope %}<td>{{ j.tenant }}</td>{% endif %}
<td class="state state-{{ j.state.value }}">{{ j.state.value }}</td><td>{{ where(j) }}</td>
<td class="num">{{ usd(j.spent_usd + j.accruing_usd) }}</td><td>{{ j.reason|truncate(90) }}</td>
<td>{{ when(j.updated_at) }}</td></tr>
{% else %}<tr><td colspan="8">No jobs yet: <code>lockstep submit job.yaml</code>.</td></tr>{% endfor %}
</tbody></table>{% endblock %}
"""

JOB = """{% extends "base.html" %}{% block body %}
<dl><dt>State</dt><dd class="state state-{{ job.state.value }}">{{ job.state.value }} — {{ job.reason }}</dd>
<dt>Tenant</dt><dd>{{ job.tenant }}</dd><dt>Where</dt><dd>{{ where(job) }}</dd>
<dt>Spend</dt><dd>${{ usd(job.spent_usd) }} booked, ${{ usd(job.accruing_usd) }} accruing</dd>
<dt>Attempts / preemptions</dt><dd>{{ job.attempts }} / {{ job.preemptions }}</dd></dl>
<h2 id="log-title">Live log</h2>
<p class="muted">Status: <span id="log-status" role="status">connecting</span></p>
<pre id="log" class="log" aria-labelledby="log-title" aria-live="polite" tabindex="0"
     data-src="{{ prefix }}/jobs/{{ job.id }}/log"></pre>
<table><caption>Events</caption><thead><tr><th scope="col">At</th><th scope="col">From</th><th scope="col">To</th>
<th scope="col">Reason</th></tr></thead><tbody>
{% for e in job.events %}<tr><td>{{ when(e.at) }}</td><td>{{ e.from_state.value if e.from_state else "" }}</td>
<td>{{ e.to_state.value }}</td><td>{{ e.reason }}</td></tr>{% endfor %}</tbody></table>
<table><caption>Allocations</caption><thead><tr><th scope="col">Provider</th><th scope="col">State</th>
<th scope="col">Region</th><th scope="col" class="num">USD/h</th><th scope="col" class="num">Cost</th></tr></thead>
<tbody>{% for a in allocations %}<tr><td>{{ a.provider }}</td><td>{{ a.state.value }}</td><td>{{ a.region }}</td>
<td class="num">{{ "%.3f"|format(a.usd_per_hour) }}</td>
<td class="num">{{ usd(a.cost_usd) if a.cost_usd is not none else "accruing" }}</td></tr>
{% else %}<tr><td colspan="5">None yet.</td></tr>{% endfor %}</tbody></table>
<script src="{{ prefix }}/static/log.js"></script>{% endblock %}
"""

TENANTS = """{% extends "base.html" %}{% block body %}
<table><caption>Month-to-date spend (UTC calendar month) against budget</caption>
<thead><tr><th scope="col">Tenant</th><th scope="col" class="num">Spent (USD)</th><th scope="col" class="num">Budget
</th><th scope="col">Used</th><th scope="col" class="num">GPU cap</th></tr></thead><tbody>
{% for t in tenants %}<tr data-tenant="{{ t.name }}"><td>{{ t.name }}</td>
<td class="num spend">{{ usd(t.month_to_date_usd) }}</td>
<td class="num">{{ "%.2f"|format(t.monthly_budget_usd) if t.monthly_budget_usd is not none else "none" }}</td>
<td>{% if t.monthly_budget_usd %}<meter min="0" max="{{ t.monthly_budget_usd }}" low="{{ t.monthly_budget_usd * 0.8 }}"
 high="{{ t.monthly_budget_usd * 0.99 }}" value="{{ t.month_to_date_usd }}"
 aria-label="{{ t.name }}: share of budget used">{{ "%.0f"|format(100 * t.month_to_date_usd / t.monthly_budget_usd) }}%
</meter> {{ "%.0f"|format(100 * t.month_to_date_usd / t.monthly_budget_usd) }}%{% else %}—{% endif %}</td>
<td class="num">{{ t.max_gpus if t.max_gpus is not none else "none" }}</td></tr>{% endfor %}</tbody></table>
{% endblock %}
"""

OFFERS = """{% extends "base.html" %}{% block body %}
<form method="get"><label for="gpu">GPU model</label> <input id="gpu" name="gpu" type="text" value="{{ gpu or '' }}"
 style="width:12rem"> <button type="submit">Filter</button></form>
<table><caption>GPUs on offer</caption><thead><tr><th scope="col">GPU</th><th scope="col">Markets</th>
<th scope="col" class="num">Offers</th><th scope="col" class="num">$/GPU-h from</th></tr></thead><tbody>
{% for g in gpus %}<tr><td>{{ g.gpu }}</td>
<td>{{ g.markets|map(attribute="market")|map(attribute="value")|join(", ") }}</td>
<td class="num">{{ g.markets|sum(attribute="offers") }}</td>
<td class="num">{{ "%.2f"|format(g.markets|map(attribute="min_usd_per_gpu_hour")|min) if g.markets else "" }}</td></tr>
{% endfor %}</tbody></table>
<table><caption>The {{ offers|length }} cheapest offers per GPU-hour</caption><thead><tr><th scope="col">Provider</th>
<th scope="col">Market</th><th scope="col">SKU</th><th scope="col">GPU</th><th scope="col" class="num">GPUs</th>
<th scope="col">Region</th><th scope="col" class="num">$/GPU-h</th><th scope="col">Price source</th>
<th scope="col">Age</th></tr></thead><tbody>
{% for o in offers %}<tr><td>{{ o.provider }}</td><td>{{ o.market.value }}</td><td>{{ o.sku }}</td><td>{{ o.gpu }}</td>
<td class="num">{{ o.gpu_count }}</td><td>{{ o.region }}</td>
<td class="num">{{ "%.3f"|format(o.usd_per_gpu_hour) }}</td>
<td>{{ o.source.value }}{% if o.stale %} (stale){% endif %}</td><td>{{ age(o.observed_at) }}</td></tr>{% endfor %}
</tbody></table>{% endblock %}
"""

PRICES = """{% extends "base.html" %}{% block body %}
<form method="get"><label for="gpu">GPU model</label> <input id="gpu" name="gpu" type="text" value="{{ gpu }}"
 style="width:12rem"> <button type="submit">Show</button></form>
{% if chart %}<figure><svg class="chart" viewBox="0 0 {{ chart.w }} {{ chart.h }}" role="img"
 aria-labelledby="chart-title"><title id="chart-title">{{ gpu }} prices, USD per hour, last 7 days</title>
<line x1="50" y1="{{ chart.h - 30 }}" x2="{{ chart.w - 10 }}" y2="{{ chart.h - 30 }}" stroke="#888"/>
<line x1="50" y1="10" x2="50" y2="{{ chart.h - 30 }}" stroke="#888"/>
<text x="46" y="16" text-anchor="end" font-size="11">{{ "%.2f"|format(chart.top) }}</text>
<text x="46" y="{{ chart.h - 30 }}" text-anchor="end" font-size="11">{{ "%.2f"|format(chart.bottom) }}</text>
<text x="50" y="{{ chart.h - 12 }}" font-size="11">{{ chart.start }}</text>
<text x="{{ chart.w - 10 }}" y="{{ chart.h - 12 }}" text-anchor="end" font-size="11">{{ chart.end }}</text>
{% for s in chart.lines %}<polyline fill="none" stroke="{{ s.color }}" stroke-width="1.5" points="{{ s.points }}"/>
{% endfor %}</svg><figcaption>{% for s in chart.lines %}<span style="color:{{ s.color }}">■</span> {{ s.label }}
{% endfor %}</figcaption></figure>
{% else %}<p>No recorded prices for {{ gpu }} in the last 7 days (the price tracker records them while
<code>lockstep serve</code> runs).</p>{% endif %}{% endblock %}
"""

PROVIDERS = """{% extends "base.html" %}{% block body %}
<table><caption>Providers' health</caption><thead><tr><th scope="col">Provider</th><th scope="col">Status</th>
<th scope="col" class="num">Offers</th><th scope="col">Last success</th><th scope="col">Circuit</th>
<th scope="col">Notes</th></tr></thead><tbody>
{% for name, h in providers.items() %}<tr><td>{{ name }}</td>
<td class="{{ 'ok' if h.ok and not h.stale else 'bad' }}">{{ "ok" if h.ok else "failing" }}
{%- if h.stale %}, stale{% endif %}
</td><td class="num">{{ h.offers }}</td><td>{{ age(h.last_ok) ~ " ago" if h.last_ok else "never" }}</td>
<td>{{ h.circuit.state.value }}{% if h.circuit.failures %} ({{ h.circuit.failures }} failures){% endif %}</td>
<td>{{ (h.notes + ([h.last_error] if h.last_error else []))|join("; ") }}</td></tr>{% endfor %}
</tbody></table>{% endblock %}
"""

ENV = Environment(
    loader=DictLoader({"base.html": BASE, "login.html": LOGIN, "jobs.html": JOBS, "job.html": JOB,
                       "tenants.html": TENANTS, "offers.html": OFFERS, "prices.html": PRICES,
                       "providers.html": PROVIDERS}),
    autoescape=select_autoescape(default=True, default_for_string=True),
)
