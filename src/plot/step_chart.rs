//! What the charts over training steps share: axes, legend panel, stage changes and
//! rolling-mean lines.
use super::canvas::{fmt_step, fmt_tick, font, plot_err, Area, Chart, STAGE_COLOR};
use super::series::{finite_segments, stage_boundaries};
use crate::run::log::TrainingLog;
use anyhow::Result;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

/// How a legend entry shows its series.
pub(super) enum Mark {
    Dot(RGBColor),
    Ring(RGBColor),
    Line(RGBColor, u32),
    Dashed(RGBColor),
}

const LEFT_CENTER: plotters::style::text_anchor::Pos = plotters::style::text_anchor::Pos {
    h_pos: plotters::style::text_anchor::HPos::Left,
    v_pos: plotters::style::text_anchor::VPos::Center,
};

/// A legend in its own panel (never over the data): one entry per row.
pub(super) fn draw_legend(
    area: &Area,
    title: Option<&str>,
    entries: &[(String, Mark)],
) -> Result<()> {
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
pub(super) fn split_titled<'a>(root: &Area<'a>, title: &str) -> Result<(Area<'a>, Area<'a>)> {
    let body = root.titled(title, font(26.0)).map_err(plot_err)?;
    let (w, _) = body.dim_in_pixel();
    Ok(body.split_horizontally(w.saturating_sub(LEGEND_WIDTH)))
}

/// Dashed vertical lines at stage changes, each labelled with the new stage; the
/// first stage is labelled at the left edge.
pub(super) fn draw_stages(
    chart: &mut Chart,
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

/// A chart over training steps with the shared axes, grid and label styles.
pub(super) fn step_chart<'a, 'b>(
    area: &'a Area<'b>,
    x: (f64, f64),
    y: (f64, f64),
    y_desc: &str,
) -> Result<Chart<'a, 'b>> {
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
pub(super) fn draw_rolling_mean(
    chart: &mut Chart,
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
