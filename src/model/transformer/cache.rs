//! The KV cache of sampling: preallocated per layer, appended in place, with the
//! per-row bookkeeping (real columns, next RoPE position) that lets rows pad, finish,
//! repeat, compact and continue a conversation.
use super::mask::{self, Layout};
use super::Transformer;
use anyhow::{bail, Result};
use candle_core::{Device, Tensor};

/// A preallocated KV cache (per layer `[B, KVH, max_len, head_dim]`), appended in place.
///
/// Columns are shared by all rows: a call to [`Transformer::forward_cached`] with `[B, T]`
/// ids writes columns `len..len+T`; a padded entry (mask 0) occupies its column but is
/// never attended to. Per row, the cache tracks the next RoPE position (the number of
/// real tokens so far), so left-padded prompts and rows that feed padding after they
/// finished keep correct positions.
#[derive(Debug, Clone)]
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    batch: usize,
    max_len: usize,
    len: usize,
    /// `[batch * max_len]`: 1 where the column holds a real token.
    key_valid: Vec<u8>,
    /// `[batch]`: position of the next real token of each row.
    next_pos: Vec<u32>,
}

impl KvCache {
    pub fn batch(&self) -> usize {
        self.batch
    }
    pub fn max_len(&self) -> usize {
        self.max_len
    }
    /// Columns written so far.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Per row: the RoPE position the next real token will get.
    pub fn next_positions(&self) -> &[u32] {
        &self.next_pos
    }

    /// A new cache made of the given rows of this one, in that order; rows may repeat
    /// (expand a prompt's prefill to G completions) or be dropped (finished rows).
    pub fn select_rows(&self, rows: &[usize]) -> Result<KvCache> {
        if let Some(&r) = rows.iter().find(|&&r| r >= self.batch) {
            bail!(
                "KvCache::select_rows: row {r} out of range (batch {})",
                self.batch
            );
        }
        let dev = self
            .k
            .first()
            .map(|t| t.device().clone())
            .unwrap_or(Device::Cpu);
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx = Tensor::from_vec(idx, rows.len(), &dev)?;
        let sel = |ts: &[Tensor]| -> Result<Vec<Tensor>> {
            ts.iter()
                .map(|t| Ok(t.index_select(&idx, 0)?))
                .collect::<Result<Vec<_>>>()
        };
        let mut key_valid = Vec::with_capacity(rows.len() * self.max_len);
        for &r in rows {
            key_valid.extend_from_slice(&self.key_valid[r * self.max_len..(r + 1) * self.max_len]);
        }
        Ok(KvCache {
            k: sel(&self.k)?,
            v: sel(&self.v)?,
            batch: rows.len(),
            max_len: self.max_len,
            len: self.len,
            key_valid,
            next_pos: rows.iter().map(|&r| self.next_pos[r]).collect(),
        })
    }

    /// The same cache with room for `extra` more columns (the written columns copied):
    /// multi-turn sampling grows it when an environment turn does not fit.
    pub fn grow(&self, extra: usize) -> Result<KvCache> {
        let ml = self.max_len + extra;
        let pad = |t: &Tensor| -> Result<Tensor> {
            let (b, h, _, d) = t.dims4()?;
            let z = Tensor::zeros((b, h, extra, d), t.dtype(), t.device())?;
            Ok(Tensor::cat(&[t, &z], 2)?)
        };
        let mut key_valid = vec![0u8; self.batch * ml];
        for r in 0..self.batch {
            key_valid[r * ml..r * ml + self.max_len]
                .copy_from_slice(&self.key_valid[r * self.max_len..(r + 1) * self.max_len]);
        }
        Ok(KvCache {
            k: self.k.iter().map(pad).collect::<Result<_>>()?,
            v: self.v.iter().map(pad).collect::<Result<_>>()?,
            batch: self.batch,
            max_len: ml,
            len: self.len,
            key_valid,
            next_pos: self.next_pos.clone(),
        })
    }

