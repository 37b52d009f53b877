//! `reward_curve.png`: reward per step, its rolling mean, stage changes and the
//! held-out evaluations.
use super::canvas::{draw_no_data, palette, plot_err, Area, Chart, STAGE_COLOR};
use super::eval_log::HeldOut;
use super::series::{padded_range, rolling_mean, step_range, with_stage_headroom};
use super::step_chart::{
    draw_legend, draw_rolling_mean, draw_stages, split_titled, step_chart, Mark,
};
use crate::run::log::TrainingLog;
use anyhow::{Context, Result};
use plotters::prelude::*;

pub(super) fn draw_reward_curve(
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

fn draw_held_out(chart: &mut Chart, held: &[HeldOut]) -> Result<Vec<(String, Mark)>> {
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
