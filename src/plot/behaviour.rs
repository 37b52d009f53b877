//! `behaviour.png`: each model's action shares per situation, one panel per
//! environment, from the behaviour reports in `eval.json`.
use super::canvas::{font, palette, plot_err, Area, Chart};
use crate::envs::BehaviourSummary;
use crate::run::eval_report::EvalReport;
use anyhow::Result;
use plotters::prelude::*;

/// Per environment with a behaviour report: (env, [(model label, summary)]), the
/// run's start (`base`) first.
pub(super) type BehaviourPanel<'a> = (String, Vec<(String, &'a BehaviourSummary)>);

pub(super) fn behaviour_panels(report: &EvalReport) -> Vec<BehaviourPanel<'_>> {
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

pub(super) fn draw_behaviour(root: &Area, panels: &[BehaviourPanel], name: &str) -> Result<()> {
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
    models: &[(String, &BehaviourSummary)],
) -> Result<()> {
    let situations = sorted_unique(models.iter().flat_map(|(_, b)| b.situations.keys()));
    let actions = sorted_unique(
        models
            .iter()
            .flat_map(|(_, b)| b.situations.values().flat_map(|s| s.actions.keys())),
    );
    let (legend_area, chart_area) = area.split_vertically(60);
    draw_panel_legend(&legend_area, env, models, &actions)?;
    let mut chart = situation_chart(&chart_area, &situations)?;
    draw_share_bars(&mut chart, models, &situations, &actions)
}

fn sorted_unique<'a>(names: impl Iterator<Item = &'a String>) -> Vec<&'a String> {
    let mut names: Vec<&String> = names.collect();
    names.sort();
    names.dedup();
    names
}

/// The panel's heading (each model's agreement and mutual information) and one
/// colour swatch per action.
fn draw_panel_legend(
    legend_area: &Area,
    env: &str,
    models: &[(String, &BehaviourSummary)],
    actions: &[&String],
) -> Result<()> {
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
    Ok(())
}

/// Shares from 0 to 1 over the situations, situation `i` centred on x = i.
fn situation_chart<'a, 'b>(
    chart_area: &'a Area<'b>,
    situations: &[&String],
) -> Result<Chart<'a, 'b>> {
    let n = situations.len();
    let mut chart = ChartBuilder::on(chart_area)
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
    Ok(chart)
}

/// Per situation, one stacked bar of action shares per model, side by side.
fn draw_share_bars(
    chart: &mut Chart,
    models: &[(String, &BehaviourSummary)],
    situations: &[&String],
    actions: &[&String],
) -> Result<()> {
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
