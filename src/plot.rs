//! `concord plot <run dir>`: PNG charts of a run.
//!
//! * `reward_curve.png`: reward per step (points), its rolling mean (line) and the
//!   curriculum's stage boundaries (dashed, labelled with the new stage).
//!   With an `eval_log.csv` (`[run] eval_every`), the held-out evaluations are drawn
//!   over it: mean reward with 95% whiskers and win rate, per environment.
//! * `components.png`: one line per reward component (`rewards/<c>/mean` columns).
//! * `sft_curve.png` instead of both for an SFT run (`concord sft`, or a warm start's
//!   `sft/` directory: a log with `loss` and no `reward`): loss and token accuracy per
//!   step, with their rolling means.
//! * `before_after.png`: base model vs adapter from `eval.json` (written by
//!   `concord eval --compare`), grouped bars with 95% confidence whiskers.
//! * `behaviour.png`: from the same `eval.json`, each model's action shares per
//!   situation (stacked bars side by side, one panel per environment), with its
//!   agreement with the reference policy and I(situation; action).
//!
//! Text is drawn with a font embedded in the binary (`assets/DejaVuSans.ttf`), so the
//! images render the same on machines without any system fonts. Every image is
//! rendered into memory, encoded, then written atomically.
use crate::run::eval_report::{EnvEval, EvalReport, ModelEval, EVAL_JSON};
use crate::run::log::{TrainingLog, TRAINING_LOG};
use anyhow::{bail, Context, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::{Path, PathBuf};

/// Width of every image, pixels.
pub const PLOT_WIDTH: u32 = 1200;
/// Height of `reward_curve.png` and `components.png` (and of `before_after.png` with
/// one or two environments), pixels.
pub const PLOT_HEIGHT: u32 = 700;

/// Draw `reward_curve.png` and `components.png` from `training_log.csv` (an SFT log,
/// with `loss` and no `reward`: `sft_curve.png`) and, when
/// `eval.json` holds both a `base` and an `adapter` model, `before_after.png`.
/// Returns the written paths. A missing or malformed `eval.json` is an error; one
/// without both models is skipped.
pub fn plot_run(run_dir: &Path, window: usize) -> Result<Vec<PathBuf>> {
    let window = window.max(1);
    let log_path = run_dir.join(TRAINING_LOG);
    let log = TrainingLog::read(&log_path)?;
    let held = read_eval_log(&run_dir.join(crate::run::log::EVAL_LOG))?;
    let name = run_name(run_dir);
    let mut written = Vec::new();

    if log.column("reward").is_none() && log.column("loss").is_some() {
        let p = run_dir.join("sft_curve.png");
        write_png(&p, PLOT_WIDTH, PLOT_HEIGHT, |root| {
            draw_sft_curve(root, &log, &name, window)
        })?;
        written.push(p);
        written.extend(plot_eval(run_dir, &name)?);
        return Ok(written);
    }

    let p = run_dir.join("reward_curve.png");
    write_png(&p, PLOT_WIDTH, PLOT_HEIGHT, |root| {
        draw_reward_curve(root, &log, &held, &name, window)
    })?;
    written.push(p);

    let p = run_dir.join("components.png");
    write_png(&p, PLOT_WIDTH, PLOT_HEIGHT, |root| {
        draw_components(root, &log, &name, window)
    })?;
    written.push(p);
    written.extend(plot_eval(run_dir, &name)?);
    Ok(written)
}

/// `before_after.png` and `behaviour.png` from the run's `eval.json`, when it has them.
fn plot_eval(run_dir: &Path, name: &str) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let eval_path = run_dir.join(EVAL_JSON);
    if eval_path.exists() {
        let report = EvalReport::read(&eval_path)?;
        if let (Some(base), Some(adapter)) =
            (report.models.get("base"), report.models.get("adapter"))
        {
            let envs = env_names(base, adapter);
            if !envs.is_empty() {
                let p = run_dir.join("before_after.png");
                let h = before_after_height(envs.len());
                write_png(&p, PLOT_WIDTH, h, |root| {
                    draw_before_after(root, &report, base, adapter, &envs, name)
                })?;
                written.push(p);
            }
        }
        let behaviours = behaviour_panels(&report);
        if !behaviours.is_empty() {
            let p = run_dir.join("behaviour.png");
            let h = 120 + 520 * behaviours.len() as u32;
            write_png(&p, PLOT_WIDTH, h, |root| {
                draw_behaviour(root, &behaviours, name)
            })?;
            written.push(p);
        }
    }
    Ok(written)
}

/// Per environment with a behaviour report: (env, [(model label, summary)]), the
/// run's start (`base`) first.
type BehaviourPanel<'a> = (String, Vec<(String, &'a crate::envs::BehaviourSummary)>);

