//! The drawing surface every figure shares: image size, embedded font, colours, tick
//! labels, and rendering into an atomically written PNG.
use anyhow::{bail, Context, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::Path;

/// Width of every image, pixels.
pub const PLOT_WIDTH: u32 = 1200;
/// Height of `reward_curve.png` and `components.png` (and of `before_after.png` with
/// one or two environments), pixels.
pub const PLOT_HEIGHT: u32 = 700;

pub(super) type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// A chart with `f64` axes on an [`Area`].
pub(super) type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

const FONT: &str = "sans-serif";
static FONT_BYTES: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

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

pub(super) fn palette(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

pub(super) const BASE_COLOR: RGBColor = RGBColor(150, 150, 150);
pub(super) const ADAPTER_COLOR: RGBColor = RGBColor(31, 119, 180);
pub(super) const STAGE_COLOR: RGBColor = RGBColor(90, 90, 90);

/// Render with `draw` into an RGB buffer, encode as PNG and write `path` atomically.
pub(super) fn write_png(
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

pub(super) fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plotting: {e:?}")
}

pub(super) fn font(size: f64) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).color(&BLACK)
}

/// Tick label: integers plainly, otherwise up to 3 significant decimals.
pub(super) fn fmt_tick(v: f64) -> String {
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
pub(super) fn fmt_step(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        String::new()
    }
}

/// A note centred on `area`, for a chart with nothing to draw.
pub(super) fn draw_no_data(area: &Area, msg: &str) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
