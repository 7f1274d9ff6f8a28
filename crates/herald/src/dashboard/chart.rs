//! Charts as server-rendered SVG: nothing loads from elsewhere and nothing runs. Every
//! series is told apart by more than colour (failed bars are hatched; latency lines are
//! solid, dashed and dotted and labelled at their end), every bar group and point carries
//! its numbers as a hover title, and the same numbers follow in a table.

use maud::{Markup, PreEscaped, html};

use crate::clock::Millis;

/// A chart's x axis: one slot per period, `start` and `period_ms` apart.
pub struct Axis {
    pub starts: Vec<Millis>,
    pub period_ms: Millis,
}

/// One series: its name and a value per slot (`None`: nothing measured then).
pub struct Series<'a> {
    pub name: &'a str,
    pub values: Vec<Option<f64>>,
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 200.0;
const LEFT: f64 = 52.0;
const RIGHT: f64 = 44.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 24.0;

/// Stacked bars (the first series at the bottom, the others hatched in turn), one group per
/// slot with anything in it.
pub fn stacked_bars(id: &str, caption: &str, axis: &Axis, series: &[Series<'_>], unit: &str) -> Markup {
    let totals: Vec<f64> =
        (0..axis.starts.len()).map(|i| series.iter().map(|s| s.values[i].unwrap_or(0.0)).sum()).collect();
    let frame = Frame::new(axis, nice_ceiling(totals.iter().copied().fold(0.0, f64::max)));
    html! {
        figure.chart #(id) {
            figcaption { (caption) }
            svg viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } role="img" aria-labelledby={ (id) "-title" } {
                title #{ (id) "-title" } { (caption) }
                defs { (hatch(id)) }
                (frame.grid(unit))
                @for i in (0..axis.starts.len()).filter(|i| totals[*i] > 0.0) {
                    g.slot data-start=(axis.starts[i]) {
                        title { (slot_label(axis, i)) ": " (numbers(series, i, unit)) }
                        @for (k, base, value) in stack(series, i) { (frame.bar(i, base, value, k, id)) }
                    }
                }
            }
            (legend(series, LegendKind::Bars))
            (table(axis, series, unit))
        }
    }
}

/// Horizontal bars, one per labelled value, largest first as given (the slowest endpoints).
pub fn ranked_bars(id: &str, caption: &str, rows: &[(String, f64)], unit: &str) -> Markup {
    let top = nice_ceiling(rows.iter().map(|(_, v)| *v).fold(0.0, f64::max));
    let row_height = 22.0;
    let height = TOP + BOTTOM + row_height * rows.len().max(1) as f64;
    let label_width = 260.0;
    let scale = |v: f64| (WIDTH - label_width - RIGHT) * (v / top).clamp(0.0, 1.0);
    html! {
        figure.chart #(id) {
            figcaption { (caption) }
            svg viewBox={ "0 0 " (WIDTH) " " (fmt(height)) } role="img" aria-labelledby={ (id) "-title" } {
                title #{ (id) "-title" } { (caption) }
                @for (i, (label, value)) in rows.iter().enumerate() {
                    @let y = TOP + row_height * i as f64;
                    g.slot {
                        title { (label) ": " (format_value(*value, unit)) }
                        text.row-label x=(fmt(label_width - 8.0)) y=(fmt(y + 15.0)) { (shorten(label, 40)) }
                        rect class="bar s0" x=(fmt(label_width)) y=(fmt(y + 3.0)) width=(fmt(scale(*value).max(1.0)))
                            height=(fmt(row_height - 6.0)) {}
                        text.value-label x=(fmt(label_width + scale(*value) + 6.0)) y=(fmt(y + 15.0)) {
                            (format_value(*value, unit))
                        }
                    }
                }
            }
            details.numbers {
                summary { "The numbers" }
                table {
                    thead { tr { th scope="col" { "Endpoint" } th scope="col" { "p95" } } }
                    tbody { @for (label, value) in rows { tr { th scope="row" { (label) } td { (format_value(*value, unit)) } } } }
                }
            }
        }
    }
}