fn behaviour_panels(report: &EvalReport) -> Vec<BehaviourPanel<'_>> {
    let mut labels: Vec<&String> = report.models.keys().collect();
    labels.sort_by_key(|l| (l.as_str() != "base", l.as_str() != "adapter", l.to_string()));
    let mut envs: Vec<&String> = report.models.values().flat_map(|m| m.envs.keys()).collect();
    envs.sort();
    envs.dedup();
    envs.into_iter()
        .map(|env| {
            let models = labels
                .iter()
                .filter_map(|l| {
                    let b = report.models[*l].envs.get(env)?.behaviour.as_ref()?;
                    Some(((*l).clone(), b))
                })
                .collect::<Vec<_>>();
            (env.clone(), models)
        })
        .filter(|(_, m)| !m.is_empty())
        .collect()
}

fn draw_behaviour(root: &Area, panels: &[BehaviourPanel], name: &str) -> Result<()> {
    let body = root
        .titled(
            &format!("{name}: action shares per situation (bars left to right: models)"),
            font(24.0),
        )
        .map_err(plot_err)?;
    for ((env, models), area) in panels.iter().zip(body.split_evenly((panels.len(), 1))) {
        draw_behaviour_panel(&area, env, models)?;
    }
    Ok(())
}

fn draw_behaviour_panel(
    area: &Area,
    env: &str,
    models: &[(String, &crate::envs::BehaviourSummary)],
) -> Result<()> {
    let mut situations: Vec<&String> = models
        .iter()
        .flat_map(|(_, b)| b.situations.keys())
        .collect();
    situations.sort();
    situations.dedup();
    let mut actions: Vec<&String> = models
        .iter()
        .flat_map(|(_, b)| b.situations.values().flat_map(|s| s.actions.keys()))
        .collect();
    actions.sort();
    actions.dedup();
    let (legend_area, chart_area) = area.split_vertically(60);
    let caption = models
        .iter()
        .map(|(l, b)| {
            format!(
                "{l}: agreement {:.2}, I {:.2} bits",
                b.agreement, b.mutual_information_bits
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    legend_area
        .draw(&Text::new(
            format!("{env} ({caption})"),
            (16, 6),
            font(17.0),
        ))
        .map_err(plot_err)?;
    for (k, a) in actions.iter().enumerate() {
        let x = 16 + 220 * k as i32;
        legend_area
            .draw(&Rectangle::new(
                [(x, 32), (x + 22, 50)],
                palette(k).filled(),
            ))
            .map_err(plot_err)?;
        legend_area
            .draw(&Text::new(a.to_string(), (x + 28, 32), font(15.0)))
            .map_err(plot_err)?;
    }
    let n = situations.len();
    let mut chart = ChartBuilder::on(&chart_area)
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..1.0)
        .map_err(plot_err)?;
    let names: Vec<String> = situations.iter().map(|s| s.to_string()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n + 1)
        .x_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
                names[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc("share of decisions")
        .label_style(font(13.0))
        .axis_desc_style(font(16.0))
        .draw()
        .map_err(plot_err)?;
    let width = 0.8 / models.len() as f64;
    for (i, sit) in situations.iter().enumerate() {
        for (m, (_, b)) in models.iter().enumerate() {
            let Some(s) = b.situations.get(sit.as_str()) else {
                continue;
            };
            let x0 = i as f64 - 0.4 + width * m as f64;
            let mut y = 0.0;
            for (k, a) in actions.iter().enumerate() {
                let share = s.actions.get(a.as_str()).copied().unwrap_or(0) as f64
                    / s.decisions.max(1) as f64;
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x0 + 0.01, y), (x0 + width - 0.01, y + share)],
                        palette(k).filled(),
                    )))
                    .map_err(plot_err)?;
                y += share;
            }
        }
    }
    Ok(())
}

/// Height of `before_after.png` for `n_envs` panels (two panels side by side per row).
pub fn before_after_height(n_envs: usize) -> u32 {
    let rows = n_envs.div_ceil(2).max(1) as u32;
    PLOT_HEIGHT.max(90 + 420 * rows)
}

fn run_name(run_dir: &Path) -> String {
    let named = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| !n.is_empty() && n != "." && n != "..")
    };
    named(run_dir)
        .or_else(|| run_dir.canonicalize().ok().and_then(|p| named(&p)))
        .unwrap_or_else(|| run_dir.display().to_string())
}

fn env_names(base: &ModelEval, adapter: &ModelEval) -> Vec<String> {
    let mut names: Vec<String> = base.envs.keys().cloned().collect();
    for k in adapter.envs.keys() {
        if !names.contains(k) {
            names.push(k.clone());
        }
    }
    names.sort();
    names
}

/// Trailing rolling mean: element `i` is the mean of the finite values among
/// `values[i+1-window ..= i]` (fewer at the start), NaN where there are none.
pub fn rolling_mean(values: &[f64], window: usize) -> Vec<f64> {
    let window = window.max(1);
    (0..values.len())
        .map(|i| {
            let lo = (i + 1).saturating_sub(window);
            let (sum, n) = values[lo..=i]
                .iter()
                .filter(|v| v.is_finite())
                .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
            if n == 0 {
                f64::NAN
            } else {
                sum / n as f64
            }
        })
        .collect()
}

