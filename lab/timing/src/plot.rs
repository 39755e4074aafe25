//! The timeline as R3's figures draw it: each data packet of the busier direction as a
//! short vertical stroke at its departure time, from its first to its last byte of
//! sequence space, and the ACKs that came back as a line; panels side by side (plaintext
//! beside TLS). I/O: writes a PNG.

use anyhow::{anyhow, Result};
use plotters::coord::CoordTranslate;
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::Path;
use std::sync::OnceLock;

use crate::analysis::{Connection, Direction};

const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers DejaVu Sans as "sans-serif" once; false when no font file is found. The lab's
/// figures draw with it too.
pub fn fonts_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        let Some(bytes) = FONTS.iter().find_map(|p| std::fs::read(p).ok()) else {
            return false;
        };
        // The registry wants 'static bytes; one font for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
    })
}

/// A plotters error (its error types carry the backend's) as ours.
pub fn err(e: impl std::fmt::Debug) -> anyhow::Error {
    anyhow!("{e:?}")
}

/// The series' legend, boxed, at `at` in `size`-point text.
pub fn legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
    at: SeriesLabelPosition,
    size: u32,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(at)
        .label_font(("sans-serif", size))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// One panel: a title and a connection (analysed with its packets kept).
pub struct Panel<'a> {
    pub title: String,
    pub conn: &'a Connection,
}

/// The direction that carried more payload, and its name.
pub fn busier(c: &Connection) -> (&Direction, &'static str) {
    if c.to_client.payload_bytes >= c.to_server.payload_bytes {
        (&c.to_client, "server → client")
    } else {
        (&c.to_server, "client → server")
    }
}

/// Draws `panels` side by side over the window `[from_ms, from_ms + span_ms]` of capture
/// time (`None`: each panel's whole data span).
pub fn timeline(
    path: &Path,
    panels: &[Panel<'_>],
    from_ms: Option<f64>,
    span_ms: Option<f64>,
) -> Result<()> {
    if !fonts_ready() {
        return Err(anyhow!(
            "no DejaVu font to draw with (apt-get install fonts-dejavu-core)"
        ));
    }
    if panels.is_empty() {
        return Err(anyhow!("nothing to draw: no TCP connection with data"));
    }
    let w = 700 * panels.len() as u32;
    let root = BitMapBackend::new(path, (w.max(800), 650)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((1, panels.len()));
    for (area, panel) in areas.iter().zip(panels) {
        let (dir, name) = busier(panel.conn);
        let first = dir.points.first().map_or(0.0, |p| p.t_ns as f64 / 1e6);
        let last = dir.points.last().map_or(1.0, |p| p.t_ns as f64 / 1e6);
        let lo = from_ms.unwrap_or(first);
        let hi = span_ms.map_or(last, |s| lo + s).max(lo + 1e-3);
        let pts: Vec<_> = dir
            .points
            .iter()
            .filter(|p| {
                let t = p.t_ns as f64 / 1e6;
                t >= lo && t <= hi
            })
            .collect();
        let base = pts.iter().map(|p| p.seq).min().unwrap_or(0);
        let top = pts
            .iter()
            .map(|p| p.seq + u64::from(p.len))
            .max()
            .unwrap_or(base + 1);
        let kib = |x: u64| x.saturating_sub(base) as f64 / 1024.0;
        let y_max = kib(top).max(1.0) * 1.03;
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(lo..hi, 0.0..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("capture time (ms)")
            .y_desc(format!("sequence, {name} (KiB)"))
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 15))
            .draw()
            .map_err(err)?;
        let data = RGBColor(31, 119, 180);
        let retr = RGBColor(214, 39, 40);
        chart
            .draw_series(pts.iter().map(|p| {
                let t = p.t_ns as f64 / 1e6;
                let c = if p.retransmit { retr } else { data };
                PathElement::new(
                    [(t, kib(p.seq)), (t, kib(p.seq + u64::from(p.len)))],
                    c.stroke_width(2),
                )
            }))
            .map_err(err)?
            .label("data packet (its sequence range)")
            .legend(move |(x, y)| {
                PathElement::new([(x + 10, y - 6), (x + 10, y + 6)], data.stroke_width(2))
            });
        let acks: Vec<(f64, f64)> = dir
            .acks
            .iter()
            .map(|&(t, a)| (t as f64 / 1e6, a))
            .filter(|&(t, a)| t >= lo && t <= hi && a >= base)
            .map(|(t, a)| (t, kib(a)))
            .collect();
        let ack_c = RGBColor(44, 160, 44);
        chart
            .draw_series(LineSeries::new(acks, ack_c.stroke_width(1)))
            .map_err(err)?
            .label("ACK received")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], ack_c.stroke_width(2)));
        legend(&mut chart, SeriesLabelPosition::UpperLeft, 13)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
