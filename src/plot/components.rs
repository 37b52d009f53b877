//! `components.png`: one rolling-mean line per reward component.
use super::canvas::{draw_no_data, palette, plot_err, Area, STAGE_COLOR};
use super::series::{padded_range, rolling_mean, step_range, with_stage_headroom};
use super::step_chart::{
    draw_legend, draw_rolling_mean, draw_stages, split_titled, step_chart, Mark,
};
use crate::run::log::TrainingLog;
use anyhow::Result;
use plotters::prelude::*;

pub(super) fn draw_components(
    root: &Area,
    log: &TrainingLog,
    name: &str,
    window: usize,
) -> Result<()> {
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