/// Rows where the stage changes: `(row index, new stage name)`; the first row is
/// never a boundary.
pub fn stage_boundaries(stages: &[String]) -> Vec<(usize, String)> {
    stages
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[0] != w[1])
        .map(|(i, w)| (i + 1, w[1].clone()))
        .collect()
}

/// `(lo, hi)` covering the finite values, padded so the range is never empty: 5% on
/// each side, or +-max(10% of |v|, 0.5) around a constant; (0, 1) with no finite value.
pub fn padded_range<'a>(values: impl IntoIterator<Item = &'a f64>) -> (f64, f64) {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let span = hi - lo;
    if span <= f64::EPSILON * lo.abs().max(hi.abs()).max(1.0) {
        let pad = (lo.abs() * 0.1).max(0.5);
        return (lo - pad, hi + pad);
    }
    (lo - span * 0.05, hi + span * 0.05)
}

/// Runs of consecutive finite `(x, y)` points (lines break at NaN).
fn finite_segments(xs: &[f64], ys: &[f64]) -> Vec<Vec<(f64, f64)>> {
    let mut segs = Vec::new();
    let mut cur = Vec::new();
    for (&x, &y) in xs.iter().zip(ys) {
        if x.is_finite() && y.is_finite() {
            cur.push((x, y));
        } else if !cur.is_empty() {
            segs.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        segs.push(cur);
    }
    segs
}

// ------------------------------------------------------------------------ drawing

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

const FONT: &str = "sans-serif";
static FONT_BYTES: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

fn register_font() -> Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *ONCE.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok()
    });
    if !ok {
        bail!("the embedded font (assets/DejaVuSans.ttf) could not be loaded");
    }
    Ok(())
}

/// Tableau-style categorical palette: 10 saturated colours then 10 lighter ones.
const PALETTE: [RGBColor; 20] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(174, 199, 232),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
    RGBColor(255, 152, 150),
    RGBColor(197, 176, 213),
    RGBColor(196, 156, 148),
    RGBColor(247, 182, 210),
    RGBColor(199, 199, 199),
    RGBColor(219, 219, 141),
    RGBColor(158, 218, 229),
];

fn palette(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

const BASE_COLOR: RGBColor = RGBColor(150, 150, 150);
const ADAPTER_COLOR: RGBColor = RGBColor(31, 119, 180);
const STAGE_COLOR: RGBColor = RGBColor(90, 90, 90);

/// Render with `draw` into an RGB buffer, encode as PNG and write `path` atomically.
fn write_png(
    path: &Path,
    width: u32,
    height: u32,
    draw: impl FnOnce(&Area) -> Result<()>,
) -> Result<()> {
    register_font()?;
    let mut buf = vec![255u8; width as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        draw(&root).with_context(|| format!("drawing {}", path.display()))?;
        root.present().map_err(plot_err)?;
    }
    let mut png_bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut png_bytes, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc
            .write_header()
            .with_context(|| format!("encoding {}", path.display()))?;
        w.write_image_data(&buf)
            .with_context(|| format!("encoding {}", path.display()))?;
        w.finish()
            .with_context(|| format!("encoding {}", path.display()))?;
    }
    crate::atomic::atomic_write_bytes(path, &png_bytes)
}

fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plotting: {e:?}")
}

fn font(size: f64) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).color(&BLACK)
}

/// Tick label: integers plainly, otherwise up to 3 significant decimals.
fn fmt_tick(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    let s = if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

/// Step ticks: integers only (fractional ticks of a short run are left blank).
fn fmt_step(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        String::new()
    }
}

enum Mark {
    Dot(RGBColor),
    Ring(RGBColor),
    Line(RGBColor, u32),
    Dashed(RGBColor),
}

/// A legend in its own panel (never over the data): one entry per row.
fn draw_legend(area: &Area, title: Option<&str>, entries: &[(String, Mark)]) -> Result<()> {
    let row = 26;
    let mut y = 20;
    if let Some(t) = title {
        area.draw(&Text::new(t.to_string(), (12, y), font(17.0)))
            .map_err(plot_err)?;
        y += row + 4;
    }
    for (label, mark) in entries {
        let cy = y + 9;
        match mark {
            Mark::Dot(c) => area.draw(&Circle::new((30, cy), 4, c.filled())),
            Mark::Ring(c) => area.draw(&Circle::new((30, cy), 5, c.stroke_width(2))),
            Mark::Line(c, w) => area.draw(&PathElement::new(
                vec![(12, cy), (48, cy)],
                c.stroke_width(*w),
            )),
            Mark::Dashed(c) => area.draw(&DashedPathElement::new(
                vec![(12, cy), (48, cy)],
                6,
                4,
                c.stroke_width(2),
            )),
        }
        .map_err(plot_err)?;
        area.draw(&Text::new(
            label.clone(),
            (58, cy),
            font(16.0).pos(LEFT_CENTER),
        ))
        .map_err(plot_err)?;
        y += row;
    }
    Ok(())
}

const LEGEND_WIDTH: u32 = 230;

