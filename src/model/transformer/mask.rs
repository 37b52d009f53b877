//! Attention masks and RoPE positions: the one place that decides which keys a query
//! sees. Masks are additive (`0` or [`MASKED`]) `[B, 1, 1, T, Tk]`, broadcast over the
//! query heads of a KV head. A padded entry gets position 1, like transformers'
//! `masked_fill(mask == 0, 1)`; its hidden state is finite and meaningless.
use anyhow::{bail, Result};
use candle_core::{Device, Tensor};

/// Additive mask value for disallowed keys (like transformers' `finfo.min`).
pub(super) const MASKED: f32 = f32::MIN;

/// A stream's positions and mask, before the RoPE tables are built.
pub(super) struct Layout {
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) positions: Vec<u32>,
    pub(super) mask: Tensor,
}

/// `attention_mask` checked against `[b, t]`; `None` is all real.
pub(super) fn real_mask(mask: Option<&[u8]>, b: usize, t: usize) -> Result<Vec<u8>> {
    match mask {
        Some(m) if m.len() != b * t => {
            bail!("attention_mask has {} entries, expected {b}x{t}", m.len())
        }
        Some(m) => Ok(m.to_vec()),
        None => Ok(vec![1; b * t]),
    }
}

/// Packed rows `[b, t]`: each real token sees the real tokens of its row up to itself,
/// at position `cumsum(mask) - 1` (a left-padded row gets the unpadded positions).
pub(super) fn packed(real: &[u8], b: usize, t: usize, device: &Device) -> Result<Layout> {
    let mut positions = Vec::with_capacity(b * t);
    for row in real.chunks(t.max(1)) {
        let mut n = 0u32;
        for &m in row {
            positions.push(if m != 0 { n } else { 1 });
            n += u32::from(m != 0);
        }
    }
    // The same rule as a cache whose columns are exactly these tokens.
    cached(real, t, (b, t, 0), positions, device)
}

/// `g` completions `[g, c]` of one all-real prompt of `p` tokens: each completion token
/// sees the whole prompt and its row's real tokens up to itself; its position is `p` +
/// the real completion tokens before it.
pub(super) fn completions(
    real: &[u8],
    p: usize,
    g: usize,
    c: usize,
    device: &Device,
) -> Result<Layout> {
    let tk = p + c;
    let mut positions = Vec::with_capacity(g * c);
    let mut add = vec![MASKED; g * c * tk];
    for gi in 0..g {
        let mut n = p as u32;
        for i in 0..c {
            let is_real = real[gi * c + i] != 0;
            positions.push(if is_real { n } else { 1 });
            n += u32::from(is_real);
            let row = &mut add[(gi * c + i) * tk..(gi * c + i + 1) * tk];
            row[..p].fill(0.0);
            for j in 0..=i {
                if real[gi * c + j] != 0 {
                    row[p + j] = 0.0;
                }
            }
        }
    }
    let mask = Tensor::from_vec(add, (g, 1, 1, c, tk), device)?;
    Ok(Layout {
        rows: g,
        cols: c,
        positions,
        mask,
    })
}

/// `t` new columns `start..start+t` of a cache whose columns `0..start+t` are marked
/// real or not in `key_valid` (row-major, `ml` columns per row): each real token sees
/// the real columns of its row up to itself. Positions come from the cache.
pub(super) fn cached(
    key_valid: &[u8],
    ml: usize,
    (b, t, start): (usize, usize, usize),
    positions: Vec<u32>,
    device: &Device,
) -> Result<Layout> {
    let tk = start + t;
    let mut add = vec![MASKED; b * t * tk];
    for bi in 0..b {
        for i in 0..t {
            let row = &mut add[(bi * t + i) * tk..(bi * t + i + 1) * tk];
            for (j, r) in row.iter_mut().enumerate().take(start + i + 1) {
                if key_valid[bi * ml + j] != 0 {
                    *r = 0.0;
                }
            }
        }
    }
    let mask = Tensor::from_vec(add, (b, 1, 1, t, tk), device)?;
    Ok(Layout {
        rows: b,
        cols: t,
        positions,
        mask,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(l: &Layout) -> Vec<Vec<u8>> {
        let v: Vec<f32> = l.mask.flatten_all().unwrap().to_vec1().unwrap();
        let tk = v.len() / (l.rows * l.cols);
        v.chunks(tk)
            .map(|r| r.iter().map(|&x| u8::from(x == 0.0)).collect())
            .collect()
    }

    #[test]
    fn packed_left_padding_by_hand() {
        let l = packed(&[0, 1, 1], 1, 3, &Device::Cpu).unwrap();
        assert_eq!(l.positions, vec![1, 0, 1]);
        assert_eq!(
            allowed(&l),
            vec![vec![0, 0, 0], vec![0, 1, 0], vec![0, 1, 1]]
        );
    }

    #[test]
    fn completions_see_the_prompt_and_their_real_past() {
        // prompt of 2; completion rows [real, pad, real] and [real, real, pad]
        let l = completions(&[1, 0, 1, 1, 1, 0], 2, 2, 3, &Device::Cpu).unwrap();
        assert_eq!(l.positions, vec![2, 1, 3, 2, 3, 1]);
        let a = allowed(&l);
        assert_eq!(a[0], vec![1, 1, 1, 0, 0]);
        assert_eq!(a[2], vec![1, 1, 1, 0, 1]);
        assert_eq!(a[4], vec![1, 1, 1, 1, 0]);
    }
}
