//! PNG figures drawn like the studies': throughput against loss on a log axis (R0), and
//! per-stream plus total bars (R1). Text goes through ab_glyph with a DejaVu font from the
//! system; without one the figures are skipped (CSV and JSON still carry every number).

use anyhow::Result;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::CoordTranslate;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;
use timing::plot::{err, legend};

/// The font from `timing::plot` (it draws R3's timeline); said once when there is none.
fn fonts_ready() -> bool {
    static SAID: Once = Once::new();
    let ready = timing::plot::fonts_ready();
    if !ready {
        SAID.call_once(|| {
            eprintln!(
                "lab: no DejaVu font (apt-get install fonts-dejavu-core); PNG figures skipped"
            )
        });
    }
    ready
}

const COLORS: &[RGBColor] = &[
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(127, 127, 127),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
];

type Chart<'a, CT> = ChartContext<'a, BitMapBackend<'a>, CT>;
type Linear<'a> = Chart<'a, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A chart on `$root` (filled white first) titled `$title` (`$caption` points), with
/// `$x_area` pixels for the x axis's labels and 70 for the y axis's, over `$x` and `$y`.
/// A macro, not a function: through a function's signature the chart's borrow of the area
/// would have to outlive the area's backend, which is dropped (and flushed) at the caller's
/// end; written in place, the borrow checker sees the two apart.
macro_rules! frame {
    ($root:expr, $title:expr, $caption:expr, $x_area:expr, $x:expr, $y:expr) => {{
        $root.fill(&WHITE).map_err(err)?;
        ChartBuilder::on($root)
            .caption($title, ("sans-serif", $caption))
            .margin(15)
            .x_label_area_size($x_area)
            .y_label_area_size(70)
            .build_cartesian_2d($x, $y)
            .map_err(err)?
    }};
}

/// The mesh of a linear chart with both axes described, labels in `label` points and the
/// descriptions two points larger.
fn axes(chart: &mut Linear<'_>, x_desc: &str, y_desc: &str, label: u32) -> Result<()> {
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style(("sans-serif", label))
        .axis_desc_style(("sans-serif", label + 2))
        .draw()
        .map_err(err)
}

/// The largest of `floor` and one coordinate (`at`) of every point of `series`.
fn largest(series: &[(String, Vec<(f64, f64)>)], at: fn(&(f64, f64)) -> f64, floor: f64) -> f64 {
    series
        .iter()
        .flat_map(|(_, p)| p.iter().map(at))
        .fold(floor, f64::max)
}

/// The link's rate as a dashed line from `x.0` to `x.1`, labelled in the legend.
fn ceiling<CT: CoordTranslate<From = (f64, f64)>>(
    chart: &mut Chart<'_, CT>,
    x: (f64, f64),
    link: f64,
    label: String,
) -> Result<()> {
    chart
        .draw_series(DashedLineSeries::new(
            [(x.0, link), (x.1, link)],
            6,
            4,
            BLACK.mix(0.5).stroke_width(1),
        ))
        .map_err(err)?
        .label(label)
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.5)));
    Ok(())
}

/// One line per series through its points (sorted by x), each point a dot; `width` of a
/// series by its name.
fn lines_with_points<CT: CoordTranslate<From = (f64, f64)>>(
    chart: &mut Chart<'_, CT>,
    series: &[(String, Vec<(f64, f64)>)],
    width: fn(&str) -> u32,
) -> Result<()> {
    for (i, (name, pts)) in series.iter().enumerate() {
        let mut pts = pts.clone();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(width(name))))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(3)));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
            .map_err(err)?;
    }
    Ok(())
}

/// Throughput (Mbit/s) against loss (%) with a log x axis; one line per series. `link` is
/// drawn as a dashed ceiling.
pub fn loss_chart(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
    link: f64,
) -> Result<()> {
    if !fonts_ready() {
        return Ok(());
    }
    let xs = series.iter().flat_map(|(_, p)| p.iter().map(|x| x.0));
    let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (lo, hi) = if lo > hi {
        (0.001, 10.0)
    } else {
        (lo / 2.0, hi * 2.0)
    };
    let root = BitMapBackend::new(path, (1100, 700)).into_drawing_area();
    let mut chart = frame!(&root, title, 24, 50, (lo..hi).log_scale(), 0.0..link * 1.05);
    chart
        .configure_mesh()
        .x_desc("random packet loss (%)")
        .y_desc("throughput (Mbit/s)")
        .x_label_formatter(&|x| format!("{x}"))
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()
        .map_err(err)?;
    ceiling(
        &mut chart,
        (lo, hi),
        link,
        format!("link rate {link} Mbit/s"),
    )?;
    // The iperf3 references thin: the network's ceiling, not a contender.
    lines_with_points(&mut chart, series, |name| {
        if name.starts_with("iperf3") {
            1
        } else {
            3
        }
    })?;
    legend(&mut chart, SeriesLabelPosition::UpperRight, 16)?;
    root.present().map_err(err)?;
    Ok(())
}