/// The part shared by the step charts: title, chart area + legend panel.
fn split_titled<'a>(root: &Area<'a>, title: &str) -> Result<(Area<'a>, Area<'a>)> {
    let body = root.titled(title, font(26.0)).map_err(plot_err)?;
    let (w, _) = body.dim_in_pixel();
    Ok(body.split_horizontally(w.saturating_sub(LEGEND_WIDTH)))
}

fn step_range(steps: &[f64]) -> (f64, f64) {
    let first = steps.iter().copied().fold(f64::INFINITY, f64::min);
    let last = steps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !first.is_finite() {
        return (0.0, 1.0);
    }
    if last - first < 1.0 {
        // One row: a couple of steps either side.
        return (first - 2.0, last + 2.0);
    }
    let pad = ((last - first) * 0.02).max(0.5);
    (first - pad, last + pad)
}

/// Extra space above the data for the stage labels, when the log has stage changes.
fn with_stage_headroom((lo, hi): (f64, f64), log: &TrainingLog) -> (f64, f64) {
    if stage_boundaries(&log.stages).is_empty() {
        (lo, hi)
    } else {
        (lo, hi + (hi - lo) * 0.1)
    }
}

const LEFT_CENTER: plotters::style::text_anchor::Pos = plotters::style::text_anchor::Pos {
    h_pos: plotters::style::text_anchor::HPos::Left,
    v_pos: plotters::style::text_anchor::VPos::Center,
};

/// Dashed vertical lines at stage changes, each labelled with the new stage; the
/// first stage is labelled at the left edge.
fn draw_stages<DB: DrawingBackend>(
    chart: &mut ChartContext<DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    log: &TrainingLog,
    y_range: (f64, f64),
    x_lo: f64,
) -> Result<bool> {
    let bounds = stage_boundaries(&log.stages);
    if bounds.is_empty() {
        return Ok(false);
    }
    let label_style = font(16.0).color(&STAGE_COLOR);
    let first = log.stages.first().cloned().unwrap_or_default();
    let mut labels = vec![(x_lo, first)];
    for (i, name) in &bounds {
        let x = (log.steps[i - 1] + log.steps[*i]) / 2.0;
        chart
            .draw_series(std::iter::once(DashedPathElement::new(
                vec![(x, y_range.0), (x, y_range.1)],
                8,
                5,
                STAGE_COLOR.stroke_width(2),
            )))
            .map_err(plot_err)?;
        labels.push((x, name.clone()));
    }
    // Alternate two heights so close boundaries stay legible; the y range has
    // head-room for them (see `with_stage_headroom`).
    for (k, (x, name)) in labels.into_iter().enumerate() {
        let dy = 6 + 20 * (k % 2) as i32;
        let style = label_style.clone();
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((x, y_range.1)) + Text::new(format!(" {name}"), (4, dy), style),
            ))
            .map_err(plot_err)?;
    }
    Ok(true)
}

type StepChart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A chart over training steps with the shared axes, grid and label styles.
fn step_chart<'a, 'b>(
    area: &'a Area<'b>,
    x: (f64, f64),
    y: (f64, f64),
    y_desc: &str,
) -> Result<StepChart<'a, 'b>> {
    let mut chart = ChartBuilder::on(area)
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x.0..x.1, y.0..y.1)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(y_desc)
        .x_labels(12)
        .y_labels(10)
        .x_label_formatter(&|v| fmt_step(*v))
        .y_label_formatter(&|v| fmt_tick(*v))
        .label_style(font(15.0))
        .axis_desc_style(font(18.0))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(plot_err)?;
    Ok(chart)
}

/// A rolling mean as width-3 lines over its finite stretches; a stretch of one point
/// becomes a dot of `dot_radius`.
fn draw_rolling_mean(
    chart: &mut StepChart,
    steps: &[f64],
    smooth: &[f64],
    color: RGBColor,
    dot_radius: i32,
) -> Result<()> {
    for seg in finite_segments(steps, smooth) {
        if seg.len() == 1 {
            chart
                .draw_series(std::iter::once(Circle::new(
                    seg[0],
                    dot_radius,
                    color.filled(),
                )))
                .map_err(plot_err)?;
        } else {
            chart
                .draw_series(LineSeries::new(seg, color.stroke_width(3)))
                .map_err(plot_err)?;
        }
    }
    Ok(())
}

/// One held-out evaluation of one environment (a row of `eval_log.csv`).
#[derive(Debug, Clone, PartialEq)]
pub struct HeldOut {
    pub step: f64,
    pub env: String,
    pub reward: f64,
    pub reward_ci: [f64; 2],
    pub win: f64,
}

/// The rows of `eval_log.csv`; none when the file does not exist.
pub fn read_eval_log(path: &Path) -> Result<Vec<HeldOut>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let num = |k: usize| -> Result<f64> {
            let v = f.get(k).copied().unwrap_or("");
            // An undefined value (no scored seat) was written as NaN.
            v.parse::<f64>().with_context(|| {
                format!(
                    "{} line {}: column {} is `{v}`",
                    path.display(),
                    i + 1,
                    k + 1
                )
            })
        };
        rows.push(HeldOut {
            step: num(0)?,
            env: f.get(1).copied().unwrap_or("").to_string(),
            win: num(3)?,
            reward: num(6)?,
            reward_ci: [num(7)?, num(8)?],
        });
    }
    Ok(rows)
}

