//! `before_after.png`: the run's start vs its adapter from `eval.json`, one panel of
//! grouped bars per environment.
use super::canvas::{
    fmt_tick, font, plot_err, Area, Chart, ADAPTER_COLOR, BASE_COLOR, PLOT_HEIGHT,
};
use super::series::padded_range;
use crate::run::eval_report::{EnvEval, EvalReport, ModelEval};
use anyhow::Result;
use plotters::prelude::*;

/// Height of `before_after.png` for `n_envs` panels (two panels side by side per row).
pub fn before_after_height(n_envs: usize) -> u32 {
    let rows = n_envs.div_ceil(2).max(1) as u32;
    PLOT_HEIGHT.max(90 + 420 * rows)
}

/// Every environment either model was evaluated on, sorted.
pub(super) fn env_names(base: &ModelEval, adapter: &ModelEval) -> Vec<String> {
    let mut names: Vec<String> = base.envs.keys().cloned().collect();
    for k in adapter.envs.keys() {
        if !names.contains(k) {
            names.push(k.clone());
        }
    }
    names.sort();
    names
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

pub(super) fn draw_before_after(
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
    let (lo, hi) = bar_value_range(&bars);
    let seats = base
        .or(adapter)
        .map(|e| format!(" ({} episodes, {} seats)", e.episodes, e.seats))
        .unwrap_or_default();
    let names: Vec<String> = bars.iter().map(|(m, _)| m.clone()).collect();
    let mut chart = metric_chart(area, &format!("{env}{seats}"), &names, (lo, hi))?;
    if lo < 0.0 {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(-0.5, 0.0), (n as f64 - 0.5, 0.0)],
                BLACK.stroke_width(1),
            )))
            .map_err(plot_err)?;
    }
    for (i, (_, vals)) in bars.iter().enumerate() {
        for (k, v) in vals.iter().enumerate() {
            let Some((v, ci)) = v else { continue };
            if !v.is_finite() {
                continue;
            }
            let color = if k == 0 { BASE_COLOR } else { ADAPTER_COLOR };
            let x0 = i as f64 - 0.38 + 0.39 * k as f64;
            draw_bar(&mut chart, x0, color, *v, *ci)?;
        }
    }
    Ok(())
}

/// The y range of a panel: every value and whisker end, and zero.
fn bar_value_range(bars: &[MetricBars]) -> (f64, f64) {
    let mut ys = vec![0.0];
    for (_, vals) in bars {
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
    (lo, hi)
}

/// A panel's chart: metric `i` of `names` centred on x = i.
fn metric_chart<'a, 'b>(
    area: &'a Area<'b>,
    caption: &str,
    names: &[String],
    (lo, hi): (f64, f64),
) -> Result<Chart<'a, 'b>> {
    let n = names.len();
    let mut chart = ChartBuilder::on(area)
        .caption(caption, font(20.0))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, lo..hi)
        .map_err(plot_err)?;
    // Asking for n + 1 labels makes the ticks exactly the integers, which are named
    // after their metric.
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
    Ok(chart)
}

/// One bar from zero to `v` starting at `x0`, its 95% whisker when finite, and its
/// value written next to it.
fn draw_bar(
    chart: &mut Chart,
    x0: f64,
    color: RGBColor,
    v: f64,
    ci: Option<[f64; 2]>,
) -> Result<()> {
    let x1 = x0 + 0.36;
    let xm = (x0 + x1) / 2.0;
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(x0, 0.0), (x1, v)],
            color.filled(),
        )))
        .map_err(plot_err)?;
    let mut top = v;
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
    // Above a bar and its whisker, or below a negative one, so the label never
    // covers either.
    let label = if v >= 0.0 {
        let style = font(13.0).pos(plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Bottom,
        ));
        EmptyElement::at((xm, top.max(0.0))) + Text::new(fmt_tick(v), (0, -3), style)
    } else {
        let style = font(13.0).pos(plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Top,
        ));
        let bottom = ci.map_or(v, |c| c[0].min(v));
        EmptyElement::at((xm, bottom)) + Text::new(fmt_tick(v), (0, 3), style)
    };
    chart
        .draw_series(std::iter::once(label))
        .map_err(plot_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