pub struct BarGroup {
    pub label: String,
    /// Per-stream values (% of the bottleneck).
    pub streams: Vec<f64>,
    pub total: f64,
    pub note: String,
}

/// Groups of per-stream bars followed by a total bar, all in % of the bottleneck.
pub fn bars(path: &Path, title: &str, groups: &[BarGroup]) -> Result<()> {
    if !fonts_ready() {
        return Ok(());
    }
    let width = 6.0; // four streams, the total, a gap
    let n = groups.len() as f64;
    let top = groups.iter().map(|g| g.total).fold(100.0, f64::max) * 1.12;
    let root = BitMapBackend::new(path, (1300, 700)).into_drawing_area();
    let mut chart = frame!(&root, title, 22, 40, 0.0..n * width, 0.0..top);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("% of the bottleneck")
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()
        .map_err(err)?;
    let stream_color = RGBColor(31, 119, 180);
    let total_color = RGBColor(214, 39, 40);
    for (gi, g) in groups.iter().enumerate() {
        let x0 = gi as f64 * width + 0.5;
        for (si, v) in g.streams.iter().enumerate() {
            let x = x0 + si as f64;
            chart
                .draw_series([Rectangle::new(
                    [(x + 0.1, 0.0), (x + 0.9, *v)],
                    stream_color.mix(0.8).filled(),
                )])
                .map_err(err)?;
        }
        let xt = x0 + 4.0;
        chart
            .draw_series([Rectangle::new(
                [(xt + 0.1, 0.0), (xt + 0.9, g.total)],
                total_color.mix(0.85).filled(),
            )])
            .map_err(err)?;
        chart
            .draw_series([Text::new(
                format!("{:.1} %", g.total),
                (xt - 0.2, g.total + top * 0.035),
                ("sans-serif", 15),
            )])
            .map_err(err)?;
        chart
            .draw_series([
                Text::new(g.label.clone(), (x0, top * 0.985), ("sans-serif", 15)),
                Text::new(g.note.clone(), (x0, top * 0.95), ("sans-serif", 14)),
            ])
            .map_err(err)?;
    }
    // The key: a swatch and its words for each colour.
    for (words, color, y) in [
        ("each stream", stream_color, 0.80),
        ("total (link use)", total_color, 0.75),
    ] {
        chart
            .draw_series([Rectangle::new(
                [(0.2, top * y), (0.5, top * (y + 0.03))],
                color.filled(),
            )])
            .map_err(err)?;
        chart
            .draw_series([Text::new(
                words,
                (0.6, top * (y + 0.035)),
                ("sans-serif", 14),
            )])
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Throughput (Mbit/s) over time (s), one thin line per stream and a thick one for the
/// link (the last series), as R2's Fig. 6; `link` is drawn as a dashed ceiling.
pub fn time_chart(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
    link: f64,
) -> Result<()> {
    if !fonts_ready() {
        return Ok(());
    }
    let t_max = largest(series, |p| p.0, 1.0);
    let y_max = largest(series, |p| p.1, link) * 1.08;
    let root = BitMapBackend::new(path, (1100, 650)).into_drawing_area();
    let mut chart = frame!(&root, title, 20, 45, 0.0..t_max + 1.0, 0.0..y_max);
    axes(&mut chart, "time (s)", "throughput (Mbit/s)", 15)?;
    ceiling(
        &mut chart,
        (0.0, t_max + 1.0),
        link,
        format!("bottleneck {link:.0} Mbit/s"),
    )?;
    let last = series.len().saturating_sub(1);
    for (i, (name, pts)) in series.iter().enumerate() {
        let (c, w) = if i == last {
            (BLACK, 3)
        } else {
            (COLORS[i % COLORS.len()], 1)
        };
        let labelled = i == last || series.len() <= 9;
        let s = chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(w)))
            .map_err(err)?;
        if labelled {
            s.label(name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(3)));
        }
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight, 14)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Throughput (Mbit/s) against added delay (ms) on a linear axis, one line per series,
/// as R4's Fig. 3; Reservoir's series thick, the others thin. `link` is a dashed ceiling.
pub fn delay_chart(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
    link: f64,
) -> Result<()> {
    if !fonts_ready() {
        return Ok(());
    }
    let x_max = largest(series, |p| p.0, 4.0);
    let root = BitMapBackend::new(path, (1100, 700)).into_drawing_area();
    let mut chart = frame!(&root, title, 22, 50, -0.5..x_max + 0.5, 0.0..link * 1.05);
    axes(
        &mut chart,
        "delay added each way (ms)",
        "throughput (Mbit/s)",
        16,
    )?;
    ceiling(
        &mut chart,
        (-0.5, x_max + 0.5),
        link,
        format!("link rate {link} Mbit/s"),
    )?;
    lines_with_points(&mut chart, series, |name| {
        if name.starts_with("Reservoir") {
            3
        } else {
            1
        }
    })?;
    legend(&mut chart, SeriesLabelPosition::LowerLeft, 14)?;
    root.present().map_err(err)?;
    Ok(())
}
