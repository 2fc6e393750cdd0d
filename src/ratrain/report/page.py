"""The report's one HTML page: the run's table, its pictures, and what could not be shown.
Self-contained: inline CSS, no scripts; the pictures are PNG files beside it."""

from __future__ import annotations

from html import escape
from pathlib import Path

from ratrain.byte_units import decimal_bytes
from ratrain.report import run_figures
from ratrain.schedule.outer_sync import parse_sync

CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1250px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; font-size: 0.92em; }
th { text-align: left; padding: 3px 14px 3px 0; color: #555; font-weight: 600; vertical-align: top; }
td { padding: 3px 0; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.4em 0; }
.pair { display: flex; flex-wrap: wrap; gap: 1em; } .pair img { max-width: 610px; }
.notes { color: #7a5a00; font-size: 0.9em; } code { background: #f4f4f4; padding: 0 3px; }
"""


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def run_table(run, sim, timeline_step: tuple[float, float | None, str] | None
              ) -> list[tuple[str, str]]:
    """(label, value) rows of the run's table, as plain text."""
    from ratrain.models.params import count_params

    cfg, s, t, p = run.cfg, run.summary, run.cfg.train, run.cfg.parallel
    m = cfg.model
    last = run.metrics[-1]
    plan = run.plan
    rows = [("model", f"{m.name}: {count_params(m) / 1e6:,.2f}M parameters, {m.n_layers} layers, "
                      f"dim {m.dim}, {m.n_heads} heads ({m.n_kv_heads} kv), vocab {m.vocab_size}"),
            ("training", f"{last['step']} steps of {t.global_batch} x {t.seq_len} tokens, {t.dtype}"
                         + (f" ({run_figures.stopped(run)})" if not s else ""))]
    if plan is not None:
        schedule = (plan.schedule + (f" ({plan.weight_grad})" if plan.weight_grad else "")
                    + (f" in groups of {plan.micro_batch_group}"
                       if plan.micro_batch_group > 1 else ""))
        rows.append(("layout", f"pp={plan.pp} x dp={plan.dp} ({plan.rank_order}), {plan.policy} "
                               f"policy, {schedule}, {plan.n_micro} micro-batches of "
                               f"{t.micro_batch_size} per replica"))
        outer = parse_sync(plan.sync)
        if outer is not None:
            rows.append(("sync", f"--sync {plan.sync}: no gradient sum every step; outer Nesterov "
                                 f"lr {t.outer_lr:g}, momentum {t.outer_momentum:g}"
                                 + (f", mix {t.outer_mix:g}" if outer.streaming else "")
                                 + "; the loss is the replicas' mean on their local weights, the "
                                 "validation loss the outer parameters'"))
        made = f"plan file {p.plan_file}" if p.plan_file else "built from the flags"
        activation = ["/".join(sorted(set(a))) for a in plan.activation] \
            if isinstance(plan.activation, list) else [str(plan.activation)]
        rows.append(("plan", f"{made}; units per stage "
                             f"{', '.join(str(len(r)) for r in plan.stage_units)}; activations "
                             f"{', '.join(activation)}; state on {plan.state_home}"
                             + plan.on_device_text
                             + (f", sharded{f' in groups of {plan.shard_group}' if plan.shard_group else ''}"
                                f" (gradient lifetime {plan.grad_lifetime})"
                                if plan.shard_state else "")
                             + (f"; view window {plan.view_window}" if plan.view_window is not None else "")
                             + ("; gradients summed over the replicas on the device before they "
                                "fold to the host" if plan.device_grad_sum else "")))
    elif run.plain_engine:
        rows.append(("layout", run.no_plan))
    else:  # a damaged run directory: what its config says, not a guess at the rest
        rows.append(("layout", f"pp={p.pp} x dp={p.dp} ({p.rank_order}) by config.yaml; "
                               f"{run.no_plan}"))
    tps, of = run_figures.tokens_per_s(run)
    rows.append(("tokens/s", (f"{tps:,.0f}" if tps is not None else "n/a") + f" ({of})"))
    m = run_figures.mfu(run)
    rows.append(("MFU", _pct(m.mfu) + (f" of {m.peak_flops / 1e9:,.1f} GFLOP/s peak; "
                                       f"{(m.flops_per_token or 0) / 1e6:,.2f} MFLOP per token"
                                       if m.peak_flops else "")
                 + (f" ({m.source})" if m.source else "")))
    if timeline_step:
        measured, simulated, which = timeline_step
        text = f"measured {measured * 1e3:,.1f} ms ({which})"
        if simulated is not None:
            on = sim.profile + (f", {sim.of}" if sim.of else "")
            text += (f", simulated {simulated * 1e3:,.1f} ms ({on}): error "
                     f"{(simulated - measured) / measured:+.1%}")
        rows.append(("step time", text))
    ledger = run_figures.per_stage(run, "ledger_peak_bytes")
    rss = run_figures.per_stage(run, "rss_growth_bytes")
    parts = []
    for stage in range(max(len(ledger or []), len(rss or []))):
        held = f"held {decimal_bytes(ledger[stage])}" if ledger else ""
        grown = f"RSS +{decimal_bytes(rss[stage])}" if rss else ""
        parts.append(f"stage {stage}: " + ", ".join(x for x in (held, grown) if x))
    peak = run_figures.process_peak(run)
    if peak is not None:
        parts.append(f"process peak {decimal_bytes(peak)}")
    if run.budget_bytes:
        parts.append(f"plan's budget {decimal_bytes(run.budget_bytes)}")
    rows.append(("peak memory", "; ".join(parts) or "n/a"))
    val = run_figures.validation(run)
    text = f"{s.get('final_loss', last['loss']):.4f}"
    if val:
        text += f", validation loss {val[0]:.4f}" + (f" (after step {val[1]})"
                                                     if val[1] != last["step"] else "")
    rows.append(("final loss", text))
    return rows


def write_page(run, out_dir: Path, table: list[tuple[str, str]],
               pictures: list[tuple[str, Path, str]]) -> Path:
    """index.html in out_dir; `pictures`: (heading, file, caption)."""
    run_dir = run.run_dir
    rel = lambda name: escape(Path("..", name).as_posix()) if (run_dir / name).exists() else None
    links = [f'<a href="{rel(n)}">{escape(n)}</a>' + extra for n, extra in
             (("metrics.jsonl", ""), ("summary.json", ""), ("config.yaml", ""), ("plan.json", ""),
              ("trace.json", " (open in ui.perfetto.dev to zoom in)")) if rel(n)]
    html = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            f"<title>ratrain report: {escape(run_dir.name)}</title>", f"<style>{CSS}</style>",
            "</head><body>", f"<h1>ratrain run {escape(run_dir.name)}</h1>",
            f'<p class="sub">{escape(str(run_dir.resolve()))}</p>', "<table>"]
    html += [f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in table]
    html.append("</table>")
    if links:
        html.append("<p>Files: " + " · ".join(links) + "</p>")
    curves = [pic for pic in pictures if pic[1].name in ("loss.png", "throughput.png")]
    others = [pic for pic in pictures if pic not in curves]
    if curves:
        html.append('<h2>Loss and throughput</h2><div class="pair">')
        html += [_img(path, caption) for _, path, caption in curves]
        html.append("</div>")
    for heading, path, caption in others:
        html += [f"<h2>{escape(heading)}</h2>", _img(path, caption)]
    if run.notes:
        html.append('<h2>Not shown</h2><ul class="notes">')
        html += [f"<li>{escape(n)}</li>" for n in run.notes]
        html.append("</ul>")
    html.append("</body></html>")
    path = out_dir / "index.html"
    path.write_text("\n".join(html) + "\n")
    return path


def _img(path: Path, caption: str) -> str:
    return (f'<figure style="margin:0"><img src="{escape(path.name)}" alt="{escape(caption)}">'
            f"<figcaption class=\"sub\">{escape(caption)}</figcaption></figure>")
