//! `learning_curve.png`: the held-out evaluations of `eval_log.csv` against the step,
//! with 95% whiskers, over horizontal lines for what a skeptic compares them with (the
//! base model, the best constant policy, the heuristic). Reward above, win rate below.
use super::canvas::font;
use super::canvas::{palette, plot_err, Area, Chart, BASE_COLOR};
use super::eval_log::HeldOut;
use super::series::padded_range;
use super::step_chart::{draw_legend, step_chart, Mark};
use anyhow::Result;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

/// A horizontal line: one policy's held-out reward and win rate on an environment.
#[derive(Debug, Clone, PartialEq)]
pub struct RefLine {
    pub env: String,
    pub label: String,
    pub reward: f64,
    pub win: f64,
}

/// Which of the two panels.
#[derive(Clone, Copy)]
enum Metric {
    Reward,
    Win,
}

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Metric::Reward => "held-out reward",
            Metric::Win => "held-out win rate",
        }
    }
    fn of(self, h: &HeldOut) -> (f64, [f64; 2]) {
        match self {
            Metric::Reward => (h.reward, h.reward_ci),
            Metric::Win => (h.win, h.win_ci),
        }
    }
    fn of_ref(self, r: &RefLine) -> f64 {
        match self {
            Metric::Reward => r.reward,
            Metric::Win => r.win,
        }
    }
}

const LEGEND_WIDTH: u32 = 390;

pub(super) fn draw_learning_curve(
    root: &Area,
    held: &[HeldOut],
    refs: &[RefLine],
    name: &str,
) -> Result<()> {
    let body = root
        .titled(&format!("{name}: held-out learning curve"), font(26.0))
        .map_err(plot_err)?;
    let panels = body.split_evenly((2, 1));
    for (area, metric) in panels.iter().zip([Metric::Reward, Metric::Win]) {
        let (w, _) = area.dim_in_pixel();
        let (chart_area, legend_area) = area.split_horizontally(w.saturating_sub(LEGEND_WIDTH));
        let entries = draw_panel(&chart_area, held, refs, metric)?;
        draw_legend(&legend_area, Some(metric.name()), &entries)?;
    }
    Ok(())
}

fn env_names(held: &[HeldOut]) -> Vec<String> {
    let mut envs: Vec<String> = held.iter().map(|h| h.env.clone()).collect();
    envs.sort();
    envs.dedup();
    envs
}

fn draw_panel(
    area: &Area,
    held: &[HeldOut],
    refs: &[RefLine],
    metric: Metric,
) -> Result<Vec<(String, Mark)>> {
    let lo = held.iter().map(|h| h.step).fold(f64::INFINITY, f64::min);
    let hi = held
        .iter()
        .map(|h| h.step)
        .fold(f64::NEG_INFINITY, f64::max);
    let x = if lo.is_finite() {
        (lo - 1.0, (hi + 1.0).max(lo + 2.0))
    } else {
        (0.0, 1.0)
    };
    let values: Vec<f64> = held
        .iter()
        .flat_map(|h| {
            let (v, ci) = metric.of(h);
            [v, ci[0], ci[1]]
        })
        .chain(refs.iter().map(|r| metric.of_ref(r)))
        .collect();
    let y = padded_range(values.iter());
    let mut chart = step_chart(area, x, y, metric.name())?;
    let envs = env_names(held);
    let several = envs.len() > 1;
    let mut entries = Vec::new();
    for (k, r) in refs.iter().enumerate() {
        let color = if r.label.starts_with("base") {
            BASE_COLOR
        } else {
            palette(3 + k)
        };
        let v = metric.of_ref(r);
        if !v.is_finite() {
            continue;
        }
        chart
            .draw_series(std::iter::once(DashedPathElement::new(
                vec![(x.0, v), (x.1, v)],
                10,
                6,
                color.stroke_width(2),
            )))
            .map_err(plot_err)?;
        let of = if several {
            format!(" ({})", r.env)
        } else {
            String::new()
        };
        entries.push((format!("{} {v:.3}{of}", r.label), Mark::Dashed(color)));
    }
    for (i, env) in envs.iter().enumerate() {
        let color = palette(i);
        let rows: Vec<&HeldOut> = held.iter().filter(|h| &h.env == env).collect();
        draw_series(&mut chart, &rows, metric, color)?;
        let of = if several {
            format!(" {env}")
        } else {
            String::new()
        };
        entries.insert(i, (format!("trained policy{of}"), Mark::Line(color, 3)));
    }
    Ok(entries)
}

/// One environment's evaluations: whiskers, a line through the means, and dots.
fn draw_series(
    chart: &mut Chart,
    rows: &[&HeldOut],
    metric: Metric,
    color: RGBColor,
) -> Result<()> {
    for h in rows {
        let (_, ci) = metric.of(h);
        if ci.iter().all(|v| v.is_finite()) {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(h.step, ci[0]), (h.step, ci[1])],
                    color.stroke_width(2),
                )))
                .map_err(plot_err)?;
        }
    }
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .map(|h| (h.step, metric.of(h).0))
        .filter(|p| p.1.is_finite())
        .collect();
    chart
        .draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))
        .map_err(plot_err)?;
    chart
        .draw_series(pts.into_iter().map(|p| Circle::new(p, 5, color.filled())))
        .map_err(plot_err)?;
    Ok(())
}
