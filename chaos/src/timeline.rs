//! The picture of a run: what the clients got done each second, with the faults laid under
//! it, so a dip in takes or a burst of errors can be read against the partition or the kill
//! that caused it (and a failure the checker reports found on the clock). One SVG per run,
//! beside its history: a browser shows it, a review can link it, and it is text, so a test can
//! look inside. Drawn with `plotters` with only `svg_backend` and `line_series`: without its
//! `ttf` (font-kit, which links freetype and fontconfig) or `ab_glyph` features it falls back
//! to its built-in "naive" font, which only *estimates* text sizes for layout, and that is all
//! an SVG needs: the backend writes each label as a `<text>` element and the viewer's own fonts
//! draw it. So the harness builds and draws on a machine with no font libraries at all.

use std::path::Path;

use anyhow::{Context, Result};
use plotters::prelude::*;

use crate::checker::{self, Fault};
use crate::history::{Event, Kind, F, HARNESS};

const SIZE: (u32, u32) = (1280, 560);
const FONT: &str = "sans-serif";
/// The fault bands' colour, light enough for the lines to show through.
const BAND: RGBColor = RGBColor(255, 140, 0);
const BAND_ALPHA: f64 = 0.18;
/// How far apart the labels of overlapping faults are stacked, as a share of the y range.
const LANE: f64 = 0.06;

/// Draws the run's timeline as an SVG at `path`: x is seconds since the start; per-second
/// lines for put ok, take ok (a task delivered), ack ok and errors (fail + info of client
/// operations); each fault a shaded band from its nemesis invoke to its completion (to the
/// end when never healed), labelled with its name; new leaders as thin vertical marks.
pub fn draw(events: &[Event], path: &Path) -> Result<()> {
    let rates = Rates::count(events);
    let (faults, _) = checker::faults(events);
    let x_max = rates.seconds().max(1) as f64;
    let y_max = (rates.max() as f64 * 1.2).max(1.0);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("tarq-chaos run", (FONT, 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds since start")
        .y_desc("operations / s")
        .label_style((FONT, 13))
        .y_label_formatter(&|v| format!("{v:.0}"))
        // Only the bold grid: the fine one drowns the bands.
        .light_line_style(WHITE)
        .draw()?;
    draw_faults(&mut chart, &faults, x_max, y_max)?;
    draw_leaders(&mut chart, events, y_max)?;
    for (name, color, counts) in rates.series() {
        let points = counts
            .iter()
            .enumerate()
            .map(|(s, &n)| (s as f64 + 0.5, n as f64));
        let style = color.stroke_width(2);
        chart
            .draw_series(LineSeries::new(points, style))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The bands first, so the lines are drawn over them; labels stacked in lanes so that
/// overlapping faults stay readable.
fn draw_faults(
    chart: &mut Chart<'_, '_>,
    faults: &[Fault<'_>],
    x_max: f64,
    y_max: f64,
) -> Result<()> {
    let fill = BAND.mix(BAND_ALPHA).filled();
    let mut lanes: Vec<f64> = Vec::new(); // each lane's latest band end
    for fault in faults {
        let from = secs(fault.start.time_us);
        let to = fault.end.map_or(x_max, |e| secs(e.time_us));
        chart.draw_series(std::iter::once(Rectangle::new(
            [(from, 0.0), (to, y_max)],
            fill,
        )))?;
        let lane = lanes
            .iter()
            .position(|&end| end <= from)
            .unwrap_or(lanes.len());
        if lane == lanes.len() {
            lanes.push(to);
        } else {
            lanes[lane] = to;
        }
        let y = y_max * (0.97 - LANE * lane as f64);
        let label = Text::new(
            fault.label(),
            (from, y),
            (FONT, 13).into_font().color(&BLACK),
        );
        chart.draw_series(std::iter::once(label))?;
    }
    // A legend entry for the bands (an empty series carries it).
    if !faults.is_empty() {
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label("fault")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], fill));
    }
    Ok(())
}

/// A thin mark where the harness saw a leader: failovers explain pauses the faults alone
/// do not.
fn draw_leaders(chart: &mut Chart<'_, '_>, events: &[Event], y_max: f64) -> Result<()> {
    let leaders: Vec<&Event> = events
        .iter()
        .filter(|e| e.f == F::Leader && e.kind != Kind::Invoke)
        .collect();
    let style = RGBColor(120, 120, 120).stroke_width(1);
    for e in &leaders {
        let x = secs(e.time_us);
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x, 0.0), (x, y_max)],
            style,
        )))?;
    }
    if !leaders.is_empty() {
        chart
            .draw_series(std::iter::empty::<PathElement<(f64, f64)>>())?
            .label("leader seen")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    Ok(())
}

fn secs(us: u64) -> f64 {
    us as f64 / 1e6
}

/// Completions per whole second since the start.
#[derive(Debug, Default)]
struct Rates {
    puts: Vec<u64>,
    takes: Vec<u64>,
    acks: Vec<u64>,
    errors: Vec<u64>,
}