fn draw_held_out(chart: &mut StepChart, held: &[HeldOut]) -> Result<Vec<(String, Mark)>> {
    let mut envs: Vec<&str> = held.iter().map(|h| h.env.as_str()).collect();
    envs.dedup();
    envs.sort();
    envs.dedup();
    let mut entries = Vec::new();
    for (i, env) in envs.iter().enumerate() {
        let rows: Vec<&HeldOut> = held.iter().filter(|h| h.env == *env).collect();
        let reward_color = palette(2 * i + 1);
        let win_color = palette(2 * i + 2);
        let pts = |f: fn(&HeldOut) -> f64| -> Vec<(f64, f64)> {
            rows.iter()
                .map(|h| (h.step, f(h)))
                .filter(|p| p.1.is_finite())
                .collect()
        };
        for h in rows
            .iter()
            .filter(|h| h.reward_ci.iter().all(|v| v.is_finite()))
        {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(h.step, h.reward_ci[0]), (h.step, h.reward_ci[1])],
                    reward_color.stroke_width(2),
                )))
                .map_err(plot_err)?;
        }
        chart
            .draw_series(LineSeries::new(
                pts(|h| h.reward),
                reward_color.stroke_width(3),
            ))
            .map_err(plot_err)?;
        chart
            .draw_series(
                pts(|h| h.reward)
                    .into_iter()
                    .map(|p| Circle::new(p, 5, reward_color.filled())),
            )
            .map_err(plot_err)?;
        chart
            .draw_series(DashedLineSeries::new(
                pts(|h| h.win),
                8,
                5,
                win_color.stroke_width(2),
            ))
            .map_err(plot_err)?;
        chart
            .draw_series(
                pts(|h| h.win)
                    .into_iter()
                    .map(|p| Circle::new(p, 5, win_color.stroke_width(2))),
            )
            .map_err(plot_err)?;
        // The legend panel is narrow: name the environment only when there are several.
        let of = if envs.len() > 1 {
            format!(" {env}")
        } else {
            String::new()
        };
        entries.push((format!("held-out reward{of}"), Mark::Line(reward_color, 3)));
        entries.push((format!("held-out win rate{of}"), Mark::Dashed(win_color)));
    }
    Ok(entries)
}

fn draw_reward_curve(
    root: &Area,
    log: &TrainingLog,
    held: &[HeldOut],
    name: &str,
    window: usize,
) -> Result<()> {
    let reward = log
        .column("reward")
        .context("no `reward` column in the header")?;
    let smooth = rolling_mean(reward, window);
    let title = if held.is_empty() {
        format!("{name}: reward per step")
    } else {
        format!("{name}: reward per step and held-out evaluations")
    };
    let (chart_area, legend_area) = split_titled(root, &title)?;
    let mut x = step_range(&log.steps);
    for h in held {
        x = (x.0.min(h.step), x.1.max(h.step));
    }
    let held_values: Vec<f64> = held
        .iter()
        .flat_map(|h| [h.reward, h.reward_ci[0], h.reward_ci[1], h.win])
        .collect();
    let y = with_stage_headroom(
        padded_range(reward.iter().chain(&smooth).chain(&held_values)),
        log,
    );

    let mut chart = step_chart(&chart_area, x, y, "reward")?;

    let has_stages = draw_stages(&mut chart, log, y, x.0)?;

    let skipped = log.skipped();
    let point_color = RGBColor(120, 170, 215);
    let pts = |want_skipped: bool| {
        log.steps
            .iter()
            .zip(reward)
            .zip(&skipped)
            .filter(move |((_, r), s)| r.is_finite() && **s == want_skipped)
            .map(|((s, r), _)| (*s, *r))
            .collect::<Vec<_>>()
    };
    let (kept, skip) = (pts(false), pts(true));
    chart
        .draw_series(
            kept.iter()
                .map(|&p| Circle::new(p, 4, point_color.filled())),
        )
        .map_err(plot_err)?;
    chart
        .draw_series(skip.iter().map(|&p| Circle::new(p, 5, RED.stroke_width(2))))
        .map_err(plot_err)?;
    let line_color = RGBColor(20, 60, 140);
    draw_rolling_mean(&mut chart, &log.steps, &smooth, line_color, 3)?;
    if reward.iter().all(|r| !r.is_finite()) {
        draw_no_data(&chart_area, "no finite reward in the log")?;
    }

    let mut entries = vec![
        ("reward (one step)".to_string(), Mark::Dot(point_color)),
        (
            format!("rolling mean ({window} steps)"),
            Mark::Line(line_color, 3),
        ),
    ];
    if !skip.is_empty() {
        entries.push(("skipped step".into(), Mark::Ring(RED)));
    }
    if has_stages {
        entries.push(("stage change".into(), Mark::Dashed(STAGE_COLOR)));
    }
    entries.extend(draw_held_out(&mut chart, held)?);
    draw_legend(&legend_area, None, &entries)?;
    Ok(())
}

