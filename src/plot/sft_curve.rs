//! `sft_curve.png`: an SFT run's loss and token accuracy per step.
use super::canvas::{draw_no_data, plot_err, Area};
use super::series::{padded_range, rolling_mean, step_range};
use super::step_chart::{draw_legend, draw_rolling_mean, split_titled, step_chart, Mark};
use crate::run::log::TrainingLog;
use anyhow::Result;
use plotters::prelude::*;

/// An SFT log: loss and mean token accuracy per step (points) with rolling means.
pub(super) fn draw_sft_curve(
    root: &Area,
    log: &TrainingLog,
    name: &str,
    window: usize,
) -> Result<()> {
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