/// The bars of slot `i`, bottom up: (series, base, value) of each series with a value.
fn stack(series: &[Series<'_>], i: usize) -> Vec<(usize, f64, f64)> {
    let mut base = 0.0;
    let mut bars = vec![];
    for (k, s) in series.iter().enumerate() {
        let value = s.values[i].unwrap_or(0.0);
        if value > 0.0 {
            bars.push((k, base, value));
        }
        base += value;
    }
    bars
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let kept: String = text.chars().take(max - 1).collect();
    format!("{kept}…")
}

/// Lines, one per series, solid, dashed and dotted in turn, each point a circle with its
/// numbers on hover; a missing value breaks the line.
pub fn lines(id: &str, caption: &str, axis: &Axis, series: &[Series<'_>], unit: &str) -> Markup {
    let top = nice_ceiling(series.iter().flat_map(|s| s.values.iter().flatten().copied()).fold(0.0, f64::max));
    let frame = Frame::new(axis, top);
    html! {
        figure.chart #(id) {
            figcaption { (caption) }
            svg viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } role="img" aria-labelledby={ (id) "-title" } {
                title #{ (id) "-title" } { (caption) }
                (frame.grid(unit))
                @for (k, s) in series.iter().enumerate() {
                    @for run in runs(&s.values) {
                        @if run.len() > 1 {
                            polyline class={ "line l" (k) } points=(frame.points(&run)) {}
                        }
                    }
                    @for (i, value) in s.values.iter().enumerate() {
                        @if let Some(v) = value {
                            circle class={ "pt l" (k) } cx=(fmt(frame.x_mid(i))) cy=(fmt(frame.y(*v))) r="3" {
                                title { (slot_label(axis, i)) " · " (s.name) ": " (format_value(*v, unit)) }
                            }
                        }
                    }
                    @if let Some((i, v)) = s.values.iter().enumerate().rev().find_map(|(i, v)| v.map(|v| (i, v))) {
                        text.end-label x=(fmt(frame.x_mid(i) + 6.0)) y=(fmt(frame.y(v) + 4.0)) { (s.name) }
                    }
                }
            }
            (legend(series, LegendKind::Lines))
            (table(axis, series, unit))
        }
    }
}

/// Where things go inside the SVG.
struct Frame {
    slots: usize,
    top: f64,
    period_ms: Millis,
    first: Millis,
}

impl Frame {
    fn new(axis: &Axis, top: f64) -> Self {
        let first = axis.starts.first().copied().unwrap_or(0);
        Self { slots: axis.starts.len().max(1), top, period_ms: axis.period_ms, first }
    }

    fn slot_width(&self) -> f64 {
        (WIDTH - LEFT - RIGHT) / self.slots as f64
    }

    fn x_mid(&self, i: usize) -> f64 {
        LEFT + self.slot_width() * (i as f64 + 0.5)
    }

    fn y(&self, value: f64) -> f64 {
        let plot = HEIGHT - TOP - BOTTOM;
        HEIGHT - BOTTOM - plot * (value / self.top).clamp(0.0, 1.0)
    }

    fn bar(&self, i: usize, base: f64, value: f64, series: usize, id: &str) -> Markup {
        let width = (self.slot_width() * 0.8).max(1.0);
        let (y0, y1) = (self.y(base), self.y(base + value));
        let x = self.x_mid(i) - width / 2.0;
        let fill = (series > 0).then(|| format!("url(#{id}-hatch{})", series.min(2)));
        html! {
            rect class={ "bar s" (series) } x=(fmt(x)) y=(fmt(y1)) width=(fmt(width)) height=(fmt((y0 - y1).max(0.5)))
                fill=[fill] {}
        }
    }

    fn points(&self, run: &[(usize, f64)]) -> String {
        run.iter()
            .map(|(i, v)| format!("{},{}", fmt(self.x_mid(*i)).0, fmt(self.y(*v)).0))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Gridlines at 0, half and the top, and time labels at about six places.
    fn grid(&self, unit: &str) -> Markup {
        let every = (self.slots / 6).max(1);
        html! {
            g.grid {
                @for fraction in [0.0, 0.5, 1.0] {
                    @let y = self.y(self.top * fraction);
                    line x1=(fmt(LEFT)) x2=(fmt(WIDTH - RIGHT)) y1=(fmt(y)) y2=(fmt(y)) {}
                    text.y-label x=(fmt(LEFT - 6.0)) y=(fmt(y + 4.0)) { (format_value(self.top * fraction, unit)) }
                }
                @for i in (0..self.slots).step_by(every) {
                    text.x-label x=(fmt(self.x_mid(i))) y=(fmt(HEIGHT - 6.0)) {
                        (tick_label(self.first + i as i64 * self.period_ms, self.period_ms))
                    }
                }
            }
        }
    }
}

/// Diagonal hatching for the second series and cross-hatching for the third.
fn hatch(id: &str) -> Markup {
    html! {
        pattern #{ (id) "-hatch1" } width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)" {
            rect.hatch-bg width="6" height="6" {}
            line.hatch x1="0" y1="0" x2="0" y2="6" {}
        }
        pattern #{ (id) "-hatch2" } width="6" height="6" patternUnits="userSpaceOnUse" {
            rect.hatch-bg2 width="6" height="6" {}
            path.hatch d="M0,0 L6,6 M6,0 L0,6" {}
        }
    }
}

enum LegendKind {
    Bars,
    Lines,
}

