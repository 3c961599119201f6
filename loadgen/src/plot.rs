//! SVG charts drawn with plotters: throughput over time (one line per run) and latency by
//! percentile (several runs on one chart, the x axis stretched towards the tail the way
//! HdrHistogram's plotter does: 1/(1-p) on a log scale).

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::path::Path;

use crate::stats::SeriesPoint;

/// Chart size in pixels: readable on a README page without scrolling.
const SIZE: (u32, u32) = (900, 520);
/// Rightmost percentile shown: 99.999% (1/(1-p) = 1e5); rarer points are drawn there.
const MAX_X: f64 = 1e5;
/// Line colours, cycled.
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing the chart: {e}")
}

/// Acks per second over the measured window, one line per run.
pub fn throughput(path: &Path, title: &str, runs: &[(String, Vec<SeriesPoint>)]) -> Result<()> {
    let max_t = runs
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.t_s + 1))
        .max()
        .unwrap_or(1) as f64;
    let max_y = runs
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.acks))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.1;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..max_t, 0f64..max_y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds into the measured window")
        .y_desc("msgs/s (acks)")
        .y_label_formatter(&|v| crate::report::thousands(*v))
        .draw()
        .map_err(err)?;
    for (i, (label, series)) in runs.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        // Each bucket is drawn at its middle: the rate over [t, t+1).
        let points: Vec<(f64, f64)> = series
            .iter()
            .map(|p| (p.t_s as f64 + 0.5, p.acks as f64))
            .collect();
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(err)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Latency by percentile, one line per run; `runs` holds (percentile, µs) points.
pub fn latency(path: &Path, title: &str, runs: &[(String, Vec<(f64, f64)>)]) -> Result<()> {
    let to_x = |pct: f64| (1.0 / (1.0 - pct / 100.0).max(1.0 / MAX_X)).clamp(1.0, MAX_X);
    let values = runs.iter().flat_map(|(_, s)| s.iter().map(|p| p.1));
    let max_y = values.clone().fold(1.0f64, f64::max) * 1.5;
    let min_y = values
        .fold(f64::INFINITY, f64::min)
        .clamp(0.1, max_y / 10.0)
        / 1.5;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .margin_right(36)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((1f64..MAX_X).log_scale(), (min_y..max_y).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (µs)")
        .x_label_formatter(&|x| percentile_label(*x))
        .y_label_formatter(&|y| format!("{y}"))
        .draw()
        .map_err(err)?;
    for (i, (label, spectrum)) in runs.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<(f64, f64)> = spectrum
            .iter()
            .map(|&(pct, us)| (to_x(pct), us.max(min_y)))
            .collect();
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(err)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// 1/(1-p) → "99.9%".
fn percentile_label(x: f64) -> String {
    let pct = (1.0 - 1.0 / x) * 100.0;
    let s = format!("{pct:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}%")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_labels() {
        assert_eq!(percentile_label(1.0), "0%");
        assert_eq!(percentile_label(10.0), "90%");
        assert_eq!(percentile_label(1000.0), "99.9%");
    }

    #[test]
    fn charts_are_svg_files_with_every_label() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t.svg");
        let series = vec![
            SeriesPoint {
                t_s: 0,
                puts: 10,
                acks: 9,
                ..SeriesPoint::default()
            },
            SeriesPoint {
                t_s: 1,
                puts: 11,
                acks: 12,
                ..SeriesPoint::default()
            },
        ];
        throughput(&t, "throughput", &[("run-a".into(), series)]).unwrap();
        let text = std::fs::read_to_string(&t).unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..80]);
        assert!(text.contains("run-a"));

        let l = dir.path().join("l.svg");
        let a = vec![(0.0, 10.0), (50.0, 20.0), (99.0, 80.0), (100.0, 200.0)];
        let b = vec![(0.0, 100.0), (50.0, 200.0), (100.0, 900.0)];
        latency(&l, "latency", &[("tarq".into(), a), ("redis".into(), b)]).unwrap();
        let text = std::fs::read_to_string(&l).unwrap();
        assert!(text.contains("tarq") && text.contains("redis"));
        assert!(text.contains("<polyline"), "lines are drawn");
    }
}