/// An SFT log: loss and mean token accuracy per step (points) with rolling means.
fn draw_sft_curve(root: &Area, log: &TrainingLog, name: &str, window: usize) -> Result<()> {
    let title =
        format!("{name}: SFT loss and token accuracy (lines: rolling mean of {window} steps)");
    let (chart_area, legend_area) = split_titled(root, &title)?;
    let series: Vec<(&str, &[f64], RGBColor)> = [
        ("loss", "loss", RGBColor(20, 60, 140)),
        ("mean_token_accuracy", "accuracy", RGBColor(200, 110, 20)),
    ]
    .into_iter()
    .filter_map(|(c, label, color)| Some((label, log.column(c)?, color)))
    .collect();
    let smooth: Vec<Vec<f64>> = series
        .iter()
        .map(|(_, v, _)| rolling_mean(v, window))
        .collect();
    let y = padded_range(
        series
            .iter()
            .flat_map(|(_, v, _)| v.iter())
            .chain(smooth.iter().flatten()),
    );
    let mut chart = step_chart(&chart_area, step_range(&log.steps), y, "value")?;
    let mut entries = Vec::new();
    for ((c, v, color), sm) in series.iter().zip(&smooth) {
        let pts: Vec<(f64, f64)> = log
            .steps
            .iter()
            .zip(v.iter())
            .filter(|(_, y)| y.is_finite())
            .map(|(x, y)| (*x, *y))
            .collect();
        let light = RGBColor(
            ((color.0 as u16 + 2 * 255) / 3) as u8,
            ((color.1 as u16 + 2 * 255) / 3) as u8,
            ((color.2 as u16 + 2 * 255) / 3) as u8,
        );
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, light.filled())))
            .map_err(plot_err)?;
        draw_rolling_mean(&mut chart, &log.steps, sm, *color, 3)?;
        entries.push((c.to_string(), Mark::Line(*color, 3)));
        entries.push((format!("{c} (one step)"), Mark::Dot(light)));
    }
    if series
        .iter()
        .all(|(_, v, _)| v.iter().all(|x| !x.is_finite()))
    {
        draw_no_data(&chart_area, "no finite loss in the log")?;
    }
    draw_legend(&legend_area, None, &entries)
}

fn draw_no_data(area: &Area, msg: &str) -> Result<()> {
    let (w, h) = area.dim_in_pixel();
    let style =
        font(22.0)
            .color(&RGBColor(160, 60, 60))
            .pos(plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Center,
                plotters::style::text_anchor::VPos::Center,
            ));
    area.draw(&Text::new(
        msg.to_string(),
        (w as i32 / 2, h as i32 / 2),
        style,
    ))
    .map_err(plot_err)
}

fn draw_components(root: &Area, log: &TrainingLog, name: &str, window: usize) -> Result<()> {
    let names = log.component_names();
    let series: Vec<(String, Vec<f64>, Vec<f64>)> = names
        .iter()
        .filter_map(|c| {
            let raw = log.column(&format!("rewards/{c}/mean"))?.to_vec();
            let smooth = rolling_mean(&raw, window);
            Some((c.clone(), raw, smooth))
        })
        .collect();
    let title = format!("{name}: reward components (mean per step, rolling mean of {window})");
    let (chart_area, legend_area) = split_titled(root, &title)?;
    let x = step_range(&log.steps);
    let y = with_stage_headroom(
        padded_range(series.iter().flat_map(|(_, r, s)| r.iter().chain(s))),
        log,
    );

    let mut chart = step_chart(&chart_area, x, y, "component reward")?;
    let has_stages = draw_stages(&mut chart, log, y, x.0)?;

    let mut entries = Vec::new();
    for (i, (c, raw, smooth)) in series.iter().enumerate() {
        let color = palette(i);
        // Raw per-step means as faint dots, the rolling mean as the line.
        chart
            .draw_series(
                log.steps
                    .iter()
                    .zip(raw)
                    .filter(|(_, v)| v.is_finite())
                    .map(|(s, v)| Circle::new((*s, *v), 2, color.mix(0.45).filled())),
            )
            .map_err(plot_err)?;
        draw_rolling_mean(&mut chart, &log.steps, smooth, color, 4)?;
        let label = if smooth.iter().all(|v| !v.is_finite()) {
            format!("{c} (no data)")
        } else {
            c.clone()
        };
        entries.push((label, Mark::Line(color, 3)));
    }
    if series.is_empty() {
        draw_no_data(
            &chart_area,
            "no rewards/<component>/mean columns in the log",
        )?;
    }
    if has_stages {
        entries.push(("stage change".into(), Mark::Dashed(STAGE_COLOR)));
    }
    draw_legend(&legend_area, Some("component"), &entries)?;
    Ok(())
}

/// One bar group: metric name, then per model `(value, optional 95% CI)`.
type MetricBars = (String, [Option<(f64, Option<[f64; 2]>)>; 2]);