    /// Real (unmasked) columns of the fullest row.
    pub fn max_real_columns(&self) -> usize {
        (0..self.batch)
            .map(|r| {
                self.key_valid[r * self.max_len..r * self.max_len + self.len]
                    .iter()
                    .filter(|&&v| v != 0)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    /// The same cache with every row's real columns moved to the left, in order, and
    /// the masked ones dropped (`len` becomes the fullest row's count): rows that
    /// appended different numbers of tokens at different steps waste columns, and this
    /// gives them back. Attention is unchanged (keys keep their RoPE positions and
    /// order; masked keys were never attended to).
    pub fn compact(&self) -> Result<KvCache> {
        let ml = self.max_len;
        let len = self.max_real_columns();
        let dev = self
            .k
            .first()
            .map(|t| t.device().clone())
            .unwrap_or(Device::Cpu);
        let mut idx = Vec::with_capacity(self.batch * len);
        let mut key_valid = vec![0u8; self.batch * ml];
        for r in 0..self.batch {
            let real: Vec<usize> = (0..self.len)
                .filter(|&j| self.key_valid[r * ml + j] != 0)
                .collect();
            for c in 0..len {
                // padding columns repeat column 0 (masked anyway)
                let j = real.get(c).copied().unwrap_or(0);
                idx.push((r * ml + j) as u32);
                key_valid[r * ml + c] = u8::from(c < real.len());
            }
        }
        let idx = Tensor::from_vec(idx, self.batch * len, &dev)?;
        let pack = |t: &Tensor| -> Result<Tensor> {
            let (b, h, _, d) = t.dims4()?;
            let rows = t.transpose(1, 2)?.contiguous()?.reshape((b * ml, h * d))?;
            let kept = rows.index_select(&idx, 0)?.reshape((b, len, h, d))?;
            let z = Tensor::zeros((b, ml - len, h, d), t.dtype(), t.device())?;
            Ok(Tensor::cat(&[&kept, &z], 1)?
                .transpose(1, 2)?
                .contiguous()?)
        };
        Ok(KvCache {
            k: self.k.iter().map(pack).collect::<Result<_>>()?,
            v: self.v.iter().map(pack).collect::<Result<_>>()?,
            batch: self.batch,
            max_len: ml,
            len,
            key_valid,
            next_pos: self.next_pos.clone(),
        })
    }

    /// Row `r`'s real columns, in order: its keys and values to seed a later cache
    /// ([`Transformer::cache_from_prefixes`]) that continues the same token sequence.
    pub fn row_real(&self, r: usize) -> Result<RowKv> {
        if r >= self.batch {
            bail!(
                "KvCache::row_real: row {r} out of range (batch {})",
                self.batch
            );
        }
        let ml = self.max_len;
        let cols: Vec<u32> = (0..self.len)
            .filter(|&j| self.key_valid[r * ml + j] != 0)
            .map(|j| j as u32)
            .collect();
        let n = cols.len();
        let dev = self
            .k
            .first()
            .map(|t| t.device().clone())
            .unwrap_or(Device::Cpu);
        let idx = Tensor::from_vec(cols, n, &dev)?;
        let take = |ts: &[Tensor]| -> Result<Vec<Tensor>> {
            ts.iter()
                .map(|t| Ok(t.narrow(0, r, 1)?.index_select(&idx, 2)?))
                .collect()
        };
        Ok(RowKv {
            k: take(&self.k)?,
            v: take(&self.v)?,
            len: n,
        })
    }

    /// Each row repeated `g` times consecutively: rows `[0,0,..,1,1,..]`.
    pub fn repeat_rows(&self, g: usize) -> Result<KvCache> {
        let rows: Vec<usize> = (0..self.batch)
            .flat_map(|r| std::iter::repeat_n(r, g))
            .collect();
        self.select_rows(&rows)
    }
}

/// One row's cached keys and values (per layer `[1, KVH, len, head_dim]`, positions
/// `0..len`), taken with [`KvCache::row_real`].
#[derive(Debug, Clone)]
pub struct RowKv {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    len: usize,
}

impl RowKv {
    /// Tokens (columns) held.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes its keys and values take.
    pub fn bytes(&self) -> usize {
        self.k
            .iter()
            .chain(&self.v)
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }
}

impl Transformer {
    /// A cache whose row `i` holds the first `rows[i].1` columns of `rows[i].0` (a row
    /// without one starts empty), with room for `extra` more columns: the next prompt
    /// of a session is then prefilled from where it leaves the last one. Rows shorter
    /// than the longest are padded with masked columns.
    pub fn cache_from_prefixes(
        &self,
        rows: &[(Option<&RowKv>, usize)],
        extra: usize,
    ) -> Result<KvCache> {
        let cfg = &self.cfg;
        let keep: Vec<usize> = rows
            .iter()
            .map(|&(kv, n)| n.min(kv.map_or(0, |kv| kv.len)))
            .collect();
        let len = keep.iter().copied().max().unwrap_or(0);
        let ml = len + extra;
        let (h, d) = (cfg.num_key_value_heads, cfg.head_dim);
        let layer = |li: usize, pick: fn(&RowKv) -> &Vec<Tensor>| -> Result<Tensor> {
            let parts = rows
                .iter()
                .zip(&keep)
                .map(|(&(kv, _), &n)| {
                    let pad = Tensor::zeros((1, h, ml - n, d), self.dtype, &self.device)?;
                    match kv {
                        Some(kv) if n > 0 => {
                            Ok(Tensor::cat(&[&pick(kv)[li].narrow(2, 0, n)?, &pad], 2)?)
                        }
                        _ => Ok(pad),
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Tensor::cat(&parts, 0)?.contiguous()?)
        };
        let mut k = Vec::with_capacity(cfg.num_hidden_layers);
        let mut v = Vec::with_capacity(cfg.num_hidden_layers);
        for li in 0..cfg.num_hidden_layers {
            k.push(layer(li, |kv| &kv.k)?);
            v.push(layer(li, |kv| &kv.v)?);
        }
        let mut key_valid = vec![0u8; rows.len() * ml];
        for (r, &n) in keep.iter().enumerate() {
            key_valid[r * ml..r * ml + n]
                .iter_mut()
                .for_each(|x| *x = 1);
        }
        Ok(KvCache {
            k,
            v,
            batch: rows.len(),
            max_len: ml,
            len,
            key_valid,
            next_pos: keep.iter().map(|&n| n as u32).collect(),
        })
    }

    /// A fresh cache for `batch` rows and up to `max_len` columns (prompt + new tokens).
    pub fn new_cache(&self, batch: usize, max_len: usize) -> Result<KvCache> {
        let cfg = &self.cfg;
        let shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim);
        let mut k = Vec::with_capacity(cfg.num_hidden_layers);
        let mut v = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            k.push(Tensor::zeros(shape, self.dtype, &self.device)?);
            v.push(Tensor::zeros(shape, self.dtype, &self.device)?);
        }
        Ok(KvCache {
            k,
            v,
            batch,
            max_len,
            len: 0,
            key_valid: vec![0; batch * max_len],
            next_pos: vec![0; batch],
        })
    }
}

impl KvCache {
    /// Open the next `t` columns for rows `[B, t]` whose entries are real or padding
    /// (`real`, row-major): marks them, moves each row's next position past its real
    /// tokens, and returns their positions and mask over every written column. The
    /// columns count as written once [`Self::commit`] says the forward succeeded.
    pub(super) fn open(&mut self, real: &[u8], t: usize, device: &Device) -> Result<Layout> {
        let (b, start, ml) = (self.batch, self.len, self.max_len);
        if start + t > ml {
            bail!("forward: cache full ({start} + {t} columns > max_len {ml})");
        }
        let mut positions = Vec::with_capacity(b * t);
        for bi in 0..b {
            for i in 0..t {
                let is_real = real[bi * t + i] != 0;
                positions.push(self.next_pos[bi]);
                self.key_valid[bi * ml + start + i] = u8::from(is_real);
                self.next_pos[bi] += u32::from(is_real);
            }
        }
        mask::cached(&self.key_valid, ml, (b, t, start), positions, device)
    }

    /// Write layer `li`'s keys and values `[B, KVH, t, D]` at the open columns and
    /// return all of that layer's columns up to them.
    pub(super) fn append(&mut self, li: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (start, t) = (self.len, k.dim(2)?);
        self.k[li].slice_set(k, 2, start)?;
        self.v[li].slice_set(v, 2, start)?;
        Ok((
            self.k[li].narrow(2, 0, start + t)?,
            self.v[li].narrow(2, 0, start + t)?,
        ))
    }

    pub(super) fn commit(&mut self, t: usize) {
        self.len += t;
    }
}