fn legend(series: &[Series<'_>], kind: LegendKind) -> Markup {
    html! {
        ul.legend {
            @for (k, s) in series.iter().enumerate() {
                li {
                    svg.swatch viewBox="0 0 24 12" aria-hidden="true" {
                        @match kind {
                            LegendKind::Bars => { rect class={ "swatch-bar s" (k) } width="24" height="12" {} }
                            LegendKind::Lines => { line class={ "line l" (k) } x1="0" y1="6" x2="24" y2="6" {} }
                        }
                    }
                    (s.name)
                }
            }
        }
    }
}

/// The numbers behind the chart, the periods with anything in them.
fn table(axis: &Axis, series: &[Series<'_>], unit: &str) -> Markup {
    let rows: Vec<usize> =
        (0..axis.starts.len()).filter(|i| series.iter().any(|s| s.values[*i].is_some_and(|v| v > 0.0))).collect();
    html! {
        details.numbers {
            summary { "The numbers (" (rows.len()) " of " (axis.starts.len()) " periods had any; UTC)" }
            table {
                thead { tr { th scope="col" { "Period" } @for s in series { th scope="col" { (s.name) } } } }
                tbody {
                    @for i in rows {
                        tr {
                            th scope="row" { (slot_label(axis, i)) }
                            @for s in series { td { (s.values[i].map(|v| format_value(v, unit)).unwrap_or_else(|| "—".into())) } }
                        }
                    }
                }
            }
        }
    }
}

/// Consecutive runs of present values, as (slot, value).
fn runs(values: &[Option<f64>]) -> Vec<Vec<(usize, f64)>> {
    let mut runs = vec![vec![]];
    for (i, v) in values.iter().enumerate() {
        match v {
            Some(v) => runs.last_mut().expect("never empty").push((i, *v)),
            None if runs.last().is_some_and(|r| !r.is_empty()) => runs.push(vec![]),
            None => {}
        }
    }
    runs.into_iter().filter(|r| !r.is_empty()).collect()
}

fn numbers(series: &[Series<'_>], i: usize, unit: &str) -> String {
    series
        .iter()
        .map(|s| format!("{} {}", format_value(s.values[i].unwrap_or(0.0), unit), s.name))
        .collect::<Vec<_>>()
        .join(", ")
}

fn format_value(v: f64, unit: &str) -> String {
    match unit {
        "ms" if v >= 10_000.0 => format!("{:.0} s", v / 1000.0),
        "ms" if v > 0.0 && v < 10.0 => format!("{v:.1} ms"),
        "ms" => format!("{v:.0} ms"),
        _ => format!("{v:.0}"),
    }
}

/// The period a slot covers, e.g. "2026-12-01 14:00–15:00".
fn slot_label(axis: &Axis, i: usize) -> String {
    let start = axis.starts[i];
    let from = utc(start, "%Y-%m-%d %H:%M");
    let to = utc(start + axis.period_ms, "%H:%M");
    format!("{from}–{to}")
}

fn tick_label(at: Millis, period_ms: Millis) -> String {
    if period_ms >= 3_600_000 && at.rem_euclid(86_400_000) == 0 { utc(at, "%b %d") } else { utc(at, "%H:%M") }
}

fn utc(at: Millis, format: &str) -> String {
    chrono::DateTime::from_timestamp_millis(at).map(|t| t.format(format).to_string()).unwrap_or_default()
}

/// The smallest of 1, 2, 2.5 or 5 times a power of ten at or above `max` (at least 1).
fn nice_ceiling(max: f64) -> f64 {
    if max <= 1.0 || !max.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * power).find(|v| *v >= max).unwrap_or(10.0 * power)
}

/// Coordinates with one decimal, enough for a 720-wide picture.
fn fmt(v: f64) -> PreEscaped<String> {
    PreEscaped(format!("{v:.1}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axis(n: usize) -> Axis {
        Axis { starts: (0..n as i64).map(|h| h * 3_600_000).collect(), period_ms: 3_600_000 }
    }

    #[test]
    fn bars_are_drawn_for_the_periods_with_traffic_only_and_carry_their_numbers() {
        let series = [
            Series { name: "succeeded", values: vec![Some(3.0), Some(0.0), Some(5.0), None] },
            Series { name: "failed", values: vec![Some(1.0), Some(0.0), Some(0.0), None] },
        ];
        let svg = stacked_bars("c", "Deliveries", &axis(4), &series, "").into_string();
        assert_eq!(svg.matches("<g class=\"slot\"").count(), 2);
        assert_eq!(svg.matches("class=\"bar s1\"").count(), 1, "one failed bar, hatched");
        assert!(svg.contains("fill=\"url(#c-hatch1)\""));
        assert!(svg.contains("1970-01-01 00:00–01:00: 3 succeeded, 1 failed"), "{svg}");
    }

    #[test]
    fn a_gap_breaks_a_line_and_every_value_is_a_point() {
        let series = [Series { name: "p95", values: vec![Some(10.0), Some(20.0), None, Some(30.0)] }];
        let svg = lines("l", "Latency", &axis(4), &series, "ms").into_string();
        assert_eq!(svg.matches("<circle").count(), 3);
        assert_eq!(svg.matches("<polyline").count(), 1, "the lone last point has no line");
        assert!(svg.contains("p95: 30 ms"));
    }

    #[test]
    fn the_scale_ends_at_a_round_number() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(nice_ceiling(180.0), 200.0);
        assert_eq!(nice_ceiling(2100.0), 2500.0);
    }
}