impl Rates {
    fn count(events: &[Event]) -> Rates {
        let end = events.iter().map(|e| e.time_us).max().unwrap_or(0);
        let n = (end / 1_000_000 + 1) as usize;
        let mut r = Rates {
            puts: vec![0; n],
            takes: vec![0; n],
            acks: vec![0; n],
            errors: vec![0; n],
        };
        for e in events.iter().filter(|e| e.process != HARNESS) {
            let s = (e.time_us / 1_000_000) as usize;
            let line = match (e.kind, e.f) {
                (Kind::Ok, F::Put) => &mut r.puts,
                // An empty take delivered nothing: only deliveries show the queue working.
                (Kind::Ok, F::Take) if e.payload.is_some() => &mut r.takes,
                (Kind::Ok, F::Ack) => &mut r.acks,
                // A disconnect is recorded as info, but it is the client's note, not an error.
                (Kind::Fail | Kind::Info, f) if f != F::Disconnect => &mut r.errors,
                _ => continue,
            };
            line[s] += 1;
        }
        r
    }

    fn seconds(&self) -> usize {
        self.puts.len()
    }

    fn max(&self) -> u64 {
        self.series()
            .iter()
            .flat_map(|(_, _, v)| v.iter().copied())
            .max()
            .unwrap_or(0)
    }

    fn series(&self) -> [(&'static str, RGBColor, &[u64]); 4] {
        [
            ("put ok/s", BLUE, &self.puts),
            ("take ok/s (delivered)", RGBColor(0, 150, 0), &self.takes),
            ("ack ok/s", MAGENTA, &self.acks),
            ("errors/s (fail + info)", RED, &self.errors),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Three seconds of puts, takes and acks by two processes, some errors, a partition from
    /// 1.0 s to 2.0 s overlapping a kill from 1.5 s that is never healed, and a new leader.
    fn run() -> Vec<Event> {
        let mut events = Vec::new();
        let mut op = |t: u64, p: u64, f: F, kind: Kind, payload: Option<String>| {
            events.push(Event::new(t, p, Kind::Invoke, f));
            let mut done = Event::new(t + 900, p, kind, f);
            done.payload = payload;
            events.push(done);
        };
        for i in 0..300u64 {
            let t = i * 10_000;
            let down = (1_000_000..2_000_000).contains(&t);
            let out = if down && i % 2 == 0 {
                Kind::Info
            } else {
                Kind::Ok
            };
            op(t, 1, F::Put, out, None);
            op(t + 2_000, 2, F::Take, Kind::Ok, Some(format!("p{i}")));
            op(
                t + 4_000,
                2,
                F::Ack,
                if down { Kind::Fail } else { Kind::Ok },
                None,
            );
        }
        let fault = |t: u64, kind: Kind, name: &str| {
            let mut e = Event::new(t, HARNESS, kind, F::Nemesis);
            e.value = Some(json!({ "name": name, "frees_holds": name.starts_with("kill") }));
            e
        };
        events.push(fault(1_000_000, Kind::Invoke, "partition n1 | n2 n3"));
        events.push(fault(1_500_000, Kind::Invoke, "kill n2"));
        events.push(fault(2_000_000, Kind::Ok, "partition n1 | n2 n3"));
        let mut leader = Event::new(1_200_000, HARNESS, Kind::Info, F::Leader);
        leader.value = Some(json!({"term": 2}));
        events.push(leader);
        events.sort_by_key(|e| e.time_us);
        events
    }

    #[test]
    fn a_run_draws_as_an_svg_with_its_faults_and_legend() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("timeline.svg");
        draw(&run(), &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for text in [
            "partition n1 | n2 n3",
            "kill n2",
            "put ok/s",
            "take ok/s (delivered)",
            "ack ok/s",
            "errors/s (fail + info)",
            "fault",
            "leader seen",
            "seconds since start",
        ] {
            assert!(svg.contains(text), "no {text:?} in the SVG");
        }
        // Bands, lines and text: far more than an empty frame.
        assert!(svg.len() > 10_000, "{} bytes", svg.len());
        assert!(svg.matches("<polyline").count() >= 4, "the four rate lines");
        assert!(
            svg.matches("<rect").count() >= 3,
            "two bands and the background"
        );
    }

    #[test]
    fn the_rates_count_completions_per_second() {
        let r = Rates::count(&run());
        assert_eq!(r.seconds(), 3);
        assert_eq!(r.puts, [100, 50, 100]);
        assert_eq!(r.takes, [100, 100, 100]);
        assert_eq!(r.acks, [100, 0, 100]);
        assert_eq!(
            r.errors,
            [0, 150, 0],
            "50 info puts and 100 failed acks in second 1"
        );
    }

    #[test]
    fn an_empty_history_still_draws() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.svg");
        draw(&[], &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("seconds since start"));
    }
}
