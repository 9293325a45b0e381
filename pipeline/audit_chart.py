"""The audit's chart: per-consumer load and latency in one PNG, for a person who would rather look than read.

Draws from the report alone (pipeline.audit_report), with matplotlib's Agg backend (no display).
Three panels share one bar per (queue, consumer): deliveries (accepted and not), groups received,
and latency percentiles on a log scale. The title says ok or FAILED and which invariants broke.
"""

from __future__ import annotations

from pathlib import Path

BARS_MAX = 40  # consumers drawn; the busiest are kept
WIDTH_IN = 12.0
PANEL_HEIGHT_IN = 3.0
DPI = 110
BAR_WIDTH = 0.6
VALUES_SHOWN_BARS_MAX = 16  # bars labelled with their value; more would overlap


def draw(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    single_queue = len(report["queues"]) == 1
    bars = [(queue["queue"], consumer) for queue in report["queues"] for consumer in queue["per_consumer"]]
    bars.sort(key=lambda bar: -bar[1]["deliveries"])
    shown = sorted(bars[:BARS_MAX], key=lambda bar: (bar[0], str(bar[1]["consumer"])))
    labels = [str(c["consumer"]) if single_queue else f"{q}\n{c['consumer']}" for q, c in shown]
    positions = list(range(len(shown)))

    figure, (load, groups, latency) = pyplot.subplots(3, 1, figsize=(WIDTH_IN, 3 * PANEL_HEIGHT_IN + 1.2),
                                                      sharex=True, constrained_layout=True)
    figure.suptitle(_title(report, len(bars), len(shown)), fontsize=12,
                    color="black" if report["ok"] else "firebrick")

    from matplotlib.ticker import FuncFormatter, MaxNLocator

    accepted = [c["accepted"] for _, c in shown]
    other = [c["deliveries"] - c["accepted"] for _, c in shown]
    load.bar(positions, accepted, BAR_WIDTH, color="tab:blue", label="accepted")
    bars = load.bar(positions, other, BAR_WIDTH, bottom=accepted, color="tab:orange",
                    label="dropped, released\nor rejected")
    if len(shown) <= VALUES_SHOWN_BARS_MAX:
        load.bar_label(bars, labels=[f"{c['deliveries']:,}" for _, c in shown], fontsize=8)
    load.set_ylabel("deliveries")
    load.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)

    bars = groups.bar(positions, [c["groups"] for _, c in shown], BAR_WIDTH, color="tab:green")
    if len(shown) <= VALUES_SHOWN_BARS_MAX:
        groups.bar_label(bars, fontsize=8)
    groups.set_ylabel("groups received")
    for axes in (load, groups):
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
        axes.grid(axis="y", alpha=0.3)
        axes.margins(y=0.15)

    _latency_bars(latency, shown, positions)
    latency.set_xticks(positions, labels, rotation=0 if len(shown) <= 12 else 60, fontsize=8)
    figure.savefig(path, dpi=DPI)
    pyplot.close(figure)


def _latency_bars(axes, shown: list, positions: list[int]) -> None:
    width = BAR_WIDTH / 4
    series = [("receive_to_settle_ms", "p50", "receive->settle p50", "tab:cyan", -1.5),
              ("receive_to_settle_ms", "p99", "receive->settle p99", "tab:blue", -0.5),
              ("send_to_receive_ms", "p50", "send->receive p50", "tab:pink", 0.5),
              ("send_to_receive_ms", "p99", "send->receive p99", "tab:red", 1.5)]
    drawn = False
    for key, percentile, label, color, offset in series:
        # a log axis cannot show 0 ms: such bars are drawn at 0.5 ms, below the 1 ms line
        values = [max((c[key] or {}).get(percentile) or 0, 0.5) if c[key] else 0 for _, c in shown]
        if any(values):
            axes.bar([p + offset * width for p in positions], values, width, color=color, label=label)
            drawn = True
    axes.set_yscale("log")
    axes.set_ylim(bottom=0.4)
    axes.set_ylabel("latency (ms, log)")
    axes.grid(axis="y", alpha=0.3, which="major")
    if drawn:
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    else:
        axes.text(0.5, 0.5, "no latency: no settled deliveries", transform=axes.transAxes, ha="center")


def _title(report: dict, consumers: int, shown: int) -> str:
    totals = report["totals"]
    verdict = "ok" if report["ok"] else "FAILED: " + ", ".join(report["broken"][:4]) + (
        " ..." if len(report["broken"]) > 4 else "")
    sends = "no send logs" if totals["sent"] is None else f"{totals['sent']:,} sends"
    more = f" (the {shown} busiest of {consumers} shown)" if shown < consumers else ""
    return (f"Delivery audit {verdict}\n{totals['deliveries']:,} deliveries, {sends}, "
            f"{len(report['queues'])} queue(s), per consumer{more}")