fn metric_bars(base: Option<&EnvEval>, adapter: Option<&EnvEval>) -> Vec<MetricBars> {
    let both = [base, adapter];
    let mut out: Vec<MetricBars> = vec![
        (
            "win_rate".into(),
            both.map(|e| e.map(|e| (e.win_rate, Some(e.win_ci95)))),
        ),
        (
            "reward_mean".into(),
            both.map(|e| e.map(|e| (e.reward_mean, Some(e.reward_ci95)))),
        ),
    ];
    let mut comps: Vec<&String> = Vec::new();
    for e in both.into_iter().flatten() {
        for k in e.components.keys() {
            if !comps.contains(&k) {
                comps.push(k);
            }
        }
    }
    for c in comps {
        out.push((
            c.clone(),
            both.map(|e| e.and_then(|e| e.components.get(c)).map(|v| (*v, None))),
        ));
    }
    out
}

fn draw_before_after(
    root: &Area,
    report: &EvalReport,
    base: &ModelEval,
    adapter: &ModelEval,
    envs: &[String],
    name: &str,
) -> Result<()> {
    let mode = if report.greedy { "greedy" } else { "sampled" };
    // A run that started from an adapter is compared with that start.
    let before = if base.adapter.is_some() {
        "start"
    } else {
        "base"
    };
    let title = format!(
        "{name}: {before} vs adapter ({} episodes per env, {mode}; whiskers: 95% CI)",
        report.episodes
    );
    let body = root.titled(&title, font(24.0)).map_err(plot_err)?;
    let (legend_strip, panels_area) = body.split_vertically(40);
    // Legend across the top, centred.
    let (lw, _) = legend_strip.dim_in_pixel();
    let x0 = lw as i32 / 2 - 120;
    for (k, (label, color)) in [(before, BASE_COLOR), ("adapter", ADAPTER_COLOR)]
        .into_iter()
        .enumerate()
    {
        let x = x0 + 140 * k as i32;
        legend_strip
            .draw(&Rectangle::new([(x, 8), (x + 28, 26)], color.filled()))
            .map_err(plot_err)?;
        legend_strip
            .draw(&Text::new(label, (x + 36, 7), font(18.0)))
            .map_err(plot_err)?;
    }
    let cols = if envs.len() == 1 { 1 } else { 2 };
    let rows = envs.len().div_ceil(cols);
    let panels = panels_area.split_evenly((rows, cols));
    for (env, panel) in envs.iter().zip(&panels) {
        draw_env_panel(panel, env, base.envs.get(env), adapter.envs.get(env))?;
    }
    Ok(())
}

