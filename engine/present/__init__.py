"""Presentation: records as rows, tables, figures and reports. Reads records; never runs a model.

columns.py declares every column once (unit, definition, chart); rows.py turns records into rows;
printers.py formats them; the other modules shape data for one view each.
"""
from engine.present.capacity import CAPACITY_LABELS, PLAN_LABELS, capacity_rows, plan_rows
from engine.present.columns import (BY_NAME as COLUMNS_BY_NAME, CHARTS, COLUMNS, PM_DEFINITION, VIEWS, Cell, Column,
                                    definitions, display, family_label, for_view, noise_label, plus_minus,
                                    step_path, step_reasons, table_cells)
from engine.present.compare import (DIFF_METRICS, available_charts, chart_series, diff_table, frontier_line,
                                    highlights, missing_charts, noise_note, pareto_frontier, pct_diff, report_diff)
from engine.present.drift import drifts
from engine.present.figures import (acceptance_figure, bar_figure, bytes_quality_figure, error_bars,
                                    expected_length_figure, kv_figure, memory_figure, pareto_axes, pareto_figure)
from engine.present.labels import eta_text, machine_rows, noisy_configs, run_choice_label
from engine.present.memory_view import activation_bytes, kv_cache_bytes, kv_grid, memory_breakdown
from engine.present.printers import format_rows
from engine.present.quality_view import bytes_points
from engine.present.rows import (CategoryView, category_rows, category_views, detail, display_rows, row, rows,
                                 view_columns, with_bounds, with_half_widths)
from engine.present.spec_view import acceptance_rows, expected_length_curve, spec_summary
from engine.present.stream import ORIGINS, legend_html, origin_counts, token_spans_html


def comparison_rows(records, usd_per_hour: float) -> list[dict]:
    """Rows for the comparison views, priced at usd_per_hour."""
    return rows(records, usd_per_hour)


__all__ = [n for n in dir() if not n.startswith("_")]