fn draw_env_panel(
    area: &Area,
    env: &str,
    base: Option<&EnvEval>,
    adapter: Option<&EnvEval>,
) -> Result<()> {
    let bars = metric_bars(base, adapter);
    let n = bars.len();
    let mut ys = vec![0.0];
    for (_, vals) in &bars {
        for (v, ci) in vals.iter().flatten() {
            ys.push(*v);
            if let Some([lo, hi]) = ci {
                ys.push(*lo);
                ys.push(*hi);
            }
        }
    }
    let (mut lo, mut hi) = padded_range(&ys);
    // Bars start at zero: keep zero on the axis edge when all values are >= 0, and
    // leave head-room for the value labels.
    if ys.iter().all(|v| !v.is_finite() || *v >= 0.0) {
        lo = 0.0;
    } else {
        lo -= (hi - lo) * 0.06;
    }
    hi += (hi - lo) * 0.08;
    let seats = base
        .or(adapter)
        .map(|e| format!(" ({} episodes, {} seats)", e.episodes, e.seats))
        .unwrap_or_default();
    let names: Vec<String> = bars.iter().map(|(m, _)| m.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{env}{seats}"), font(20.0))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, lo..hi)
        .map_err(plot_err)?;
    // Metric i is centred on x = i; asking for n + 1 labels makes the ticks exactly
    // the integers, which are named after their metric.
    let label_of = |v: &f64| {
        let i = v.round();
        if (v - i).abs() < 1e-6 && i >= 0.0 {
            names.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n + 1)
        .y_desc("value")
        .y_labels(8)
        .x_label_formatter(&label_of)
        .y_label_formatter(&|v| fmt_tick(*v))
        .label_style(font(15.0))
        .axis_desc_style(font(17.0))
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(plot_err)?;
    if lo < 0.0 {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(-0.5, 0.0), (n as f64 - 0.5, 0.0)],
                BLACK.stroke_width(1),
            )))
            .map_err(plot_err)?;
    }
    let value_style = font(13.0).pos(plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Bottom,
    ));
    let value_below = font(13.0).pos(plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Top,
    ));
    for (i, (_, vals)) in bars.iter().enumerate() {
        for (k, v) in vals.iter().enumerate() {
            let Some((v, ci)) = v else { continue };
            if !v.is_finite() {
                continue;
            }
            let color = if k == 0 { BASE_COLOR } else { ADAPTER_COLOR };
            let x0 = i as f64 - 0.38 + 0.39 * k as f64;
            let x1 = x0 + 0.36;
            let xm = (x0 + x1) / 2.0;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0, 0.0), (x1, *v)],
                    color.filled(),
                )))
                .map_err(plot_err)?;
            let mut top = *v;
            if let Some([clo, chi]) = ci.filter(|c| c[0].is_finite() && c[1].is_finite()) {
                let w = 0.07;
                let whisker = BLACK.stroke_width(2);
                chart
                    .draw_series([
                        PathElement::new(vec![(xm, clo), (xm, chi)], whisker),
                        PathElement::new(vec![(xm - w, clo), (xm + w, clo)], whisker),
                        PathElement::new(vec![(xm - w, chi), (xm + w, chi)], whisker),
                    ])
                    .map_err(plot_err)?;
                top = top.max(chi);
            }
            // The value above a bar (and its whisker), or below a negative one.
            let label = if *v >= 0.0 {
                EmptyElement::at((xm, top.max(0.0)))
                    + Text::new(fmt_tick(*v), (0, -3), value_style.clone())
            } else {
                let bottom = ci.map_or(*v, |c| c[0].min(*v));
                EmptyElement::at((xm, bottom))
                    + Text::new(fmt_tick(*v), (0, 3), value_below.clone())
            };
            chart
                .draw_series(std::iter::once(label))
                .map_err(plot_err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rolling_mean_by_hand() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(rolling_mean(&v, 1), v.to_vec());
        assert_eq!(rolling_mean(&v, 3), vec![1.0, 1.5, 2.0, 3.0, 4.0]);
        assert_eq!(rolling_mean(&v, 10), vec![1.0, 1.5, 2.0, 2.5, 3.0]);
        // NaNs are skipped; a window of only NaNs is NaN.
        let v = [f64::NAN, 2.0, f64::NAN, f64::NAN, 6.0];
        let m = rolling_mean(&v, 2);
        assert!(m[0].is_nan());
        assert_eq!(m[1], 2.0);
        assert_eq!(m[2], 2.0);
        assert!(m[3].is_nan());
        assert_eq!(m[4], 6.0);
        assert!(rolling_mean(&[], 3).is_empty());
        assert_eq!(rolling_mean(&[4.0, 8.0], 0), vec![4.0, 8.0]);
    }

    #[test]
    fn stage_boundaries_found() {
        let s: Vec<String> = ["a", "a", "b", "b", "b", "c", "a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            stage_boundaries(&s),
            vec![(2, "b".into()), (5, "c".into()), (6, "a".into())]
        );
        assert!(stage_boundaries(&s[..2]).is_empty());
        assert!(stage_boundaries(&[]).is_empty());
    }

    #[test]
    fn ranges_are_never_degenerate() {
        assert_eq!(padded_range(&[f64::NAN, f64::NAN]), (0.0, 1.0));
        assert_eq!(padded_range(&[]), (0.0, 1.0));
        assert_eq!(padded_range(&[2.0, 2.0]), (1.5, 2.5));
        assert_eq!(padded_range(&[0.0]), (-0.5, 0.5));
        assert_eq!(padded_range(&[100.0]), (90.0, 110.0));
        let (lo, hi) = padded_range(&[0.0, f64::NAN, 10.0]);
        assert!((lo + 0.5).abs() < 1e-12 && (hi - 10.5).abs() < 1e-12);
        assert_eq!(step_range(&[7.0]), (5.0, 9.0));
    }

    #[test]
    fn segments_break_at_nan() {
        let xs = [1.0, 2.0, 3.0, 4.0, 5.0];
        let ys = [1.0, f64::NAN, 3.0, 4.0, f64::NAN];
        assert_eq!(
            finite_segments(&xs, &ys),
            vec![vec![(1.0, 1.0)], vec![(3.0, 3.0), (4.0, 4.0)]]
        );
    }

    #[test]
    fn tick_format() {
        assert_eq!(fmt_tick(0.0), "0");
        assert_eq!(fmt_tick(0.25), "0.25");
        assert_eq!(fmt_tick(1.5), "1.5");
        assert_eq!(fmt_tick(-0.0001), "0");
        assert_eq!(fmt_tick(12345.6), "12346");
        assert_eq!(fmt_step(5.0), "5");
        assert_eq!(fmt_step(5.5), "");
    }

    #[test]
    fn metric_bars_order_and_union() {
        let mk = |comps: &[(&str, f64)]| EnvEval {
            behaviour: None,
            episodes: 4,
            seats: 8,
            reward_mean: 0.5,
            reward_ci95: [0.4, 0.6],
            win_rate: 0.25,
            win_ci95: [0.1, 0.4],
            components: comps.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        };
        let b = mk(&[("a", 1.0)]);
        let a = mk(&[("a", 2.0), ("b", 3.0)]);
        let bars = metric_bars(Some(&b), Some(&a));
        let names: Vec<&str> = bars.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, vec!["win_rate", "reward_mean", "a", "b"]);
        assert_eq!(bars[0].1[0], Some((0.25, Some([0.1, 0.4]))));
        assert_eq!(bars[3].1[0], None);
        assert_eq!(bars[3].1[1], Some((3.0, None)));
    }
}
